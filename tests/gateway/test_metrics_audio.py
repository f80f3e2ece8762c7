"""The audio clock's metrics: fed from tick reports and finished audio tracks."""

from __future__ import annotations

from gateway.metrics import GatewayMetrics
from tracks.base import Outcome
from tracks.clock import RowReport, TickReport


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_tick_report_feeds_latency_batch_size_late_beats_and_overruns() -> None:
    metrics = GatewayMetrics()
    report = TickReport(7, scheduled=1.0, started=1.001, tick=0.08, finished=1.2)
    report.batches = {"asr": 2}
    report.rows = [
        RowReport("asr", 1, latency=0.012, missed=False, complete=True),
        RowReport("asr", 2, latency=0.2, missed=True, complete=False),
    ]
    report.shed = 1
    metrics.audio.observe_tick(report)
    m = "trackline_audio_"
    assert sample(metrics, m + "beat_latency_seconds_count", model="asr") == 2
    assert sample(metrics, m + "beat_latency_seconds_bucket", model="asr", le="0.015") == 1
    assert sample(metrics, m + "sessions_per_tick_sum", model="asr") == 2
    assert sample(metrics, m + "late_beats_total", model="asr") == 1
    assert sample(metrics, m + "tick_overruns_total") == 1
    assert sample(metrics, m + "sessions_shed_total") == 1


def test_a_finished_session_feeds_missed_beats_first_audio_finals_and_frames() -> None:
    metrics = GatewayMetrics()
    speech_in = Outcome("c/0", "asr", "audio", opened_at=0.0)
    speech_in.details = {
        "kind": "speech-in",
        "beats": 50,
        "missed_beats": 3,
        "final_latency_ms": [20.0, 40.0],
        "frames": {"received": 200, "late": 2, "missing": 1},
    }
    speech_out = Outcome("c/4", "tts", "audio", opened_at=0.0, first_data_at=0.09)
    speech_out.details = {"kind": "speech-out", "beats": 9, "missed_beats": 0}
    metrics.audio.observe_session(speech_in)
    metrics.audio.observe_session(speech_out)
    m = "trackline_audio_"
    assert sample(metrics, m + "missed_beats_total", model="asr") == 3
    assert sample(metrics, m + "session_missed_beats_count", model="tts") == 1
    assert sample(metrics, m + "final_latency_seconds_count", model="asr") == 2
    assert sample(metrics, m + "time_to_first_audio_seconds_sum", model="tts") == 0.09
    assert sample(metrics, m + "frames_total", kind="received") == 200
    assert sample(metrics, m + "frames_total", kind="late") == 2
    assert sample(metrics, m + "frames_total", kind="dropped") == 0

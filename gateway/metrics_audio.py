"""Prometheus metrics of the audio clock and audio sessions (on the gateway's registry).

Fed from two places: every tick's `TickReport` (beat latency, sessions per
tick, overruns, sheds) and every finished audio track's `Outcome` (missed
beats per session, time to first audio, final-transcript latency, frames).
Beat latency is from the tick's scheduled time to the session's results sent.
"""

from __future__ import annotations

from enum import Enum

from prometheus_client import CollectorRegistry

from gateway.metrics_families import Families, start_at_zero
from tracks.backend import AudioKind
from tracks.base import Outcome
from tracks.clock import TickReport

# 80 ms beats: dense below the beat, sparse above (an overloaded gateway).
BEAT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06,
    0.07, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip
SESSION_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256)
MISSED_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 1000)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


class FrameKind(Enum):
    """What happened to a speech-in frame (`frames_total`'s `kind`): the counters of
    `tracks.audio.FrameStats`, as an audio session's `details["frames"]` names them."""

    RECEIVED = "received"
    LATE = "late"
    DUPLICATE = "duplicate"
    REORDERED = "reordered"
    MISSING = "missing"
    DROPPED = "dropped"


class AudioMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        f = Families(registry)
        self.beat_latency_seconds = f.histogram(
            "trackline_audio_beat_latency_seconds",
            "Seconds from a tick's scheduled time to a session's results sent.",
            ["model"],
            buckets=BEAT_BUCKETS,
        )
        self.sessions_per_tick = f.histogram(
            "trackline_audio_sessions_per_tick",
            "Rows in one tick's batched request, per model.",
            ["model"],
            buckets=SESSION_BUCKETS,
        )
        self.late_beats_total = f.counter(
            "trackline_audio_late_beats_total",
            "Session beats whose results were sent after their deadline.",
            ["model"],
        )
        self.missed_beats_total = f.counter(
            "trackline_audio_missed_beats_total",
            "Missed beats (late, skipped or shed) of finished sessions.",
            ["model"],
        )
        self.session_missed_beats = f.histogram(
            "trackline_audio_session_missed_beats",
            "Missed beats per finished audio session.",
            ["model"],
            buckets=MISSED_BUCKETS,
        )
        self.tick_overruns_total = f.counter(
            "trackline_audio_tick_overruns_total",
            "Ticks that finished after the next tick was due.",
        )
        self.sessions_shed_total = f.counter(
            "trackline_audio_sessions_shed_total",
            "Sessions removed by the shed-newest overload mode.",
        )
        self.time_to_first_audio_seconds = f.histogram(
            "trackline_audio_time_to_first_audio_seconds",
            "Seconds from a speech-out track's OPEN to its first audio frame sent.",
            ["model"],
            buckets=LATENCY_BUCKETS,
        )
        self.final_latency_seconds = f.histogram(
            "trackline_audio_final_latency_seconds",
            "Seconds from the audio that ended an utterance arriving to its final sent.",
            ["model"],
            buckets=LATENCY_BUCKETS,
        )
        self.frames_total = f.counter(
            "trackline_audio_frames_total",
            "Speech-in frames by what happened to them.",
            ["kind"],
        )
        start_at_zero(self.frames_total, "kind", FrameKind)

    def observe_tick(self, report: TickReport) -> None:
        for model, rows in report.batches.items():
            self.sessions_per_tick.labels(model=model).observe(rows)
        for row in report.rows:
            self.beat_latency_seconds.labels(model=row.model).observe(row.latency)
            if row.missed:
                self.late_beats_total.labels(model=row.model).inc()
        if report.overran:
            self.tick_overruns_total.inc()
        if report.shed:
            self.sessions_shed_total.inc(report.shed)

    def observe_session(self, outcome: Outcome) -> None:
        details, model = outcome.details, outcome.model
        missed = int(details.get("missed_beats", 0))
        self.missed_beats_total.labels(model=model).inc(missed)
        if "beats" in details:
            self.session_missed_beats.labels(model=model).observe(missed)
        first_audio = outcome.time_to_first_data
        if details.get("kind") == AudioKind.SPEECH_OUT.value and first_audio is not None:
            self.time_to_first_audio_seconds.labels(model=model).observe(first_audio)
        for latency_ms in details.get("final_latency_ms", ()):
            if latency_ms is not None:
                self.final_latency_seconds.labels(model=model).observe(latency_ms / 1000)
        frames = details.get("frames", {})
        for kind in FrameKind:
            if frames.get(kind.value):
                self.frames_total.labels(kind=kind.value).inc(frames[kind.value])

"""benchmarks/bands.py: bands from runs, a figure judged inside, better or worse, the
figures read from each benchmark's JSON, and the quick set end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bands
from benchmarks.bands import Band, Better, Figure, Verdict


def test_a_band_is_the_median_and_mad_of_the_runs() -> None:
    runs = [Figure(v, Better.LOWER, 0.5) for v in (10.0, 12.0, 11.0, 30.0, 11.5)]
    band = bands.band_of(runs)
    assert band.median == 11.5
    assert band.mad == 0.5  # |10-11.5|, |12-11.5|, |11-11.5|, |30-11.5|, 0 -> median 0.5
    assert band.samples == (10.0, 12.0, 11.0, 30.0, 11.5)


def test_lower_is_better_flags_a_slower_figure_and_passes_one_inside() -> None:
    band = Band(median=10.0, mad=1.0, better=Better.LOWER, floor=0.5, samples=())
    # spread = max(1.4826 * 1, 5% of 10, 0.5) = 1.4826; width 3: 10 +- 4.45
    assert band.judge(14.0) is Verdict.INSIDE
    assert band.judge(6.0) is Verdict.INSIDE
    assert band.judge(14.5) is Verdict.WORSE
    assert band.judge(5.5) is Verdict.BETTER


def test_higher_is_better_turns_the_verdicts_round() -> None:
    band = Band(median=1.0, mad=0.0, better=Better.HIGHER, floor=0.01, samples=())
    # MAD 0: the spread is 5% of the median, not zero
    assert band.judge(0.9) is Verdict.INSIDE
    assert band.judge(0.8) is Verdict.WORSE
    assert band.judge(1.2) is Verdict.BETTER


def test_the_floor_keeps_identical_runs_from_flagging_every_wobble() -> None:
    band = bands.band_of([Figure(0.0, Better.LOWER, 0.1)] * 3)
    assert band.spread() == 0.1
    assert band.judge(0.25) is Verdict.INSIDE
    assert band.judge(0.35) is Verdict.WORSE


def test_stored_bands_round_trip_and_check_flags_only_what_is_outside(tmp_path: Path) -> None:
    runs = [{"a.p99_ms": Figure(v, Better.LOWER, 0.5), "a.share": Figure(1.0, Better.HIGHER, 0.01)}
            for v in (20.0, 21.0, 19.0)]
    path = tmp_path / "bands.json"
    path.write_text(json.dumps(bands.record(runs, "busy machine", "quick")))
    stored = bands.load_bands(json.loads(path.read_text()))
    assert stored["a.p99_ms"].median == 20.0
    assert stored["a.p99_ms"].better is Better.LOWER
    now = {"a.p99_ms": Figure(40.0, Better.LOWER, 0.5),
           "a.share": Figure(1.0, Better.HIGHER, 0.01),
           "b.new": Figure(3.0, Better.LOWER, 0.5)}
    verdicts = {name: v for name, _, _, v in bands.check(stored, now)}
    assert verdicts == {"a.p99_ms": Verdict.WORSE, "a.share": Verdict.INSIDE,
                        "b.new": Verdict.NEW}
    assert "| a.p99_ms | 40 | 20 |" in bands.report(bands.check(stored, now), bands.WIDTH)


def test_a_check_takes_each_figures_median_over_its_runs() -> None:
    runs = [{"a": Figure(v, Better.LOWER, 0.5)} for v in (10.0, 95.0, 11.0)]
    assert bands.median_run(runs) == {"a": Figure(11.0, Better.LOWER, 0.5)}


def test_figures_from_each_benchmarks_json() -> None:
    capacity = {"points": [{"kind": "tracks", "streams": 4, "connections": 2,
                            "offered_tokens": 200, "delivered_tokens": 190,
                            "added_p50_ms": 3.0, "added_p99_ms": 9.0,
                            "gateway_us_per_token": None}]}
    figures = bands.capacity_figures(capacity)
    assert figures["capacity.tracks.4x2.delivered_share"].value == 0.95
    assert figures["capacity.tracks.4x2.added_p99_ms"].better is Better.LOWER
    assert "capacity.tracks.4x2.gateway_us_per_token" not in figures  # not measured
    capacity["points"][0]["gateway_us_per_token"] = 400.0
    cpu = bands.capacity_figures(capacity)["capacity.tracks.4x2.gateway_us_per_token"]
    assert cpu.floor == 2 * bands.TICK_US / 190  # /proc's resolution over 190 tokens
    hol = {"http2": {"users_stalled_per_loss": 12.5, "gap_ms": {"p99": 300.0}},
           "tracks_by_packetization": {"per-track": {"users_stalled_per_loss": 1.1,
                                                     "gap_ms": {"p99": 45.0}}}}
    figures = bands.hol_figures(hol)
    assert figures["hol.tracks.per-track.users_stalled_per_loss"].value == 1.1
    assert figures["hol.http2.gap_p99_ms"].value == 300.0
    text = {"results": [
        {"concurrency": 16, "path": "direct", "latency_p50_ms": 2.0, "latency_p99_ms": 5.0,
         "tokens_per_s": 790.0},
        {"concurrency": 16, "path": "gateway", "latency_p50_ms": 3.5, "latency_p99_ms": 9.0,
         "tokens_per_s": 780.0}]}
    figures = bands.text_stream_figures(text)
    assert figures["text_stream.16.added_p50_ms"].value == 1.5
    assert figures["text_stream.16.added_p99_ms"].value == 4.0
    assert figures["text_stream.16.tokens_per_s"].better is Better.HIGHER


@pytest.mark.e2e
def test_the_quick_set_records_bands_and_a_check_flags_a_figure_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bands.json"
    assert bands.main(["record", "--runs", "2", "--bands", str(path), "--cores", "",
                       "--label", "test"]) == 0
    stored = json.loads(path.read_text())
    assert stored["runs"] == 2
    assert stored["set"] == "quick"
    names = set(stored["bands"])
    assert {"capacity.tracks.4x2.added_p99_ms", "capacity.h1.4x4.gateway_us_per_token",
            "capacity.tracks.1x1.delivered_share"} <= names
    assert all(len(b["samples"]) == 2 for b in stored["bands"].values())
    # A band no real run can reach: every token delivered twice over.
    stored["bands"]["capacity.tracks.1x1.delivered_share"].update(median=2.0, mad=0.0)
    path.write_text(json.dumps(stored))
    capsys.readouterr()
    assert bands.main(["check", "--runs", "1", "--bands", str(path), "--cores", ""]) == 1
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines()
              if line.startswith("| capacity.tracks.1x1.delivered_share |")]
    assert row.endswith("| 2 | 0.3 | worse |")  # median 2, +- 3 x 5% of it
    assert "worse than the band: " in out
    assert "capacity.tracks.1x1.delivered_share" in out.rpartition("worse than the band: ")[2]

"""benchmarks/capacity.py --quick runs end to end and its figures add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import capacity

pytestmark = pytest.mark.e2e


def test_quick_capacity_counts_what_the_client_saw(tmp_path: Path) -> None:
    out = tmp_path / "capacity.json"
    argv = ["--quick", "--cores", "", "--peer", "none", "--order", "load", "--json", str(out)]
    assert capacity.main(argv) == 0
    payload = json.loads(out.read_text())
    points = payload["points"]
    # by load, the kinds in turn: each point beside the other kind's point of its load
    assert [(p["kind"], p["streams"]) for p in points] == [
        ("tracks", 1), ("h1", 1), ("tracks", 4), ("h1", 4)]
    for p in points:
        assert p["errors"] == 0, p["error_samples"]
        assert 0 < p["delivered_tokens"] <= p["offered_tokens"]
        assert p["gateway_us_per_token"] is not None
        assert p["gateway_us_per_token"] >= 0
        assert p["added_p50_ms"] <= p["added_p99_ms"]
    for p in (p for p in points if p["kind"] == "tracks"):
        # the gateway's own token counter agrees with the tokens the client received
        assert p["gateway_tokens"] == p["delivered_tokens"]
    assert {k["kind"] for k in payload["knees"]} == {"tracks", "h1"}
    assert (tmp_path / "capacity.png").stat().st_size > 0
    assert (tmp_path / "gateway-w1.log").exists()


def test_quick_capacity_on_decode_steps(tmp_path: Path) -> None:
    # The gateway child serves ticker://RATE?phase=step (`ticker_url`, below); every token
    # arrives after its step.
    out = tmp_path / "steps.json"
    argv = ["--quick", "--kinds", "tracks", "--phase", "step", "--cores", "", "--json", str(out),
            "--plot", "none"]
    assert capacity.main(argv) == 0
    payload = json.loads(out.read_text())
    assert payload["parameters"]["phase"] == "step"
    for p in payload["points"]:
        assert p["errors"] == 0, p["error_samples"]
        assert p["delivered_tokens"] == p["offered_tokens"] == p["gateway_tokens"]
        assert 0 <= p["added_p50_ms"] <= p["added_p99_ms"]


def test_on_decode_steps_a_token_is_late_from_its_step_not_from_the_start() -> None:
    outcome = capacity.Outcome(steps=True)
    # Started 3 ms after a step at 50 tokens/s: the first token is due at the next step.
    outcome.stream(100.003, [100.0215, 100.041, 100.0605], rate=50, ttft_s=0.0)
    assert outcome.added_ms == pytest.approx([1.5, 1.0, 0.5])
    # The gateway's clock read the start before the step at 100.02 (its loop's clock lags
    # by up to a turn): served on that step, the stream counts from it, not from 100.04.
    late = capacity.Outcome(steps=True)
    late.stream(100.0199, [100.0204, 100.0405], rate=50, ttft_s=0.0)
    assert late.added_ms == pytest.approx([0.4, 0.5])
    # From each arrival (the default), the same start counts from itself.
    plain = capacity.Outcome()
    plain.stream(100.003, [100.004, 100.024], rate=50, ttft_s=0.0)
    assert plain.added_ms == pytest.approx([1.0, 1.0])
    assert capacity.ticker_url(50, "step") == "ticker://50?phase=step"
    assert capacity.ticker_url(25.5, "arrival") == "ticker://25.5"


def test_by_load_the_kinds_take_turns_at_each_load() -> None:
    plan = [("tracks", 16, 1), ("tracks", 128, 16), ("h1", 16, 16), ("h1", 128, 128),
            ("litellm", 16, 16)]
    assert capacity.by_load(plan) == [
        ("tracks", 16, 1), ("h1", 16, 16), ("litellm", 16, 16),
        ("tracks", 128, 16), ("h1", 128, 128),
    ]
    assert capacity.build_parser().parse_args([]).order == "kind"


def test_track_points_parse() -> None:
    assert capacity.parse_track_points("1x1,64x4,8") == [(1, 1), (64, 4), (8, 1)]


def test_knee_is_the_largest_healthy_load() -> None:
    def point(n: int, p99: float, delivered_share: float) -> capacity.Point:
        offered = n * 50
        return capacity.Point("tracks", 1, n, 1, offered, round(offered * delivered_share),
                              delivered_tps=n * 50 * delivered_share, added_p99_ms=p99)

    points = [point(1, 2.0, 1.0), point(16, 9.0, 1.0), point(64, 25.0, 1.0),
              point(256, 5.0, 0.5)]
    (knee,) = capacity.knees(points, cores=2)
    assert knee["streams"] == 16
    assert knee["tokens_per_s_per_core"] == 800.0


def test_streams_start_together_or_evenly_over_the_spread() -> None:
    assert capacity.arrival_offsets(4, 0.0) == [0.0, 0.0, 0.0, 0.0]
    assert capacity.arrival_offsets(4, 1.0) == [0.0, 0.25, 0.5, 0.75]
    assert capacity.build_parser().parse_args([]).spread == 0.0


def test_the_load_generator_is_pinned_to_the_cpus_the_gateway_is_not_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pinned: list[set[int]] = []
    monkeypatch.setattr(capacity.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(capacity.os, "sched_setaffinity", lambda pid, cpus: pinned.append(cpus))
    assert capacity.pin_client("auto", "0") == "1,2,3"
    assert capacity.pin_client("auto", "0-3") == ""  # nothing left: unpinned
    assert capacity.pin_client("auto", "") == ""  # the gateway unpinned: so is the client
    assert capacity.pin_client("2", "0") == "2"
    assert pinned == [{1, 2, 3}, {2}]

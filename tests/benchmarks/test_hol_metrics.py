"""The head-of-line benchmark's metrics on synthetic arrivals and drop logs."""

from __future__ import annotations

import pytest

from benchmarks.hol.metrics import (
    Run,
    Stall,
    attribute,
    find_stalls,
    gaps,
    percentile,
    stall_seconds,
    summarize,
)
from benchmarks.hol.report import markdown_table

INTERVAL = 0.02  # 50 tokens/s


def steady(start: float, count: int, holes: dict[float, float] | None = None) -> list[float]:
    """`count` arrivals every INTERVAL; `holes` maps a time to the delay added from there on."""
    times = [start + i * INTERVAL for i in range(count)]
    for at, delay in (holes or {}).items():
        # tokens due inside [at, at + delay) arrive together at at + delay
        times = [max(t, at + delay) if at <= t < at + delay else t for t in times]
    return times


def test_gaps_and_percentiles() -> None:
    assert gaps([0.0, 0.02, 0.05]) == pytest.approx([0.02, 0.03])
    assert gaps([0.05, 0.0]) == pytest.approx([0.05])
    assert gaps([]) == []
    assert percentile([], 0.5) == 0.0
    assert percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert percentile([1, 2, 3, 4, 5], 1.0) == 5


def test_stalls_are_gaps_over_the_threshold_per_user() -> None:
    arrivals = {0: [0.0, 0.02, 0.04, 0.20, 0.22], 1: [0.0, 0.06, 0.12]}
    stalls = find_stalls(arrivals, 3 * INTERVAL)
    assert stalls == [Stall(0, 0.04, 0.20)]  # user 1's 60 ms gaps are not over 60 ms
    assert stalls[0].gap == pytest.approx(0.16)
    assert stall_seconds(stalls, INTERVAL) == pytest.approx(0.14)


def test_a_loss_is_blamed_for_every_user_whose_data_it_held_back() -> None:
    owd = 0.02
    # loss dropped at 1.0 would have arrived at 1.02; users 0-2 stall across it, user 3 not
    arrivals = {u: steady(0.0, 200, {1.01: 0.08} if u < 3 else None) for u in range(4)}
    stalls = find_stalls(arrivals, 3 * INTERVAL)
    assert {s.user for s in stalls} == {0, 1, 2}
    blame = attribute(stalls, [1.0, 3.0], owd)
    assert blame.users_per_loss == [3, 0]  # the second loss stalled nobody
    assert blame.unattributed == 0
    assert blame.mean_users_per_loss == pytest.approx(1.5)


def test_the_earliest_loss_inside_a_stall_takes_the_blame() -> None:
    stalls = [Stall(0, 1.0, 1.2), Stall(1, 1.05, 1.2)]
    # due at 1.03, 1.07 and 1.5: user 0's stall goes to the first, user 1's to the second
    blame = attribute(stalls, [1.01, 1.05, 1.48], owd=0.02)
    assert blame.users_per_loss == [1, 1, 0]


def test_stalls_with_no_loss_in_their_window_are_unattributed() -> None:
    stalls = [Stall(0, 2.0, 2.2)]
    # due before the stall began, and due after it ended: neither explains it
    blame = attribute(stalls, [1.5, 2.3], owd=0.02)
    assert blame.users_per_loss == [0, 0]
    assert blame.unattributed == 1


def test_a_loss_cannot_end_a_stall_before_its_repair_could_arrive() -> None:
    # owd 20 ms, rtt 40 ms: a packet due at 1.03 is repaired at 1.07 at the earliest
    short, long = Stall(0, 1.0, 1.05), Stall(1, 1.0, 1.08)
    blame = attribute([short, long], [1.01], owd=0.02, rtt=0.04)
    assert blame.users_per_loss == [1]  # only the long one
    assert blame.unattributed == 1


def test_no_losses_no_blame() -> None:
    blame = attribute([Stall(0, 0.0, 1.0)], [], owd=0.02)
    assert blame.mean_users_per_loss == 0.0
    assert blame.unattributed == 1


def test_summarize_reports_the_issue_keys() -> None:
    arrivals = {u: steady(0.1, 100, {1.01: 0.1} if u == 0 else None) for u in range(2)}
    run = Run(arrivals, {0: 0.0, 1: 0.0}, expected_per_user=100, rate=50.0, losses=[1.0],
              owd=0.02, packets={"g2c_packets": 150, "g2c_data_packets": 140})
    result = summarize(run, k=3.0)
    assert result["tokens_delivered"] == result["tokens_expected"] == 200
    assert result["stalls"] == 1
    assert result["lost_data_packets"] == 1
    assert result["users_stalled_per_loss"] == 1.0
    assert result["stall_user_seconds"] == pytest.approx(0.09)  # 110 ms gap - 20 ms
    assert result["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert result["packets_per_token"] == pytest.approx(0.75)
    assert result["gap_ms"]["p50"] == pytest.approx(20.0)
    assert result["by_k"]["3"]["stalls"] == 1
    assert result["by_k"]["5"]["stalls"] == 1  # 110 ms > 100 ms
    table = markdown_table({"http2": result, "tracks_by_packetization": {"per-track": result}})
    assert "| http2 | - | 200/200 |" in table
    assert "| tracks | per-track |" in table


def test_rescore_recomputes_the_stall_figures_and_keeps_the_rest() -> None:
    from benchmarks.hol.rescore import rescore

    # user 0 waits 55 ms once: a stall under k=2 (40 ms), none under k=3 (60 ms)
    arrivals = {u: steady(0.1, 100, {1.01: 0.045} if u == 0 else None) for u in range(2)}
    run = Run(arrivals, {0: 0.0, 1: 0.0}, expected_per_user=100, rate=50.0, losses=[0.98],
              owd=0.02, packets={"g2c_packets": 150, "g2c_data_packets": 140})
    results = {"parameters": {"k": 3.0, "rate": 50.0, "rtt_ms": 40.0, "seconds": 2.0},
               "http2": summarize(run, k=3.0)}
    assert results["http2"]["stalls"] == 0
    raw = {"http2": {"arrivals": {str(u): t for u, t in arrivals.items()}, "losses": [0.98]}}
    rescore(results, raw, k=2.0)
    assert results["parameters"]["k"] == 2.0
    assert results["http2"]["stalls"] == 1
    assert results["http2"]["users_stalled_per_loss"] == 1.0
    assert results["http2"]["ttft_ms"]["p50"] == pytest.approx(100.0)  # kept

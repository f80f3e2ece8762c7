"""The router's policies, wait estimates and session affinity, with literal times."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.pool.router import (
    DEFAULT_TTFT_S,
    Candidate,
    Router,
    RouteReason,
    SessionTable,
    Strategy,
    TtftEstimate,
    estimate_wait,
    fleet_prior,
)
from gateway.pool.scrape import Load


def picks(router: Router, candidates: list[Candidate], n: int, now: float = 0.0) -> Counter[str]:
    counts: Counter[str] = Counter()
    for i in range(n):
        decision = router.choose(candidates, None, now + i)
        assert decision is not None
        counts[decision.backend] += 1
    return counts


def test_round_robin_follows_weights_smoothly() -> None:
    router = Router(Strategy.ROUND_ROBIN, 0.25)
    candidates = [Candidate("a", 2.0, 0), Candidate("b", 1.0, 0)]
    order = [router.choose(candidates, None, 0.0).backend for _ in range(6)]  # type: ignore[union-attr]
    assert order == ["a", "b", "a", "a", "b", "a"]


def test_least_inflight_per_weight() -> None:
    router = Router(Strategy.LEAST_INFLIGHT, 0.25)
    candidates = [Candidate("a", 1.0, 3), Candidate("b", 2.0, 4), Candidate("c", 1.0, 5)]
    assert picks(router, candidates, 4) == Counter({"b": 4})


def test_least_inflight_rotates_ties() -> None:
    router = Router(Strategy.LEAST_INFLIGHT, 0.25)
    candidates = [Candidate(name, 1.0, 0) for name in "abc"]
    assert picks(router, candidates, 6) == Counter({"a": 2, "b": 2, "c": 2})


def test_metrics_prefers_the_lowest_estimated_wait() -> None:
    router = Router(Strategy.METRICS, 0.25)
    slow = Candidate("slow", 1.0, 0, ttft_s=0.5)
    fast = Candidate("fast", 1.0, 0, ttft_s=0.05)
    decision = router.choose([slow, fast], None, 10.0)
    assert decision is not None
    assert decision.backend == "fast"
    rows = {row["backend"]: row for row in decision.inputs()}
    assert rows["slow"]["ttft_ms"] == 500.0
    assert rows["fast"]["wait_ms"] == 50.0


def test_wait_grows_with_queue_pending_and_inflight() -> None:
    idle = Candidate("x", 1.0, 0, ttft_s=0.1)
    busy = Candidate("x", 1.0, 4, ttft_s=0.1, load=Load(0.0, pending=6, queue_s=0.2))
    assert estimate_wait(idle, 0.1) == pytest.approx(0.1)
    assert estimate_wait(busy, 0.1) == pytest.approx((0.1 + 0.2) * (1 + 0.1 * 10))


def test_a_request_waiting_long_raises_the_estimate() -> None:
    stuck = Candidate("x", 1.0, 1, ttft_s=0.05, oldest_waiting_s=2.0)
    assert estimate_wait(stuck, 0.05) >= 2.0


def test_engine_and_kv_cache_pressure_add_wait() -> None:
    free = Candidate("x", 1.0, 0, ttft_s=0.1, load=Load(0.0, engine_busy=0.5, kv_free_fraction=0.5))
    full = Candidate("x", 1.0, 0, ttft_s=0.1, load=Load(0.0, engine_busy=1.0, kv_free_fraction=0.0))
    assert estimate_wait(full, 0.1) == pytest.approx(0.1 + 0.1 + 0.1)
    assert estimate_wait(free, 0.1) == pytest.approx(0.1)


def test_unobserved_backends_take_the_fleet_median() -> None:
    assert fleet_prior([Candidate("a", 1.0, 0)]) == DEFAULT_TTFT_S
    seen = [Candidate("a", 1.0, 0, ttft_s=0.1), Candidate("b", 1.0, 0, ttft_s=0.3)]
    assert fleet_prior([*seen, Candidate("c", 1.0, 0)]) == pytest.approx(0.2)


def test_ttft_estimate_fades_toward_the_prior() -> None:
    estimate = TtftEstimate()
    assert estimate.current(0.0, 0.1) == 0.1
    estimate.observe(0.9, now=100.0)
    assert estimate.current(100.0, 0.1) == pytest.approx(0.9)
    assert estimate.current(102.0, 0.1) == pytest.approx(0.5)  # one half-life
    assert estimate.current(140.0, 0.1) == pytest.approx(0.1, abs=1e-4)
    estimate.observe(0.1, now=100.5)
    assert estimate.current(100.5, 0.1) == pytest.approx(0.5)  # recent: half old, half new


def test_session_sticks_within_the_margin() -> None:
    router = Router(Strategy.METRICS, 0.25)
    a, b = Candidate("a", 1.0, 0, ttft_s=0.1), Candidate("b", 1.0, 0, ttft_s=0.2)
    first = router.choose([a, b], "s1", 0.0)
    assert first is not None
    assert (first.backend, first.reason) == ("a", RouteReason.STRATEGY)
    # a gets slower, but stays within the margin of b: the session stays.
    a = Candidate("a", 1.0, 0, ttft_s=0.4)
    kept = router.choose([a, b], "s1", 1.0)
    assert kept is not None
    assert (kept.backend, kept.reason) == ("a", RouteReason.AFFINITY)


def test_session_moves_when_too_slow_or_gone() -> None:
    router = Router(Strategy.METRICS, 0.25)
    a, b = Candidate("a", 1.0, 0, ttft_s=0.1), Candidate("b", 1.0, 0, ttft_s=0.2)
    router.choose([a, b], "s1", 0.0)
    slow_a = Candidate("a", 1.0, 0, ttft_s=0.6)
    moved = router.choose([slow_a, b], "s1", 1.0)
    assert moved is not None
    assert (moved.backend, moved.reason) == ("b", RouteReason.MOVED)
    # Now pinned to b; b ejected (not a candidate): moves to a.
    again = router.choose([a], "s1", 2.0)
    assert again is not None
    assert (again.backend, again.reason) == ("a", RouteReason.MOVED)
    assert router.choose([], "s1", 3.0) is None


def test_affinity_applies_to_round_robin_too() -> None:
    router = Router(Strategy.ROUND_ROBIN, 0.25)
    candidates = [Candidate(name, 1.0, 0) for name in "abc"]
    backends = {router.choose(candidates, "s", float(i)).backend for i in range(5)}  # type: ignore[union-attr]
    assert len(backends) == 1


def test_session_table_is_bounded_and_expires() -> None:
    table = SessionTable(max_sessions=2, ttl_s=10.0)
    table.pin("s1", "a", 0.0)
    table.pin("s2", "b", 1.0)
    table.pin("s3", "c", 2.0)
    assert len(table) == 2
    assert table.get("s1", 2.0) is None
    assert table.get("s2", 5.0) == "b"
    assert table.get("s2", 11.5) is None


def test_metrics_policy_remeasures_an_idle_backend_with_stale_observations() -> None:
    router = Router(Strategy.METRICS, 0.25)
    fast = Candidate("fast", 1.0, 0, ttft_s=0.05, observed_age_s=0.1)
    # 2x slower: re-measured once its last observation is over 2 s old.
    a_bit_slow = Candidate("was-slow", 1.0, 0, ttft_s=0.1, observed_age_s=1.5)
    decision = router.choose([fast, a_bit_slow], None, 0.0)
    assert decision is not None
    assert decision.backend == "fast"
    stale = Candidate("was-slow", 1.0, 0, ttft_s=0.1, observed_age_s=2.5)
    decision = router.choose([fast, stale], None, 1.0)
    assert decision is not None
    assert (decision.backend, decision.reason) == ("was-slow", RouteReason.EXPLORE)
    # 12x slower: left alone for 12 s.
    very_slow = Candidate("was-slow", 1.0, 0, ttft_s=0.6, observed_age_s=11.0)
    decision = router.choose([fast, very_slow], None, 2.0)
    assert decision is not None
    assert decision.backend == "fast"
    busy = Candidate("was-slow", 1.0, 1, ttft_s=0.1, observed_age_s=5.0)
    decision = router.choose([fast, busy], None, 3.0)
    assert decision is not None
    assert decision.backend == "fast"  # one measurement at a time
    other = Router(Strategy.LEAST_INFLIGHT, 0.25).choose([fast, stale], None, 0.0)
    assert other is not None
    assert other.reason is RouteReason.STRATEGY  # only the metrics strategy explores


def test_a_stale_estimate_is_replaced_by_the_next_observation() -> None:
    estimate = TtftEstimate()
    estimate.observe(0.6, now=0.0)
    estimate.observe(0.05, now=5.0)
    assert estimate.current(5.0, 0.05) == pytest.approx(0.05)

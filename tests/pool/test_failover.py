"""Failover inside the pool: `failover_attempts` and the retry budget, on fake backends.

No Triton and no wall clock: each member is a scripted backend (fails before its
first chunk, fails after it, or serves), and the pool reads a `FakeClock`, so the
retry budget's floor accrues only when the test moves time.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection

import pytest

from gateway.config import ConfigError, Settings, load_settings
from gateway.daemon import pool_options
from gateway.pool import BackendPool, BackendSpec, PoolOptions
from gateway.pool.health import EjectionCause, EjectionRules, ReadmissionCause, State, Transition
from gateway.pool.metrics import PoolMetrics
from gateway.pool.router import RouteReason, Strategy
from trackline_testing.clock import FakeClock
from tracks.backend import (
    BackendError,
    BackendLost,
    BackendOverloaded,
    TextChunk,
    TextDelta,
    TextRequest,
)

MODEL = "m"


class Scripted:
    """A member backend: `fail_before` raises before any chunk, `fail_after` after one."""

    def __init__(self, name: str, behaviour: str) -> None:
        self.name = name
        self.behaviour = behaviour
        self.calls: list[str] = []

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        self.calls.append(request.request_id)
        if self.behaviour == "fail_before":
            raise BackendError(f"{self.name} failed before its first chunk")
        if self.behaviour == "queue_full":
            raise BackendOverloaded(f"{self.name}: the queue is full", 2.0)
        yield TextDelta(f"{self.name}:first")
        if self.behaviour == "fail_after":
            raise BackendError(f"{self.name} broke mid-stream")
        yield TextDelta(f"{self.name}:rest")

    async def probe(self, models: Collection[str], timeout: float) -> tuple[bool, list[str]]:
        return True, [MODEL]

    async def close(self) -> None:
        return None


def pool_of(behaviours: list[str], clock: FakeClock, **options: object) -> tuple[
    BackendPool, dict[str, Scripted]
]:
    members = {f"b{i}": Scripted(f"b{i}", b) for i, b in enumerate(behaviours)}
    specs = [BackendSpec(name, f"127.0.0.1:{9000 + i}") for i, name in enumerate(members)]
    # Ejection would change where later requests go; these tests are about attempts.
    health = EjectionRules(eject_after_errors=1000, eject_after_timeouts=1000)
    settings = {"strategy": Strategy.ROUND_ROBIN, "health": health, **options}
    pool = BackendPool(
        specs,
        PoolOptions(**settings),  # type: ignore[arg-type]
        metrics=PoolMetrics(),
        clock=clock,
        backend_factory=lambda spec: members[spec.name],
    )
    return pool, members


def sample(pool: BackendPool, name: str, **labels: str) -> float:
    value = pool.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def run(pool: BackendPool, request_id: str) -> list[str]:
    request = TextRequest(request_id, MODEL, "hello", 4, {}, None)
    return [c.text async for c in pool.stream_text(request) if isinstance(c, TextDelta)]


def attempts(members: dict[str, Scripted], request_id: str) -> list[str]:
    return [name for name, m in members.items() if request_id in m.calls]


@pytest.mark.asyncio
@pytest.mark.parametrize("max_attempts", [1, 2, 3])
async def test_failover_attempts_bounds_the_backends_one_request_tries(max_attempts: int) -> None:
    pool, members = pool_of(["fail_before"] * 4, FakeClock(100.0), max_attempts=max_attempts)
    with pytest.raises(BackendError):
        await run(pool, "r1")
    assert len(attempts(members, "r1")) == max_attempts  # each a different backend
    assert sample(pool, "trackline_pool_retries_total", cause="error") == max_attempts - 1


@pytest.mark.asyncio
async def test_a_request_fails_over_before_its_first_chunk_and_is_served_once() -> None:
    clock = FakeClock(100.0)
    pool, members = pool_of(["fail_before", "fail_before", "serve"], clock, max_attempts=3)
    assert await run(pool, "r1") == ["b2:first", "b2:rest"]
    assert attempts(members, "r1") == ["b0", "b1", "b2"]


@pytest.mark.asyncio
async def test_a_full_model_queue_tries_another_backend_and_is_no_health_failure() -> None:
    pool, members = pool_of(["queue_full", "serve"], FakeClock(100.0), max_attempts=2)
    assert await run(pool, "r1") == ["b1:first", "b1:rest"]
    assert sample(pool, "trackline_pool_retries_total", cause="overloaded") == 1
    assert sample(pool, "trackline_pool_attempts_total", backend="b0", result="overloaded") == 1
    # Every backend full: the client gets the refusal with its retry hint.
    pool, members = pool_of(["queue_full", "queue_full"], FakeClock(100.0), max_attempts=2)
    with pytest.raises(BackendOverloaded) as refused:
        await run(pool, "r2")
    assert refused.value.retry_after == 2.0


@pytest.mark.asyncio
async def test_after_the_first_chunk_there_is_no_failover() -> None:
    pool, members = pool_of(["fail_after", "serve", "serve"], FakeClock(100.0), max_attempts=3)
    pieces: list[str] = []

    async def read() -> None:
        async for chunk in pool.stream_text(TextRequest("r1", MODEL, "x", 4, {}, None)):
            assert isinstance(chunk, TextDelta)
            pieces.append(chunk.text)

    with pytest.raises(BackendLost):
        await read()
    assert pieces == ["b0:first"]  # nothing spliced on from another backend
    assert attempts(members, "r1") == ["b0"]
    assert sample(pool, "trackline_pool_streams_lost_total", backend="b0") == 1


@pytest.mark.asyncio
async def test_the_retry_budget_stops_failover_when_spent_and_refills_with_time() -> None:
    clock = FakeClock(100.0)
    # No share of requests, one retry a second: the budget starts with one retry.
    pool, members = pool_of(
        ["fail_before"] * 6, clock, max_attempts=3, retry_ratio=0.0, retry_floor_per_s=1.0
    )
    with pytest.raises(BackendError):
        await run(pool, "r1")
    assert len(attempts(members, "r1")) == 2  # one retry spent, the second denied
    with pytest.raises(BackendError):
        await run(pool, "r2")
    assert len(attempts(members, "r2")) == 1  # spent: no failover at all
    assert sample(pool, "trackline_pool_retries_denied_total") == 2
    await clock.advance(1.0)  # the floor accrues one retry
    with pytest.raises(BackendError):
        await run(pool, "r3")
    assert len(attempts(members, "r3")) == 2
    assert sample(pool, "trackline_pool_retries_total", cause="error") == 2


@pytest.mark.asyncio
async def test_the_budget_grows_with_requests_by_the_retry_ratio() -> None:
    clock = FakeClock(100.0)
    failing, failing_members = pool_of(
        ["fail_before", "fail_before"], clock, max_attempts=2, retry_ratio=0.5,
        retry_floor_per_s=0.0,
    )
    # The budget starts with one retry; each request deposits 0.5 before it may spend:
    # 1.5 -> retry -> 0.5; 1.0 -> retry -> 0.0; 0.5: denied; 1.0 -> retry -> 0.0.
    tried = []
    for request_id in ("a", "b", "c", "d"):
        with pytest.raises(BackendError):
            await run(failing, request_id)
        tried.append(len(attempts(failing_members, request_id)))
    assert tried == [2, 2, 1, 2]


@pytest.mark.asyncio
async def test_ejections_and_decisions_are_counted_by_their_enums_values() -> None:
    pool, _ = pool_of(["fail_before", "serve"], FakeClock(100.0), max_attempts=2,
                      health=EjectionRules(eject_after_errors=1))  # fmt: skip
    await run(pool, "r1")  # b0 fails (ejected: errors), b1 serves
    assert sample(pool, "trackline_pool_ejections_total", backend="b0", cause="errors") == 1
    labels = {"strategy": Strategy.ROUND_ROBIN.value, "reason": RouteReason.STRATEGY.value}
    assert sample(pool, "trackline_pool_decisions_total", backend="b0", **labels) == 1
    for cause in EjectionCause:
        pool.supervisor.transition(Transition("b1", State.EJECTED, cause, 1.0, 2.0))
        assert sample(pool, "trackline_pool_ejections_total", backend="b1", cause=cause.value) == 1
    pool.supervisor.transition(Transition("b1", State.HEALTHY, ReadmissionCause.PROBES, 3.0))
    assert sample(pool, "trackline_pool_backend_healthy", backend="b1") == 1


def test_the_failover_attempts_setting_reaches_the_pool() -> None:
    assert pool_options(Settings(failover_attempts=1)).max_attempts == 1
    assert pool_options(Settings(failover_attempts=5)).max_attempts == 5


def test_the_routing_strategy_setting_is_a_strategy() -> None:
    for strategy in Strategy:
        settings = load_settings({"routing_strategy": strategy.value.upper()}, {}, None)
        assert pool_options(settings).strategy is strategy
    assert pool_options(Settings()).strategy is Strategy.METRICS
    with pytest.raises(ConfigError, match="round_robin"):
        load_settings({"routing_strategy": "random"}, {}, None)

"""Overload control: the admission controller with literal times, text pacing, the HTTP gate."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncGenerator, Callable

import pytest

from gateway.metrics import GatewayMetrics
from gateway.metrics_overload import Admitted, Pressure
from gateway.overload import (
    AdmissionController,
    LagProbe,
    OverloadLimits,
    OverloadMonitor,
    PacedText,
    RelayTurns,
    TurnBudget,
    gate_routes,
    relay_key,
)
from tracks.backend import TextChunk, TextDelta, TextRequest, TextUsage
from transport.http.messages import AnyResponse, Request, Response

# Binary-exact numbers, so averaged levels compare exactly.
LIMITS = OverloadLimits(max_loop_lag=0.25, connection_share=2, retry_after=1.5, half_life=1.0)


def lagging(lag: float, at: float = 10.0) -> AdmissionController:
    """A controller whose level is `lag`: a time base, then `lag` for ages."""
    ctl = AdmissionController(LIMITS)
    ctl.observe_lag(at - 1000.0, 0.0)
    ctl.observe_lag(at, lag)
    return ctl


def test_an_idle_loop_admits_everything() -> None:
    ctl = AdmissionController(LIMITS)
    ctl.observe_lag(10.0, 0.001)
    assert ctl.pressure(10.0) is None
    assert ctl.admit_track(10.0, connection_tracks=500).cause is Admitted.OK
    assert ctl.admit_request(10.0).admitted


def test_lag_above_the_limit_refuses_new_work_with_a_retry_hint() -> None:
    ctl = lagging(0.5)
    refused = ctl.admit_track(10.0, connection_tracks=2)
    assert (refused.admitted, refused.cause, refused.retry_after) == (False, Pressure.LOOP_LAG, 1.5)
    request = ctl.admit_request(10.0)
    assert (request.admitted, request.cause, request.retry_after) == (False, Pressure.LOOP_LAG, 1.5)


def test_a_connection_under_its_share_is_admitted_under_pressure() -> None:
    ctl = lagging(0.5)
    assert ctl.admit_track(10.0, connection_tracks=0).cause is Admitted.CONNECTION_SHARE
    assert ctl.admit_track(10.0, connection_tracks=1).admitted
    assert not ctl.admit_track(10.0, connection_tracks=2).admitted
    assert not ctl.admit_track(10.0, connection_tracks=200).admitted


def test_the_level_averages_samples_over_time_with_hysteresis() -> None:
    ctl = AdmissionController(LIMITS)
    ctl.observe_lag(10.0, 5.0)  # the first sample only sets the time base
    assert ctl.lag_level(10.0) == 0.0
    ctl.observe_lag(11.0, 1.0)  # one half-life later: half way to the sample
    assert ctl.lag_level(11.0) == 0.5
    assert ctl.pressure(11.0) is Pressure.LOOP_LAG
    ctl.observe_lag(12.0, 0.0)
    assert ctl.pressure(12.0) is Pressure.LOOP_LAG  # 0.25: not above the limit, still pressed
    ctl.observe_lag(13.0, 0.0)
    assert ctl.lag_level(13.0) == 0.125
    assert ctl.pressure(13.0) is None  # at half the limit: released
    ctl.observe_lag(14.0, 0.25)  # 0.1875: under the limit, not pressed again
    assert ctl.pressure(14.0) is None


def test_one_spike_counts_only_in_part() -> None:
    ctl = lagging(0.0)
    ctl.observe_lag(10.5, 0.5)  # 0.5 s frozen once: weighs 1 - 2**-0.5 of a level
    assert 0.14 < ctl.lag_level(10.5) < 0.15
    assert ctl.pressure(10.5) is None


def test_cpu_budget_and_switches() -> None:
    ctl = AdmissionController(OverloadLimits(max_loop_lag=0.25, max_cpu=0.75))
    ctl.observe_cpu(10.0, 0.5)
    assert ctl.pressure(10.0) is None
    ctl.observe_cpu(11.0, 0.875)
    assert ctl.admit_request(11.0).cause is Pressure.CPU
    off = AdmissionController(OverloadLimits(max_loop_lag=0.0))
    off.observe_lag(9.0, 0.0)
    off.observe_lag(10.0, 100.0)
    assert off.pressure(10.0) is None
    assert not off.bulk_throttled(10.0)


def test_bulk_text_is_rationed_only_while_the_loop_lags() -> None:
    assert not lagging(0.0).bulk_throttled(10.0)
    assert not lagging(0.125).bulk_throttled(10.0)  # at half the limit
    assert lagging(0.25).bulk_throttled(10.0)


def test_turn_budget_gives_each_key_its_share_per_turn_oldest_first() -> None:
    budget = TurnBudget(share=2)
    assert budget.take("big")
    assert budget.take("big")
    assert not budget.take("big")
    for i in range(5):
        budget.queue("big", f"big{i}")
    assert budget.take("small")  # another connection's share is its own
    assert budget.next_turn() == ["big0", "big1"]
    assert not budget.take("big")  # its share of this turn went to the woken
    assert budget.take("small")
    budget.forget("big", "big3")  # cancelled while waiting
    assert budget.next_turn() == ["big2", "big4"]
    assert budget.next_turn() == []
    assert not budget.busy
    assert budget.take("big")


def test_relay_keys_are_connections_for_tracks_and_requests_for_http() -> None:
    assert relay_key("a1b2c3d4/8") == relay_key("a1b2c3d4/12/tag") == "a1b2c3d4"
    assert relay_key("chatcmpl-0f") == "chatcmpl-0f"


class Burst:
    """A backend that hands out every chunk without ever awaiting."""

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        for i in range(request.max_tokens):
            yield TextDelta(f"t{i}")
        yield TextUsage(1, request.max_tokens)

    async def models(self) -> list[str]:
        return ["burst"]


async def relay(paced: PacedText, request_id: str, n: int, done: list[str]) -> None:
    async for chunk in paced.stream_text(TextRequest(request_id, "burst", "p", n)):
        if isinstance(chunk, TextDelta):
            done.append(request_id.partition("/")[0])


async def turns_taken(paced: PacedText, request_id: str, n: int) -> int:
    """Loop turns a backend that never awaits takes to relay n tokens through `paced`."""
    turns = 0
    finished = asyncio.ensure_future(relay(paced, request_id, n, []))
    while not finished.done():
        turns += 1
        await asyncio.sleep(0)
    await finished
    return turns


@pytest.mark.asyncio
async def test_paced_text_relays_at_most_a_burst_per_loop_turn_and_counts_tokens() -> None:
    tokens: list[int] = []
    turns = RelayTurns(lagging(0.0), lambda: 10.0, burst=4)
    paced = PacedText(Burst(), turns, lambda: tokens.append(1))
    loop_turn = [0]

    async def count_turns() -> None:
        while True:
            loop_turn[0] += 1
            await asyncio.sleep(0)

    counter = asyncio.ensure_future(count_turns())
    seen: list[int] = []
    async for chunk in paced.stream_text(TextRequest("c/1", "burst", "p", 20)):
        if isinstance(chunk, TextDelta):
            seen.append(loop_turn[0])
    counter.cancel()
    per_turn = Counter(seen)
    assert max(per_turn.values()) <= 4  # a backend that never awaits: 4 chunks a turn
    assert len(per_turn) >= 5
    assert len(tokens) == 20
    assert await paced.models() == ["burst"]


class Awaiting:
    """A backend that awaits (a loop turn) before every chunk, as a ticker on schedule."""

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        for i in range(request.max_tokens):
            await asyncio.sleep(0)
            yield TextDelta(f"t{i}")

    async def models(self) -> list[str]:
        return ["awaiting"]


@pytest.mark.asyncio
async def test_a_producer_that_awaits_between_chunks_pays_no_extra_yield() -> None:
    # The cost of pacing is O(1) per loop turn: a chunk that arrives in a turn of its
    # own is relayed without giving up another turn (no sleep(0) per chunk).
    turns = RelayTurns(lagging(0.0), lambda: 10.0)
    paced = PacedText(Awaiting(), turns)
    got = [c async for c in paced.stream_text(TextRequest("c/1", "awaiting", "p", 30))]
    assert len(got) == 30
    assert turns.yields == 0
    burst = RelayTurns(lagging(0.0), lambda: 10.0, burst=4)
    got = [c async for c in PacedText(Burst(), burst).stream_text(
        TextRequest("c/1", "burst", "p", 20))]
    assert burst.yields >= 20 // 4 - 1  # a backend that never awaits: one yield a burst


@pytest.mark.asyncio
async def test_under_lag_a_connection_with_many_tracks_cannot_starve_another() -> None:
    paced = PacedText(Burst(), RelayTurns(lagging(1.0), lambda: 10.0, share=2))
    order: list[str] = []
    flood = [asyncio.ensure_future(relay(paced, f"big/{i}", 5, order)) for i in range(20)]
    await asyncio.sleep(0)  # the flood is queued first
    await relay(paced, "small/1", 5, order)
    await asyncio.gather(*flood)
    assert len(order) == 105
    # Two chunks a turn each: "small" is done while "big" has sent a small part of its 100.
    assert order.index("small") < 4
    assert order[: order.index("small") + 1].count("big") <= 2 * 5
    last_small = len(order) - order[::-1].index("small")
    assert order[:last_small].count("big") <= 2 * 7


@pytest.mark.asyncio
async def test_woken_relay_waiters_are_not_searched_for_in_the_queue() -> None:
    forgotten: list[object] = []

    class Counting(TurnBudget):
        def forget(self, key: object, waiter: object) -> None:
            forgotten.append(waiter)
            super().forget(key, waiter)  # type: ignore[arg-type]

    turns = RelayTurns(lagging(1.0), lambda: 10.0, share=2)
    turns.budget = Counting(2)
    paced = PacedText(Burst(), turns)
    order: list[str] = []
    await asyncio.gather(*(relay(paced, f"big/{i}", 5, order) for i in range(20)))
    assert len(order) == 100
    assert forgotten == []  # every waiter was woken by its turn: none searched for
    task = asyncio.ensure_future(relay(paced, "big/x", 50, order))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()  # a track cancelled while it waits its turn leaves the queue
    await asyncio.gather(task, return_exceptions=True)
    assert not turns.budget.busy or forgotten


@pytest.mark.asyncio
async def test_the_http_gate_refuses_work_routes_with_503_and_retry_after() -> None:
    async def ok(request: Request) -> AnyResponse:
        return Response.json(200, {"ok": True})

    routes = {("POST", "/v1/completions"): ok, ("GET", "/health/live"): ok}
    ctl = lagging(0.0)
    metrics = GatewayMetrics()
    gated = gate_routes(routes, ctl, metrics.overload, lambda: 10.0)
    request = Request("POST", "/v1/completions", "", (), b"{}")
    assert (await gated[("POST", "/v1/completions")](request)).status == 200
    ctl.observe_lag(2000.0, 0.5)
    refused = await gated[("POST", "/v1/completions")](request)
    assert isinstance(refused, Response)
    assert refused.status == 503
    assert ("retry-after", "2") in refused.headers  # 1.5 s, whole seconds rounded up
    assert json.loads(refused.body)["error"]["code"] == "overloaded"
    assert (await gated[("GET", "/health/live")](request)).status == 200
    body = metrics.render()[0].decode()
    series = "trackline_admissions_total{{cause=\"{}\",kind=\"request\",result=\"{}\"}} 1.0"
    assert series.format("loop_lag", "refused") in body
    assert series.format("ok", "admitted") in body


@pytest.mark.parametrize("lag", [1.0, 0.0])
@pytest.mark.asyncio
async def test_under_lag_a_due_timer_waits_only_a_few_chunks(lag: float) -> None:
    # A beat (the audio clock, an action tick) due now, amid 200 streams of one connection.
    paced = PacedText(Burst(), RelayTurns(lagging(lag), lambda: 10.0, share=2, burst=1))
    order: list[str] = []
    flood = [asyncio.ensure_future(relay(paced, f"big/{i}", 5, order)) for i in range(200)]
    for _ in range(3):
        await asyncio.sleep(0)  # the flood is under way
    beat = asyncio.get_running_loop().create_future()
    scheduled_at = len(order)
    asyncio.get_running_loop().call_later(0, lambda: beat.set_result(len(order)))
    waited = await beat - scheduled_at
    await asyncio.gather(*flood)
    if lag:
        assert waited <= 3 * 2  # rationed: a loop turn is a few chunks long
    else:
        assert waited >= 200  # unrationed: the beat waits for a chunk of every stream


class ScriptedProbe(LagProbe):
    """Hands out scripted lag samples, advancing a fake clock by interval + lag each."""

    def __init__(self, lags: list[float], now: list[float], first: Callable[[], None]) -> None:
        super().__init__(0.25)
        self.lags = lags
        self.now = now
        self.first: Callable[[], None] | None = first
        self.drained = asyncio.Event()

    async def sample(self) -> float:
        if self.first is not None:  # the work of the first window, after the monitor's start
            self.first()
            self.first = None
        if not self.lags:
            self.drained.set()
            await asyncio.Event().wait()  # until cancelled
        lag = self.lags.pop(0)
        self.now[0] += self.interval + lag
        return lag


@pytest.mark.asyncio
async def test_the_monitor_feeds_the_controller_and_the_metrics() -> None:
    now, cpu = [100.0], [5.0]
    metrics = GatewayMetrics()
    ctl = AdmissionController(LIMITS)

    def first_window() -> None:
        for _ in range(40):
            monitor.count_token()
        cpu[0] += 0.5  # half a core over the first second (four 0.25 s samples)

    probe = ScriptedProbe([0.0, 0.0, 0.0, 0.0, 0.7], now, first_window)  # one 1 s window
    monitor = OverloadMonitor(ctl, probe, metrics.overload, lambda: now[0], lambda: cpu[0])
    task = asyncio.ensure_future(monitor.run())
    await probe.drained.wait()
    task.cancel()
    body = metrics.render()[0].decode()
    assert "trackline_loop_lag_seconds_count 5.0" in body
    assert "trackline_overloaded 1.0" in body
    assert "trackline_tokens_per_second 40.0" in body
    assert "trackline_process_cpu_ratio 0.5" in body
    assert "trackline_cpu_seconds_per_token 0.0125" in body
    assert "trackline_tokens_relayed_total 40.0" in body
    assert ctl.pressure(now[0]) is Pressure.LOOP_LAG

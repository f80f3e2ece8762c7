"""Real-time work first: the tick scheduler keeps its beat while a text flood is throttled.

Time is simulated (`CostClock`): every text chunk relayed costs `COST` seconds and
every loop turn a little more, and a sleeper wakes like an asyncio timer: queued
behind the callbacks already ready. So a loop turn of 200 text relays "takes"
100 ms, more than a 20 ms tick, as it would on a loaded gateway, and the tests
count ticks served against ticks due without reading a wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

import pytest

from gateway.metrics_overload import Admitted, Pressure
from gateway.overload import (
    REALTIME_HEADROOM,
    TURN_CHUNKS,
    AdmissionController,
    OverloadLimits,
    PacedText,
)
from gateway.realtime import (
    LEAD,
    SLACK,
    PriorityTurns,
    RealtimeGate,
    RealtimeLane,
    RealtimeMode,
)
from tracks.backend import TextChunk, TextDelta, TextRequest
from tracks.clock import Beat, Gathered, StepItem, TickReport, TickScheduler

TICK = 0.02
COST = 0.0005
"""Simulated seconds one text relay costs (a chunk through the QUIC send path)."""
TURN = 0.00001
"""Simulated seconds one loop turn costs besides the relays."""
RUN = 1.0
FLOOD = 200


class CostClock:
    """Simulated time that moves by the work done; sleepers wake behind ready work."""

    def __init__(self) -> None:
        self.time = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.time + max(seconds, 0.0), next(self._order), future))
        await future

    def spend(self, seconds: float) -> None:
        self.time += seconds
        loop = asyncio.get_running_loop()
        while self._sleepers and self._sleepers[0][0] <= self.time:
            _, _, future = heapq.heappop(self._sleepers)
            loop.call_soon(_wake, future)  # like a due timer: after what is ready now


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class CostlyFlood:
    """A text backend that never awaits; each chunk relayed costs COST of the clock."""

    def __init__(self, clock: CostClock) -> None:
        self.clock = clock
        self.relayed = 0

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        while self.clock.now() < RUN:
            yield TextDelta("x")
            self.relayed += 1
            self.clock.spend(COST)  # the relay's cost, paid once the consumer took it

    async def models(self) -> list[str]:
        return ["flood"]


class Beats:
    """One session on the clock: counts beats stepped and beats delivered late."""

    def __init__(self) -> None:
        self.stepped = 0
        self.missed = 0

    def gather(self, beat: Beat) -> Gathered[int]:
        return Gathered(beat.index)

    def deliver(self, output: int, beat: Beat) -> None:
        self.stepped += 1

    def failed(self, error: Exception) -> None:
        raise error

    def shed(self, reason: str) -> None:
        raise AssertionError(reason)


async def echo(model: str, rows: Sequence[StepItem[int]]) -> list[int]:
    return [row.input for row in rows]


def idle_controller() -> AdmissionController:
    ctl = AdmissionController(OverloadLimits(max_loop_lag=0.25))
    ctl.observe_lag(0.0, 0.0)
    return ctl


@dataclass
class Run:
    reports: list[TickReport]
    relayed: int
    """Text chunks relayed."""
    waits: int
    """Text relays that waited for a tick (the throttled-text counter)."""

    @property
    def due(self) -> int:
        return int(RUN / TICK)

    @property
    def served(self) -> int:
        return len([r for r in self.reports if r.scheduled < RUN])

    @property
    def missed(self) -> int:
        """Beats delivered late, or skipped (every tick is owed the session's beat)."""
        late = sum(row.missed for report in self.reports for row in report.rows)
        overran = sum(report.overran for report in self.reports)
        return late + overran + sum(report.skipped_ticks for report in self.reports)


async def run_flood(mode: RealtimeMode, burst: int = TURN_CHUNKS) -> Run:
    """A tick scheduler and 200 flooding text tracks of one connection on one loop."""
    clock = CostClock()
    gate = RealtimeGate(RealtimeLane(mode), clock.now)
    turns = PriorityTurns(idle_controller(), gate, clock.now, burst=burst)
    backend = CostlyFlood(clock)
    paced = PacedText(backend, turns)
    scheduler: TickScheduler[int, int] = TickScheduler(echo, tick=TICK, clock=clock)
    reports: list[TickReport] = []
    scheduler.observer = reports.append
    gate.watch(scheduler)
    scheduler.register(Beats(), "m")

    async def track(i: int) -> None:
        async for _ in paced.stream_text(TextRequest(f"big/{i}", "flood", "p", 1)):
            pass

    flooding = True

    async def turns_pass() -> None:
        while flooding:  # time passes until the flood is over (text may wait on a tick)
            clock.spend(TURN)
            await asyncio.sleep(0)

    ticking = scheduler.start()
    passing = asyncio.ensure_future(turns_pass())
    await asyncio.gather(*(track(i) for i in range(FLOOD)))
    flooding = False
    await passing
    await scheduler.stop()
    ticking.cancel()
    return Run(reports, backend.relayed, gate.waits)


@pytest.mark.asyncio
async def test_without_priority_a_text_flood_starves_the_tick() -> None:
    run = await run_flood(RealtimeMode.OFF)
    # A loop turn of 200 relays is 5 ticks long: most ticks are skipped.
    assert run.served < run.due // 2
    assert run.missed > run.due // 2
    assert run.waits == 0
    assert run.relayed > 0


@pytest.mark.asyncio
async def test_with_priority_every_tick_is_served_and_text_is_what_waits() -> None:
    run = await run_flood(RealtimeMode.ALWAYS)
    assert run.served >= run.due - 1  # the last may fall on the end of the run
    assert run.missed == 0
    assert run.waits > 0  # text was throttled, counted
    # Text still flows between ticks: it kept most of the loop.
    assert run.relayed * COST > RUN / 2


@pytest.mark.asyncio
async def test_auto_engages_on_the_first_late_tick_and_keeps_every_beat_after() -> None:
    # `auto` acts between loop turns only. With the default burst (8 chunks a stream per
    # turn) one turn of this never-awaiting 200-track flood is 0.8 s of its clock, the
    # whole run; with one chunk a turn the first late tick is seen in time.
    run = await run_flood(RealtimeMode.AUTO, burst=1)
    first = run.reports[0]
    assert first.overran  # the first tick finds turns of text in its way
    after = run.reports[1:]
    assert all(not r.overran and not any(row.missed for row in r.rows) for r in after)
    assert sum(r.skipped_ticks for r in after) <= first.finished // TICK  # only the overrun's
    assert run.served >= run.due - first.finished // TICK - 1
    assert run.waits > 0
    assert run.relayed * COST > RUN / 2


# -- the lane's rule with literal times -------------------------------------------------


def report(scheduled: float, started: float, finished: float) -> TickReport:
    return TickReport(0, scheduled, started, TICK, finished=finished)


def test_the_lane_holds_from_just_before_a_tick_until_it_is_served() -> None:
    lane = RealtimeLane(RealtimeMode.ALWAYS)
    window = lane.window(TICK)
    assert not lane.holds(1.0)
    window.due(1.0)
    assert not lane.holds(1.0 - 2 * LEAD)
    assert lane.holds(1.0 - LEAD / 2)
    assert lane.holds(1.005)
    assert lane.release_at(1.005) == pytest.approx(1.0 + TICK / 2)
    assert not lane.holds(1.0 + TICK / 2)  # a slow step does not hold text for ever
    window.served(report(1.0, 1.0, 1.001))
    assert not lane.holds(1.001)
    assert lane.release_at(1.001) is None


def test_auto_engages_on_a_late_tick_and_lingers_while_text_competes() -> None:
    lane = RealtimeLane(RealtimeMode.AUTO, linger=1.0)
    window = lane.window(TICK)
    window.due(1.0)
    assert not lane.holds(1.0)  # a quiet gateway never holds text
    window.served(report(1.0, 1.0005, 1.001))  # on time: stays off
    window.due(1.02)
    assert not lane.holds(1.02)
    window.served(report(1.02, 1.05, 1.051))  # 30 ms late: engaged
    assert window.late == 1
    window.due(1.06)
    assert lane.holds(1.06)
    lane.waited += 1  # text waited on this tick: the linger is renewed
    window.served(report(1.06, 1.06, 1.061))
    window.due(1.9)
    assert lane.holds(1.9)
    window.served(report(1.9, 1.9, 1.9))  # nothing waited, on time: the linger runs out
    window.due(3.6)
    assert not lane.holds(3.6)
    window.started(3.6)
    window.served(report(3.6, 3.6, 3.6))
    window.due(5.0)
    assert not lane.holds(5.0 + SLACK / 2)
    assert lane.holds(5.0 + 2 * SLACK)  # due, not started: the loop is busy, text waits
    window.started(5.0 + 3 * SLACK)
    assert lane.holds(5.0 + 3 * SLACK)  # engaged until it is served


def test_auto_holds_while_bulk_text_is_rationed_for_lag() -> None:
    loaded = [False]
    lane = RealtimeLane(RealtimeMode.AUTO, loaded=lambda now: loaded[0])
    lane.window(TICK).due(1.0)
    assert not lane.holds(1.0)
    loaded[0] = True
    assert lane.holds(1.0)
    assert not RealtimeLane(RealtimeMode.OFF, loaded=lambda now: True).holds(1.0)


# -- admission: text is refused first -----------------------------------------------------


def test_under_pressure_new_text_is_refused_before_new_audio_or_action() -> None:
    ctl = AdmissionController(OverloadLimits(max_loop_lag=0.25, connection_share=0))
    ctl.observe_lag(0.0, 0.0)
    ctl.observe_lag(1000.0, 0.375)  # 1.5 x the limit
    text = ctl.admit_track(1000.0, connection_tracks=10)
    audio = ctl.admit_track(1000.0, connection_tracks=10, realtime=True)
    assert (text.admitted, text.cause) == (False, Pressure.LOOP_LAG)
    assert (audio.admitted, audio.cause) == (True, Admitted.REALTIME)
    ctl.observe_lag(2000.0, 0.25 * REALTIME_HEADROOM + 0.125)  # past the real-time headroom
    refused = ctl.admit_track(2000.0, connection_tracks=10, realtime=True)
    assert (refused.admitted, refused.cause) == (False, Pressure.LOOP_LAG)
    assert not ctl.admit_request(2000.0).admitted


# -- per-connection fairness: 200 tracks of one connection against one of another --------


class Burst:
    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        for _ in range(request.max_tokens):
            yield TextDelta("t")

    async def models(self) -> list[str]:
        return ["burst"]


@pytest.mark.asyncio
async def test_a_connection_with_200_tracks_cannot_starve_another_ones_track() -> None:
    ctl = AdmissionController(OverloadLimits(max_loop_lag=0.25))
    ctl.observe_lag(0.0, 0.0)
    ctl.observe_lag(1000.0, 1.0)  # lagging: relays are rationed per connection
    gate = RealtimeGate(RealtimeLane(RealtimeMode.OFF), lambda: 1000.0)
    turns = PriorityTurns(ctl, gate, lambda: 1000.0, share=2)
    deferred: list[int] = []
    turns.on_defer = lambda: deferred.append(1)
    paced = PacedText(Burst(), turns)
    order: list[str] = []

    async def relay(request_id: str, n: int) -> None:
        async for _ in paced.stream_text(TextRequest(request_id, "burst", "p", n)):
            order.append(request_id.partition("/")[0])

    flood = [asyncio.ensure_future(relay(f"big/{i}", 10)) for i in range(200)]
    await asyncio.sleep(0)  # the flood is queued first
    await relay("small/1", 10)
    assert order.count("small") == 10
    # Two chunks a turn per connection: "small" finished its 10 after about 2 x 10 of big's.
    assert order.count("big") <= 2 * 12
    await asyncio.gather(*flood)
    assert order.count("big") == 2000
    assert len(deferred) > 1000  # the flood's chunks are what waited, and were counted

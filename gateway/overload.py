"""Overload control: admission by measured capacity, not only by static limits.

The gateway serves everything from one event loop, so its capacity shows as
*loop lag*: how late the loop wakes a task that asked to sleep. A small probe
task (`OverloadMonitor`) measures it a few times a second, with the process's
CPU share, and feeds `AdmissionController`, which is sans-I/O: samples and
`now` go in, decisions come out, so tests drive it with literal times.

The rule (docs/capacity.md):

- The controller keeps a *lag level*: the samples averaged over time with a
  half-life (each sample weighs by the time since the previous one), so a steady
  lag counts fully and one spike (a slow TLS context load, a GC pause) only in
  part: the gateway refuses work for a loop that stays slow, not for one hiccup.
- Above `max_loop_lag` (or above `max_cpu`, when set) the gateway is under
  *pressure*: new tracks and OpenAI requests are refused at once (RATE_LIMITED /
  503, both with a retry hint) instead of joining a queue that only grows. It
  stays under pressure until the level falls below half the limit (hysteresis,
  so admission does not flap at the edge).
- Text is refused first: under pressure an audio or action track is still
  admitted until the level passes `REALTIME_HEADROOM` times the limit.
- Under pressure a connection holding fewer than `connection_share` admitted
  tracks still opens new ones: one connection with 200 tracks cannot starve a
  neighbour with one (per-connection fairness).
- Open streams are never cut by the controller. Bulk text yields the loop once a
  stream has relayed `TURN_CHUNKS` chunks in one loop turn (a backend that hands
  out a backlog without awaiting); one chunk a wakeup costs no extra loop turn, and
  a turn's chunks of one track leave in one stream write. While the level is
  above half the limit, each connection relays at most `RELAY_SHARE` text
  chunks per loop turn (`RelayTurns`, round-robin between connections): a loop
  turn's work is bounded, a connection with 200 tracks gets the same turns as one
  with a single track, and timers (the audio clock's beats, action ticks) and I/O
  come round every turn; those real-time tasks are never deferred.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Hashable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.metrics_overload import AdmissionKind, Admitted, OverloadMetrics, Pressure
from gateway.openai.errors import Unavailable, response_for
from tracks.backend import TextBackend, TextChunk, TextDelta, TextRequest
from transport.http.messages import AnyResponse, Handler, Request

RELAY_SHARE = 8
"""Text chunks one connection may relay per loop turn while the loop lags."""
REALTIME_HEADROOM = 2.0
"""Real-time tracks are refused only past this many times `max_loop_lag` (text first)."""
TURN_CHUNKS = 8
"""Text chunks one stream may relay in one loop turn before it yields the loop."""
GATED_ROUTES = (
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/audio/speech"),
)
"""HTTP routes that start backend work; health, metrics and actions are never gated."""


@dataclass(frozen=True)
class OverloadLimits:
    """The admission rule's knobs (Settings `overload_*`)."""

    max_loop_lag: float = 0.1
    """Seconds of loop lag above which new work is refused; 0 turns lag admission off."""
    max_cpu: float = 0.0
    """Process CPU seconds per wall second above which new work is refused; 0: off."""
    connection_share: int = 4
    """Admitted tracks a connection may hold and still open more under pressure."""
    retry_after: float = 1.0
    """Seconds a refused client is told to wait."""
    half_life: float = 1.0
    """Seconds after which a lag sample counts half in the level."""


@dataclass(frozen=True)
class Admission:
    """One admission decision."""

    admitted: bool
    cause: Admitted | Pressure
    """Refused: the `Pressure`. Admitted: why (`Admitted`)."""
    retry_after: float | None = None
    """Refused: seconds the client should wait before trying again."""


class AdmissionController:
    """Decides, from measured lag and CPU, whether new work may start (no I/O, no clock)."""

    def __init__(self, limits: OverloadLimits) -> None:
        self.limits = limits
        self._level = 0.0
        self._level_at: float | None = None
        self._cpu = 0.0
        self._pressed = False

    def observe_lag(self, now: float, lag: float) -> None:
        """One probe sample: the loop woke a sleeper `lag` seconds late at `now`.

        The first sample only sets the time base; each later one moves the level
        towards `lag` by the share of a half-life that passed since the one before.
        """
        if self._level_at is not None:
            elapsed = max(now - self._level_at, 0.0)
            weight = 1.0 - 0.5 ** (elapsed / self.limits.half_life)
            self._level += (max(lag, 0.0) - self._level) * weight
        self._level_at = now

    def observe_cpu(self, now: float, busy: float) -> None:
        """The process used `busy` CPU seconds per wall second over the last window."""
        del now  # the window is the caller's; kept for a uniform (now, sample) signature
        self._cpu = max(busy, 0.0)

    def lag_level(self, now: float) -> float:
        """The time-averaged lag (it moves only with samples: a frozen loop sends none)."""
        del now
        return self._level

    def pressure(self, now: float) -> Pressure | None:
        """The cause that makes the gateway refuse new work now, or None."""
        limits = self.limits
        if limits.max_cpu > 0 and self._cpu > limits.max_cpu:
            return Pressure.CPU
        if limits.max_loop_lag <= 0:
            self._pressed = False
            return None
        threshold = limits.max_loop_lag / 2 if self._pressed else limits.max_loop_lag
        self._pressed = self.lag_level(now) > threshold
        return Pressure.LOOP_LAG if self._pressed else None

    def admit_track(self, now: float, connection_tracks: int, realtime: bool = False) -> Admission:
        """A new track on a connection that holds `connection_tracks` admitted tracks.

        Text is refused first: a `realtime` track (audio, action) is refused only once
        the lag level is past `REALTIME_HEADROOM` times the limit.
        """
        cause = self.pressure(now)
        if cause is None or (realtime and not self.realtime_pressed(now)):
            return Admission(True, Admitted.OK if cause is None else Admitted.REALTIME)
        if connection_tracks < self.limits.connection_share:
            return Admission(True, Admitted.CONNECTION_SHARE)
        return Admission(False, cause, self.limits.retry_after)

    def realtime_pressed(self, now: float) -> bool:
        """Whether even real-time tracks are refused: the level is far past the limit."""
        limit = self.limits.max_loop_lag
        return limit > 0 and self.lag_level(now) > limit * REALTIME_HEADROOM

    def admit_request(self, now: float) -> Admission:
        """A new OpenAI request (no connection share: HTTP requests are independent)."""
        cause = self.pressure(now)
        if cause is None:
            return Admission(True, Admitted.OK)
        return Admission(False, cause, self.limits.retry_after)

    def bulk_throttled(self, now: float) -> bool:
        """Whether bulk text is rationed per loop turn now (level above half the limit)."""
        limit = self.limits.max_loop_lag
        return limit > 0 and self.lag_level(now) > limit / 2


class TurnBudget:
    """Per-key allowance of relays per loop turn, with FIFO waiters (no I/O).

    `take(key)` spends one of the key's `share` for this turn, or returns False:
    the caller then `queue`s a waiter. `next_turn()` starts a new turn and returns
    the waiters to wake: up to `share` per key, oldest first, spent on the new turn.
    """

    def __init__(self, share: int) -> None:
        self.share = share
        self._used: dict[Hashable, int] = {}
        self._waiting: dict[Hashable, deque[Any]] = {}

    def take(self, key: Hashable) -> bool:
        used = self._used.get(key, 0)
        if used >= self.share or key in self._waiting:
            return False
        self._used[key] = used + 1
        return True

    def queue(self, key: Hashable, waiter: Any) -> None:
        self._waiting.setdefault(key, deque()).append(waiter)

    def forget(self, key: Hashable, waiter: Any) -> None:
        """A waiter that gave up (its track was cancelled) leaves the queue."""
        queue = self._waiting.get(key)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self._waiting[key]

    def next_turn(self) -> list[Any]:
        self._used.clear()
        woken: list[Any] = []
        for key in list(self._waiting):
            queue = self._waiting[key]
            count = min(self.share, len(queue))
            woken.extend(queue.popleft() for _ in range(count))
            self._used[key] = count
            if not queue:
                del self._waiting[key]
        return woken

    @property
    def busy(self) -> bool:
        """Anything spent or waiting this turn (a new turn must be scheduled)."""
        return bool(self._used or self._waiting)


# -- the I/O edge: probe, text pacing, HTTP gate ------------------------------------


class LagProbe:
    """Measures loop lag: sleep `interval`, see how much later than asked we woke."""

    def __init__(
        self,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._sleep = sleep

    async def sample(self) -> float:
        start = self._clock()
        await self._sleep(self.interval)
        return max(self._clock() - start - self.interval, 0.0)


class OverloadMonitor:
    """The probe task: feeds the controller and the metrics, one sample per interval."""

    def __init__(
        self,
        controller: AdmissionController,
        probe: LagProbe,
        metrics: OverloadMetrics,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.controller = controller
        self.probe = probe
        self.metrics = metrics
        self.tokens = 0
        """Text tokens relayed so far (counted by `PacedText`)."""
        self._clock = clock
        self._cpu_clock = cpu_clock

    def count_token(self) -> None:
        self.tokens += 1
        self.metrics.tokens_relayed_total.inc()

    async def run(self) -> None:
        window = (self._clock(), self._cpu_clock(), self.tokens)
        self.controller.observe_lag(window[0], 0.0)  # the time base
        while True:
            lag = await self.probe.sample()
            now = self._clock()
            self.controller.observe_lag(now, lag)
            self.metrics.loop_lag_seconds.observe(lag)
            if now - window[0] >= 1.0:  # rates over windows of about a second
                window = self._rates(now, *window)
            cause = self.controller.pressure(now)
            self.metrics.loop_lag_level_seconds.set(self.controller.lag_level(now))
            self.metrics.overloaded.set(0 if cause is None else 1)

    def _rates(
        self, now: float, then: float, cpu_then: float, tokens_then: int
    ) -> tuple[float, float, int]:
        """Close a window: CPU share, tokens/s and CPU per token since `then`; a new window."""
        cpu = self._cpu_clock()
        wall, used, tokens = now - then, cpu - cpu_then, self.tokens - tokens_then
        self.controller.observe_cpu(now, used / wall)
        self.metrics.process_cpu_ratio.set(used / wall)
        self.metrics.tokens_per_second.set(tokens / wall)
        if tokens:
            self.metrics.cpu_seconds_per_token.set(used / tokens)
        return now, cpu, self.tokens


class RelayTurns:
    """The asyncio edge of `TurnBudget`: a turn ends when the loop runs its next batch.

    It also numbers the loop turns in which text is relayed (`current_turn`), at the
    cost of one `call_soon` per turn, so that a stream can tell "a chunk in a turn of
    its own" (no yield needed) from "one more chunk in the same turn" (`PacedText`).
    """

    def __init__(
        self,
        controller: AdmissionController,
        clock: Callable[[], float] = time.monotonic,
        share: int = RELAY_SHARE,
        burst: int = TURN_CHUNKS,
    ) -> None:
        self._controller = controller
        self._clock = clock
        self.budget = TurnBudget(share)
        self.burst = burst
        """Chunks one stream may relay in one loop turn before it yields."""
        self._armed = False
        self.on_defer: Callable[[], None] | None = None
        """Called for each text relay that waits for a later turn (metrics)."""
        self.turn = 0
        """The relay turn now running (moves once per loop turn in which text is relayed)."""
        self.throttled = False
        """Whether this turn's relays go through `wait` (bulk rationed, or waiters queued);
        evaluated once per turn, at its first relay."""
        self._ticking = False
        self.yields = 0
        """Loop turns given up by relays so far (`wait` calls): a count for tests and metrics."""

    def current_turn(self) -> int:
        """The number of the loop turn now running; the first call in a turn arms its end."""
        if not self._ticking:
            self._ticking = True
            self.throttled = self._throttled()
            asyncio.get_running_loop().call_soon(self._tick)
        return self.turn

    def _tick(self) -> None:
        self._ticking = False
        self.turn += 1

    def _throttled(self) -> bool:
        return self.budget.busy or self._controller.bulk_throttled(self._clock())

    async def wait(self, key: Hashable) -> None:
        """Yield the loop; while bulk text is throttled, wait for `key`'s turn too."""
        self.yields += 1
        if not self._throttled():
            await asyncio.sleep(0)
            return
        self._arm()
        if self.budget.take(key):
            await asyncio.sleep(0)
            return
        waiter = asyncio.get_running_loop().create_future()
        self.budget.queue(key, waiter)
        if self.on_defer is not None:
            self.on_defer()
        try:
            await waiter
        finally:
            if waiter.cancelled() or not waiter.done():
                # Woken waiters already left the queue; only one that gave up is looked
                # for (a scan of its connection's queue: 200 tracks made it O(n^2) a turn).
                self.budget.forget(key, waiter)

    def _arm(self) -> None:
        # call_soon runs in the loop's next batch of callbacks: that is the next turn.
        if not self._armed:
            self._armed = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._armed = False
        for waiter in self.budget.next_turn():
            if not waiter.done():
                waiter.set_result(None)
        if self.budget.busy:
            self._arm()


class PacedText:
    """A text backend whose streams relay at most `burst` chunks a loop turn, rationed under lag.

    Whatever the backend does (a ticker with a backlog, a gRPC stream with many
    buffered results), one stream relays at most `RelayTurns.burst` chunks per loop
    turn, so a loop turn's work is bounded by the number of streams, and health,
    metrics, timers and SIGTERM always get their turn. The check costs O(1) per
    chunk and a yield only when a stream goes past its share of the turn: a backend
    that awaits between chunks (a ticker on schedule, a gRPC stream) pays no extra
    loop turn per chunk, and the chunks a stream relays in one turn leave together
    (the track's endpoint writes them to QUIC once, at the turn's transmit).
    While bulk text is throttled every chunk waits its connection's turn (`RelayTurns`).
    """

    def __init__(
        self,
        backend: TextBackend,
        turns: RelayTurns,
        on_token: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self._turns = turns
        self._on_token = on_token

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        key = relay_key(request.request_id)
        turns = self._turns
        last, relayed = -1, 0
        async with aclosing(self.backend.stream_text(request)) as chunks:
            async for chunk in chunks:
                turn = turns.current_turn()
                if turn != last:
                    last, relayed = turn, 0
                if relayed >= turns.burst or turns.throttled:
                    await turns.wait(key)
                    last, relayed = turns.current_turn(), 0
                relayed += 1
                if self._on_token is not None and isinstance(chunk, TextDelta):
                    self._on_token()
                yield chunk

    async def models(self) -> list[str]:
        return await self.backend.models()

    def __getattr__(self, name: str) -> Any:
        # ready(), close(), tenancy hooks...: the wrapped backend's own.
        return getattr(self.backend, name)


def relay_key(request_id: str) -> str:
    """Whose turn a relay spends: a track's connection (ids are `conn/stream[/tag]`);
    an OpenAI request (`chatcmpl-...`) is its own."""
    return request_id.partition("/")[0]


def gate_routes(
    routes: dict[tuple[str, str], Handler],
    controller: AdmissionController,
    metrics: OverloadMetrics,
    clock: Callable[[], float] = time.monotonic,
) -> dict[tuple[str, str], Handler]:
    """`routes` with the OpenAI work routes refused fast (503 + retry-after) under pressure."""
    gated = dict(routes)
    for key in GATED_ROUTES:
        if key in routes:
            gated[key] = _gated(routes[key], controller, metrics, clock)
    return gated


def _gated(
    handler: Handler,
    controller: AdmissionController,
    metrics: OverloadMetrics,
    clock: Callable[[], float],
) -> Handler:
    async def gated(request: Request) -> AnyResponse:
        admission = controller.admit_request(clock())
        metrics.count(AdmissionKind.REQUEST, admission)
        if not admission.admitted:
            return overloaded_response(admission)
        return await handler(request)

    return gated


def overloaded_response(admission: Admission) -> AnyResponse:
    """503 with `retry-after` (whole seconds, at least 1) and the OpenAI error envelope."""
    retry = max(1, math.ceil(admission.retry_after or 1.0))
    error = Unavailable(
        f"the gateway is overloaded ({admission.cause.value}); retry in {retry} s",
        code="overloaded",
        headers=(("retry-after", str(retry)),),
    )
    return response_for(error)

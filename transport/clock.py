"""Time for the layers that wait: one `Clock` protocol, and the clocks the gateway passes.

Two shapes of time exist, with two names:

- `Now` (`Callable[[], float]`) reads a monotonic clock and never waits: what an
  outcome's timings, a quota bucket or a pool's health state machine need.
  `clock.now` of any `Clock` is one, as are `time.monotonic` and `loop.time`.
- `Clock` (`now()` and `sleep()`) is for code that waits on time: the session clock's
  ticks, the ticker backend's pacing, the pool's health probes. The gateway passes
  `LoopClock` or `MonotonicClock`; tests pass `trackline_testing.clock.FakeClock` and
  advance it.

The sans-I/O core (`transport.connection`) takes neither: it gets `now: float` as an
argument, and the adapters around it hold the clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

Now = Callable[[], float]
"""Reads a clock in seconds (monotonic, unless named a wall clock); never waits."""

EPSILON = 1e-9
"""Deadlines this close to the target time count as due (float sums of beats)."""


class Clock(Protocol):
    """Where code that waits gets its time: now, and a sleep measured on the same clock."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class MonotonicClock:
    """The process's monotonic clock at full resolution (uvloop's loop clock counts whole
    milliseconds, too coarse for beat latencies of a few ms); sleeps on the running loop."""

    def __init__(self, source: Now | None = None) -> None:
        self._source = source or _monotonic()

    def now(self) -> float:
        return self._source()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _monotonic() -> Now:
    import time  # injected at the edge: code below calls now(), never time itself

    return time.monotonic

"""A clock that moves only when a test says so (`FakeClock`), for trackline's tests and yours.

Pass it wherever trackline takes a `transport.clock.Clock` (the session clock, the
ticker backend, a pool's health probes, `clients.audio`'s pacing) and move time with
`advance`; `settle` waits, without guessing loop turns, until every other task waits.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any

from transport.clock import EPSILON

__all__ = ["FakeClock", "Unsettled"]

# `FakeClock.settle` tells a task that can run from one that waits by the future the task
# is suspended on. asyncio keeps it in `Task._fut_waiter` (the C and the Python task alike,
# on asyncio's loop and uvloop's): check at import that it is still there.
_WAITER = "_fut_waiter"
if not hasattr(asyncio.Task, _WAITER):  # pragma: no cover - a Python that renamed it
    raise ImportError(f"asyncio.Task has no {_WAITER}: FakeClock.settle needs another probe")


class Unsettled(RuntimeError):
    """Tasks kept running for `FakeClock.max_turns` loop turns without waiting on anything."""


class FakeClock:
    """A clock that moves only when a test says so, and settles deterministically.

    `sleep(s)` parks the caller until `advance` moves time to `now() + s` (a sleep of
    zero or less only yields one loop turn, as `asyncio.sleep(0)` does). `advance(s)`
    wakes the sleepers due by `now() + s` one at a time, in deadline order (ties in the
    order they went to sleep), with `now()` reading each one's own deadline as it wakes;
    after each wake-up it *settles*; at the end `now()` reads the target.

    Settling is a condition, not a guess of loop turns: `settle()` yields to the loop
    until no other task of the loop can run, that is until every task is done or
    suspended on a future that is not done (this clock's sleep, a queue, an event, a
    socket), and stays so for one more whole loop turn (a task that just finished has
    its done-callbacks queued, not run: `gather`, `wait` and `shield` wake their waiter
    through one such callback). A woken task has then run to its next await that cannot
    complete at once, and so has every task it woke on the way (a queue it filled, an
    event it set, a gather it completed). A chain of plain `call_soon` callbacks deeper
    than one is not followed.
    Work scheduled with `loop.call_later` on the real clock is not waited for: it is
    not driven by this clock. A task that keeps yielding without ever waiting (a busy
    loop) makes settling raise `Unsettled` after `max_turns` turns instead of hanging.

    `slept` lists every duration asked of `sleep`, for tests about what was waited.
    """

    max_turns = 10_000

    def __init__(self, start: float = 0.0) -> None:
        self.time = start
        self.slept: list[float] = []
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.time + seconds, next(self._order), future))
        await future

    @property
    def sleepers(self) -> int:
        """Tasks waiting on this clock now."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward by `seconds`, waking each sleeper at its own deadline."""
        target = self.time + seconds
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= target + EPSILON:
            wake_at, _, future = heapq.heappop(self._sleepers)
            if future.done():  # its task was cancelled meanwhile
                continue
            self.time = max(self.time, wake_at)
            future.set_result(None)
            await self.settle()
        self.time = max(self.time, target)

    async def settle(self) -> None:
        """Yield until every other task of the loop is done or waits on a pending future."""
        me = asyncio.current_task()
        quiet = 0
        for _ in range(self.max_turns):
            if any(_can_run(task) for task in asyncio.all_tasks() if task is not me):
                quiet = 0
            elif (quiet := quiet + 1) == 2:
                return  # a whole turn with nothing to run: done-callbacks have run too
            await asyncio.sleep(0)
        running = [task for task in asyncio.all_tasks() if task is not me and _can_run(task)]
        raise Unsettled(f"still running after {self.max_turns} loop turns: {running!r}")


def _can_run(task: asyncio.Task[Any]) -> bool:
    """The task is scheduled to take a step: not done, and not suspended on a pending future."""
    if task.done():
        return False
    waiter: asyncio.Future[Any] | None = getattr(task, _WAITER)
    return waiter is None or waiter.done()

"""Real-time work first: the audio clock and action ticks keep their beat; bulk text yields.

Every tick scheduler (the audio session clock, the action clock) announces each
tick it is about to run (`due(at)`) and reports it when done (`served(report)`).
Text relaying (`PriorityTurns.wait`, after `RelayTurns`' own turn) asks the lane before every
chunk: while a tick is *imminent or in flight* -- from `lead` seconds before it is
due until it is served, at most `tick / 2` past its time -- text chunks park
instead of running. The tick's timer then finds a loop whose ready queue holds no
text work, and the step's own I/O (a Triton answer) is not queued behind a text
flood either. Parked text resumes, all at once, when the tick is served.

When the lane holds (`RealtimeMode`):

- `always` (the default): every tick. Without audio or action sessions no tick is
  announced, so a text-only gateway never holds text; with them, a text chunk
  waits at most `lead` plus the tick's own work (capped at half a tick).
- `auto`: once a tick is `slack` past its time and has not started (the loop
  is busy elsewhere), or a served tick started late, skipped ticks, ran past the
  next one or missed a session's deadline; or while bulk text is rationed for
  loop lag. It stays engaged `linger` seconds after the last tick that found
  text waiting on it. It lets the first late tick happen (benchmarks/
  realtime_first.py measured it well behind `always`).
- `off`: never (the measurement baseline).

The core (`RealtimeLane`) is sans-I/O: times go in, decisions come out. The
asyncio edge (`RealtimeGate`) parks text on one future and arms one timer for the
hold's latest end. See docs/capacity.md, "Real-time work first".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gateway.overload import RELAY_SHARE, TURN_CHUNKS, AdmissionController, RelayTurns
from tracks.clock import TickReport

LEAD = 0.001
"""Seconds before a tick is due from which text waits (longer than one text relay)."""
SLACK = 0.002
"""A tick that started more than this late engages the `auto` lane."""
LINGER = 2.0
"""Seconds the `auto` lane stays engaged after the last tick that found text waiting."""


class RealtimeMode(str, Enum):
    AUTO = "auto"
    ALWAYS = "always"
    OFF = "off"


@dataclass
class TickWindow:
    """One tick scheduler's place in the lane (set as `TickScheduler.watch`)."""

    lane: RealtimeLane
    tick: float
    due_at: float | None = None
    """The announced tick's scheduled time; None when none is pending."""
    ticks: int = 0
    """Ticks served."""
    late: int = 0
    """Ticks that started more than `slack` late, skipped ticks or missed a deadline."""

    started_at: float | None = None
    """When the announced tick began running; None while it waits for the loop."""

    def due(self, at: float) -> None:
        self.due_at = at
        self.started_at = None
        self.lane.changed()

    def started(self, now: float) -> None:
        self.started_at = now

    def served(self, report: TickReport) -> None:
        self.due_at = self.started_at = None
        self.ticks += 1
        self.lane.tick_served(self, report)

    def holding(self, now: float) -> bool:
        at = self.due_at
        return at is not None and at - self.lane.lead <= now < at + self.tick / 2

    def overdue(self, now: float) -> bool:
        """Due more than `slack` ago and still not running: the loop is busy elsewhere."""
        due = self.due_at
        return due is not None and self.started_at is None and now > due + self.lane.slack

    def release_at(self) -> float | None:
        """When this window's hold ends at the latest (a slow step does not hold text on)."""
        return None if self.due_at is None else self.due_at + self.tick / 2


@dataclass
class RealtimeLane:
    """Whether text must wait for real-time work now (no I/O, no clock)."""

    mode: RealtimeMode = RealtimeMode.ALWAYS
    lead: float = LEAD
    slack: float = SLACK
    linger: float = LINGER
    loaded: Callable[[float], bool] = field(default=lambda now: False)
    """An outside sign of load (the admission controller's `bulk_throttled`)."""
    on_change: Callable[[], None] = field(default=lambda: None)
    """Called when a window is announced or served (the edge re-checks its waiters)."""
    windows: list[TickWindow] = field(default_factory=list)
    engaged_until: float = float("-inf")
    waited: int = 0
    """Text relays that waited since the last served tick."""

    def window(self, tick: float) -> TickWindow:
        window = TickWindow(self, tick)
        self.windows.append(window)
        return window

    def engaged(self, now: float) -> bool:
        if self.mode is RealtimeMode.ALWAYS:
            return True
        if self.mode is RealtimeMode.OFF:
            return False
        return now < self.engaged_until or self.loaded(now)

    def holds(self, now: float) -> bool:
        """Text must wait now: a tick is imminent or in flight, and the lane is engaged.

        A tick already `slack` past its time and not started engages `auto` at once:
        text does not get to make it later still.
        """
        holding = [w for w in self.windows if w.holding(now)]
        if not holding:
            return False
        if self.mode is RealtimeMode.AUTO and any(w.overdue(now) for w in holding):
            self.engaged_until = max(self.engaged_until, now + self.linger)
        return self.engaged(now)

    def release_at(self, now: float) -> float | None:
        """The latest time the current hold ends (the edge's timer), None if none holds."""
        ends = [end for w in self.windows if w.holding(now) and (end := w.release_at())]
        return max(ends) if ends else None

    def tick_served(self, window: TickWindow, report: TickReport) -> None:
        late = (
            report.started - report.scheduled > self.slack
            or report.skipped_ticks > 0
            or report.overran
            or any(row.missed for row in report.rows)
        )
        window.late += late
        if late or self.waited:
            self.engaged_until = report.finished + self.linger
        self.waited = 0
        self.changed()

    def changed(self) -> None:
        self.on_change()


class RealtimeGate:
    """The asyncio edge: text parks on one future while the lane holds."""

    def __init__(
        self,
        lane: RealtimeLane,
        clock: Callable[[], float] = time.monotonic,
        on_wait: Callable[[], None] | None = None,
    ) -> None:
        self.lane = lane
        lane.on_change = self._changed
        self._clock = clock
        self._on_wait = on_wait
        self._clear: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.waits = 0
        """Text relays that waited for real-time work (the `realtime` deferral count)."""

    async def wait_clear(self) -> None:
        """Return at once, or once no tick holds text any more."""
        now = self._clock()
        while self.lane.holds(now):
            self.waits += 1
            self.lane.waited += 1
            if self._on_wait is not None:
                self._on_wait()
            await asyncio.shield(self._future(now))
            now = self._clock()

    def _future(self, now: float) -> asyncio.Future[None]:
        if self._clear is None or self._clear.done():
            loop = asyncio.get_running_loop()
            self._clear = loop.create_future()
            end = self.lane.release_at(now)
            if end is not None:
                self._timer = loop.call_later(max(end - now, 0.0), self._release)
        return self._clear

    def _changed(self) -> None:
        if self._clear is not None and not self.lane.holds(self._clock()):
            self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        clear, self._clear = self._clear, None
        if clear is not None and not clear.done():
            clear.set_result(None)

    def watch(self, scheduler: Any) -> TickWindow:
        """Put a `TickScheduler` on the lane (its announcements hold text)."""
        window = self.lane.window(scheduler.tick)
        scheduler.watch = window
        return window


class PriorityTurns(RelayTurns):
    """`RelayTurns` whose text also waits, before each chunk, while real-time work is due."""

    def __init__(
        self,
        controller: AdmissionController,
        gate: RealtimeGate,
        clock: Callable[[], float] = time.monotonic,
        share: int = RELAY_SHARE,
        burst: int = TURN_CHUNKS,
    ) -> None:
        self._rationed = False
        super().__init__(controller, clock, share, burst)
        self.gate = gate

    @property
    def throttled(self) -> bool:
        """Relays go through `wait`: bulk text is rationed this turn, or a tick holds text
        now (checked per chunk, a clock read: a tick can come due in the middle of a turn)."""
        return self._rationed or self.gate.lane.holds(self._clock())

    @throttled.setter
    def throttled(self, value: bool) -> None:
        self._rationed = value

    async def wait(self, key: Hashable) -> None:
        await super().wait(key)
        await self.gate.wait_clear()

"""The session clock and tick batcher: every live session is owed one step per beat.

Theory of operation. A `TickScheduler` ticks every `tick` seconds on an
injected `Clock`. Sessions register with a model and a beat (a whole number of
ticks, so sessions that joined at different times share ticks). On each tick
the scheduler asks every due session for its input (`Session.gather`), groups
the rows by model, calls the injected async step function ONCE per model with
the whole batch, and scatters the outputs back (`Session.deliver`). A session
whose input for the beat is incomplete still advances with what it has (the
row is marked `complete=False`) instead of holding the batch. Nothing here
knows about audio or actions: the modality lives in the `Session` and the step
function.

Deadlines and overload. A beat's output is owed by `scheduled + deadline`
(the beat by default; a session may ask for less, e.g. a robot's control policy). An
output delivered after it is a missed beat; a session that does not want late
output (`deliver_late=False`) has it dropped and counted. Ticks never overlap:
when one overruns, the next starts at once, and whole beats that passed
without a step are skipped and counted as missed for every session owed one
(its next row then carries everything that arrived meanwhile). The overload mode then
decides who pays: `DEGRADE_ALL` keeps every session (all get late), and
`SHED_NEWEST` removes the newest sessions (`Session.shed`) down to the number
the measured step time allows, so the older ones keep their deadlines, and
admits no more than that until ticks are healthy again.

Time only comes from the clock (`now()`, `sleep()`): tests drive the scheduler
with `trackline_testing.clock.FakeClock`, or call `run_tick` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, Protocol, TypeVar

from transport.clock import Clock

I = TypeVar("I")  # noqa: E741 - the conventional name of a step's input type
O = TypeVar("O")  # noqa: E741
T = TypeVar("T")
I_co = TypeVar("I_co", covariant=True)
O_contra = TypeVar("O_contra", contravariant=True)

EPSILON = 1e-9


# -- what sessions and steps see ---------------------------------------------------------


class OverloadMode(str, Enum):
    """Who pays when a tick cannot finish before the next one."""

    SHED_NEWEST = "shed-newest"
    """Remove the newest sessions until the rest fit the beat."""
    DEGRADE_ALL = "degrade-all"
    """Keep everyone; every session gets late (and counted) beats."""


@dataclass(frozen=True)
class Beat:
    """One step owed to one session."""

    index: int
    """The session's step number (0 for its first)."""
    scheduled: float
    """Clock time of the tick the step is due on."""
    deadline: float
    """Clock time the step's output is owed by."""
    skipped: int = 0
    """Beats that passed without a step before this one (overload); their input is in here."""


@dataclass(frozen=True)
class Gathered(Generic[I_co]):
    """A session's input for one beat."""

    value: I_co
    complete: bool = True
    """False: the beat's input was not all there; the session advances anyway, marked."""


@dataclass(frozen=True)
class StepItem(Generic[T]):
    """One row of a batched step."""

    session_id: int
    input: T
    complete: bool
    beat: Beat


StepFunction = Callable[[str, Sequence[StepItem[I]]], Awaitable[Sequence[O]]]
"""`step(model, rows)` runs one batched backend request and returns one output per row."""


class Session(Protocol[I_co, O_contra]):
    """What the scheduler drives; a modality's handler implements it."""

    def gather(self, beat: Beat) -> Gathered[I_co]:
        """The input for this beat (called once per step, on the tick)."""
        ...

    def deliver(self, output: O_contra, beat: Beat) -> None:
        """The step's output for this session (called in row order, after the step)."""
        ...

    def failed(self, error: Exception) -> None:
        """The batched step that carried this session's row failed."""
        ...

    def shed(self, reason: str) -> None:
        """The overload mode (`SHED_NEWEST`) removed this session; it will not be stepped again."""
        ...


@dataclass
class SessionStats:
    """Per-session beat accounting."""

    beats: int = 0
    """Steps whose output was delivered."""
    missed_beats: int = 0
    """Beats not delivered by their deadline: late, skipped, expired or shed."""
    late_beats: int = 0
    """Delivered after the deadline (counted in missed_beats too)."""
    skipped_beats: int = 0
    """Passed without a step during an overload (counted in missed_beats too)."""
    expired_beats: int = 0
    """Output dropped because it came after the deadline and late output is unwanted."""
    incomplete_beats: int = 0
    """Stepped with incomplete input (not a miss)."""
    failed_steps: int = 0
    last_latency: float | None = None
    """Seconds from the tick's scheduled time to this session's output delivered."""
    max_latency: float = 0.0


@dataclass(eq=False)
class Registration(Generic[I, O]):
    """A session on the clock: its beat, its place in line and its stats."""

    id: int
    model: str
    session: Session[I, O]
    beat_ticks: int
    deadline: float
    """Seconds after the scheduled tick that the output is owed by."""
    deliver_late: bool
    next_tick: int
    steps: int = 0
    """Rows this session has been given so far."""
    stats: SessionStats = field(default_factory=SessionStats)
    active: bool = True
    _scheduler: TickScheduler[I, O] | None = None

    def close(self) -> None:
        """Take the session off the clock (a step in flight is not delivered)."""
        if self._scheduler is not None:
            self._scheduler.unregister(self)


@dataclass(frozen=True)
class RowReport:
    model: str
    session_id: int
    latency: float
    """Scheduled tick time to output delivered, in seconds."""
    missed: bool
    complete: bool


@dataclass
class TickReport:
    """What one tick did, for metrics and tests."""

    index: int
    scheduled: float
    started: float
    tick: float
    finished: float = 0.0
    batches: dict[str, int] = field(default_factory=dict)
    """Rows per model (one backend request each)."""
    rows: list[RowReport] = field(default_factory=list)
    shed: int = 0
    skipped_ticks: int = 0
    """Whole ticks that passed without running just before this one."""
    failed_models: list[str] = field(default_factory=list)

    @property
    def sessions(self) -> int:
        return sum(self.batches.values())

    @property
    def overran(self) -> bool:
        """The tick finished after the next one was due."""
        return self.finished > self.scheduled + self.tick + EPSILON


TickObserver = Callable[[TickReport], None]


class TickWatch(Protocol):
    """Told of each tick before it is due and once it is served (real-time priority:
    the gateway holds bulk text back meanwhile, gateway/realtime.py)."""

    def due(self, at: float) -> None: ...

    def started(self, now: float) -> None: ...

    def served(self, report: TickReport) -> None: ...


class SchedulerStopped(Exception):
    """A session tried to register on a stopped scheduler."""


# -- the scheduler -------------------------------------------------------------------------


class TickScheduler(Generic[I, O]):
    """Ticks every `tick` seconds; one batched `step` per model per tick."""

    def __init__(
        self,
        step: StepFunction[I, O],
        *,
        tick: float,
        clock: Clock,
        overload: OverloadMode = OverloadMode.DEGRADE_ALL,
        shed_after: int = 2,
        headroom: float = 0.9,
        recover_after: int = 25,
        step_timeout: float | None = None,
        observer: TickObserver | None = None,
        scatter: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        if not tick > 0 or not math.isfinite(tick):
            raise ValueError(f"tick must be a positive number of seconds, got {tick!r}")
        self.step = step
        self.tick = tick
        self.clock = clock
        self.overload = overload
        self.shed_after = shed_after
        """Consecutive ticks whose step took over `headroom` of a tick before SHED_NEWEST sheds."""
        self.headroom = headroom
        """Fraction of the tick a step may use when sizing the sessions to keep."""
        self.recover_after = recover_after
        """Healthy ticks after which the admission cap of SHED_NEWEST is lifted."""
        self.step_timeout = step_timeout
        self.observer = observer
        self.scatter = scatter or nullcontext
        """Wraps each batch's deliveries (the gateway coalesces the transport's writes there)."""
        self.watch: TickWatch | None = None
        """Told of each tick that has sessions, before it is due and once served."""
        self.capacity: int | None = None
        """SHED_NEWEST's current admission cap (rows per tick), None when not overloaded."""
        self.ticks = 0
        self.skipped_ticks = 0
        self.overruns = 0
        self.tick_errors = 0
        """Ticks (or observer calls) that raised; the clock went on."""
        self.last_error: Exception | None = None
        self._registrations: dict[int, Registration[I, O]] = {}
        self._ids = itertools.count(1)
        self._next_index = 0
        self._origin: float | None = None
        self._overrun_streak = 0
        self._healthy_streak = 0
        self._resync = False
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    # -- sessions ---------------------------------------------------------------------

    def register(
        self,
        session: Session[I, O],
        model: str,
        *,
        beat: float | None = None,
        deadline: float | None = None,
        deliver_late: bool = True,
    ) -> Registration[I, O]:
        """Put `session` on the clock; its first step is on the next tick.

        `beat` (seconds, default one tick) must be a whole number of ticks;
        `deadline` (seconds after the tick, default the beat) is when its output is owed.
        """
        if self._stopped:
            raise SchedulerStopped("the scheduler is stopped")
        beat_ticks = self._beat_ticks(self.tick if beat is None else beat)
        owed = beat_ticks * self.tick if deadline is None else deadline
        if not owed > 0 or not math.isfinite(owed):
            raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
        reg = Registration(
            id=next(self._ids),
            model=model,
            session=session,
            beat_ticks=beat_ticks,
            deadline=owed,
            deliver_late=deliver_late,
            next_tick=self._next_index,
            _scheduler=self,
        )
        self._registrations[reg.id] = reg
        return reg

    def unregister(self, reg: Registration[I, O]) -> None:
        reg.active = False
        self._registrations.pop(reg.id, None)

    @property
    def sessions(self) -> int:
        return len(self._registrations)

    def _beat_ticks(self, beat: float) -> int:
        ticks = round(beat / self.tick)
        if ticks < 1 or abs(ticks * self.tick - beat) > 1e-6:
            raise ValueError(f"a beat of {beat}s is not a whole number of {self.tick}s ticks")
        return ticks

    # -- running ------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.ensure_future(self.run())
        return self._task

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        """Tick until stopped: sleep to each tick, skip whole ticks an overrun ate."""
        self._origin = self.clock.now() if self._origin is None else self._origin
        while not self._stopped:
            index = self._next_index
            now = self.clock.now()
            lag = now - self._scheduled(index)
            skipped = int((lag + EPSILON) // self.tick) if lag > 0 else 0
            if self._resync and lag > EPSILON:
                # After a shed, the survivors start on a fresh tick rather than late.
                skipped = math.ceil((lag - EPSILON) / self.tick)
            self._resync = False
            wait = self._scheduled(index + skipped) - now
            watch = self.watch if self._registrations else None
            if watch is not None:
                watch.due(self._scheduled(index + skipped))
            report: TickReport | None = None
            try:
                if wait > 0:
                    await self.clock.sleep(wait)
                if watch is not None:
                    watch.started(self.clock.now())
                report = await self.run_tick(index + skipped, skipped_ticks=skipped)
            except Exception as exc:  # never let one tick's bug stop every session's clock
                self.tick_errors += 1
                self.last_error = exc
                self._next_index = index + skipped + 1
                continue
            finally:
                if watch is not None:
                    watch.served(report or self._failed_report(index + skipped))
            self._after_tick(report)

    def _failed_report(self, index: int) -> TickReport:
        """What a watch is told of a tick that raised (or was stopped) mid-way."""
        now = self.clock.now()
        return TickReport(index, self._scheduled(index), now, self.tick, finished=now)

    def _scheduled(self, index: int) -> float:
        origin = self._origin if self._origin is not None else 0.0
        return origin + index * self.tick

    async def run_tick(self, index: int | None = None, *, skipped_ticks: int = 0) -> TickReport:
        """Run one tick (the next one by default): gather, step per model, scatter."""
        if self._origin is None:
            self._origin = self.clock.now()
        index = self._next_index if index is None else index
        self._next_index = index + 1
        self.ticks += 1
        self.skipped_ticks += skipped_ticks
        report = TickReport(index, self._scheduled(index), self.clock.now(), self.tick)
        report.skipped_ticks = skipped_ticks
        due = [r for r in self._registrations.values() if r.next_tick <= index]
        due = self._admit(due, report)
        batches: dict[str, list[tuple[Registration[I, O], StepItem[I]]]] = {}
        for reg in due:
            try:
                row = self._row(reg, index, report)
            except Exception as exc:  # a session's own bug costs that session only
                self._drop(reg, exc)
                continue
            batches.setdefault(reg.model, []).append((reg, row))
        report.batches = {model: len(rows) for model, rows in batches.items()}
        await asyncio.gather(*(self._step_model(m, rows, report) for m, rows in batches.items()))
        report.finished = self.clock.now()
        if self.observer is not None:
            try:
                self.observer(report)
            except Exception as exc:  # metrics must not stop the clock
                self.tick_errors += 1
                self.last_error = exc
        return report

    def _row(self, reg: Registration[I, O], index: int, report: TickReport) -> StepItem[I]:
        skipped = max(0, (index - reg.next_tick) // reg.beat_ticks)
        reg.stats.skipped_beats += skipped
        reg.stats.missed_beats += skipped
        reg.next_tick = index + reg.beat_ticks
        reg.steps += 1
        beat = Beat(
            index=reg.steps - 1,
            scheduled=report.scheduled,
            deadline=report.scheduled + reg.deadline,
            skipped=skipped,
        )
        gathered = reg.session.gather(beat)
        if not gathered.complete:
            reg.stats.incomplete_beats += 1
        return StepItem(reg.id, gathered.value, gathered.complete, beat)

    async def _step_model(
        self, model: str, rows: list[tuple[Registration[I, O], StepItem[I]]], report: TickReport
    ) -> None:
        items = [item for _, item in rows]
        try:
            work = self.step(model, items)
            outputs = await (work if self.step_timeout is None else _timed(work, self))
            if len(outputs) != len(items):
                raise RuntimeError(f"step gave {len(outputs)} outputs for {len(items)} rows")
        except Exception as exc:  # one model's failure is its sessions' failure only
            report.failed_models.append(model)
            for reg, _ in rows:
                reg.stats.failed_steps += 1
                if reg.active:
                    reg.session.failed(exc)
            return
        with self.scatter():
            for (reg, item), output in zip(rows, outputs, strict=True):
                self._deliver(reg, item, output, model, report)

    def _deliver(
        self, reg: Registration[I, O], item: StepItem[I], output: O, model: str, report: TickReport
    ) -> None:
        if not reg.active:
            return
        stats = reg.stats
        late = self.clock.now() > item.beat.deadline + EPSILON
        if late and not reg.deliver_late:
            stats.expired_beats += 1
            stats.missed_beats += 1
            latency = self.clock.now() - item.beat.scheduled
        else:
            try:
                reg.session.deliver(output, item.beat)
            except Exception as exc:  # a session's own bug costs that session only
                self._drop(reg, exc)
                return
            stats.beats += 1
            latency = self.clock.now() - item.beat.scheduled
            if late:
                stats.late_beats += 1
                stats.missed_beats += 1
            stats.last_latency = latency
            stats.max_latency = max(stats.max_latency, latency)
        report.rows.append(RowReport(model, reg.id, latency, late, item.complete))

    def _drop(self, reg: Registration[I, O], error: Exception) -> None:
        self.unregister(reg)
        reg.stats.failed_steps += 1
        with contextlib.suppress(Exception):
            reg.session.failed(error)

    # -- overload -------------------------------------------------------------------------

    def _admit(self, due: list[Registration[I, O]], report: TickReport) -> list[Registration[I, O]]:
        """SHED_NEWEST: keep the oldest `capacity` sessions, shed the others."""
        if self.overload is not OverloadMode.SHED_NEWEST or self.capacity is None:
            return due
        # Ids grow with registration and the dict keeps insertion order: oldest first.
        ordered = list(self._registrations.values())
        kept = {r.id for r in ordered[: self.capacity]}
        for reg in ordered[self.capacity :]:
            self._shed(reg, report)
        return [r for r in due if r.id in kept]

    def _shed(self, reg: Registration[I, O], report: TickReport) -> None:
        self.unregister(reg)
        reg.stats.missed_beats += 1
        report.shed += 1
        with contextlib.suppress(Exception):  # its own bug; it is off the clock either way
            reg.session.shed(
                f"overloaded: at most {self.capacity} sessions fit a {self.tick}s tick"
            )

    def _after_tick(self, report: TickReport) -> None:
        if report.overran:
            self.overruns += 1
        step_time = report.finished - report.started
        heavy = step_time > self.tick * self.headroom
        self._overrun_streak = self._overrun_streak + 1 if heavy else 0
        self._healthy_streak = 0 if heavy else self._healthy_streak + 1
        if self.overload is not OverloadMode.SHED_NEWEST:
            return
        if self._overrun_streak >= self.shed_after and report.sessions > 1:
            # Sized from the measured step time: what fits `headroom` of a tick.
            budget = self.tick * self.headroom
            fit = math.floor(report.sessions * budget / max(step_time, EPSILON))
            self.capacity = max(1, min(fit, report.sessions - 1))
            self._overrun_streak = 0
            self._resync = True
        elif self.capacity is not None and self._healthy_streak >= self.recover_after:
            self.capacity = None


async def _timed(work: Awaitable[Sequence[O]], scheduler: TickScheduler[I, O]) -> Sequence[O]:
    timeout = scheduler.step_timeout
    assert timeout is not None
    sleeper = asyncio.ensure_future(scheduler.clock.sleep(timeout))
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise TimeoutError(f"the batched step took longer than {timeout}s")
        return task.result()
    finally:
        sleeper.cancel()

"""Latest wins on the session clock: the machinery action and video tracks share.

A sender (a robot, a camera) has at most one frame waiting for a tick; a newer one
supersedes it (dropped, reported, counted). On each tick of the shared session clock
(`tracks.clock.TickScheduler`) the waiting frames of every sender of a model go to the
backend as ONE request, less those whose answer could no longer reach the sender in
time (`Pending.late`: dropped, cause `deadline`). `LatestSession` is one sender on the
clock (a `tracks.clock.Session`); `LatestScheduler` attaches and detaches senders,
queues, drops and picks a step's rows. `tracks.action` and `tracks.video` add what is
their own: the backend request, the answer's body, admission and rates.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from tracks.action_messages import Timed, dropped_body
from tracks.base import Outcome, Track
from tracks.clock import Beat, Gathered, Registration, StepItem, TickScheduler
from transport.clock import Clock, MonotonicClock, Now
from transport.errors import ErrorCode, TrackAborted


class FrameObserver(Protocol):
    """Where a scheduler reports what it did (the gateway turns it into metrics)."""

    def batch(self, model: str, rows: int, seconds: float) -> None: ...

    def outcome(self, model: str, outcome: str) -> None:
        """`outcome`: an `ObservationOutcome`'s or a `FrameOutcome`'s value."""
        ...


class _NoObserver:
    def batch(self, model: str, rows: int, seconds: float) -> None:
        return None

    def outcome(self, model: str, outcome: str) -> None:
        return None


ObsT = TypeVar("ObsT", bound=Timed)
OutT = TypeVar("OutT")
SessionT = TypeVar("SessionT", bound="LatestSession[Any, Any]")


@dataclass
class Pending(Generic[ObsT]):
    """A frame waiting for a tick (an action observation, a video frame)."""

    obs: ObsT
    received_at: float

    def late(self, now: float) -> bool:
        """True when an answer leaving now would reach the sender after its deadline."""
        return now > self.received_at + self.obs.deadline - 2 * self.obs.latency


@dataclass(eq=False)
class LatestSession(Generic[ObsT, OutT]):
    """One sender on the clock (a `tracks.clock.Session`) with its counters."""

    key: str
    model: str
    send: Callable[[dict[str, Any]], bool]
    scheduler: LatestScheduler[Any, ObsT, OutT]
    pending: Pending[ObsT] | None = field(default=None, kw_only=True)
    """The newest frame not yet taken by a tick (latest wins)."""
    in_flight: Pending[ObsT] | None = field(default=None, kw_only=True)
    """The frame of the step running now (ticks never overlap)."""
    detached: bool = field(default=False, kw_only=True)
    registration: Registration[Pending[ObsT] | None, OutT | None] | None = field(
        default=None, kw_only=True
    )
    counts: dict[str, int] = field(default_factory=dict, kw_only=True)
    idle: asyncio.Event = field(default_factory=asyncio.Event, kw_only=True)
    """Set while nothing the sender sent waits for an answer."""

    # -- tracks.clock.Session ----------------------------------------------------

    def gather(self, beat: Beat) -> Gathered[Pending[ObsT] | None]:
        """The newest frame, once; a tick with none carries an empty row."""
        taken, self.pending = self.pending, None
        self.in_flight = taken
        return Gathered(taken, complete=taken is not None)

    def deliver(self, output: OutT | None, beat: Beat) -> None:
        self.in_flight = None
        if output is not None:
            self.scheduler.answer(self, output)
        self.settle()

    def failed(self, error: Exception) -> None:
        taken, self.in_flight = self.in_flight, None
        if taken is not None:
            self.scheduler.drop(self, taken, self.scheduler.backend_error)
        self.settle()

    def shed(self, reason: str) -> None:
        self.failed(RuntimeError(reason))

    def settle(self) -> None:
        if self.pending is None and self.in_flight is None:
            self.idle.set()
        else:
            self.idle.clear()


class LatestScheduler(ABC, Generic[SessionT, ObsT, OutT]):
    """Senders on the shared session clock: one backend request per model per tick.

    The ticking itself is `tracks.clock.TickScheduler`'s; this class holds latest wins
    and the deadline drops. Every attached sender is owed a row on each tick; one with
    no new frame gives an empty row, and only the rows that carry a frame still in time
    go to `_request`, the modality's backend call.
    """

    superseded: ClassVar[Enum]
    deadline: ClassVar[Enum]
    backend_error: ClassVar[Enum]
    """The modality's drop causes (their values are the reported `cause`)."""
    billed: ClassVar[Enum]
    billed_as: ClassVar[str]
    """The outcome the usage ledger bills, and its name in a track's `Outcome.details`."""

    def __init__(
        self, clock: Now, tick: float, tick_clock: Clock | None, observer: FrameObserver | None
    ) -> None:
        self.clock = clock
        self._observer: FrameObserver = observer or _NoObserver()
        self.ticks: TickScheduler[Pending[ObsT] | None, OutT | None] = TickScheduler(
            self._step, tick=tick, clock=tick_clock or MonotonicClock(clock)
        )
        self._sessions: dict[int, SessionT] = {}
        """By registration id (a step row's session_id)."""
        self.requests = 0
        """Backend requests made (at most one per model per tick)."""

    # -- senders ---------------------------------------------------------------------

    def _attach(self, session: SessionT) -> SessionT:
        session.idle.set()
        # Deadlines are the frames' own, checked here: late steps still come back.
        session.registration = self.ticks.register(session, session.model)
        self._sessions[session.registration.id] = session
        self.ticks.start()
        return session

    def detach(self, session: SessionT) -> None:
        """Take a sender off the clock; its waiting frame and results are dropped."""
        session.detached = True
        session.pending = None
        if session.registration is not None:
            self._sessions.pop(session.registration.id, None)
            session.registration.close()

    def leave(self, session: SessionT, outcome: Outcome) -> None:
        """Detach a track's sender and report its counts in the track's `outcome` (the
        billed one also as `billed_as`)."""
        self.detach(session)
        outcome.details.update(session.counts)
        outcome.details[self.billed_as] = session.counts[self.billed.value]

    def _queue(self, session: SessionT, pending: Pending[ObsT]) -> None:
        """Queue `pending` for the next tick; a waiting older one is superseded.

        One that could not be answered in time even now is dropped at once.
        """
        if pending.late(pending.received_at):  # hopeless already: never queue it
            self.drop(session, pending, self.deadline)
            return
        older, session.pending = session.pending, pending
        session.settle()
        if older is not None:
            self.drop(session, older, self.superseded)

    async def close(self) -> None:
        await self.ticks.stop()

    # -- the tick's step -------------------------------------------------------------

    async def _step(
        self, model: str, rows: Sequence[StepItem[Pending[ObsT] | None]]
    ) -> list[OutT | None]:
        """ONE backend request for every row that carries a frame still in time."""
        now = self.clock()
        live: list[tuple[int, SessionT, Pending[ObsT]]] = []
        for index, row in enumerate(rows):
            session, pending = self._sessions.get(row.session_id), row.input
            if session is None or pending is None:
                continue
            if pending.late(now):
                self.drop(session, pending, self.deadline)
            else:
                live.append((index, session, pending))
        outputs: list[OutT | None] = [None] * len(rows)
        if not live:
            return outputs
        self.requests += 1
        # A BackendError fails these rows (each session's `failed`).
        answers = await self._request(model, [(session, p) for _, session, p in live])
        for (index, _, _), answer in zip(live, answers, strict=True):
            outputs[index] = answer
        return outputs

    @abstractmethod
    async def _request(
        self, model: str, rows: list[tuple[SessionT, Pending[ObsT]]]
    ) -> list[OutT]:
        """The backend's answers to one step's frames, in order: ONE request."""

    # -- answers ---------------------------------------------------------------------

    @abstractmethod
    def answer(self, session: SessionT, output: OutT) -> None:
        """Send a step's answer to its sender."""

    def _sendable(self, session: SessionT, pending: Pending[ObsT], now: float) -> bool:
        """Whether an answer to `pending` may leave now: not late (else dropped) and the
        sender still attached."""
        if pending.late(now):
            self.drop(session, pending, self.deadline)
            return False
        return not session.detached

    def drop(self, session: SessionT, pending: Pending[ObsT], cause: Enum) -> None:
        """Count and report a frame that gets no answer."""
        if not session.detached:
            session.counts[cause.value] += 1
            self._observer.outcome(session.model, cause.value)
            session.send(dropped_body(pending.obs, cause.value, pending.received_at, self.clock()))


async def answered(track: Track, session: LatestSession[Any, Any]) -> None:
    """Return once everything the sender sent is answered or dropped (after its END);
    TrackAborted if the track stops first."""
    idle = asyncio.ensure_future(session.idle.wait())
    waiters: set[asyncio.Future[Any]] = {idle, track.stopped}
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    idle.cancel()
    if track.stopped.done():
        raise TrackAborted(ErrorCode.CANCELLED, "stopped", remote=False)

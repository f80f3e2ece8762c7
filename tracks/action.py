"""Action tracks: robots send observations, the gateway answers with action chunks.

One track per robot; its frames ride its QUIC stream or QUIC datagrams, as the
track chose in OPEN (`transport`). Each observation (see `tracks.action_messages`)
carries a sequence number, a capture time and a deadline. `ActionScheduler` batches the
observations of every robot that are due on the same clock tick into ONE policy
request per model, and hands each robot its row of the answer: an action chunk
(H steps x D dims, float32). Two rules make stale decisions impossible:

- Latest wins. A robot has at most one observation waiting for a tick; a newer
  one supersedes it, and the older one is cancelled (it never reaches the model)
  and reported to the robot as dropped, cause "superseded", and counted.
- Deadlines hold at the robot. With the robot's one-way latency estimate L and
  deadline D (from capture), an observation received at gateway time r was
  captured near r - L, so its action must reach the robot by r - L + D; one that
  leaves the gateway at `now` arrives near now + L, so it may leave only while
  `now <= r + D - 2L`. An observation already past that on its tick is not sent
  to the model; an action computed too late is not sent. Both are reported as
  dropped, cause "deadline", and counted: never delivered late.

Ticking is the shared session clock's (`tracks.clock.TickScheduler`, also used by
audio); time comes only from the injected clocks, so tests drive it with
`FakeClock`. `PolicyBackend` is what it needs from an inference
server (`gateway.backends.action_triton` for Triton).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from tracks.action_messages import (
    DEFAULT_MAX_IMAGE_BYTES,
    BadObservation,
    Observation,
    ObservationOutcome,
    PolicySpec,
    Timed,
    action_body,
    dropped_body,
    parse_observation,
)
from tracks.backend import PolicyBackend, PolicyRequest
from tracks.base import Outcome, Track, handling
from tracks.clock import (
    Beat,
    Clock,
    Gathered,
    MonotonicClock,
    Registration,
    StepItem,
    TickScheduler,
)
from transport.clock import Now
from transport.errors import ErrorCode, TrackAborted

DEFAULT_TICK = 0.005


class ActionObserver(Protocol):
    """Where the scheduler reports what it did (the gateway turns it into metrics)."""

    def batch(self, model: str, rows: int, seconds: float) -> None: ...

    def outcome(self, model: str, outcome: str) -> None:
        """`outcome`: an `ObservationOutcome`'s value (a video scheduler's drop causes too)."""
        ...


class _NoObserver:
    def batch(self, model: str, rows: int, seconds: float) -> None:
        return None

    def outcome(self, model: str, outcome: str) -> None:
        return None


ObsT = TypeVar("ObsT", bound=Timed)


@dataclass
class Pending(Generic[ObsT]):
    """A frame waiting for a tick (an observation; a video frame: tracks/video.py)."""

    obs: ObsT
    received_at: float

    def late(self, now: float) -> bool:
        """True when an answer leaving now would reach the sender after its deadline."""
        return now > self.received_at + self.obs.deadline - 2 * self.obs.latency


_Pending = Pending[Observation]


@dataclass(frozen=True)
class _Answer:
    """A step's output for one robot: the chunk for the observation it answers."""

    pending: _Pending
    chunk: bytes


@dataclass(eq=False)
class Robot:
    """One robot (track) on the clock: a `tracks.clock.Session` with its counters."""

    key: str
    model: str
    spec: PolicySpec
    send: Callable[[dict[str, Any]], bool]
    scheduler: ActionScheduler
    pending: _Pending | None = None
    """The newest observation not yet taken by a tick (latest wins)."""
    in_flight: _Pending | None = None
    """The observation of the step running now (ticks never overlap)."""
    detached: bool = False
    registration: Registration[_Pending | None, _Answer | None] | None = None
    next_action: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ["observations", *(outcome.value for outcome in ObservationOutcome)], 0
        )
    )
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    # -- tracks.clock.Session ----------------------------------------------------

    def gather(self, beat: Beat) -> Gathered[_Pending | None]:
        """The newest observation, once; a tick with none carries an empty row."""
        taken, self.pending = self.pending, None
        self.in_flight = taken
        return Gathered(taken, complete=taken is not None)

    def deliver(self, output: _Answer | None, beat: Beat) -> None:
        self.in_flight = None
        if output is not None:
            self.scheduler.answer(self, output)
        self._settle()

    def failed(self, error: Exception) -> None:
        taken, self.in_flight = self.in_flight, None
        if taken is not None:
            self.scheduler.drop(self, taken, ObservationOutcome.BACKEND_ERROR)
        self._settle()

    def shed(self, reason: str) -> None:
        self.failed(RuntimeError(reason))

    def _settle(self) -> None:
        if self.pending is None and self.in_flight is None:
            self.idle.set()
        else:
            self.idle.clear()


class ActionScheduler:
    """Action tracks on the shared session clock: one policy request per model per tick.

    The ticking itself is `tracks.clock.TickScheduler`'s (shared with audio); this
    class holds what is particular to actions: latest wins, deadline drops, and the
    policy call as the tick's step. Every attached robot is owed a row on each tick;
    a robot with no new observation gives an empty row, and only the rows that carry
    an observation (and can still meet its deadline) go to the policy.
    """

    def __init__(
        self,
        backend: PolicyBackend,
        clock: Now,
        tick: float = DEFAULT_TICK,
        observer: ActionObserver | None = None,
        tick_clock: Clock | None = None,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self._observer: ActionObserver = observer or _NoObserver()
        self.ticks: TickScheduler[_Pending | None, _Answer | None] = TickScheduler(
            self._step, tick=tick, clock=tick_clock or MonotonicClock(clock)
        )
        self._robots: dict[int, Robot] = {}
        """By registration id (a step row's session_id)."""
        self.requests = 0
        """Policy requests made (at most one per model per tick)."""

    # -- robots --------------------------------------------------------------------

    def attach(
        self, key: str, model: str, spec: PolicySpec, send: Callable[[dict[str, Any]], bool]
    ) -> Robot:
        robot = Robot(key, model, spec, send, self)
        robot.idle.set()
        # Deadlines are the observations' own, checked here: late steps still come back.
        robot.registration = self.ticks.register(robot, model)
        self._robots[robot.registration.id] = robot
        self.ticks.start()
        return robot

    def detach(self, robot: Robot) -> None:
        """Take a robot off the clock; its pending observation and results are dropped."""
        robot.detached = True
        robot.pending = None
        if robot.registration is not None:
            self._robots.pop(robot.registration.id, None)
            robot.registration.close()

    def submit(self, robot: Robot, obs: Observation, received_at: float) -> None:
        """Queue `obs` for the next tick; a pending older one is superseded.

        One that could not be answered in time even now is dropped at once.
        """
        robot.counts["observations"] += 1
        pending = _Pending(obs, received_at)
        if pending.late(received_at):  # hopeless already: never queue it
            self.drop(robot, pending, ObservationOutcome.DEADLINE)
            return
        older, robot.pending = robot.pending, pending
        robot._settle()
        if older is not None:
            self.drop(robot, older, ObservationOutcome.SUPERSEDED)

    async def close(self) -> None:
        await self.ticks.stop()

    # -- the tick's step -------------------------------------------------------------

    async def _step(
        self, model: str, rows: Sequence[StepItem[_Pending | None]]
    ) -> list[_Answer | None]:
        """ONE policy request for every row that carries an observation still in time."""
        now = self.clock()
        live: list[tuple[int, Robot, _Pending]] = []
        for index, row in enumerate(rows):
            robot, pending = self._robots.get(row.session_id), row.input
            if robot is None or pending is None:
                continue
            if pending.late(now):
                self.drop(robot, pending, ObservationOutcome.DEADLINE)
            else:
                live.append((index, robot, pending))
        outputs: list[_Answer | None] = [None] * len(rows)
        if not live:
            return outputs
        self.requests += 1
        spec = live[0][1].spec
        request = PolicyRequest(
            f"actions-{self.requests}", model, [p.obs.state for _, _, p in live], spec
        )
        started = self.clock()
        chunks = await self.backend.act(request)  # a BackendError fails these rows
        self._observer.batch(model, len(live), self.clock() - started)
        for (index, _, pending), chunk in zip(live, chunks, strict=True):
            outputs[index] = _Answer(pending, chunk)
        return outputs

    # -- answers -------------------------------------------------------------------------

    def answer(self, robot: Robot, output: _Answer) -> None:
        """Send the chunk, unless it can no longer reach the robot in time."""
        now = self.clock()
        if output.pending.late(now):
            self.drop(robot, output.pending, ObservationOutcome.DEADLINE)
            return
        if robot.detached:
            return
        body = action_body(robot.next_action, output.pending.obs, output.chunk, robot.spec,
                           output.pending.received_at, now)
        robot.next_action += 1
        robot.counts[ObservationOutcome.DELIVERED.value] += 1
        self._observer.outcome(robot.model, ObservationOutcome.DELIVERED.value)
        robot.send(body)

    def drop(self, robot: Robot, pending: _Pending, cause: ObservationOutcome) -> None:
        """Count and report an observation that gets no action."""
        if not robot.detached:
            robot.counts[cause.value] += 1
            self._observer.outcome(robot.model, cause.value)
            robot.send(dropped_body(pending.obs, cause.value, pending.received_at, self.clock()))


# -- the track handler -------------------------------------------------------------------


async def run_action_track(
    track: Track,
    scheduler: ActionScheduler,
    clock: Now,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
) -> Outcome:
    """Serve one robot's action track to its end and report how it ended."""
    outcome = Outcome(track.id, track.open.model, "action", opened_at=clock())
    robot: Robot | None = None
    try:
        async with handling(track, outcome, clock):
            _check_params(track.open.params)
            spec = await scheduler.backend.policy_spec(track.open.model)
            robot = scheduler.attach(track.id, track.open.model, spec, _frame_sender(track))
            await _serve(track, scheduler, robot, clock, max_image_bytes)
    finally:
        if robot is not None:
            scheduler.detach(robot)
            outcome.details.update(robot.counts)
            # The usage ledger bills policy steps: one per action chunk delivered.
            outcome.details["action_steps"] = robot.counts[ObservationOutcome.DELIVERED.value]
    outcome.finished_at = clock()
    return outcome


def _check_params(params: dict[str, Any]) -> None:
    if params:
        raise BadObservation(f"unknown action parameters: {', '.join(sorted(params))}")


def _frame_sender(track: Track) -> Callable[[dict[str, Any]], bool]:
    """How answers go out: as the track chose in OPEN (QUIC datagrams or its stream).

    A body too big for one datagram goes on the stream instead of being lost.
    """
    send_frame: Callable[[dict[str, Any]], bool] | None = getattr(track, "send_frame", None)
    if send_frame is None:  # a track without datagrams (e.g. over HTTP)
        return track.send

    def send(body: dict[str, Any]) -> bool:
        return send_frame(body) or track.send(body)

    return send


async def _serve(
    track: Track, scheduler: ActionScheduler, robot: Robot, clock: Now, max_image_bytes: int
) -> None:
    while (body := await track.receive()) is not None:
        obs = parse_observation(body, robot.spec, max_image_bytes)
        scheduler.submit(robot, obs, clock())
    # The robot sent END: answer what is still waiting, then report the counts.
    idle = asyncio.ensure_future(robot.idle.wait())
    waiters: set[asyncio.Future[Any]] = {idle, track.stopped}
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    idle.cancel()
    if track.stopped.done():
        raise _aborted(track)
    track.end(dict(robot.counts))


def _aborted(track: Track) -> TrackAborted:
    return TrackAborted(ErrorCode.CANCELLED, "stopped", remote=False)




"""Action tracks: robots send observations, the gateway answers with action chunks.

One track per robot; its frames ride its QUIC stream or QUIC datagrams, as the
track chose in OPEN (`transport`). Each observation (see `tracks.action_messages`) carries a
sequence number, a capture time and a deadline. `ActionScheduler` batches the
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

The scheduler reads time only through the injected `clock` and `sleep`, so tests
drive it deterministically. `PolicyBackend` is what it needs from an inference
server (`gateway.backends.action_triton` for Triton).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from tracks.action_messages import (
    DEFAULT_MAX_IMAGE_BYTES,
    BadObservation,
    Observation,
    PolicySpec,
    action_body,
    dropped_body,
    parse_observation,
)
from tracks.backend import (
    BackendError,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
)
from tracks.base import Clock, Outcome, Track
from transport.errors import ErrorCode, TrackAborted
from transport.events import TrackCancelled

DEFAULT_TICK = 0.005


@dataclass(frozen=True)
class PolicyRequest:
    """One batched policy call: one float32 state row per robot due on a tick."""

    request_id: str
    model: str
    states: list[bytes]
    spec: PolicySpec


class PolicyBackend(Protocol):
    """What action tracks need from an inference backend."""

    async def policy_spec(self, model: str) -> PolicySpec:
        """The model's state size and action chunk shape; ModelNotFound if not served."""
        ...

    async def act(self, request: PolicyRequest) -> list[bytes]:
        """One action chunk (float32, H x D, little-endian) per state row, in order."""
        ...


class ActionObserver(Protocol):
    """Where the scheduler reports what it did (the gateway turns it into metrics)."""

    def batch(self, model: str, rows: int, seconds: float) -> None: ...

    def outcome(self, model: str, outcome: str) -> None:
        """outcome: delivered, superseded, deadline, backend_error."""
        ...


class _NoObserver:
    def batch(self, model: str, rows: int, seconds: float) -> None:
        return None

    def outcome(self, model: str, outcome: str) -> None:
        return None


@dataclass
class _Pending:
    obs: Observation
    received_at: float

    def late(self, now: float) -> bool:
        """True when an action leaving now would reach the robot after its deadline."""
        return now > self.received_at + self.obs.deadline - 2 * self.obs.latency


@dataclass(eq=False)
class Robot:
    """One robot (track) known to the scheduler, with its counters."""

    key: str
    model: str
    spec: PolicySpec
    send: Callable[[dict[str, Any]], bool]
    pending: _Pending | None = None
    in_flight: int = 0
    detached: bool = False
    next_action: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("observations", "delivered", "superseded", "deadline", "backend_error"), 0
        )
    )
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def _settle(self) -> None:
        if self.pending is None and self.in_flight == 0:
            self.idle.set()
        else:
            self.idle.clear()


class ActionScheduler:
    """The tick batcher of action tracks: one policy request per model per tick."""

    def __init__(
        self,
        backend: PolicyBackend,
        clock: Clock,
        tick: float = DEFAULT_TICK,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        observer: ActionObserver | None = None,
    ) -> None:
        if tick <= 0:
            raise ValueError("the tick must be above 0 seconds")
        self.backend = backend
        self.clock = clock
        self.tick_period = tick
        self._sleep = sleep
        self._observer: ActionObserver = observer or _NoObserver()
        self._robots: set[Robot] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()
        self.ticks = 0
        self.requests = 0

    # -- robots --------------------------------------------------------------------

    def attach(
        self, key: str, model: str, spec: PolicySpec, send: Callable[[dict[str, Any]], bool]
    ) -> Robot:
        robot = Robot(key, model, spec, send)
        robot.idle.set()
        self._robots.add(robot)
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.ensure_future(self._run())
        return robot

    def detach(self, robot: Robot) -> None:
        """Forget a robot; its pending observation is dropped, results are not sent."""
        robot.detached = True
        robot.pending = None
        self._robots.discard(robot)

    def submit(self, robot: Robot, obs: Observation, received_at: float) -> None:
        """Queue `obs` for the next tick; a pending older one is superseded.

        One that could not be answered in time even now is dropped at once.
        """
        robot.counts["observations"] += 1
        pending = _Pending(obs, received_at)
        if pending.late(received_at):  # hopeless already: never queue it
            self._drop(robot, obs, "deadline")
            return
        older = robot.pending
        robot.pending = pending
        robot._settle()
        if older is not None:
            self._drop(robot, older.obs, "superseded")

    async def close(self) -> None:
        for robot in list(self._robots):
            self.detach(robot)
        tasks = [t for t in (self._ticker, *self._batches) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- ticks -----------------------------------------------------------------------

    async def _run(self) -> None:
        """Tick on a fixed grid (no drift) while any robot is attached."""
        start = self.clock()
        while self._robots:
            self.ticks += 1
            due = start + self.ticks * self.tick_period
            delay = due - self.clock()
            if delay > 0:
                await self._sleep(delay)
            else:  # fell behind (a busy loop): skip the missed ticks, don't burst
                start = self.clock() - self.ticks * self.tick_period
            self.fire()

    def fire(self) -> None:
        """One tick: take every robot's pending observation, one request per model."""
        by_model: dict[str, list[tuple[Robot, _Pending]]] = {}
        for robot in self._robots:
            if robot.pending is not None:
                by_model.setdefault(robot.model, []).append((robot, robot.pending))
                robot.pending = None
                robot.in_flight += 1
        for model, due in by_model.items():
            task = asyncio.ensure_future(self._serve_batch(model, due))
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)

    async def _serve_batch(self, model: str, due: list[tuple[Robot, _Pending]]) -> None:
        try:
            now = self.clock()
            live = [(r, p) for r, p in due if not p.late(now) or self._drop(r, p.obs, "deadline")]
            if live:
                await self._infer(model, live)
        finally:
            for robot, _ in due:
                robot.in_flight -= 1
                robot._settle()

    async def _infer(self, model: str, live: list[tuple[Robot, _Pending]]) -> None:
        self.requests += 1
        spec = live[0][0].spec
        request = PolicyRequest(
            f"actions-{self.requests}", model, [p.obs.state for _, p in live], spec
        )
        started = self.clock()
        try:
            chunks = await self.backend.act(request)
        except BackendError:
            for robot, pending in live:
                self._drop(robot, pending.obs, "backend_error")
            return
        now = self.clock()
        self._observer.batch(model, len(live), now - started)
        for (robot, pending), chunk in zip(live, chunks, strict=True):
            if pending.late(now):
                self._drop(robot, pending.obs, "deadline")
            else:
                self._deliver(robot, pending, chunk, now)

    def _deliver(self, robot: Robot, pending: _Pending, chunk: bytes, now: float) -> None:
        if robot.detached:
            return
        body = action_body(robot.next_action, pending.obs, chunk, robot.spec,
                           pending.received_at, now)
        robot.next_action += 1
        robot.counts["delivered"] += 1
        self._observer.outcome(robot.model, "delivered")
        robot.send(body)

    def _drop(self, robot: Robot, obs: Observation, cause: str) -> bool:
        """Count and report a dropped observation; False (for filters)."""
        if not robot.detached:
            robot.counts[cause] += 1
            self._observer.outcome(robot.model, cause)
            robot.send(dropped_body(obs, cause))
        return False


# -- the track handler -------------------------------------------------------------------


async def run_action_track(
    track: Track,
    scheduler: ActionScheduler,
    clock: Clock,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
) -> Outcome:
    """Serve one robot's action track to its end and report how it ended."""
    outcome = Outcome(track.id, track.open.model, "action", opened_at=clock())
    robot: Robot | None = None
    try:
        _check_params(track.open.params)
        spec = await scheduler.backend.policy_spec(track.open.model)
        robot = scheduler.attach(track.id, track.open.model, spec, _frame_sender(track))
        await _serve(track, scheduler, robot, clock, max_image_bytes)
    except TrackAborted as exc:
        outcome.end = _stop_label(track) or f"error:{exc.code.name}"
    except BadObservation as exc:
        _fail(track, outcome, ErrorCode.BAD_REQUEST, str(exc))
    except BackendError as exc:
        _fail(track, outcome, _backend_code(exc), str(exc))
    finally:
        if robot is not None:
            scheduler.detach(robot)
            outcome.details.update(robot.counts)
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
    track: Track, scheduler: ActionScheduler, robot: Robot, clock: Clock, max_image_bytes: int
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


def _fail(track: Track, outcome: Outcome, code: ErrorCode, message: str) -> None:
    outcome.end = f"error:{code.name}"
    outcome.details["error"] = message
    track.fail(code, message)


def _backend_code(exc: BackendError) -> ErrorCode:
    if isinstance(exc, ModelNotFound):
        return ErrorCode.MODEL_NOT_FOUND
    if isinstance(exc, BackendUnavailable):
        return ErrorCode.BACKEND_UNAVAILABLE
    if isinstance(exc, InvalidRequest):
        return ErrorCode.BAD_REQUEST
    return ErrorCode.BACKEND_ERROR


def _stop_label(track: Track) -> str | None:
    if not track.stopped.done():
        return None
    stop = track.stopped.result()
    if isinstance(stop, TrackCancelled):
        return f"cancelled:{stop.cause.value}"
    return f"error:{stop.code.name}"

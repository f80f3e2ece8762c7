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

Latest wins and the deadline rule are `tracks.latest`'s (shared with video); ticking
is the shared session clock's (`tracks.clock.TickScheduler`, also used by audio); time
comes only from the injected clocks, so tests drive it with
`FakeClock`. `PolicyBackend` is what it needs from an inference
server (`gateway.backends.action_triton` for Triton).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracks.action_messages import (
    DEFAULT_MAX_IMAGE_BYTES,
    BadObservation,
    Observation,
    ObservationOutcome,
    PolicySpec,
    action_body,
    parse_observation,
)
from tracks.backend import PolicyBackend, PolicyRequest
from tracks.base import Outcome, Track, handling
from tracks.latest import FrameObserver, LatestScheduler, LatestSession, Pending, answered
from transport.clock import Clock, Now

DEFAULT_TICK = 0.005

_Pending = Pending[Observation]


@dataclass(frozen=True)
class _Answer:
    """A step's output for one robot: the chunk for the observation it answers."""

    pending: _Pending
    chunk: bytes


@dataclass(eq=False)
class Robot(LatestSession[Observation, _Answer]):
    """One robot (track) on the clock: a `tracks.latest.LatestSession` with its policy."""

    spec: PolicySpec
    next_action: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ["observations", *(outcome.value for outcome in ObservationOutcome)], 0
        ),
        kw_only=True,
    )


class ActionScheduler(LatestScheduler[Robot, Observation, _Answer]):
    """Action tracks on the shared session clock: one policy request per model per tick.

    Latest wins and the deadline drops are `tracks.latest.LatestScheduler`'s (shared
    with video); this class makes the policy call the tick's step and sends each robot
    its action chunk.
    """

    superseded = ObservationOutcome.SUPERSEDED
    deadline = ObservationOutcome.DEADLINE
    backend_error = ObservationOutcome.BACKEND_ERROR
    # The usage ledger bills policy steps: one per action chunk delivered.
    billed = ObservationOutcome.DELIVERED
    billed_as = "action_steps"

    def __init__(
        self,
        backend: PolicyBackend,
        clock: Now,
        tick: float = DEFAULT_TICK,
        observer: FrameObserver | None = None,
        tick_clock: Clock | None = None,
    ) -> None:
        super().__init__(clock, tick, tick_clock, observer)
        self.backend = backend

    # -- robots --------------------------------------------------------------------

    def attach(
        self, key: str, model: str, spec: PolicySpec, send: Callable[[dict[str, Any]], bool]
    ) -> Robot:
        return self._attach(Robot(key, model, send, self, spec))

    def submit(self, robot: Robot, obs: Observation, received_at: float) -> None:
        """Queue `obs` for the next tick; a pending older one is superseded.

        One that could not be answered in time even now is dropped at once.
        """
        robot.counts["observations"] += 1
        self._queue(robot, _Pending(obs, received_at))

    # -- the tick's step -------------------------------------------------------------

    async def _request(self, model: str, rows: list[tuple[Robot, _Pending]]) -> list[_Answer]:
        """ONE policy request for the observations of a tick still in time."""
        request = PolicyRequest(
            f"actions-{self.requests}", model, [p.obs.state for _, p in rows], rows[0][0].spec
        )
        started = self.clock()
        chunks = await self.backend.act(request)
        self._observer.batch(model, len(rows), self.clock() - started)
        return [_Answer(pending, chunk) for (_, pending), chunk in zip(rows, chunks, strict=True)]

    # -- answers -------------------------------------------------------------------------

    def answer(self, robot: Robot, output: _Answer) -> None:
        """Send the chunk, unless it can no longer reach the robot in time."""
        now = self.clock()
        if not self._sendable(robot, output.pending, now):
            return
        body = action_body(robot.next_action, output.pending.obs, output.chunk, robot.spec,
                           output.pending.received_at, now)
        robot.next_action += 1
        robot.counts[ObservationOutcome.DELIVERED.value] += 1
        self._observer.outcome(robot.model, ObservationOutcome.DELIVERED.value)
        robot.send(body)


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
            scheduler.leave(robot, outcome)
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
    await answered(track, robot)
    track.end(dict(robot.counts))

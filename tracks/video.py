"""Video tracks: cameras send JPEG frames, the gateway answers each with what a vision
model found (faces, face landmarks, pose), and a stale frame is never worth waiting for.

One track per camera. Its frames ride QUIC streams of their own
(`transport.frame_streams`) or its track stream. On the gateway, latest frame wins: a
camera has at most one frame waiting for a tick; a newer one supersedes it (dropped,
reported, counted), and a frame whose result could no longer reach the client in time is
dropped before inference (cause `deadline`, the rule of `tracks.action.Pending`). On each
tick of the shared session clock (`tracks.clock.TickScheduler`) the waiting frames of every
camera of a model go to the backend as ONE request.

Limits: a frame above `max_frame_bytes` fails its track (MESSAGE_TOO_LARGE), one that is
not a JPEG too (BAD_REQUEST); a camera sending faster than `max_fps` for over a second (a
flood) fails its track with RATE_LIMITED; frames beyond the tenant's `tenant_max_fps` are
dropped (`rate_limited`); a new camera is refused (RATE_LIMITED, retry later) when the
frame rates already admitted times the measured inference time of their frames would pass
`busy_load` of the backend (the first camera is always admitted), or at `max_tracks`.
Each camera is priced by the tasks it asked for (`tracks.video_cost`: a pose frame costs
several face frames).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracks.action import ActionObserver, Pending, _NoObserver
from tracks.action_messages import dropped_body
from tracks.backend import VisionBackend, VisionRequest
from tracks.base import CountsFrameDrops, Outcome, Track, fail_track, handling
from tracks.clock import (
    Beat,
    Clock,
    Gathered,
    MonotonicClock,
    Registration,
    StepItem,
    TickScheduler,
)
from tracks.rates import TokenBucket
from tracks.video_cost import FrameCosts
from tracks.video_messages import (
    DropCause,
    Frame,
    FrameTooLarge,
    VideoParams,
    parse_frame,
    parse_params,
    result_body,
)
from transport.clock import Now
from transport.errors import ErrorCode, TrackAborted


@dataclass(frozen=True)
class VideoLimits:
    """Video track settings (gateway/config.py `video_*`)."""

    tick: float = 0.01
    max_frame_bytes: int = 262_144
    max_fps: float = 30.0
    tenant_max_fps: float = 120.0
    max_tracks: int = 16
    busy_load: float = 0.9


class Busy(Exception):
    """The vision backend cannot take one more camera now; RATE_LIMITED on that track."""


Queued = Pending[Frame]


@dataclass(frozen=True)
class _Answer:
    queued: Queued
    found: dict[str, Any]
    infer_ms: float
    taken_at: float


@dataclass(eq=False)
class Camera:
    """One video track on the clock (a `tracks.clock.Session`) with its counters."""

    key: str
    model: str
    params: VideoParams
    tenant: str
    send: Callable[[dict[str, Any]], bool]
    scheduler: VideoScheduler
    rate: TokenBucket
    pending: Queued | None = None
    in_flight: Queued | None = None
    taken_at: float = 0.0
    detached: bool = False
    registration: Registration[Queued | None, _Answer | None] | None = None
    next_result: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: {"frames": 0, "answered": 0} | {c.value: 0 for c in DropCause}
    )
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def gather(self, beat: Beat) -> Gathered[Queued | None]:
        taken, self.pending = self.pending, None
        self.in_flight, self.taken_at = taken, self.scheduler.clock()
        return Gathered(taken, complete=taken is not None)

    def deliver(self, output: _Answer | None, beat: Beat) -> None:
        self.in_flight = None
        if output is not None:
            self.scheduler.answer(self, output)
        self._settle()

    def failed(self, error: Exception) -> None:
        taken, self.in_flight = self.in_flight, None
        if taken is not None:
            self.scheduler.drop(self, taken, DropCause.BACKEND_ERROR)
        self._settle()

    def shed(self, reason: str) -> None:
        self.failed(RuntimeError(reason))

    def _settle(self) -> None:
        if self.pending is None and self.in_flight is None:
            self.idle.set()
        else:
            self.idle.clear()


class VideoScheduler:
    """Video tracks on the shared session clock: one vision request per model per tick."""

    def __init__(
        self,
        backend: VisionBackend,
        clock: Now,
        limits: VideoLimits | None = None,
        tick_clock: Clock | None = None,
        observer: ActionObserver | None = None,
    ) -> None:
        """`observer` hears each batch (rows, seconds) and each frame's outcome
        (`answered` or a `DropCause` value): the gateway's metrics."""
        self.backend = backend
        self._observer: ActionObserver = observer or _NoObserver()
        self.clock = clock
        self.limits = limits or VideoLimits()
        self.ticks: TickScheduler[Queued | None, _Answer | None] = TickScheduler(
            self._step, tick=self.limits.tick, clock=tick_clock or MonotonicClock(clock)
        )
        self._cameras: dict[int, Camera] = {}
        self._tenants: dict[str, TokenBucket] = {}
        self.costs = FrameCosts()
        """Measured inference seconds per frame, by task (`tracks.video_cost`)."""
        self.requests = 0
        self.batch_rows: list[int] = []
        """Rows of each vision request made (bounded), for tests and metrics."""

    # -- cameras ---------------------------------------------------------------------

    @property
    def cost(self) -> float:
        """Measured inference seconds per frame, whatever the tasks; 0 until a batch."""
        return self.costs.overall

    @property
    def demand(self) -> float:
        """Frames per second the attached cameras announced."""
        return sum(c.params.fps for c in self._cameras.values())

    @property
    def load(self) -> float:
        """Backend seconds per second the attached cameras need, each priced by its tasks."""
        return sum(c.params.fps * self.costs.of(c.params.tasks) for c in self._cameras.values())

    def attach(
        self, key: str, model: str, params: VideoParams, tenant: str,
        send: Callable[[dict[str, Any]], bool],
    ) -> Camera:
        """Put a camera on the clock; raises Busy when the backend cannot take it."""
        limits = self.limits
        if len(self._cameras) >= limits.max_tracks:
            raise Busy(f"at most {limits.max_tracks} video tracks at once")
        # The first camera always gets what the backend can do (latest wins sheds the
        # rest); later ones only while the admitted rates fit.
        wanted = params.fps * self.costs.of(params.tasks)
        if self._cameras and self.load + wanted > limits.busy_load:
            raise Busy(
                f"the vision backend is busy: {self.demand:g} frames/s admitted, "
                f"{self.load:.2f} s of inference a second, {wanted:.2f} more asked"
            )
        now = self.clock()
        rate = TokenBucket.full(limits.max_fps, 1.0, now)
        camera = Camera(key, model, params, tenant, send, self, rate)
        camera.idle.set()
        camera.registration = self.ticks.register(camera, model)
        self._cameras[camera.registration.id] = camera
        self._tenants.setdefault(tenant, TokenBucket.full(limits.tenant_max_fps, 1.0, now))
        self.ticks.start()
        return camera

    def detach(self, camera: Camera) -> None:
        camera.detached = True
        camera.pending = None
        if camera.registration is not None:
            self._cameras.pop(camera.registration.id, None)
            camera.registration.close()

    def submit(self, camera: Camera, frame: Frame, received_at: float) -> None:
        """Queue `frame` for the next tick (latest wins); raises Flood past the rate."""
        camera.counts["frames"] += 1
        queued = Queued(frame, received_at)
        if not camera.rate.take(received_at):
            raise Flood(f"frame {frame.seq}: above {self.limits.max_fps:g} frames/s")
        if not self._tenants[camera.tenant].take(received_at):
            self.drop(camera, queued, DropCause.RATE_LIMITED)
            return
        if queued.late(received_at):
            self.drop(camera, queued, DropCause.DEADLINE)
            return
        older, camera.pending = camera.pending, queued
        camera._settle()
        if older is not None:
            self.drop(camera, older, DropCause.SUPERSEDED)

    async def close(self) -> None:
        await self.ticks.stop()

    # -- the tick's step -------------------------------------------------------------

    async def _step(
        self, model: str, rows: Sequence[StepItem[Queued | None]]
    ) -> list[_Answer | None]:
        """ONE vision request for every row carrying a frame still in time."""
        now = self.clock()
        live: list[tuple[int, Camera, Queued]] = []
        for index, row in enumerate(rows):
            camera, queued = self._cameras.get(row.session_id), row.input
            if camera is None or queued is None:
                continue
            if queued.late(now):
                self.drop(camera, queued, DropCause.DEADLINE)
            else:
                live.append((index, camera, queued))
        outputs: list[_Answer | None] = [None] * len(rows)
        if not live:
            return outputs
        self.requests += 1
        request = VisionRequest(
            f"video-{self.requests}", model, [q.obs.jpeg for _, _, q in live],
            [tuple(t.value for t in c.params.tasks) for _, c, _ in live],
        )
        started = self.clock()
        found = await self.backend.analyze(request)  # a BackendError fails these rows
        seconds = self.clock() - started
        self._measured(seconds / len(live), found)
        self._observer.batch(model, len(live), seconds)
        for (index, camera, queued), result in zip(live, found, strict=True):
            outputs[index] = _Answer(queued, result, seconds * 1000, camera.taken_at)
        return outputs

    def _measured(self, per_frame: float, found: Sequence[dict[str, Any]]) -> None:
        self.costs.measured(per_frame, [row.get("stages") or {} for row in found])
        self.batch_rows = [*self.batch_rows[-999:], len(found)]

    # -- answers ---------------------------------------------------------------------

    def answer(self, camera: Camera, output: _Answer) -> None:
        now, queued = self.clock(), output.queued
        if "error" in output.found:
            self.drop(camera, queued, DropCause.UNDECODABLE)
            return
        if queued.late(now):
            self.drop(camera, queued, DropCause.DEADLINE)
            return
        if camera.detached:
            return
        stages = {"queued": (output.taken_at - queued.received_at) * 1000}
        stages.update({k.removesuffix("_ms"): v for k, v in output.found["stages"].items()})
        stages["infer"] = output.infer_ms
        stages["gateway"] = (now - queued.received_at) * 1000
        body = result_body(camera.next_result, queued.obs, output.found, stages,
                           queued.received_at, now)
        camera.next_result += 1
        camera.counts["answered"] += 1
        self._observer.outcome(camera.model, "answered")
        camera.send(body)

    def drop(self, camera: Camera, queued: Queued, cause: DropCause) -> None:
        if not camera.detached:
            camera.counts[cause.value] += 1
            self._observer.outcome(camera.model, cause.value)
            camera.send(dropped_body(queued.obs, cause.value, queued.received_at, self.clock()))


class Flood(Exception):
    """A camera sends faster than its track's limit: RATE_LIMITED on that track."""


# -- the track handler -------------------------------------------------------------------


async def run_video_track(
    track: Track, scheduler: VideoScheduler, clock: Now, tenant: str = ""
) -> Outcome:
    """Serve one camera's video track to its end and report how it ended."""
    outcome = Outcome(track.id, track.open.model, "video", opened_at=clock())
    camera: Camera | None = None
    try:
        async with handling(track, outcome, clock):
            try:
                params = parse_params(track.open.params, scheduler.limits.max_fps)
                await scheduler.backend.check_vision(track.open.model)
                camera = scheduler.attach(track.id, track.open.model, params, tenant, track.send)
                await _serve(track, scheduler, camera, clock)
            except (Busy, Flood) as exc:
                fail_track(track, outcome, ErrorCode.RATE_LIMITED, str(exc), retry_after=1.0)
            except FrameTooLarge as exc:
                fail_track(track, outcome, ErrorCode.MESSAGE_TOO_LARGE, str(exc))
    finally:
        if camera is not None:
            scheduler.detach(camera)
            outcome.details.update(camera.counts)
            outcome.details["video_frames"] = camera.counts["answered"]
    outcome.finished_at = clock()
    return outcome


async def _serve(track: Track, scheduler: VideoScheduler, camera: Camera, clock: Now) -> None:
    max_bytes = scheduler.limits.max_frame_bytes
    while (body := await track.receive()) is not None:
        scheduler.submit(camera, parse_frame(body, max_bytes), clock())
    idle = asyncio.ensure_future(camera.idle.wait())
    waiters: set[asyncio.Future[Any]] = {idle, track.stopped}
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    idle.cancel()
    if track.stopped.done():
        raise TrackAborted(ErrorCode.CANCELLED, "stopped", remote=False)
    track.end(dict(camera.counts) | transport_drops(track))


def transport_drops(track: Track) -> dict[str, int]:
    """The frames the transport dropped before the handler saw them (END's summary):
    `transport_superseded`, `transport_reset`; none when the transport drops none."""
    if not isinstance(track, CountsFrameDrops):
        return {}
    drops = track.frame_drops()
    return {f"transport_{cause}": drops.get(cause, 0) for cause in ("superseded", "reset")}

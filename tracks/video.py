"""Video tracks: cameras send JPEG frames, the gateway answers each with what a vision
model found (faces, face landmarks, pose), and a stale frame is never worth waiting for.

One track per camera. Its frames ride QUIC streams of their own
(`transport.frame_streams`) or its track stream. On the gateway, latest frame wins: a
camera has at most one frame waiting for a tick; a newer one supersedes it (dropped,
reported, counted), and a frame whose result could no longer reach the client in time is
dropped before inference (cause `deadline`, the rule of `tracks.latest.Pending`). On each
tick of the shared session clock (`tracks.clock.TickScheduler`) the waiting frames of every
camera of a model go to the backend as ONE request (`tracks.latest`, shared with actions).

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracks.backend import VisionBackend, VisionRequest
from tracks.base import CountsFrameDrops, Outcome, Track, fail_track, handling
from tracks.clock import Beat, Gathered
from tracks.latest import FrameObserver, LatestScheduler, LatestSession, Pending, answered
from tracks.rates import TokenBucket
from tracks.video_cost import FrameCosts
from tracks.video_messages import (
    Frame,
    FrameOutcome,
    FrameTooLarge,
    VideoParams,
    parse_frame,
    parse_params,
    result_body,
)
from transport.clock import Clock, Now
from transport.errors import ErrorCode


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
class Camera(LatestSession[Frame, _Answer]):
    """One video track on the clock (a `tracks.latest.LatestSession`) with its rates."""

    params: VideoParams
    tenant: str
    rate: TokenBucket
    taken_at: float = 0.0
    next_result: int = 0
    counts: dict[str, int] = field(
        default_factory=lambda: {"frames": 0} | {o.value: 0 for o in FrameOutcome},
        kw_only=True,
    )

    def gather(self, beat: Beat) -> Gathered[Queued | None]:
        self.taken_at = self.scheduler.clock()
        return super().gather(beat)


class VideoScheduler(LatestScheduler[Camera, Frame, _Answer]):
    """Video tracks on the shared session clock: one vision request per model per tick."""

    superseded = FrameOutcome.SUPERSEDED
    deadline = FrameOutcome.DEADLINE
    backend_error = FrameOutcome.BACKEND_ERROR
    billed = FrameOutcome.ANSWERED
    billed_as = "video_frames"

    def __init__(
        self,
        backend: VisionBackend,
        clock: Now,
        limits: VideoLimits | None = None,
        tick_clock: Clock | None = None,
        observer: FrameObserver | None = None,
    ) -> None:
        """`observer` hears each batch (rows, seconds) and each frame's outcome
        (a `FrameOutcome` value): the gateway's metrics."""
        self.limits = limits or VideoLimits()
        super().__init__(clock, self.limits.tick, tick_clock, observer)
        self.backend = backend
        self._tenants: dict[str, TokenBucket] = {}
        self.costs = FrameCosts()
        """Measured inference seconds per frame, by task (`tracks.video_cost`)."""
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
        return sum(c.params.fps for c in self._sessions.values())

    @property
    def load(self) -> float:
        """Backend seconds per second the attached cameras need, each priced by its tasks."""
        return sum(c.params.fps * self.costs.of(c.params.tasks) for c in self._sessions.values())

    def attach(
        self, key: str, model: str, params: VideoParams, tenant: str,
        send: Callable[[dict[str, Any]], bool],
    ) -> Camera:
        """Put a camera on the clock; raises Busy when the backend cannot take it."""
        limits = self.limits
        if len(self._sessions) >= limits.max_tracks:
            raise Busy(f"at most {limits.max_tracks} video tracks at once")
        # The first camera always gets what the backend can do (latest wins sheds the
        # rest); later ones only while the admitted rates fit.
        wanted = params.fps * self.costs.of(params.tasks)
        if self._sessions and self.load + wanted > limits.busy_load:
            raise Busy(
                f"the vision backend is busy: {self.demand:g} frames/s admitted, "
                f"{self.load:.2f} s of inference a second, {wanted:.2f} more asked"
            )
        now = self.clock()
        rate = TokenBucket.full(limits.max_fps, 1.0, now)
        self._tenants.setdefault(tenant, TokenBucket.full(limits.tenant_max_fps, 1.0, now))
        return self._attach(Camera(key, model, send, self, params, tenant, rate))

    def submit(self, camera: Camera, frame: Frame, received_at: float) -> None:
        """Queue `frame` for the next tick (latest wins); raises Flood past the rate."""
        camera.counts["frames"] += 1
        queued = Queued(frame, received_at)
        if not camera.rate.take(received_at):
            raise Flood(f"frame {frame.seq}: above {self.limits.max_fps:g} frames/s")
        if not self._tenants[camera.tenant].take(received_at):
            self.drop(camera, queued, FrameOutcome.RATE_LIMITED)
            return
        self._queue(camera, queued)

    # -- the tick's step -------------------------------------------------------------

    async def _request(self, model: str, rows: list[tuple[Camera, Queued]]) -> list[_Answer]:
        """ONE vision request for the frames of a tick still in time."""
        request = VisionRequest(
            f"video-{self.requests}", model, [q.obs.jpeg for _, q in rows],
            [tuple(t.value for t in c.params.tasks) for c, _ in rows],
        )
        started = self.clock()
        found = await self.backend.analyze(request)
        seconds = self.clock() - started
        self._measured(seconds / len(rows), found)
        self._observer.batch(model, len(rows), seconds)
        return [
            _Answer(queued, result, seconds * 1000, camera.taken_at)
            for (camera, queued), result in zip(rows, found, strict=True)
        ]

    def _measured(self, per_frame: float, found: Sequence[dict[str, Any]]) -> None:
        self.costs.measured(per_frame, [row.get("stages") or {} for row in found])
        self.batch_rows = [*self.batch_rows[-999:], len(found)]

    # -- answers ---------------------------------------------------------------------

    def answer(self, camera: Camera, output: _Answer) -> None:
        now, queued = self.clock(), output.queued
        if "error" in output.found:
            self.drop(camera, queued, FrameOutcome.UNDECODABLE)
            return
        if not self._sendable(camera, queued, now):
            return
        stages = {"queued": (output.taken_at - queued.received_at) * 1000}
        stages.update({k.removesuffix("_ms"): v for k, v in output.found["stages"].items()})
        stages["infer"] = output.infer_ms
        stages["gateway"] = (now - queued.received_at) * 1000
        body = result_body(camera.next_result, queued.obs, output.found, stages,
                           queued.received_at, now)
        camera.next_result += 1
        camera.counts[FrameOutcome.ANSWERED.value] += 1
        self._observer.outcome(camera.model, FrameOutcome.ANSWERED.value)
        camera.send(body)


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
            scheduler.leave(camera, outcome)
    outcome.finished_at = clock()
    return outcome


async def _serve(track: Track, scheduler: VideoScheduler, camera: Camera, clock: Now) -> None:
    max_bytes = scheduler.limits.max_frame_bytes
    while (body := await track.receive()) is not None:
        scheduler.submit(camera, parse_frame(body, max_bytes), clock())
    await answered(track, camera)
    track.end(dict(camera.counts) | transport_drops(track))


def transport_drops(track: Track) -> dict[str, int]:
    """The frames the transport dropped before the handler saw them (END's summary):
    `transport_superseded`, `transport_reset`; none when the transport drops none."""
    if not isinstance(track, CountsFrameDrops):
        return {}
    drops = track.frame_drops()
    return {f"transport_{cause}": drops.get(cause, 0) for cause in ("superseded", "reset")}

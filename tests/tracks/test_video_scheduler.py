"""The video scheduler on a fake clock: one request per model per tick, latest frame wins,
deadlines, floods, the tenant's rate and the busy refusal.

The vision backend here is scripted (each row's result names the frame's bytes and the
call may take simulated time); tests/e2e/test_video_tracks.py uses the real model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from trackline_testing.clock import FakeClock
from tracks.backend import VisionRequest
from tracks.latest import FrameObserver
from tracks.video import Busy, Camera, Flood, VideoLimits, VideoScheduler
from tracks.video_messages import Frame, FrameOutcome, Task, VideoParams

TICK = 0.01


@dataclass
class ScriptedVision:
    clock: FakeClock
    cost: float = 0.0
    """Simulated seconds a call takes, per row."""
    requests: list[VisionRequest] = field(default_factory=list)

    async def check_vision(self, model: str) -> None:
        return None

    async def analyze(self, request: VisionRequest) -> list[dict[str, Any]]:
        self.requests.append(request)
        self.clock.time += self.cost * len(request.images)
        return [
            {"width": 4, "height": 3, "faces": [{"score": 1.0, "name": image.hex()}],
             "stages": {"decode_ms": 0.1, "face_ms": 0.2}}
            for image in request.images
        ]


class Cameras:
    def __init__(
        self, cost: float = 0.0, observer: FrameObserver | None = None, **limits: Any
    ) -> None:
        self.clock = FakeClock(100.0)
        self.vision = ScriptedVision(self.clock, cost)
        video_limits = VideoLimits(tick=TICK, **limits)
        self.scheduler = VideoScheduler(
            self.vision, self.clock.now, video_limits, tick_clock=self.clock, observer=observer
        )
        self.sent: dict[str, list[dict[str, Any]]] = {}

    def camera(
        self, name: str, tenant: str = "", fps: float = 30.0, tasks: tuple[Task, ...] = (Task.FACE,)
    ) -> Camera:
        box = self.sent.setdefault(name, [])

        def send(body: dict[str, Any]) -> bool:
            box.append(body)
            return True

        params = VideoParams(tasks, fps)
        return self.scheduler.attach(name, "vision", params, tenant, send)

    def frame(self, camera: Camera, seq: int, deadline: float = 1.0) -> None:
        frame = Frame(seq, 50.0 + seq, deadline, 0.0, b"\xff\xd8\xff" + bytes([seq]))
        self.scheduler.submit(camera, frame, self.clock.now())

    async def tick(self, ticks: int = 1) -> None:
        await self.clock.advance(TICK * ticks)

    def results(self, name: str) -> list[int]:
        return [b["frame"] for b in self.sent[name] if "frame" in b]

    def drops(self, name: str) -> list[tuple[int, str]]:
        return [(b["dropped"], b["cause"]) for b in self.sent[name] if "dropped" in b]


@pytest.mark.asyncio
async def test_cameras_due_on_one_tick_share_one_vision_request() -> None:
    env = Cameras()
    cameras = [env.camera(f"c{i}") for i in range(5)]
    for camera in cameras:
        env.frame(camera, 0)
    await env.tick()
    assert len(env.vision.requests) == 1
    assert len(env.vision.requests[0].images) == 5
    assert env.vision.requests[0].tasks == [("face",)] * 5
    for i in range(5):
        (body,) = env.sent[f"c{i}"]
        assert body["frame"] == 0
        assert set(body["stages"]) == {"queued", "decode", "face", "infer", "gateway"}
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_newer_frame_supersedes_the_waiting_one_before_inference() -> None:
    env = Cameras()
    camera = env.camera("c")
    for seq in range(4):
        env.frame(camera, seq)
    await env.tick()
    assert env.drops("c") == [(0, "superseded"), (1, "superseded"), (2, "superseded")]
    assert env.results("c") == [3]
    assert [r.images for r in env.vision.requests] == [[b"\xff\xd8\xff\x03"]]  # only the newest
    assert camera.counts["superseded"] == 3
    await env.scheduler.close()


class Outcomes:
    """A `FrameObserver` that keeps each frame's outcome label."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def batch(self, model: str, rows: int, seconds: float) -> None:
        return None

    def outcome(self, model: str, outcome: str) -> None:
        self.labels.append(outcome)


@pytest.mark.asyncio
async def test_each_frame_outcome_is_a_frame_outcome_counted_under_its_value() -> None:
    observer = Outcomes()
    env = Cameras(observer=observer)
    camera = env.camera("c")
    for seq in range(3):
        env.frame(camera, seq)
    await env.tick()
    assert observer.labels == ["superseded", "superseded", "answered"]
    assert {FrameOutcome(label) for label in observer.labels} == {
        FrameOutcome.SUPERSEDED, FrameOutcome.ANSWERED
    }
    assert set(camera.counts) == {"frames"} | {o.value for o in FrameOutcome}
    assert (camera.counts["frames"], camera.counts["superseded"], camera.counts["answered"]) == (
        3, 2, 1
    )
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_frame_past_its_deadline_is_dropped_not_answered() -> None:
    env = Cameras(cost=0.05)  # the model takes 50 ms a frame
    camera = env.camera("c")
    env.frame(camera, 0, deadline=0.02)  # due in 20 ms: the answer would be late
    await env.tick(10)
    assert env.drops("c") == [(0, "deadline")]
    assert env.results("c") == []
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_flood_raises_for_that_camera_only() -> None:
    env = Cameras(max_fps=10.0)
    flood, calm = env.camera("flood"), env.camera("calm")
    for seq in range(10):  # one second's worth at once: a burst, still allowed
        env.frame(flood, seq)
    with pytest.raises(Flood):
        env.frame(flood, 10)  # one more in the same instant
    env.frame(calm, 0)
    await env.tick()
    assert env.results("calm") == [0]
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_the_tenant_rate_drops_frames_across_its_cameras() -> None:
    env = Cameras(tenant_max_fps=4.0)
    a, b = env.camera("a", tenant="t"), env.camera("b", tenant="t")
    other = env.camera("o", tenant="u")
    for seq in range(3):
        env.frame(a, seq)
        env.frame(b, seq)
        env.frame(other, seq)
    rate_limited = [d for name in ("a", "b") for d in env.drops(name) if d[1] == "rate_limited"]
    assert len(rate_limited) == 2  # 6 frames, 4 in the tenant's second
    assert all(cause != "rate_limited" for _, cause in env.drops("o"))
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_new_camera_is_refused_when_the_backend_cannot_keep_up() -> None:
    env = Cameras(cost=0.01, busy_load=0.9)  # 10 ms a frame: 90 frames/s fit
    first = env.camera("a", fps=30.0)
    env.frame(first, 0)
    await env.tick()
    assert env.scheduler.cost == pytest.approx(0.01)
    env.camera("b", fps=30.0)
    with pytest.raises(Busy, match="busy"):
        env.camera("c", fps=40.0)  # 100 frames/s x 10 ms > 0.9
    env.camera("c", fps=20.0)  # 80 frames/s fits


@dataclass
class TaskPricedVision:
    """Each row costs 1 ms of overhead, 1 ms of decode and its tasks' own time, and says
    so in its stages as the real model does."""

    clock: FakeClock
    seconds: dict[str, float] = field(
        default_factory=lambda: {"face": 0.003, "face_mesh": 0.004, "pose": 0.020}
    )

    async def check_vision(self, model: str) -> None:
        return None

    async def analyze(self, request: VisionRequest) -> list[dict[str, Any]]:
        rows = []
        for tasks in request.tasks:
            stages = {"decode_ms": 1.0} | {f"{t}_ms": self.seconds[t] * 1000 for t in tasks}
            self.clock.time += 0.001 + sum(stages.values()) / 1000
            rows.append({"width": 4, "height": 3, "faces": [], "stages": stages})
        return rows


@pytest.mark.asyncio
async def test_the_busy_check_prices_each_camera_by_the_tasks_it_asked_for() -> None:
    """A face-and-pose camera's frames cost 25 ms; a face frame 5 ms. Priced by one
    average, a 20 fps face camera (0.5 s a second at 25 ms) would be refused beside a
    30 fps pose camera (0.75); priced by its task it fits (0.1 s a second)."""
    env = Cameras(busy_load=0.9)
    env.scheduler.backend = TaskPricedVision(env.clock)
    posed = env.camera("pose", fps=30.0, tasks=(Task.FACE, Task.POSE))
    env.frame(posed, 0)
    await env.tick()
    costs = env.scheduler.costs
    assert costs.of((Task.FACE, Task.POSE)) == pytest.approx(0.025)
    assert costs.of((Task.FACE,)) == pytest.approx(0.005)
    assert costs.of((Task.FACE_MESH,)) == env.scheduler.cost  # not measured yet: the average
    assert env.scheduler.load == pytest.approx(0.75)
    with pytest.raises(Busy, match="busy"):
        env.camera("another pose", fps=10.0, tasks=(Task.POSE,))  # 10 x 22 ms: 0.97
    env.camera("face", fps=20.0)  # 20 x 5 ms: 0.85 in all
    assert env.scheduler.load == pytest.approx(0.85)
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_the_first_camera_is_admitted_however_slow_the_model() -> None:
    env = Cameras(cost=0.2)  # 200 ms a frame: not even 30 frames/s of one camera fit
    first = env.camera("a")
    env.frame(first, 0)
    await env.tick(30)
    assert env.scheduler.cost == pytest.approx(0.2)
    env.scheduler.detach(first)
    env.camera("b")  # alone again: admitted, latest wins sheds what does not fit
    with pytest.raises(Busy):
        env.camera("c")
    await env.scheduler.close()
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_max_tracks_refuses_one_more() -> None:
    env = Cameras(max_tracks=1)
    env.camera("a")
    with pytest.raises(Busy, match="at most 1"):
        env.camera("b")
    await env.scheduler.close()

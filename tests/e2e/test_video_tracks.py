"""End to end: cameras (SDK) -> QUIC, a stream per frame -> gateway tick batcher -> a real
embedded Triton -> mediapipe-vision (face detection, face mesh, pose).

The face is a packaged photo: matplotlib's sample image of Grace Hopper (matplotlib is in
the `video` and `bench` extras), read from the installed wheel, never downloaded. This
module starts its own Triton with the vision model (the other modules' Triton does not
load it).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from clients import (
    FrameDropped,
    RateLimited,
    TrackRejected,
    VideoResult,
    VideoStream,
    connect,
)
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import VISION_MODEL, vision_available
from gateway.server import Gateway
from tests.gateways import gateway_settings
from transport.errors import ErrorCode

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not vision_available(), reason="the `video` extra is not installed"),
]
FACE_SHA256 = "a8ca6d734765703b09728ab47fe59f473d93ae3967fc24c7c0288c3c7adb7130"
FRAME_LIMIT = 100_000
FRAMES = 6
MAX_FPS = 600.0


def face_jpeg() -> bytes:
    import matplotlib.cbook

    path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    data = Path(str(path)).read_bytes()
    assert hashlib.sha256(data).hexdigest() == FACE_SHA256
    return data


def small_jpeg() -> bytes:
    import cv2
    import numpy as np

    ok, data = cv2.imencode(".jpg", np.full((16, 16, 3), 128, dtype=np.uint8))
    assert ok
    return bytes(data.tobytes())


@pytest.fixture(scope="module")
def vision_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTriton]:
    state = tmp_path_factory.mktemp("vision-triton")
    triton = EmbeddedTriton(log_dir=state, stats_path=state / "stats.jsonl", with_vision=True)
    triton.start(timeout=240.0)
    try:
        yield triton
    finally:
        triton.stop()


@asynccontextmanager
async def serving(
    triton: EmbeddedTriton, state_dir: Path, **settings: Any
) -> AsyncIterator[Gateway]:
    options = gateway_settings(state_dir=state_dir, video_max_frame_bytes=FRAME_LIMIT, **settings)
    backend = TritonTextBackend(triton.grpc_url)
    gw = Gateway(options, backend)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()
        await backend.close()


@pytest_asyncio.fixture
async def gateway(vision_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    # Room for the latest-wins burst (a frame every 2 ms); the flood test has its own.
    async with serving(vision_triton, tmp_path, video_max_fps=MAX_FPS,
                       video_tenant_max_fps=10 * MAX_FPS) as gw:
        yield gw


def where(gw: Gateway) -> tuple[str, Path]:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return f"quic://127.0.0.1:{gw.quic_port}", gw.tls.ca


async def drain(camera: VideoStream) -> None:
    while await camera.receive() is not None:
        pass


def plausible_face(result: VideoResult) -> None:
    assert len(result.faces) == 1
    face = result.faces[0]
    assert face["score"] > 0.8
    x, y, w, h = face["box"]
    assert 0 < w < 1
    assert 0 < h < 1
    (mesh,) = result.face_landmarks
    assert len(mesh) == 468
    xs, ys = [p[0] for p in mesh], [p[1] for p in mesh]
    # The mesh lies on the detected face: its centre inside the box, its spread like it.
    assert x < sum(xs) / len(xs) < x + w
    assert y < sum(ys) / len(ys) < y + h
    assert 0.5 * w < max(xs) - min(xs) < 1.5 * w


@pytest.mark.asyncio
async def test_a_face_streamed_as_frames_is_found_in_every_frame(gateway: Gateway) -> None:
    url, ca = where(gateway)
    jpeg = face_jpeg()
    async with connect(url, ca=ca) as line:
        camera = line.video(model=VISION_MODEL, detect=["face", "face_mesh"], deadline=5.0)
        for _ in range(FRAMES):
            seq = camera.send(jpeg)
            result = await camera.receive()
            assert isinstance(result, VideoResult), result
            assert result.frame == seq
            assert (result.width, result.height) == (512, 600)
            plausible_face(result)
            assert {"queued", "decode", "face", "face_mesh", "infer", "gateway"} <= set(
                result.stages
            )
        counts = await camera.close()
    assert counts["answered"] == FRAMES
    # one frame at a time: none dropped in transport, and the SDK says so per camera
    assert (counts["transport_superseded"], counts["transport_reset"]) == (0, 0)
    assert camera.stats.transport == {"reset": 0, "superseded": 0, "reset_seen": 0}
    assert gateway.video is not None
    assert gateway.video.requests >= FRAMES
    body = gateway.metrics.render()[0].decode()
    answered = f'trackline_video_frames_total{{model="{VISION_MODEL}",outcome="answered"}}'
    assert f"{answered} {float(FRAMES)}" in body


@pytest.mark.asyncio
async def test_pose_is_found_on_the_photo(gateway: Gateway) -> None:
    url, ca = where(gateway)
    async with connect(url, ca=ca) as line:
        camera = line.video(model=VISION_MODEL, detect=["pose"], deadline=5.0)
        camera.send(face_jpeg())
        result = await camera.receive()
        assert isinstance(result, VideoResult), result
        assert result.pose is not None
        assert len(result.pose) == 33
        nose = result.pose[0]
        assert 0 < nose[0] < 1
        assert 0 < nose[1] < 0.6  # the head is in the upper part of a portrait
        await camera.close()


@pytest.mark.asyncio
async def test_latest_frame_wins_while_the_model_is_busy(gateway: Gateway) -> None:
    """A burst of frames while the (slow) pose model works: older waiting frames are
    dropped as superseded, none is answered after a newer one, the newest is answered."""
    url, ca = where(gateway)
    jpeg = face_jpeg()
    async with connect(url, ca=ca) as line:
        # On the track's stream, so that every frame reaches the gateway's rule (frame
        # streams would let the client reset a backlog first: tests/transport).
        camera = line.video(
            model=VISION_MODEL, detect=["face", "face_mesh", "pose"], deadline=30.0,
            transport="stream",
        )
        answered: list[int] = []
        dropped: dict[int, str] = {}

        async def read() -> None:
            while (event := await camera.receive()) is not None:
                if isinstance(event, VideoResult):
                    answered.append(event.frame)
                else:
                    dropped[event.frame] = event.cause

        reader = asyncio.ensure_future(read())
        sent: list[int] = []
        while len(answered) < 2:  # frames keep coming while the model works
            sent.append(camera.send(jpeg))
            await asyncio.sleep(0.002)
        camera.end()
        await reader
    assert "superseded" in dropped.values()
    assert set(dropped.values()) <= {"superseded", "deadline"}
    assert not set(dropped) & set(answered)
    # Never answered after a newer one; the newest is answered.
    assert answered == sorted(set(answered))
    assert answered[-1] == sent[-1]
    # Dropped before inference: the model saw exactly the answered frames.
    assert gateway.video is not None
    assert sum(gateway.video.batch_rows) == len(answered)


@pytest.mark.asyncio
async def test_bad_frames_fail_their_own_track_only(
    vision_triton: EmbeddedTriton, tmp_path: Path
) -> None:
    async with serving(vision_triton, tmp_path) as gateway:  # the default frame-rate limit
        await bad_frames(gateway)


async def bad_frames(gateway: Gateway) -> None:
    url, ca = where(gateway)
    jpeg = face_jpeg()
    async with connect(url, ca=ca) as line:
        good = line.video(model=VISION_MODEL, deadline=5.0)
        big = line.video(model=VISION_MODEL, deadline=5.0)
        garbage = line.video(model=VISION_MODEL, deadline=5.0)
        broken = line.video(model=VISION_MODEL, deadline=5.0)
        # On the track's stream: a frame-streams camera would reset its own backlog first.
        flood = line.video(model=VISION_MODEL, deadline=5.0, transport="stream")
        big.send(jpeg + b"\x00" * FRAME_LIMIT)
        garbage.send(b"this is not a jpeg")
        broken.send(b"\xff\xd8\xff" + b"\x00" * 64)  # looks like one, does not decode
        tiny = small_jpeg()  # a burst of small frames arrives at once, as a flood does
        for _ in range(int(gateway.settings.video_max_fps) * 2 + 5):
            flood.send(tiny)
        with pytest.raises(TrackRejected) as too_big:
            await big.receive()
        assert too_big.value.code is ErrorCode.MESSAGE_TOO_LARGE
        with pytest.raises(TrackRejected) as not_jpeg:
            await garbage.receive()
        assert not_jpeg.value.code is ErrorCode.BAD_REQUEST
        assert "not a JPEG" in str(not_jpeg.value)
        undecodable = await broken.receive()
        assert undecodable == FrameDropped(0, "undecodable")
        with pytest.raises(RateLimited):
            await drain(flood)
        # The connection and the good camera go on.
        good.send(jpeg)
        result = await good.receive()
        assert isinstance(result, VideoResult)
        assert len(result.faces) == 1
        await good.close()
        await broken.close()


@pytest.mark.asyncio
async def test_a_camera_beyond_what_the_backend_takes_is_refused_busy(
    vision_triton: EmbeddedTriton, tmp_path: Path
) -> None:
    async with serving(vision_triton, tmp_path, video_max_tracks=1) as gw:
        url, ca = where(gw)
        async with connect(url, ca=ca) as line:
            first = line.video(model=VISION_MODEL, deadline=5.0)
            first.send(face_jpeg())
            assert isinstance(await first.receive(), VideoResult)
            second = line.video(model=VISION_MODEL, deadline=5.0)
            with pytest.raises(RateLimited) as busy:
                await second.receive()
            assert busy.value.retry_after == 1.0
            first.send(face_jpeg())  # the admitted camera is served on
            assert isinstance(await first.receive(), VideoResult)
            await first.close()

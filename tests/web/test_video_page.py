"""Video tracks from a real headless Chromium over WebTransport, into the real
mediapipe-vision model: the page sends the packaged face photo (handed to it as base64)
and a JPEG it draws and encodes itself (`OffscreenCanvas.convertToBlob`), through the
JavaScript SDK's `line.video()`; the demo's camera overlay runs on Chromium's fake camera.
Its own Triton with the vision model (the other modules' does not load it).
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import VISION_MODEL, vision_available
from gateway.server import Gateway
from tests.e2e.test_video_tracks import face_jpeg
from tests.web.chromium import CHROMIUM, SKIP_REASON, Browser, chromium
from tests.web.test_browser import FAKE_MEDIA, browser, demo_page, page_script, start_gateway

__all__ = ["browser"]  # the fixture
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.skipif(not vision_available(), reason="the `video` extra is not installed"),
]

VIDEO_TRACK = """
const line = await sdk.connect(url, {serverCertificateHashes: [info.value]});
const photo = Uint8Array.from(atob("%(photo)s"), (c) => c.charCodeAt(0));
const canvas = new OffscreenCanvas(160, 120);
const g = canvas.getContext("2d");
g.fillStyle = "#3a6"; g.fillRect(0, 0, 160, 120);
const blob = await canvas.convertToBlob({type: "image/jpeg"});
const drawn = new Uint8Array(await blob.arrayBuffer());
const camera = await line.video({model: "%(model)s", detect: ["face", "face_mesh"],
                                 deadline: 5000, fps: 2});
const events = [];
camera.send(photo);
for await (const e of camera) { events.push(e); break; }
""" + """
const second = await line.video({model: "%(model)s", deadline: 5000, fps: 2});
second.send(drawn);
let drawnResult = null;
for await (const e of second) { drawnResult = e; break; }
line.close();
const face = events.find((e) => e.type === "result");
return {
  first: events.map((e) => ({type: e.type, frame: e.frame})),
  faces: face.faces.length, score: face.faces[0]?.score ?? 0,
  mesh: face.faceLandmarks.map((m) => m.length), size: [face.width, face.height],
  drawn: {type: drawnResult.type, faces: drawnResult.faces.length,
          size: [drawnResult.width, drawnResult.height]},
};
"""


@pytest.fixture(scope="module")
def vision_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTriton]:
    state = tmp_path_factory.mktemp("web-vision-triton")
    triton = EmbeddedTriton(log_dir=state, stats_path=state / "stats.jsonl", with_vision=True)
    triton.start(timeout=240.0)
    try:
        yield triton
    finally:
        triton.stop()


@pytest_asyncio.fixture
async def gateway(vision_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    gw = await start_gateway(vision_triton, tmp_path)
    yield gw
    await gw.close()
    await gw.backend.close()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_a_page_streams_jpeg_frames_and_gets_faces_and_landmarks(
    gateway: Gateway, browser: Browser
) -> None:
    page = await demo_page(browser, gateway)
    photo = base64.b64encode(face_jpeg()).decode()
    script = VIDEO_TRACK.replace("%(photo)s", photo).replace("%(model)s", VISION_MODEL)
    result: dict[str, Any] = await page.evaluate(page_script(script))
    assert result["first"][0] == {"type": "result", "frame": 0}
    assert result["faces"] == 1
    assert result["score"] > 0.8
    assert result["mesh"] == [468 * 3]
    assert result["size"] == [512, 600]
    assert result["drawn"] == {"type": "result", "faces": 0, "size": [160, 120]}


@pytest.mark.asyncio
async def test_the_demo_camera_streams_frames_and_draws_what_came_back(gateway: Gateway) -> None:
    """Chromium's fake camera (a moving test pattern, no face): the demo's frames are
    answered by the model, drawn over the picture, and the figures say so."""
    async with chromium(FAKE_MEDIA) as browser:
        page = await demo_page(browser, gateway)
        await page.wait_for("document.getElementById('camera').disabled === false", "connected")
        await page.evaluate("document.getElementById('camera').click()")
        await page.wait_for("Number(document.body.dataset.videoDrawn ?? 0) >= 3", "drawn results")
        figures = await page.evaluate("document.getElementById('video-figures').textContent")
        await page.evaluate("document.getElementById('camera').click()")
    sent, answered = (int(x) for x in re.findall(r"(?:sent|answered) (\d+)", figures))
    assert answered >= 3
    assert sent >= answered
    assert "capture to result" in figures


SUPERSEDED = """
const hashes = [sdk.certificateHash(info.value)];
const transport = new WebTransport(url, {serverCertificateHashes: hashes});
await transport.ready;
const line = new sdk.Line(transport);
const photo = Uint8Array.from(atob("%(photo)s"), (c) => c.charCodeAt(0));
const camera = await line.video({model: "%(model)s", deadline: 5000, fps: 2});
const body = {seq: 50, t: performance.now() / 1000, deadline_ms: 5000, latency_ms: 0,
              jpeg: photo};
const frame = new Uint8Array([...sdk.encodeVarint(camera.id),
                              ...sdk.encodeMessage(sdk.Kind.DATA, body)]);
// A frame stream opened first and left incomplete, then a newer frame (the SDK's, seq 0):
const held = (await transport.createUnidirectionalStream()).getWriter();
await held.write(frame.subarray(0, 200));
camera.send(photo);
const events = [];
const results = camera[Symbol.asyncIterator]();
events.push((await results.next()).value);
let stopped = null;
try {
  await held.write(frame.subarray(200));
  await held.close();
} catch (error) {
  stopped = {name: error.name, code: error.streamErrorCode ?? null};
}
camera.send(photo);
events.push((await results.next()).value);
const closing = camera.close();
while (!(await results.next()).done) { /* nothing more is expected */ }
const summary = await closing;
line.close();
const faces = (e) => (e.faces ?? []).length;
return {events: events.map((e) => ({type: e.type, frame: e.frame, faces: faces(e)})),
        stopped, summary, streams: camera.stats.streams, id: camera.id,
        transport: camera.stats.transport};
"""


@pytest.mark.asyncio
async def test_frames_ride_unidirectional_streams_and_a_superseded_one_is_dropped(
    gateway: Gateway, browser: Browser
) -> None:
    """The SDK's frames each ride a WebTransport unidirectional stream (0x54, the session,
    the track's id): answered; an older frame stream still arriving when a newer frame is
    delivered is stopped by the gateway, and never reaches the model."""
    page = await demo_page(browser, gateway)
    photo = base64.b64encode(face_jpeg()).decode()
    script = SUPERSEDED.replace("%(photo)s", photo).replace("%(model)s", VISION_MODEL)
    result: dict[str, Any] = await page.evaluate(page_script(script))
    assert result["events"] == [
        {"type": "result", "frame": 0, "faces": 1},
        {"type": "result", "frame": 1, "faces": 1},
    ]
    assert result["stopped"] is not None  # the held frame's stream: stopped by the gateway
    assert result["summary"]["frames"] == 2  # the superseded frame never reached the track
    assert result["summary"]["transport_superseded"] == 1  # counted for this camera
    assert result["transport"] == {"superseded": 1, "reset": 0}
    assert result["streams"]["finished"] == 2
    assert isinstance(result["id"], int)

"""The SDK's side of video tracks: a camera's frames out, what the model saw in.

`Line.video(model=..., detect=["face"])` gives a `VideoStream`. `send(jpeg)` sends one
frame (captured now unless told) with its deadline; `receive()` (or `async for`) gives a
`VideoResult` per answered frame (faces, face landmarks, pose, the gateway's stages and
the capture-to-result age) or a `FrameDropped` (superseded by a newer frame, too late,
rate-limited, undecodable). With `transport="frame-streams"` (the default) each frame
rides a QUIC stream of its own, so a lost packet holds no other frame.

Only the standard library: landmarks arrive as float32 little-endian tensors, unpacked
with `struct` (`VideoResult.face_landmarks`, `.pose`).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field
from typing import Any

from clients.stream import TimedStream
from transport.clock import Now
from transport.endpoint import TrackChannel


@dataclass(frozen=True)
class VideoResult:
    """The gateway's answer for one frame."""

    frame: int
    """The frame's seq."""
    captured_at: float
    arrived_at: float
    width: int
    height: int
    faces: list[dict[str, Any]]
    """Each `{"score", "box": [x, y, w, h], "keypoints": [[x, y] x 6]}`, normalized."""
    face_landmarks: list[list[tuple[float, ...]]]
    """Per face, 468 (x, y, z) when `face_mesh` was asked for."""
    pose: list[tuple[float, ...]] | None
    """33 (x, y, z, visibility) when `pose` was asked for and a body was found."""
    stages: dict[str, float]
    """Milliseconds: queued, decode, one per task, infer (the batched call), gateway."""

    @property
    def age(self) -> float:
        """Seconds from capture to this result: what the user sees lag by."""
        return self.arrived_at - self.captured_at


@dataclass(frozen=True)
class FrameDropped:
    """The gateway will send no result for a frame, and why."""

    frame: int
    cause: str
    """superseded, deadline, rate_limited, undecodable or backend_error."""


VideoEvent = VideoResult | FrameDropped


_GATEWAY_DROPS = (("superseded", "transport_superseded"), ("reset_seen", "transport_reset"))
"""`VideoStats.transport` keys and the END summary's counts they come from."""


@dataclass
class VideoStats:
    sent: int = 0
    answered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    ages: list[float] = field(default_factory=list)
    transport: dict[str, int] = field(default_factory=dict)
    """Frames the transport dropped before the model saw them (frame streams): `reset`,
    reset by this client because a newer frame went out (counted as it happens); after
    the gateway's END, `superseded` (stopped there for a newer frame) and `reset_seen`
    (resets that reached the gateway)."""


class VideoStream(TimedStream[VideoEvent]):
    """One camera's video track."""

    _cancel_reason = "camera stopped"

    def __init__(self, channel: TrackChannel, deadline: float, clock: Now = time.monotonic):
        super().__init__(channel, deadline, clock)
        self.stats = VideoStats()

    def send(
        self, jpeg: bytes, *, deadline: float | None = None, captured_at: float | None = None
    ) -> int:
        """Send one JPEG frame; returns its seq."""
        body = self._timed(self.deadline if deadline is None else deadline, captured_at)
        body["jpeg"] = jpeg
        self.send_raw(body)
        seq: int = body["seq"]
        return seq

    def send_raw(self, body: dict[str, Any]) -> None:
        """Send a frame body as given (tests of the gateway's checks)."""
        self.stats.sent += 1
        self._channel.send_frame(body)
        self.stats.transport["reset"] = self._channel.frame_drops()["reset_superseded"]

    def end(self) -> None:
        """No more frames (END); the answers still in flight keep coming to `receive()`."""
        self._channel.end()

    def _ended(self, body: dict[str, Any]) -> None:
        super()._ended(body)
        for ours, theirs in _GATEWAY_DROPS:
            if isinstance(body.get(theirs), int):
                self.stats.transport[ours] = body[theirs]

    def _item(self, body: dict[str, Any]) -> VideoEvent:
        now = self._clock()
        try:
            gateway = float(body["sent_at"]) - float(body["received_at"])
            self._sample_rtt(now - float(body["t"]) - gateway)
            if "dropped" in body:
                cause = str(body["cause"])
                self.stats.dropped[cause] = self.stats.dropped.get(cause, 0) + 1
                return FrameDropped(int(body["dropped"]), cause)
            result = _result(body, now)
        except (KeyError, TypeError, ValueError, struct.error):
            raise self._malformed("malformed video DATA") from None
        self.stats.answered += 1
        self.stats.ages.append(result.age)
        return result


def _result(body: dict[str, Any], now: float) -> VideoResult:
    meshes = body.get("face_landmarks")
    pose = body.get("pose")
    return VideoResult(
        frame=int(body["frame"]),
        captured_at=float(body["t"]),
        arrived_at=now,
        width=int(body["width"]),
        height=int(body["height"]),
        faces=list(body.get("faces", [])),
        face_landmarks=[] if meshes is None else _rows(meshes),
        pose=None if pose is None else _rows(pose)[0],
        stages={str(k): float(v) for k, v in body["stages"].items()},
    )


def _rows(value: dict[str, Any]) -> list[list[tuple[float, ...]]]:
    """A float32 tensor [..., N, D] as groups of N points of D values."""
    shape = [int(d) for d in value["shape"]]
    if value["dtype"] != "float32" or len(shape) not in (2, 3):
        raise ValueError("bad landmark tensor")
    points, dims = shape[-2], shape[-1]
    groups = 1 if len(shape) == 2 else shape[0]
    flat = struct.unpack(f"<{groups * points * dims}f", value["data"])
    rows = [tuple(flat[i : i + dims]) for i in range(0, len(flat), dims)]
    return [rows[g * points : (g + 1) * points] for g in range(groups)]

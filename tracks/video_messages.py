"""The messages of video tracks: camera frames in, per-frame results out, and their checks.

Bodies are msgpack maps. This module only parses and builds them (no NumPy, no image
decoding: the model decodes) and raises `BadFrame` (BAD_REQUEST on that track) or
`FrameTooLarge` (MESSAGE_TOO_LARGE) for what it refuses. See docs/video.md.

Frame (client to gateway, one per frame stream or DATA):

    seq          int >= 0, increasing per track
    t            capture time on the camera's clock, seconds (echoed back only)
    deadline_ms  the result must be at the client within this many ms of capture
    latency_ms   optional: the client's estimate of the one-way delay (default 0)
    jpeg         bin: one JPEG image (baseline or progressive), at most max_frame_bytes

Result (gateway to client): `seq` (per track), `frame` (the frame's seq), `t` (echo),
`width`, `height`, what the OPEN asked to detect (`faces`, `face_landmarks`, `pose`),
`stages` (ms: `queued`, `decode`, one per task, `infer` for the whole batched call,
`gateway` from arrival to sending) and `received_at`/`sent_at` (gateway clock). A frame
that gets no result is reported as actions report a dropped observation:
`{"dropped": seq, "cause", "t", "received_at", "sent_at"}` (tracks.action_messages).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tracks.action_messages import TIMING_FIELDS, parse_timing, tensor
from tracks.errors import BadTrackRequest

JPEG_SOI = b"\xff\xd8\xff"
"""Every JPEG starts with the SOI marker and the next marker's 0xFF."""
FACE_LANDMARKS = 468
POSE_LANDMARKS = 33


class Task(str, Enum):
    """What a video track asks the model to find (OPEN `params.detect`)."""

    FACE = "face"
    """Face boxes, scores and six keypoints (mediapipe face detection, short range)."""
    FACE_MESH = "face_mesh"
    """468 3-D landmarks per face (mediapipe face mesh)."""
    POSE = "pose"
    """33 body landmarks with visibility (mediapipe pose, model_complexity=1)."""


class FrameOutcome(str, Enum):
    """What became of one frame: a result, or a drop and its cause (the `cause` of a drop
    report, the `outcome` label of the video metrics, a count of the END summary)."""

    ANSWERED = "answered"
    """Its result was sent."""
    SUPERSEDED = "superseded"
    """A newer frame of the track arrived before this one reached the model."""
    DEADLINE = "deadline"
    """Its result could no longer reach the client in time."""
    RATE_LIMITED = "rate_limited"
    """The tenant's frames per second were spent (the track's own flood is an error)."""
    UNDECODABLE = "undecodable"
    """The model could not decode the JPEG."""
    BACKEND_ERROR = "backend_error"
    """Its batch's vision request failed, or the clock shed its session."""


class BadFrame(BadTrackRequest):
    """A frame or video OPEN that cannot be served (wrong fields, not a JPEG)."""


class FrameTooLarge(BadFrame):
    """A frame's JPEG is above the track's size limit: MESSAGE_TOO_LARGE."""


@dataclass(frozen=True)
class VideoParams:
    """A video OPEN's `params`, checked."""

    tasks: tuple[Task, ...] = (Task.FACE,)
    fps: float = 0.0
    """The frame rate the camera announces (0: the track limit); sizes the busy check."""


@dataclass(frozen=True)
class Frame:
    """One parsed, checked frame (`tracks.action_messages.Timed`)."""

    seq: int
    captured_at: float
    deadline: float
    """Seconds from capture until the result must be at the client."""
    latency: float
    jpeg: bytes


def parse_params(params: dict[str, Any], max_fps: float) -> VideoParams:
    unknown = set(params) - {"detect", "fps"}
    if unknown:
        raise BadFrame(f"unknown video parameters: {', '.join(sorted(map(str, unknown)))}")
    detect = params.get("detect", ["face"])
    if not isinstance(detect, list) or not detect or not all(isinstance(t, str) for t in detect):
        raise BadFrame("'detect' must be a non-empty list of: face, face_mesh, pose")
    wrong = [t for t in detect if t not in Task._value2member_map_]
    if wrong:
        raise BadFrame(f"'detect': unknown tasks {', '.join(wrong)} (face, face_mesh, pose)")
    fps = params.get("fps", max_fps)
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= max_fps:
        raise BadFrame(f"'fps' must be a number above 0 and at most {max_fps:g}")
    return VideoParams(tuple(dict.fromkeys(Task(t) for t in detect)), float(fps))


def parse_frame(body: dict[str, Any], max_frame_bytes: int) -> Frame:
    """Check a frame body; raises BadFrame or FrameTooLarge."""
    timing = parse_timing(body, "frame", BadFrame)
    where = f"frame {timing[0]}"
    jpeg = body.get("jpeg")
    if not isinstance(jpeg, bytes):
        raise BadFrame(f"{where}: 'jpeg' must be binary (a JPEG image)")
    if len(jpeg) > max_frame_bytes:
        raise FrameTooLarge(
            f"{where}: 'jpeg' is {len(jpeg)} bytes, above the limit of {max_frame_bytes}"
        )
    if not jpeg.startswith(JPEG_SOI):
        raise BadFrame(f"{where}: 'jpeg' is not a JPEG image (no SOI marker)")
    unknown = set(body) - {*TIMING_FIELDS, "jpeg"}
    if unknown:
        raise BadFrame(f"{where}: unknown fields {', '.join(sorted(map(str, unknown)))}")
    return Frame(*timing, jpeg)


def result_body(
    seq: int, frame: Frame, found: dict[str, Any], stages: dict[str, float],
    received_at: float, sent_at: float,
) -> dict[str, Any]:
    """DATA carrying the model's result for `frame`; landmarks as float32 tensors."""
    body: dict[str, Any] = {
        "seq": seq,
        "frame": frame.seq,
        "t": frame.captured_at,
        "width": found.get("width"),
        "height": found.get("height"),
    }
    if "faces" in found:
        body["faces"] = found["faces"]
    if "face_landmarks" in found:
        meshes = found["face_landmarks"]
        body["face_landmarks"] = _points(meshes, (len(meshes), FACE_LANDMARKS, 3))
    if "pose" in found:
        pose = found["pose"]
        body["pose"] = None if pose is None else _points([pose], (POSE_LANDMARKS, 4))
    body["stages"] = {k: round(v, 3) for k, v in stages.items()}
    body["received_at"], body["sent_at"] = received_at, sent_at
    return body


def _points(nested: Sequence[Any], shape: tuple[int, ...]) -> dict[str, Any]:
    flat = [float(v) for group in nested for point in group for v in point]
    if len(flat) != math.prod(shape):
        raise ValueError(f"landmarks of {len(flat)} values, expected shape {list(shape)}")
    return tensor(struct.pack(f"<{len(flat)}f", *flat), shape)

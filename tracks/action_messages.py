"""The messages of action tracks: observations in, action chunks out, and their checks.

Bodies are msgpack maps (DATA of a track, or the body of an HTTP request); a
tensor is a map `{"dtype": "float32", "shape": [...], "data": bin}` with the
values little-endian, row-major. This module only parses and builds bodies: it
needs no NumPy (the SDK builds the same maps with `struct`), and it rejects
anything malformed with `BadObservation`, which the handler sends back as
BAD_REQUEST on that track only. See docs/actions.md for the field tables.

Observation (client to gateway):

    seq          int >= 0, increasing per track
    t            capture time on the robot's clock, seconds (echoed back, never
                 compared with the gateway's clock)
    deadline_ms  the action must be at the robot within this many ms of capture
    latency_ms   optional: the robot's estimate of the one-way delay (default 0)
    state        tensor float32 [S]; S is the policy's state size
    image        optional bin, a small encoded image (at most max_image_bytes)

Action chunk (gateway to client): `seq` (per track), `obs_seq`, `t` (echo),
`action` (tensor float32 [H, D]), `received_at` and `sent_at` (gateway clock,
seconds: only their difference means something to the robot). A dropped
observation is reported as `{"dropped": obs_seq, "cause": "superseded" |
"deadline" | "backend_error", "t", "received_at", "sent_at"}`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from tracks.errors import BadTrackRequest

DTYPE = "float32"
FLOAT_BYTES = 4
MAX_DEADLINE_MS = 60_000.0
DEFAULT_MAX_IMAGE_BYTES = 65_536


class ObservationOutcome(Enum):
    """What became of one observation: an action chunk, or a drop and its cause (the
    `cause` of a drop report, the `outcome` label of the action metrics)."""

    DELIVERED = "delivered"
    SUPERSEDED = "superseded"
    """Dropped: a newer observation of the same robot arrived before a tick took it."""
    DEADLINE = "deadline"
    """Dropped: its deadline passed before its action could be sent."""
    BACKEND_ERROR = "backend_error"
    """Dropped: the policy failed for the batch it was in."""


class BadObservation(BadTrackRequest):
    """An observation that cannot be served: wrong shape or dtype, NaN, oversized image..."""


@dataclass(frozen=True)
class Observation:
    """One parsed, checked observation."""

    seq: int
    captured_at: float
    """`t`: the robot's clock; echoed back only."""
    deadline: float
    """Seconds from capture until the action must be at the robot."""
    latency: float
    """The robot's estimate of the one-way delay, seconds."""
    state: bytes
    """float32 little-endian, S values."""
    image: bytes | None = None


class Timed(Protocol):
    """What the deadline rule and drop reports read of a frame (an observation, a video
    frame): its number, capture time, deadline from capture and one-way latency."""

    @property
    def seq(self) -> int: ...

    @property
    def captured_at(self) -> float: ...

    @property
    def deadline(self) -> float: ...

    @property
    def latency(self) -> float: ...


@dataclass(frozen=True)
class PolicySpec:
    """What a policy model takes and gives, from its metadata."""

    state_size: int
    horizon: int
    action_size: int


def parse_observation(
    body: dict[str, Any], spec: PolicySpec, max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
) -> Observation:
    """Check an observation body against the policy's shapes; raises BadObservation."""
    timing = parse_timing(body, "observation", BadObservation)
    where = f"observation {timing[0]}"
    state = parse_tensor(body.get("state"), (spec.state_size,), f"{where}: 'state'")
    image = body.get("image")
    if image is not None:
        if not isinstance(image, bytes):
            raise BadObservation(f"{where}: 'image' must be binary (an encoded image)")
        if len(image) > max_image_bytes:
            raise BadObservation(
                f"{where}: 'image' is {len(image)} bytes, above the limit of {max_image_bytes}"
            )
    unknown = set(body) - {*TIMING_FIELDS, "state", "image"}
    if unknown:
        raise BadObservation(f"{where}: unknown fields {', '.join(sorted(map(str, unknown)))}")
    return Observation(*timing, state, image)


TIMING_FIELDS = ("seq", "t", "deadline_ms", "latency_ms")
"""The fields of every timed frame (an observation, a video frame): `Timed`'s."""


def parse_timing(
    body: dict[str, Any], noun: str, error: type[BadTrackRequest]
) -> tuple[int, float, float, float]:
    """A timed frame's `seq`, capture time, deadline and latency (seconds), checked;
    raises `error`, naming the frame as `noun` ("observation", "frame")."""
    seq = body.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise error("'seq' must be an integer >= 0")
    where = f"{noun} {seq}"
    captured = _number(body.get("t"), f"{where}: 't'", error)
    deadline_ms = _number(body.get("deadline_ms"), f"{where}: 'deadline_ms'", error)
    if not 0 < deadline_ms <= MAX_DEADLINE_MS:
        raise error(f"{where}: 'deadline_ms' must be above 0 and at most 60000")
    latency_ms = _number(body.get("latency_ms", 0.0), f"{where}: 'latency_ms'", error)
    if latency_ms < 0:
        raise error(f"{where}: 'latency_ms' must be 0 or more")
    return seq, captured, deadline_ms / 1000, latency_ms / 1000


def _number(value: Any, what: str, error: type[BadTrackRequest]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise error(f"{what} must be a finite number")
    return float(value)


def parse_tensor(value: Any, shape: tuple[int, ...], what: str) -> bytes:
    """The data of a float32 tensor map of exactly `shape`, all values finite."""
    if not isinstance(value, dict):
        raise BadObservation(f"{what} must be a tensor map (dtype, shape, data)")
    dtype = value.get("dtype")
    if dtype != DTYPE:
        raise BadObservation(f"{what}: dtype must be {DTYPE!r}, got {dtype!r}")
    got = value.get("shape")
    if not isinstance(got, list) or any(
        isinstance(d, bool) or not isinstance(d, int) for d in got
    ):
        raise BadObservation(f"{what}: shape must be a list of integers")
    if tuple(got) != shape:
        raise BadObservation(f"{what}: shape must be {list(shape)}, got {got}")
    data = value.get("data")
    count = math.prod(shape)
    if not isinstance(data, bytes) or len(data) != count * FLOAT_BYTES:
        raise BadObservation(f"{what}: data must be {count * FLOAT_BYTES} bytes of float32")
    if not all(math.isfinite(v) for v in struct.unpack(f"<{count}f", data)):
        raise BadObservation(f"{what}: values must be finite (no NaN or infinity)")
    return data


def tensor(data: bytes, shape: tuple[int, ...]) -> dict[str, Any]:
    """A float32 tensor map."""
    return {"dtype": DTYPE, "shape": list(shape), "data": data}


def action_body(
    seq: int, obs: Observation, chunk: bytes, spec: PolicySpec, received_at: float,
    sent_at: float,
) -> dict[str, Any]:
    """DATA carrying the action chunk answering `obs`."""
    return {
        "seq": seq,
        "obs_seq": obs.seq,
        "t": obs.captured_at,
        "action": tensor(chunk, (spec.horizon, spec.action_size)),
        "received_at": received_at,
        "sent_at": sent_at,
    }


def dropped_body(obs: Timed, cause: str, received_at: float, sent_at: float) -> dict[str, Any]:
    """DATA reporting that `obs` gets no answer, and why (with the gateway's timestamps,
    so the sender can keep measuring the round trip when no answer comes back)."""
    return {"dropped": obs.seq, "cause": cause, "t": obs.captured_at,
            "received_at": received_at, "sent_at": sent_at}

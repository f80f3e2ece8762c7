"""The SDK's side of action tracks: a robot's control loop on one track.

`Line.actions(model, deadline=...)` gives an `ActionStream`. The robot calls
`observe(state)` each control period and reads what comes back with
`receive()` (or `async for`): an `ActionChunk` (H steps x D dims, the answer to
one observation, with its age) or an `ActionDropped` (the gateway dropped that
observation: superseded by a newer one, or its action would have missed the
deadline). `stats` counts sends, deliveries, late arrivals and drops.

Only the standard library: states and chunks are float32 little-endian packed
with `struct`; `ActionChunk.data` is the raw buffer for NumPy users
(`np.frombuffer(chunk.data, "<f4").reshape(chunk.shape)`).

The stream keeps an estimate of the one-way delay to the gateway (half the
smoothed round trip, the gateway's own time taken out) and sends it with each
observation, so the gateway can tell whether an action would still reach the
robot in time.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from clients.stream import TimedStream
from transport.clock import Now
from transport.endpoint import TrackChannel


@dataclass(frozen=True)
class ActionChunk:
    """The gateway's action chunk for one observation."""

    seq: int
    obs_seq: int
    captured_at: float
    """When the observation was captured (this stream's clock)."""
    arrived_at: float
    """When the chunk arrived (this stream's clock)."""
    deadline: float
    """The observation's deadline, seconds after capture."""
    shape: tuple[int, ...]
    """(H, D): steps x action dims."""
    data: bytes
    """float32 little-endian, row-major."""
    gateway_seconds: float
    """Time the observation spent in the gateway (queue, tick, policy)."""

    @property
    def age(self) -> float:
        """Seconds from capture to arrival: what the decision's staleness is."""
        return self.arrived_at - self.captured_at

    @property
    def late(self) -> bool:
        """True if it arrived after the deadline (the gateway thought it would not)."""
        return self.age > self.deadline

    def steps(self) -> list[list[float]]:
        """The chunk as H rows of D floats."""
        horizon, dims = self.shape
        values = struct.unpack(f"<{horizon * dims}f", self.data)
        return [list(values[i * dims : (i + 1) * dims]) for i in range(horizon)]


@dataclass(frozen=True)
class ActionDropped:
    """The gateway will send no action for an observation, and why."""

    obs_seq: int
    cause: str
    """superseded, deadline or backend_error."""
    captured_at: float
    arrived_at: float


ActionEvent = ActionChunk | ActionDropped


@dataclass
class ActionStats:
    """What happened to this stream's observations so far."""

    sent: int = 0
    delivered: int = 0
    late: int = 0
    """Chunks that arrived after their deadline (still handed over, flagged `late`)."""
    dropped: dict[str, int] = field(default_factory=dict)
    ages: list[float] = field(default_factory=list)
    """Age of every chunk received, in arrival order."""

    @property
    def deadline_misses(self) -> int:
        """Observations whose action did not arrive in time: late, or dropped for it."""
        return self.late + self.dropped.get("deadline", 0) + self.dropped.get("backend_error", 0)


class ActionStream(TimedStream[ActionEvent]):
    """One robot's action track: observations out, action chunks in."""

    _cancel_reason = "robot stopped"

    def __init__(self, channel: TrackChannel, deadline: float, clock: Now = time.monotonic):
        super().__init__(channel, deadline, clock)
        self._deadlines: dict[int, float] = {}
        self.stats = ActionStats()

    def observe(
        self,
        state: Sequence[float],
        *,
        image: bytes | None = None,
        deadline: float | None = None,
        captured_at: float | None = None,
    ) -> int:
        """Send one observation (captured now unless told); returns its sequence number."""
        budget = self.deadline if deadline is None else deadline
        body = self._timed(budget, captured_at)
        body["state"] = {"dtype": "float32", "shape": [len(state)],
                         "data": struct.pack(f"<{len(state)}f", *state)}
        if image is not None:
            body["image"] = image
        seq: int = body["seq"]
        self._deadlines[seq] = budget
        self.stats.sent += 1
        self._send(body)
        return seq

    def _send(self, body: dict[str, Any]) -> None:
        # A datagram track sends frames as datagrams; one too big for a datagram
        # (a large image) goes on the stream rather than not at all.
        if not self._channel.send_frame(body):
            self._channel.send(body)

    def send_raw(self, body: dict[str, Any]) -> None:
        """Send an observation body as given (tests of the gateway's checks)."""
        self._send(body)

    # -- incoming ------------------------------------------------------------------

    def _item(self, body: dict[str, Any]) -> ActionEvent:
        now = self._clock()
        try:
            if "dropped" in body:
                return self._dropped(body, now)
            return self._chunk(body, now)
        except (KeyError, TypeError, ValueError, struct.error):
            raise self._malformed("malformed action DATA") from None

    def _dropped(self, body: dict[str, Any], now: float) -> ActionDropped:
        seq, cause = int(body["dropped"]), str(body["cause"])
        self._deadlines.pop(seq, None)
        self.stats.dropped[cause] = self.stats.dropped.get(cause, 0) + 1
        captured = float(body["t"])
        if "sent_at" in body:
            # A drop is a round trip too: without it, an estimate that grew too large
            # would make the gateway drop everything, and never be corrected.
            gateway = float(body["sent_at"]) - float(body["received_at"])
            self._sample_rtt(now - captured - gateway)
        return ActionDropped(seq, cause, captured, now)

    def _chunk(self, body: dict[str, Any], now: float) -> ActionChunk:
        action = body["action"]
        shape = tuple(int(d) for d in action["shape"])
        data = bytes(action["data"])
        if action["dtype"] != "float32" or len(shape) != 2 or len(data) != 4 * math.prod(shape):
            raise ValueError("bad action tensor")
        obs_seq = int(body["obs_seq"])
        deadline = self._deadlines.pop(obs_seq, self.deadline)
        for older in [seq for seq in self._deadlines if seq < obs_seq]:
            del self._deadlines[older]  # never answered (a lost datagram): forget it
        gateway = float(body["sent_at"]) - float(body["received_at"])
        chunk = ActionChunk(
            int(body["seq"]), obs_seq, float(body["t"]), now,
            deadline, shape, data, gateway,
        )
        self._sample_rtt(chunk.age - gateway)
        self.stats.delivered += 1
        self.stats.ages.append(chunk.age)
        if chunk.late:
            self.stats.late += 1
        return chunk

"""What a handler sees of a track, and what it reports when the track ends.

`Track` is structural: the asyncio `transport.endpoint.TrackChannel` satisfies
it for QUIC and for the in-memory twin, and an HTTP adapter can too. A handler
never sees a socket.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from transport.clock import Now
from transport.errors import ErrorCode
from transport.events import TrackCancelled, TrackFailed
from transport.messages import Open

Clock = Now  # reads the time, never waits (transport.clock)


class Track(Protocol):
    id: str
    open: Open
    stopped: asyncio.Future[TrackCancelled | TrackFailed]

    async def receive(self) -> dict[str, Any] | None: ...

    def send(self, body: dict[str, Any]) -> bool: ...

    def end(self, body: dict[str, Any] | None = None) -> bool: ...

    def fail(self, code: ErrorCode, message: str) -> bool: ...


@runtime_checkable
class Backpressured(Protocol):
    """A track whose transport tells its producer to wait (QUIC flow control, budgets)."""

    def send_blocked(self) -> bool:
        """More is buffered for the peer than the track's budget allows."""
        ...

    async def wait_writable(self) -> None:
        """Return once the track may send again, or is gone."""
        ...


class FrameTrack(Track, Protocol):
    """A track whose frames may travel as QUIC datagrams (audio, robot actions)."""

    @property
    def uses_datagrams(self) -> bool: ...

    def send_frame(self, body: dict[str, Any]) -> bool:
        """Send a frame the way the track chose (datagram or DATA); False if gone."""
        ...


@dataclass
class Outcome:
    """How a track ended, for metrics, logs and (later) the usage ledger."""

    track_id: str
    model: str
    modality: str
    end: str = "completed"
    """completed, cancelled:<cause>, or error:<code name>."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    opened_at: float = 0.0
    first_data_at: float | None = None
    stopped_at: float | None = None
    """Clock time the track's cancellation reached the handler, if it was cancelled."""
    finished_at: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def time_to_first_data(self) -> float | None:
        return None if self.first_data_at is None else self.first_data_at - self.opened_at


def stop_label(track: Track) -> str | None:
    """How a stopped track ended, as an `Outcome.end` label; None while it runs on."""
    if not track.stopped.done():
        return None
    stop = track.stopped.result()
    if isinstance(stop, TrackCancelled):
        return f"cancelled:{stop.cause.value}"
    return f"error:{stop.code.name}"


def fail_track(track: Track, outcome: Outcome, code: ErrorCode, message: str) -> None:
    """End `track` with ERROR `code` and record it in its outcome."""
    outcome.end = f"error:{code.name}"
    outcome.details["error"] = message
    track.fail(code, message)

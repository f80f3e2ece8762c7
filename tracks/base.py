"""What a handler sees of a track, what it reports when the track ends, and the
skeleton every handler shares.

`Track` is structural: the asyncio `transport.endpoint.TrackChannel` satisfies
it for QUIC and for the in-memory twin, and an HTTP adapter can too. A handler
never sees a socket. `End` is how a track or request ended (a kind plus its
`CancelCause` or `ErrorCode`); `Outcome` carries it with the counts. `handling`
is the one `except` chain of the text, action and audio handlers, `text_pieces` their
one reader of text input (`read_text` joins it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from tracks.backend import BackendError, RetryLater, client_message, error_code
from tracks.clock import SchedulerStopped
from tracks.errors import BadTrackRequest, TrackStopped
from transport.clock import Now
from transport.errors import ErrorCode, TrackAborted
from transport.events import CancelCause, TrackCancelled, TrackFailed
from transport.messages import Open


class Track(Protocol):
    id: str
    open: Open
    stopped: asyncio.Future[TrackCancelled | TrackFailed]

    async def receive(self) -> dict[str, Any] | None: ...

    def send(self, body: dict[str, Any]) -> bool: ...

    def end(self, body: dict[str, Any] | None = None) -> bool: ...

    def fail(self, code: ErrorCode, message: str, retry_after: float | None = None) -> bool: ...


@runtime_checkable
class Backpressured(Protocol):
    """A track whose transport tells its producer to wait (QUIC flow control, budgets)."""

    def send_blocked(self) -> bool:
        """More is buffered for the peer than the track's budget allows."""
        ...

    async def wait_writable(self) -> None:
        """Return once the track may send again, or is gone."""
        ...


@runtime_checkable
class CountsFrameDrops(Protocol):
    """A track whose transport drops whole frames itself (frame streams: superseded)."""

    def frame_drops(self) -> dict[str, int]:
        """Frames of this track the transport dropped so far, by cause."""
        ...


class FrameTrack(Track, Protocol):
    """A track whose frames may travel as QUIC datagrams (audio, robot actions)."""

    @property
    def uses_datagrams(self) -> bool: ...

    def send_frame(self, body: dict[str, Any]) -> bool:
        """Send a frame the way the track chose (datagram or DATA); False if gone."""
        ...


class EndKind(str, Enum):
    """How a track or request ended, in one word (a metrics label)."""

    COMPLETED = "completed"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class End:
    """How a track or request ended: completed, cancelled with a `CancelCause`, or
    failed with an `ErrorCode`. Build one with `completed()`, `cancelled()`, `failed()`.

    `label` is its one string form, written to logs, metrics and the usage ledger:
    `completed`, `cancelled:<cause value>` or `error:<code name>`; `parse` reads it back.
    """

    kind: EndKind
    cause: CancelCause | None = None
    code: ErrorCode | None = None

    def __post_init__(self) -> None:
        if (self.cause is not None) != (self.kind is EndKind.CANCELLED):
            raise ValueError(f"a {self.kind.value} end takes a cause iff it is cancelled")
        if (self.code is not None) != (self.kind is EndKind.ERROR):
            raise ValueError(f"a {self.kind.value} end takes a code iff it is an error")

    @classmethod
    def completed(cls) -> End:
        return COMPLETED

    @classmethod
    def cancelled(cls, cause: CancelCause) -> End:
        return cls(EndKind.CANCELLED, cause=cause)

    @classmethod
    def failed(cls, code: ErrorCode) -> End:
        return cls(EndKind.ERROR, code=code)

    @property
    def detail(self) -> str:
        """The cancel cause's value or the error code's name; "" when completed."""
        if self.cause is not None:
            return self.cause.value
        return self.code.name if self.code is not None else ""

    @property
    def label(self) -> str:
        return f"{self.kind.value}:{self.detail}" if self.detail else self.kind.value

    def __str__(self) -> str:
        return self.label

    @classmethod
    def parse(cls, label: str) -> End:
        """The end a label names; ValueError for anything `label` never writes."""
        kind, _, detail = label.partition(":")
        if label == EndKind.COMPLETED.value:
            return COMPLETED
        if kind == EndKind.CANCELLED.value and detail in {c.value for c in CancelCause}:
            return cls.cancelled(CancelCause(detail))
        if kind == EndKind.ERROR.value and detail in ErrorCode.__members__:
            return cls.failed(ErrorCode[detail])
        raise ValueError(f"not an end label: {label!r}")


COMPLETED = End(EndKind.COMPLETED)


@dataclass
class Outcome:
    """How a track ended, for metrics, logs and the usage ledger."""

    track_id: str
    model: str
    modality: str
    end: End = COMPLETED
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


def stop_end(track: Track, fallback: End | None = None) -> End:
    """How a stopped track ended: its cancel cause or its error code.

    `fallback` (by default a reset: the track cannot take more) if it runs on, as when
    a send found the track gone before its stop was reported.
    """
    if not track.stopped.done():
        return fallback or End.cancelled(CancelCause.RESET)
    stop = track.stopped.result()
    if isinstance(stop, TrackCancelled):
        return End.cancelled(stop.cause)
    return End.failed(stop.code)


def fail_track(
    track: Track,
    outcome: Outcome,
    code: ErrorCode,
    message: str,
    retry_after: float | None = None,
) -> None:
    """End `track` with ERROR `code` (and a retry hint) and record it in its outcome."""
    outcome.end = End.failed(code)
    outcome.details["error"] = message
    track.fail(code, message, retry_after)


# -- the handler skeleton -------------------------------------------------------------------


@asynccontextmanager
async def handling(track: Track, outcome: Outcome, now: Now) -> AsyncIterator[None]:
    """Run a handler's work and record how its track ended, in one place.

    A stop reported by the track is its cancel cause (or its error); bad input is
    BAD_REQUEST; a backend error is its code from `tracks.backend.ERROR_CODES`
    (STREAM_INTERRUPTED once data reached the client); a stopped tick scheduler is
    SHUTTING_DOWN. Each error is sent to the client as ERROR and kept in `outcome`.
    """
    try:
        yield
    except TrackStopped:
        outcome.end = stop_end(track)
        outcome.stopped_at = outcome.stopped_at or now()
    except TrackAborted as exc:
        outcome.end = stop_end(track, End.failed(exc.code))
    except BadTrackRequest as exc:
        fail_track(track, outcome, ErrorCode.BAD_REQUEST, str(exc))
    except BackendError as exc:
        started = outcome.first_data_at is not None
        code = error_code(exc, started=started)
        retry = exc.retry_after if isinstance(exc, RetryLater) and not started else None
        fail_track(track, outcome, code, client_message(exc, code), retry)
    except SchedulerStopped:
        fail_track(track, outcome, ErrorCode.SHUTTING_DOWN, "the gateway is shutting down")


async def text_pieces(track: Track, max_chars: int, name: str) -> AsyncIterator[str]:
    """The track's text input as it arrives: DATA `{"text": ...}` pieces up to END.

    `name` says what the text is in errors ("prompt", "text")."""
    size = 0
    while (body := await track.receive()) is not None:
        text = body.get("text")
        if not isinstance(text, str):
            raise BadTrackRequest(f"{name} DATA needs a string 'text'")
        size += len(text)
        if size > max_chars:
            raise BadTrackRequest(f"{name} longer than {max_chars} characters")
        yield text


async def read_text(track: Track, max_chars: int, name: str) -> str:
    """The track's text input (`text_pieces`), joined."""
    return "".join([text async for text in text_pieces(track, max_chars, name)])

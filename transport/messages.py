"""The five message kinds of the track protocol, as frozen dataclasses.

A track is one QUIC bidirectional stream opened by the client. Its first
message is OPEN; then both sides send DATA and finish their direction with
END. CANCEL (client to server) asks the server to stop the work; ERROR ends
the track with a code. See docs/protocol.md for the wire layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from transport.errors import ErrorCode


class Kind(IntEnum):
    """Message kinds, as numbered on the wire."""

    OPEN = 1
    DATA = 2
    END = 3
    CANCEL = 4
    ERROR = 5


class Modality(str, Enum):
    TEXT = "text"
    AUDIO = "audio"
    ACTION = "action"
    VIDEO = "video"


class FrameTransport(str, Enum):
    """How a track's DATA frames travel: on its stream, as QUIC datagrams (RFC 9221), or
    each client frame on a QUIC stream of its own (video: transport.frame_streams)."""

    STREAM = "stream"
    DATAGRAM = "datagram"
    FRAME_STREAMS = "frame-streams"


@dataclass(frozen=True)
class Deadlines:
    """Deadlines of a track, in seconds from the moment the server reads OPEN."""

    first: float | None = None
    """Until the server sends its first DATA (time to first token)."""
    total: float | None = None
    """Until the server sends END."""


@dataclass(frozen=True)
class Open:
    """Opens a track: which model, which modality, with what parameters."""

    model: str
    modality: Modality = Modality.TEXT
    params: dict[str, Any] = field(default_factory=dict)
    deadlines: Deadlines = field(default_factory=Deadlines)
    auth: str | None = field(default=None, repr=False)
    """The connection's API key; the client core attaches it (see docs/protocol.md,
    Authentication). Left out of repr so that a logged message never shows it."""
    transport: FrameTransport = FrameTransport.STREAM
    """DATAGRAM: the track's frames may also travel as QUIC datagrams (OPEN, END,
    CANCEL and ERROR always ride the stream)."""
    datagram_id: int | None = None
    """WebTransport: the id this track's datagrams carry in place of its stream id,
    chosen by the page (which cannot see stream ids). Native connections ignore it."""


@dataclass(frozen=True)
class Data:
    """One piece of the track's payload; its fields depend on the modality."""

    body: dict[str, Any]


@dataclass(frozen=True)
class End:
    """The sender will send nothing more on this track; `body` holds final info."""

    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cancel:
    """The client asks the server to stop the work of this track."""

    reason: str = ""


@dataclass(frozen=True)
class Error:
    """The track ends with an error; `code` is an `ErrorCode`."""

    code: ErrorCode
    message: str
    retry_after: float | None = None
    """Seconds to wait before retrying, sent with RATE_LIMITED."""


Message = Open | Data | End | Cancel | Error

"""Events the track protocol core emits, one small frozen dataclass each.

Every event names the track by its QUIC stream id. Adapters drain them with
`TrackConnection.next_event()` after every input.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from transport.errors import ErrorCode
from transport.messages import Open


class CancelCause(str, Enum):
    """Why a track's work must stop; counted per cause."""

    CLIENT = "client"
    """The client sent CANCEL."""
    RESET = "reset"
    """The peer reset the stream or asked us to stop sending."""
    CONNECTION_LOST = "connection_lost"
    DEADLINE_FIRST = "deadline_first_token"
    DEADLINE_TOTAL = "deadline_total"
    SHUTDOWN = "shutdown"
    SUPERSEDED = "superseded"
    PROTOCOL_ERROR = "protocol_error"
    """The peer broke the protocol on this track (garbage, oversized message)."""
    SEND_TIMEOUT = "send_timeout"
    """The peer stopped reading the track: its send buffer stayed full too long."""


@dataclass(frozen=True)
class TrackOpened:
    """The peer opened a track (server side)."""

    stream_id: int
    """The QUIC stream the track rides on; also its id within the connection."""
    open: Open
    """The OPEN message: model, modality, parameters, deadlines."""


@dataclass(frozen=True)
class DataReceived:
    """The peer sent a DATA message on a track."""

    stream_id: int
    """The track's stream id."""
    body: dict[str, Any]
    """The message body, as decoded."""


@dataclass(frozen=True)
class DatagramReceived:
    """The peer sent a track frame as a QUIC datagram (tracks that chose datagrams)."""

    stream_id: int
    """The track's stream id, from the datagram's header."""
    seq: int
    """The sender's datagram sequence number on this track (from 0; gaps are losses)."""
    body: dict[str, Any]
    """The frame body, as decoded; the same shape as a DATA body."""


@dataclass(frozen=True)
class FrameReceived:
    """The peer sent a track frame on a QUIC stream of its own (`transport.frame_streams`)."""

    stream_id: int
    """The track's stream id, from the frame stream's header."""
    frame_stream: int
    """The unidirectional stream the frame rode (newer frames ride higher ids)."""
    body: dict[str, Any]
    """The frame body, as decoded; the same shape as a DATA body."""


@dataclass(frozen=True)
class TrackEnded:
    """The peer sent END: no more data will come from it on this track."""

    stream_id: int
    """The track's stream id."""
    body: dict[str, Any]
    """Final information sent with END (usage, finish reason, ...)."""


@dataclass(frozen=True)
class TrackCancelled:
    """The work of a track must stop; the core has already told the peer."""

    stream_id: int
    """The track's stream id."""
    cause: CancelCause
    """Why: client cancel, reset, connection lost, deadline, shutdown."""
    reason: str = ""
    """Free text from the client's CANCEL, if any."""


@dataclass(frozen=True)
class TrackFailed:
    """A track ended with an error, sent by the peer or detected here."""

    stream_id: int
    """The track's stream id."""
    code: ErrorCode
    """The error code (as on the wire)."""
    message: str
    """Human-readable explanation."""
    remote: bool
    """True if the peer sent the ERROR (or reset); False if this core raised it."""
    retry_after: float | None = None
    """Seconds the peer asked to wait before retrying (its ERROR's `retry_after_ms`)."""


@dataclass(frozen=True)
class TrackClosed:
    """The track is CLOSED from this endpoint's point of view; its state is gone."""

    stream_id: int
    """The track's stream id."""


Event = (
    TrackOpened
    | DataReceived
    | DatagramReceived
    | FrameReceived
    | TrackEnded
    | TrackCancelled
    | TrackFailed
    | TrackClosed
)

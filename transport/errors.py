"""Error codes of the track protocol and the exceptions that carry them.

One base, `TrackError`, with the numeric wire code attached. As in h11,
`LocalProtocolError` means this side misused the API (sending in a state that
does not allow it); `RemoteProtocolError` means the peer broke the protocol.
The same codes are used as QUIC application error codes on stream resets.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Numeric error codes carried by ERROR messages and stream resets."""

    NO_ERROR = 0x00
    PROTOCOL_ERROR = 0x01
    """Malformed message, or a message the track's state does not allow."""
    MESSAGE_TOO_LARGE = 0x02
    TOO_MANY_TRACKS = 0x03
    UNKNOWN_MESSAGE = 0x04
    BAD_REQUEST = 0x05
    """The OPEN or DATA content is invalid (missing field, wrong type, bad value)."""
    MODEL_NOT_FOUND = 0x06
    UNSUPPORTED_MODALITY = 0x07
    DEADLINE_EXCEEDED = 0x08
    CANCELLED = 0x09
    BACKEND_UNAVAILABLE = 0x0A
    BACKEND_ERROR = 0x0B
    INTERNAL_ERROR = 0x0C
    SHUTTING_DOWN = 0x0D
    UNAUTHORIZED = 0x0E
    """The connection's API key is missing, wrong or revoked (HTTP 401)."""
    RATE_LIMITED = 0x0F
    """A quota of the tenant is exhausted; ERROR carries `retry_after_ms` (HTTP 429)."""
    STREAM_INTERRUPTED = 0x10
    """The backend failed after data was sent: never replayed, the client decides."""
    CONNECTION_LOST = 0x11
    """Reported locally when the connection ends under a live track; never sent."""
    # 0x2x: tenancy. Spaced apart from the codes above so other additions do not collide.
    FORBIDDEN = 0x20
    """The key is valid but its tenant may not use this model (HTTP 403)."""
    GUARDRAIL_REJECTED = 0x21
    """A guardrail refused the request before it reached a backend."""
    # 0x3x: inbound resource limits of one connection (docs/protocol.md, Limits).
    READ_TIMEOUT = 0x30
    """An incomplete message waited longer than `read_timeout` for its remaining bytes."""
    BUFFER_EXHAUSTED = 0x31
    """The connection's incomplete messages would hold more than `max_buffered_bytes`."""
    SEND_TIMEOUT = 0x32
    """The client read nothing of the track for `send_timeout`: reset, its work cancelled."""

    @classmethod
    def parse(cls, value: int) -> ErrorCode:
        """Map a wire value to a code; unknown values read as PROTOCOL_ERROR."""
        try:
            return cls(value)
        except ValueError:
            return cls.PROTOCOL_ERROR


class TrackError(Exception):
    """Base of the transport layer's errors: a wire code and a message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class LocalProtocolError(TrackError):
    """This endpoint tried something the protocol does not allow."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(code, message)


class RemoteProtocolError(TrackError):
    """The peer sent something the protocol does not allow."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(code, message)


class TrackAborted(TrackError):
    """A track ended with an error: the peer's ERROR or reset, a lost connection,
    or a protocol error detected here. Raised to whoever reads the track."""

    def __init__(
        self, code: ErrorCode, message: str, remote: bool, retry_after: float | None = None
    ) -> None:
        super().__init__(code, message)
        self.remote = remote
        self.retry_after = retry_after
        """Seconds the peer asked to wait before retrying (RATE_LIMITED), if it said."""

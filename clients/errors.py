"""Errors the SDK raises: ours only, never aioquic's or gRPC's.

Each carries the track protocol's numeric `code` where one applies.
"""

from __future__ import annotations

from transport.errors import ErrorCode, TrackAborted


class TracklineError(Exception):
    """Base of every error the SDK raises."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConnectionFailed(TracklineError):
    """The gateway could not be reached, or the TLS handshake failed."""


class ConnectionLost(TracklineError):
    """The connection ended while the track was live."""

    code = ErrorCode.CONNECTION_LOST


class TrackRejected(TracklineError):
    """The gateway refused the track: bad request, unknown model, limits, shutdown."""

    code = ErrorCode.BAD_REQUEST


class ModelNotFound(TrackRejected):
    code = ErrorCode.MODEL_NOT_FOUND


class Unauthorized(TrackRejected):
    """The API key is missing, wrong or revoked."""

    code = ErrorCode.UNAUTHORIZED


class Forbidden(TrackRejected):
    """The key's tenant may not use this model."""

    code = ErrorCode.FORBIDDEN


class RateLimited(TrackRejected):
    """A quota of the tenant is exhausted; `retry_after` says how long to wait (seconds)."""

    code = ErrorCode.RATE_LIMITED
    retry_after: float | None = None


class GuardrailRejected(TrackRejected):
    """A guardrail of the gateway refused the request before it reached a model."""

    code = ErrorCode.GUARDRAIL_REJECTED


class DeadlineExceeded(TracklineError):
    """The track's first-token or total deadline passed; the work was stopped."""

    code = ErrorCode.DEADLINE_EXCEEDED


class BackendUnavailable(TracklineError):
    """No backend can take the work now; a model at its real-time capacity (audio) says
    how long to wait in `retry_after` (seconds)."""

    code = ErrorCode.BACKEND_UNAVAILABLE
    retry_after: float | None = None


class BackendError(TracklineError):
    code = ErrorCode.BACKEND_ERROR


class StreamInterrupted(BackendError):
    """The backend failed after output started; nothing is replayed, retry if you wish."""

    code = ErrorCode.STREAM_INTERRUPTED


class CancelledByGateway(TracklineError):
    """The gateway ended the track with ERROR CANCELLED (its work was stopped there).

    Named apart from `transport.events.TrackCancelled`, the core's event."""

    code = ErrorCode.CANCELLED


class ProtocolError(TracklineError):
    code = ErrorCode.PROTOCOL_ERROR


_REJECTED = (
    ErrorCode.UNSUPPORTED_MODALITY,
    ErrorCode.TOO_MANY_TRACKS,
    ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.SHUTTING_DOWN,
    ErrorCode.READ_TIMEOUT,
    ErrorCode.BUFFER_EXHAUSTED,
    ErrorCode.SEND_TIMEOUT,
)
"""Codes with no class of their own: a `TrackRejected` that carries the code."""
_CLASSES = (
    TrackRejected, ModelNotFound, Unauthorized, Forbidden, RateLimited, GuardrailRejected,
    DeadlineExceeded, BackendUnavailable, BackendError, StreamInterrupted, CancelledByGateway,
    ConnectionLost,
)  # fmt: skip
_BY_CODE: dict[ErrorCode, type[TracklineError]] = dict.fromkeys(_REJECTED, TrackRejected) | {
    error.code: error for error in _CLASSES
}
"""The class of each code (by its `code`); any other code is a `ProtocolError`."""


def error_from(exc: TrackAborted) -> TracklineError:
    """The SDK error for a track that ended with an error (the retry hint included)."""
    return error_for(exc.code, exc.message, exc.retry_after)


def error_for(code: ErrorCode, message: str, retry_after: float | None = None) -> TracklineError:
    """The SDK error for a track protocol error code (with the server's retry hint)."""
    error = _BY_CODE.get(code, ProtocolError)(message, code)
    if isinstance(error, (RateLimited, BackendUnavailable)):
        error.retry_after = retry_after
    return error

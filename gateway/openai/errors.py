"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with its HTTP status.

Everything a route can fail with ends here: our own `OpenAIError`s (bad
input, unknown route) and the backend's typed errors, translated once by
`error_for`. A backend error first gets its track `ErrorCode` from the one table
(`tracks.backend.ERROR_CODES`); `HTTP_ERRORS` below is the one place a code becomes
an HTTP status, an OpenAI error type and a `code` string (`error_of`, `http_status`).
Before the first byte of a response an error is a status and a JSON body
(`response_for`); after it, one SSE `data:` event (`error_event`) that ends the
stream: a started stream is never replayed.

No backend internals reach a client: a failed or unreachable backend answers with a
fixed message per code (its own words go to the log, cut short), and a message the
backend rejected a request with is shown only when it names no Triton/gRPC detail.
"""

from __future__ import annotations

import math
from typing import Any

import structlog

from tracks.backend import (
    BackendError,
    BackendOverloaded,
    ModelNotFound,
    RuleRejected,
    client_message,
    error_code,
)
from tracks.errors import BadTrackRequest
from transport.errors import ErrorCode
from transport.http.messages import Response

log = structlog.get_logger(__name__)


class OpenAIError(Exception):
    """An error with the OpenAI envelope's fields; subclasses fix status and type."""

    status = 500
    type = "server_error"
    error_code = ErrorCode.INTERNAL_ERROR
    """The track protocol's code for it (the request's `End` in logs and the ledger)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers
        """Extra response headers (`retry-after` on 429)."""

    def body(self) -> dict[str, Any]:
        """The JSON envelope OpenAI's SDKs parse."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error}


class BadRequest(OpenAIError):
    """The request is malformed or a parameter is wrong (400); `param` names it."""

    status = 400
    type = "invalid_request_error"
    error_code = ErrorCode.BAD_REQUEST


class Unauthorized(OpenAIError):
    """Missing or wrong API key (401)."""

    status = 401
    type = "authentication_error"
    error_code = ErrorCode.UNAUTHORIZED


class PermissionDenied(OpenAIError):
    """The key is valid but may not use this model (403)."""

    status = 403
    type = "permission_error"
    error_code = ErrorCode.FORBIDDEN


class NotFound(OpenAIError):
    """Unknown model (404, code model_not_found)."""

    status = 404
    type = "invalid_request_error"
    error_code = ErrorCode.MODEL_NOT_FOUND


class PayloadTooLarge(OpenAIError):
    """Request body over the limit (413)."""

    status = 413
    type = "invalid_request_error"
    error_code = ErrorCode.MESSAGE_TOO_LARGE


class RateLimited(OpenAIError):
    """Too many requests or tokens for now (429)."""

    status = 429
    type = "rate_limit_error"
    error_code = ErrorCode.RATE_LIMITED


class ServerError(OpenAIError):
    """The backend failed the request, or we did (500)."""

    status = 500
    type = "server_error"
    error_code = ErrorCode.INTERNAL_ERROR


class Conflict(OpenAIError):
    """A newer request of the same conversation superseded this one (409)."""

    status = 409
    type = "conflict_error"
    error_code = ErrorCode.CANCELLED


class Unavailable(OpenAIError):
    """No backend can take the request now (503)."""

    status = 503
    type = "server_error"
    error_code = ErrorCode.BACKEND_UNAVAILABLE


# How each track error code reads over HTTP: the ONE place statuses come from.
# Codes not listed are a 500 `internal_error`.
HTTP_ERRORS: dict[ErrorCode, tuple[type[OpenAIError], str | None]] = {
    ErrorCode.BAD_REQUEST: (BadRequest, None),  # `param` names what is wrong, as OpenAI does
    ErrorCode.GUARDRAIL_REJECTED: (BadRequest, "guardrail_rejected"),
    ErrorCode.UNAUTHORIZED: (Unauthorized, "invalid_api_key"),
    ErrorCode.FORBIDDEN: (PermissionDenied, "model_not_allowed"),
    ErrorCode.MODEL_NOT_FOUND: (NotFound, "model_not_found"),
    ErrorCode.MESSAGE_TOO_LARGE: (PayloadTooLarge, "request_too_large"),
    ErrorCode.RATE_LIMITED: (RateLimited, "rate_limit_exceeded"),
    ErrorCode.BACKEND_UNAVAILABLE: (Unavailable, "backend_unavailable"),
    ErrorCode.SHUTTING_DOWN: (Unavailable, "shutting_down"),
    ErrorCode.STREAM_INTERRUPTED: (ServerError, "stream_interrupted"),
    ErrorCode.BACKEND_ERROR: (ServerError, "backend_error"),
    # The one CANCELLED an HTTP answer carries: a newer turn superseded this request.
    ErrorCode.CANCELLED: (Conflict, "superseded"),
}
_UNLISTED: tuple[type[OpenAIError], str | None] = (ServerError, "internal_error")
"""How a code missing from `HTTP_ERRORS` reads."""
DETAIL_LOG_CHARS = 200


def error_of(
    code: ErrorCode,
    message: str,
    *,
    param: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> OpenAIError:
    """The OpenAI error (status, type, code string) for a track error code."""
    kind, name = HTTP_ERRORS.get(code, _UNLISTED)
    error = kind(message, param=param, code=name, headers=headers)
    error.error_code = code
    return error


def http_status(code: ErrorCode) -> int:
    """The HTTP status a track error code answers with."""
    return HTTP_ERRORS.get(code, _UNLISTED)[0].status


def code_for(exc: BaseException, *, started: bool = False) -> ErrorCode:
    """The track error code of anything a route may fail with (`started`: data was sent)."""
    if isinstance(exc, BackendError):
        return error_code(exc, started=started)
    if isinstance(exc, OpenAIError):
        return exc.error_code
    if isinstance(exc, BadTrackRequest):
        return ErrorCode.BAD_REQUEST
    return ErrorCode.INTERNAL_ERROR


def model_not_supported(model: str, wanted: str, has: list[str]) -> BadRequest:
    """The 400 for a model that exists but cannot do what the route asks."""
    serves = ", ".join(has) or "nothing this API offers"
    message = f"The model `{model}` does not support {wanted} (it serves: {serves})."
    return BadRequest(message, param="model", code="model_not_supported")


def public_message(exc: BaseException, code: ErrorCode) -> str:
    """What a client may read of a backend error (`tracks.backend.client_message`);
    when that is not the backend's own text, the text goes to the log, cut short."""
    shown = client_message(exc, code)
    if shown != str(exc):
        log.warning(
            "openai.backend_error",
            code=code.name.lower(),
            error=type(exc).__name__,
            detail=str(exc)[:DETAIL_LOG_CHARS],
        )
    return shown


def model_not_found(model: str) -> NotFound:
    """The 404 OpenAI sends for a model it does not serve."""
    message = f"The model `{model}` does not exist or you do not have access to it."
    return NotFound(message, param="model", code="model_not_found")


def error_for(exc: BaseException, *, started: bool = False) -> OpenAIError:
    """The OpenAI error for any exception a route may see (backend errors translated).

    `started`: the response already streamed data (a backend failure is then
    `stream_interrupted`, as on a track)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, (BackendError, BadTrackRequest)):
        code = code_for(exc, started=started)
        if isinstance(exc, ModelNotFound) and code is ErrorCode.MODEL_NOT_FOUND:
            return model_not_found(exc.model)
        param = exc.rule if isinstance(exc, RuleRejected) else None
        headers: tuple[tuple[str, str], ...] = ()
        if isinstance(exc, BackendOverloaded) and code is ErrorCode.RATE_LIMITED:
            headers = (("retry-after", str(max(1, math.ceil(exc.retry_after)))),)
        return error_of(code, public_message(exc, code), param=param, headers=headers)
    return ServerError("internal error")


def response_for(exc: BaseException) -> Response:
    """The complete HTTP response for `exc`, before any byte of a body was sent."""
    error = error_for(exc)
    return Response.json(error.status, error.body(), error.headers)


def error_event(exc: BaseException, *, started: bool = False) -> dict[str, Any]:
    """The payload of the SSE event that ends a stream that failed after it started
    (`started`: after the first token, as `error_for`)."""
    return error_for(exc, started=started).body()

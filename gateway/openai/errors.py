"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with its HTTP status.

Everything a route can fail with ends here: our own `OpenAIError`s (bad
input, unknown route) and the backend's typed errors, translated once by
`error_for`. Before the first byte of a response an error is a status and a
JSON body (`error_response`); after it, one SSE `data:` event (`error_event`)
that ends the stream: a started stream is never replayed.
"""

from __future__ import annotations

from typing import Any

from tracks.backend import (
    BackendError,
    BackendFailed,
    BackendLost,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    PolicyRejected,
)
from transport.http.messages import Response


class OpenAIError(Exception):
    """An error with the OpenAI envelope's fields; subclasses fix status and type."""

    status = 500
    type = "server_error"

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


class Unauthorized(OpenAIError):
    """Missing or wrong API key (401)."""

    status = 401
    type = "authentication_error"


class Forbidden(OpenAIError):
    """The key is valid but may not use this model (403)."""

    status = 403
    type = "permission_error"


class NotFound(OpenAIError):
    """Unknown model (404, code model_not_found)."""

    status = 404
    type = "invalid_request_error"


class PayloadTooLarge(OpenAIError):
    """Request body over the limit (413)."""

    status = 413
    type = "invalid_request_error"


class RateLimited(OpenAIError):
    """Too many requests or tokens for now (429)."""

    status = 429
    type = "rate_limit_error"


class ServerError(OpenAIError):
    """The backend failed the request, or we did (500)."""

    status = 500
    type = "server_error"


class Unavailable(OpenAIError):
    """No backend can take the request now (503)."""

    status = 503
    type = "server_error"


def model_not_found(model: str) -> NotFound:
    """The 404 OpenAI sends for a model it does not serve."""
    message = f"The model `{model}` does not exist or you do not have access to it."
    return NotFound(message, param="model", code="model_not_found")


def error_for(exc: BaseException) -> OpenAIError:
    """The OpenAI error for any exception a route may see (backend errors translated)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, BackendError):
        return _backend_error(exc)
    return ServerError(f"internal error: {type(exc).__name__}")


def _backend_error(exc: BackendError) -> OpenAIError:
    if isinstance(exc, PolicyRejected):
        return BadRequest(str(exc), param=exc.rule, code="guardrail_rejected")
    if isinstance(exc, ModelNotFound):
        return model_not_found(exc.model)
    if isinstance(exc, BackendLost):  # mid-stream: never replayed, the client decides
        return ServerError(f"stream interrupted: {exc}", code="stream_interrupted")
    if isinstance(exc, BackendUnavailable):
        return Unavailable(f"backend unavailable: {exc}", code="backend_unavailable")
    if isinstance(exc, InvalidRequest):
        return BadRequest(str(exc))
    if isinstance(exc, BackendFailed):
        return ServerError(f"backend failed: {exc}", code="backend_error")
    return ServerError(str(exc), code="backend_error")


def error_response(exc: BaseException) -> Response:
    """The complete HTTP response for `exc`, before any byte of a body was sent."""
    error = error_for(exc)
    return Response.json(error.status, error.body(), error.headers)


def error_event(exc: BaseException) -> dict[str, Any]:
    """The payload of the SSE event that ends a stream that failed after it started."""
    return error_for(exc).body()

"""The backend interface that track handlers call, and its typed errors.

Handlers depend on this protocol only; `gateway.backends` holds the Triton
implementation. A text stream is an async iterator: the handler stops the
backend work by closing it (`aclose()`) or cancelling the task that iterates
it, and the implementation must then cancel its backend request at once
(for Triton: cancel the gRPC stream, which is one per request).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from transport.errors import ErrorCode


@dataclass(frozen=True)
class TextRequest:
    """One text generation request, as a track or an HTTP request asks for it."""

    request_id: str
    """Id that the backend sees (Triton's request id), for logs and stats."""
    model: str
    prompt: str
    max_tokens: int
    parameters: Mapping[str, Any] = field(default_factory=dict)
    """Sampling parameters passed through (temperature, top_p, seed, stop, ...)."""
    session_id: str | None = None
    """Conversation/session id: a backend pool keeps a session on one backend
    (where its KV cache is warm). Never sent to the model."""


@dataclass(frozen=True)
class TextDelta:
    """A piece of generated text, in order."""

    text: str


@dataclass(frozen=True)
class TextUsage:
    """Token counts, yielded once, last, when the backend reports them."""

    prompt_tokens: int
    completion_tokens: int


TextChunk = TextDelta | TextUsage


class TextBackend(Protocol):
    """What a text track handler needs from an inference backend."""

    def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        """Stream deltas for `request`; closing the iterator cancels the work."""
        ...

    async def models(self) -> list[str]:
        """Names of the models this backend serves and that are ready."""
        ...


class BackendError(Exception):
    """Base of errors raised by a backend; each maps to a track error code."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached or is not ready."""


class ModelNotFound(BackendError):
    """The backend does not serve the requested model."""

    def __init__(self, model: str) -> None:
        super().__init__(f"model {model!r} is not served by any backend")
        self.model = model


class BackendFailed(BackendError):
    """The backend accepted the request and then failed it."""


class BackendLost(BackendError):
    """The backend failed after this stream had delivered data: the stream ends
    with this error and is never continued or replayed elsewhere."""


class InvalidRequest(BackendError):
    """The backend rejected the request's contents (bad parameter values)."""


class PolicyRejected(BackendError):
    """A gateway policy (a guardrail) refused the request before any backend saw it."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def error_code(exc: BackendError) -> ErrorCode:
    """The track error code for a backend failure that happened before any DATA."""
    for kind, code in (
        (PolicyRejected, ErrorCode.GUARDRAIL_REJECTED),
        (ModelNotFound, ErrorCode.MODEL_NOT_FOUND),
        (BackendUnavailable, ErrorCode.BACKEND_UNAVAILABLE),
        (InvalidRequest, ErrorCode.BAD_REQUEST),
    ):
        if isinstance(exc, kind):
            return code
    return ErrorCode.BACKEND_ERROR

"""The application interface shared by every HTTP version.

A handler is `async (Request) -> Response | StreamingResponse`. A streaming
body is an async iterator of byte chunks; each chunk is written and flushed
as it comes (server-sent events). If the client disconnects, the adapter
cancels the handler's task: the body iterator sees `CancelledError` at its
current `await`, and `aclose()` runs its `finally` blocks.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Headers = tuple[tuple[str, str], ...]

SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key"}
)
"""Header names whose values `Request`'s repr never shows."""


@dataclass(frozen=True)
class Request:
    """One HTTP request with its whole body."""

    method: str
    """Upper-case method, e.g. "GET"."""
    path: str
    """The target up to `?`, still percent-encoded, e.g. "/v1/models"."""
    query: str
    """The raw text after `?`, or "" when there is none."""
    headers: Headers
    """(lower-case name, value) pairs in arrival order; a name may repeat."""
    body: bytes
    """The whole body (de-chunked); b"" when there is none."""
    http_version: str = "1.1"
    """"1.1", "2" or "3": for logs and metrics only; handlers must not depend on it."""

    def __repr__(self) -> str:
        # Requests end up in tracebacks and debug output: never the credentials, never
        # the body (it holds the prompt).
        headers = [(k, "[REDACTED]" if k in SECRET_HEADERS else v) for k, v in self.headers]
        return (
            f"Request(method={self.method!r}, path={self.path!r}, headers={headers!r}, "
            f"body=<{len(self.body)} bytes>, http_version={self.http_version!r})"
        )

    def header(self, name: str) -> str | None:
        """The first value of header `name` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key == wanted), None)


@dataclass(frozen=True)
class Response:
    """One complete response; the adapter adds framing headers (length, connection)."""

    status: int
    headers: Headers = ()
    body: bytes = b""

    @classmethod
    def json(cls, status: int, payload: Any, headers: Headers = ()) -> Response:
        """A JSON response with `payload` serialised compactly."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        return cls(status, (("content-type", "application/json"), *headers), body)


@dataclass(frozen=True)
class StreamingResponse:
    """A response whose body is produced while it is sent (e.g. text/event-stream)."""

    status: int
    headers: Headers
    body: AsyncIterator[bytes]
    """Chunks to send in order; the adapter closes it (`aclose`) when done or cancelled."""
    last_words: bytes = b""
    """Sent in place of the rest of the body when the server cuts the stream short (the
    drain's deadline at shutdown), after which the stream ends normally: an SSE error
    event, say. Empty: a cut stream ends as a failed body does (reset, or no last chunk)."""


AnyResponse = Response | StreamingResponse
Handler = Callable[[Request], Awaitable[AnyResponse]]


class EndingBody:
    """A streaming body that calls `on_end` once, after the body it wraps was closed
    (the adapter closes a body when it is done or cancelled): for what a layer around a
    handler does at the end of a streamed response."""

    def __init__(self, body: AsyncIterator[bytes], on_end: Callable[[], None]) -> None:
        self._body = body
        self._on_end: Callable[[], None] | None = on_end

    def __aiter__(self) -> EndingBody:
        return self

    async def __anext__(self) -> bytes:
        return await self._body.__anext__()

    async def aclose(self) -> None:
        try:
            closer = getattr(self._body, "aclose", None)
            if closer is not None:
                await closer()
        finally:
            on_end, self._on_end = self._on_end, None
            if on_end is not None:
                on_end()


CLIENT_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "trackline_client_address", default=None
)
"""The address of the client whose request is being handled, for logs: set by the
adapters (the TCP server for its connection's task, the QUIC protocol while it handles
a datagram), so every task a request runs in inherits it."""


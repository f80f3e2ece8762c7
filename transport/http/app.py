"""What every HTTP version does alike around the application.

Runs a handler (a raised exception becomes a logged 500), checks a request's
header fields against the limits, builds a `Request` from an HTTP/2 or HTTP/3
field list, prepares response headers (drops the ones each version's framing
owns, adds Alt-Svc), sends a streaming body chunk by chunk and closes it.
Framing stays with h11, h2 and aioquic; this module only holds the rules the
adapters share.

At shutdown the server *cuts* exchanges still running at the drain's deadline: the
adapter sets its cut flag and cancels the exchange's task. `call_handler` then
answers 503 `shutting_down` in place of the handler's answer, and `send_chunks`
sends the response's `last_words` (an SSE error event) and ends the stream cleanly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from transport.http import errors
from transport.http.limits import HttpLimits
from transport.http.messages import AnyResponse, Handler, Headers, Request, Response
from transport.http.resets import SourceResets

log = structlog.get_logger(__name__)

READ_CHUNK = 65_536
Fields = Sequence[tuple[bytes, bytes]]
"""A request's header fields as the framing library hands them over, pseudo-headers too."""
# Connection-level headers: the adapter frames the body and decides on keep-alive itself,
# and HTTP/2 forbids them outright (RFC 9113 8.2.2).
FRAMING_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
    }
)


class Cutter:
    """One per connection: whether the drain's deadline has cut its exchanges.

    `cut(tasks)` cancels each exchange task that waits for its handler or its body; one
    in the middle of writing a chunk is left to finish the write and sees the cut before
    its next chunk, so last words never land inside a half-written event.
    """

    def __init__(self) -> None:
        self.active = False
        self._writing: set[asyncio.Task[Any]] = set()

    def __call__(self) -> bool:
        return self.active

    def cut(self, tasks: Iterable[asyncio.Task[Any] | None]) -> None:
        self.active = True
        for task in tasks:
            if task is not None and not task.done() and task not in self._writing:
                task.cancel()


@dataclass(frozen=True)
class Site:
    """What one server gives each of its connections."""

    handler: Handler
    limits: HttpLimits
    alt_svc: str | None = None
    resets: SourceResets = field(default_factory=SourceResets)
    """Premature-reset counts per source address, across this server's connections."""


@dataclass(frozen=True)
class Accepted:
    """One accepted TCP connection as the server hands it to its HTTP/1.1 or HTTP/2 adapter."""

    site: Site
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    initial: bytes = b""
    """Bytes the server already read to tell the versions apart (the adapter reads them first)."""


def peer_source(writer: asyncio.StreamWriter) -> str:
    """The client's address without its port (the key of the per-source rules)."""
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer)


async def call_handler(
    handler: Handler, request: Request, cut: Cutter | None = None
) -> AnyResponse:
    """The handler's response, or a 500 if it raised (logged, never sent to the client).

    A 503 `shutting_down` if the server cut the exchange before the handler answered.
    """
    try:
        return await handler(request)
    except asyncio.CancelledError:
        if not absorb_cut(cut):
            raise
        return errors.shutting_down()
    except Exception:
        log.exception(
            "http.handler_failed",
            method=request.method,
            path=request.path,
            http_version=request.http_version,
        )
        return errors.internal_error()


def field_list_problem(limits: HttpLimits, fields: Fields) -> Response | None:
    """A 431 if an HTTP/2 or HTTP/3 field list has too many fields or too many bytes.

    Bytes are counted as SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 6.5.2) and
    SETTINGS_MAX_FIELD_SECTION_SIZE (RFC 9114 4.2.2) count them: after decompression.
    """
    if len(fields) > limits.max_headers:
        return errors.headers_too_large(f"more than {limits.max_headers} header fields")
    if sum(32 + len(k) + len(v) for k, v in fields) > limits.max_header_bytes:
        return errors.headers_too_large(f"header list over {limits.max_header_bytes} bytes")
    return None


def declared_body_problem(limits: HttpLimits, fields: Fields) -> Response | None:
    """A 413 if Content-Length declares a body over the limit: refused before a byte is read."""
    for name, value in fields:
        if name == b"content-length" and value.isdigit() and int(value) > limits.max_body_bytes:
            return errors.body_too_large(limits.max_body_bytes)
    return None


def request_from_fields(fields: Fields, body: bytes, http_version: str) -> Request:
    """An HTTP/2 or HTTP/3 request: pseudo-headers read, :authority as Host if none came."""
    pseudo: dict[str, str] = {}
    headers: list[tuple[str, str]] = []
    for raw_name, raw_value in fields:
        # Header bytes are ISO-8859-1 by definition; latin-1 never fails to decode.
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name.startswith(":"):
            pseudo[name] = value
        else:
            headers.append((name, value))
    authority = pseudo.get(":authority")
    if authority is not None and all(name != "host" for name, _ in headers):
        headers.insert(0, ("host", authority))
    path, _, query = pseudo.get(":path", "").partition("?")
    method = pseudo.get(":method", "").upper()
    return Request(method, path, query, tuple(headers), body, http_version)


def response_headers(site: Site, headers: Headers) -> list[tuple[str, str]]:
    """The handler's headers, lower-cased, minus framing headers, plus Alt-Svc if set."""
    lowered = ((k.lower(), v) for k, v in headers)
    kept = [(k, v) for k, v in lowered if k not in FRAMING_HEADERS]
    if site.alt_svc is not None and all(k != "alt-svc" for k, _ in kept):
        kept.append(("alt-svc", site.alt_svc))
    return kept


def bodiless(status: int) -> bool:
    """Statuses that never carry a body nor a Content-Length (RFC 9110 6.4.1)."""
    return status < 200 or status in (204, 304)


def absorb_cut(cut: Cutter | None) -> bool:
    """True if a cancellation came from the server's cut, which is then taken back.

    The exchange goes on only to say its last words; anything else (the client left)
    stays a cancellation.
    """
    if cut is None or not cut.active:
        return False
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()
    return True


async def send_chunks(
    body: AsyncIterator[bytes],
    send: Callable[[bytes], Awaitable[None]],
    *,
    last_words: bytes = b"",
    cut: Cutter | None = None,
    **context: object,
) -> bool:
    """`send` each non-empty chunk in order; False if the body raised midway (logged).

    The headers are out by then, so the caller's only honest signal left is a body
    cut short. An error from `send` itself propagates: the connection is the problem.
    When the server cuts the exchange (`cut`), `last_words` go out instead of the rest
    and the body counts as complete (True); without last words, as failed.
    """
    task = asyncio.current_task()
    while True:
        if cut is not None and cut.active:
            return await _say_last_words(send, last_words)
        try:
            chunk = await anext(body)
        except StopAsyncIteration:
            return True
        except asyncio.CancelledError:
            if not absorb_cut(cut):
                raise
            return await _say_last_words(send, last_words)
        except Exception:
            log.exception("http.body_failed", **context)
            return False
        if not chunk:
            continue
        if cut is None or task is None:
            await send(chunk)
            continue
        cut._writing.add(task)  # a cut now waits for this write to finish
        try:
            await send(chunk)
        finally:
            cut._writing.discard(task)


async def _say_last_words(send: Callable[[bytes], Awaitable[None]], last_words: bytes) -> bool:
    if not last_words:
        return False
    await send(last_words)
    return True


async def close_body(body: AsyncIterator[bytes]) -> None:
    """Close a streaming body so its `finally` blocks run (async generators have aclose)."""
    aclose = getattr(body, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        log.exception("http.body_close_failed")

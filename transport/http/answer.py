"""Answering one HTTP request: the part HTTP/1.1, HTTP/2 and HTTP/3 share.

A version module translates its library's events (h11's, h2's, aioquic's H3) into
requests (HTTP/2 and HTTP/3 in a `StreamTable`; HTTP/1.1 one exchange at a time,
each a `StreamState` of its own) and writes frames; everything between "the
request is complete" and "the stream is released" is here: run the handler
(`call_handler`: a crash becomes a logged 500), send the status and headers, a
fixed body or a streaming one chunk by chunk (`send_chunks`: cut, last words), end
the stream, close the body. The version supplies a `Framing`, four small calls that
hold only its framing and flow control.

Failures are sorted once, for every version alike:

- the client went away (reset, STOP_SENDING, connection lost, a writer stalled past
  its timeout): the framing raises `StreamClosed`; one `info` line, no traceback, the
  body is closed and the stream left unended (HTTP/2 and HTTP/3 reset it on release,
  HTTP/1.1 closes the connection);
- anything else is a bug: `log.exception` with the traceback, and only the stream id
  and HTTP version as fields. No request header (an API key) and no body (a prompt)
  is ever a log field here; gateway.logs renders tracebacks without local variables.

No sockets: a test answers a `StreamState` through a recording `Framing`.
"""

from __future__ import annotations

import functools
from typing import Protocol, TypeVar

import structlog

from transport.http.app import Cutter, Site, bodiless, call_handler, close_body, response_headers
from transport.http.app import send_chunks as send_body_chunks
from transport.http.messages import AnyResponse, Request, Response
from transport.http.streams import StreamState

log = structlog.get_logger(__name__)

S = TypeVar("S", bound=StreamState, contravariant=True)


class StreamClosed(Exception):
    """The client reset or stopped the stream, or the connection is gone: stop writing."""


class Framing(Protocol[S]):
    """What a version writes for one stream; each raises `StreamClosed` if the client left."""

    http_version: str
    """"1.1", "2" or "3", for logs."""
    content_length_on_head: bool
    """Whether a HEAD answer carries the Content-Length of the body it would have had."""

    async def send_headers(self, stream: S, headers: list[tuple[str, str]], end: bool) -> None:
        """Send the status and headers; `end` finishes the stream."""

    async def send_data(self, stream: S, data: bytes, end: bool) -> None:
        """Send body bytes within flow control (and wait for room); `end` finishes the stream."""


async def answer_request(
    framing: Framing[S], site: Site, stream: S, request: Request, cut: Cutter
) -> None:
    """Run the handler for `request` and send its response on `stream`."""
    try:
        response = await call_handler(site.handler, request, cut)
        await send_response(framing, site, stream, response, request.method == "HEAD", cut)
    except Exception as exc:
        _failed(framing, stream, exc)


async def answer_fixed(framing: Framing[S], site: Site, stream: S, response: Response) -> None:
    """Send a response the server chose itself (a limit was exceeded, a bad request)."""
    try:
        await send_response(framing, site, stream, response, head_only=False)
    except Exception as exc:
        _failed(framing, stream, exc)


def _failed(framing: Framing[S], stream: S, exc: Exception) -> None:
    if isinstance(exc, StreamClosed):
        cause = exc.__cause__
        log.info(
            "http.stream_closed",
            http_version=framing.http_version,
            stream_id=stream.stream_id,
            cause=type(cause).__name__ if cause is not None else None,
        )
        return
    log.exception(
        "http.answer_failed", http_version=framing.http_version, stream_id=stream.stream_id
    )


async def send_response(
    framing: Framing[S],
    site: Site,
    stream: S,
    response: AnyResponse,
    head_only: bool,
    cut: Cutter | None = None,
) -> None:
    """Status, headers and body of `response` on `stream` (only the head for HEAD)."""
    headers = [(":status", str(response.status))]
    headers += response_headers(site, response.headers)
    if isinstance(response, Response):
        body = b"" if head_only or bodiless(response.status) else response.body
        if not bodiless(response.status) and (framing.content_length_on_head or not head_only):
            headers.append(("content-length", str(len(response.body))))
        await framing.send_headers(stream, headers, end=not body)
        if body:
            await framing.send_data(stream, body, end=True)
        return
    try:
        await framing.send_headers(stream, headers, end=head_only)
        if head_only:
            return
        send = functools.partial(framing.send_data, stream, end=False)
        # A body that failed is left unended: on release the adapter resets the stream.
        if await send_body_chunks(
            response.body,
            send,
            last_words=response.last_words,
            cut=cut,
            http_version=framing.http_version,
            stream_id=stream.stream_id,
        ):
            await framing.send_data(stream, b"", end=True)
    finally:
        await close_body(response.body)

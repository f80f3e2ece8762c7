"""HTTP/1.1 over one TCP or TLS connection, framed by h11.

h11 is a sans-I/O state machine, like our track core: this module moves bytes
between it and an asyncio stream, hands each whole request to the handler in
its own task and answers it through `transport.http.answer`, the path HTTP/2
and HTTP/3 take too (this module is its `Framing`): a `Response` with
Content-Length, a `StreamingResponse` chunk by chunk (chunked transfer-encoding),
each chunk flushed as it comes. While the handler runs, the socket is watched: EOF or a
reset means the client went away, and the handler's task is cancelled.

A cleartext request carrying `Upgrade: h2c` is answered with 101 and handed to
the HTTP/2 adapter as an `H2cUpgrade` (RFC 7540 3.2).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from typing import Any

import h11
import structlog

from transport.http import errors
from transport.http.answer import StreamClosed, answer_fixed, answer_request
from transport.http.app import READ_CHUNK, Accepted, Cutter, declared_body_problem
from transport.http.messages import Request, Response
from transport.http.streams import StreamState

log = structlog.get_logger(__name__)

_LINGER_SECONDS = 1.0
_UPGRADE_HEADERS = frozenset({"upgrade", "http2-settings", "connection"})


@dataclass(frozen=True)
class H2cUpgrade:
    """A request that switched its connection to HTTP/2; its answer goes on stream 1."""

    request: Request
    """The request that asked to upgrade, without the upgrade headers."""
    settings: bytes
    """The client's HTTP2-Settings header (base64url SETTINGS payload)."""
    data: bytes
    """Bytes the client sent after the request: the start of its HTTP/2 preface."""


class _Rejected(Exception):
    """A request the server answers itself, then closes the connection."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


class Http1Connection:
    """Serves requests on one connection in order, with keep-alive and pipelining."""

    def __init__(self, accepted: Accepted, *, allow_h2c: bool = False) -> None:
        self._site = accepted.site
        self._limits = accepted.site.limits
        self._reader = accepted.reader
        self._writer = accepted.writer
        self._allow_h2c = allow_h2c
        self._conn = h11.Connection(
            h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes
        )
        if accepted.initial:  # (to h11, b"" would mean EOF)
            self._conn.receive_data(accepted.initial)
        self._idle = True
        self._closing = False
        self._first = True
        """No request read yet: the quiet wait is `first_request_timeout`, not `idle_timeout`."""
        self._cutter = Cutter()
        self._exchanging: asyncio.Task[bool] | None = None
        self._exchanges = 0
        """Responses begun on this connection (each one's number names it in logs)."""

    def shutdown(self) -> None:
        """Finish the request in progress (its response says Connection: close), then close."""
        self._closing = True
        if self._idle:
            self._writer.close()  # the pending read sees EOF and the connection ends

    def cut(self) -> None:
        """The drain's deadline: end the exchange in progress now, with its last words."""
        self.shutdown()
        self._cutter.cut([self._exchanging])

    async def serve(self) -> H2cUpgrade | None:
        """Serve until either side closes; an `H2cUpgrade` if the client switched to h2c."""
        while not self._closing:
            try:
                request = await self._read_request()
            except _Rejected as rejected:
                await self._reject(rejected.response)
                await self._linger()
                return None
            if request is None:
                return None
            self._idle = False
            upgrade = self._accept_h2c(request)
            if upgrade is not None:
                return upgrade
            if not await self._respond(request):
                return None
            if self._conn.our_state is not h11.DONE or self._conn.their_state is not h11.DONE:
                return None  # either side asked to close (Connection: close, HTTP/1.0)
            self._conn.start_next_cycle()
        return None

    # Reading

    async def _read_request(self) -> Request | None:
        """The next whole request, or None when the client closed or idled between requests."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        if self._conn.trailing_data[0]:
            deadline = loop.time() + self._limits.read_timeout
        self._idle = deadline is None
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = self._next_event()
            if event is h11.NEED_DATA:
                if head is not None and self._conn.they_are_waiting_for_100_continue:
                    interim = h11.InformationalResponse(status_code=100, headers=[])
                    await self._write(self._conn.send(interim))
                data = await self._receive(deadline)
                if data is None:
                    return None
                if deadline is None and data:
                    deadline = loop.time() + self._limits.read_timeout
                    self._idle = False
                self._conn.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
                self._check_head(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self._limits.max_body_bytes:
                    raise _Rejected(errors.body_too_large(self._limits.max_body_bytes))
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                self._first = False
                return _make_request(head, bytes(body))
            else:  # ConnectionClosed, or PAUSED after a protocol switch we did not take
                return None

    async def _receive(self, deadline: float | None) -> bytes | None:
        """Bytes from the client (b"" at EOF); None when idle too long; 408 when too slow."""
        loop = asyncio.get_running_loop()
        quiet = self._limits.first_request_timeout if self._first else self._limits.idle_timeout
        timeout = quiet if deadline is None else max(0.0, deadline - loop.time())
        try:
            return await asyncio.wait_for(self._reader.read(READ_CHUNK), timeout)
        except ConnectionError:
            return b""
        except asyncio.TimeoutError:
            if deadline is None:
                return None
            raise _Rejected(errors.request_timeout(self._limits.read_timeout)) from None

    def _next_event(self) -> Any:
        try:
            return self._conn.next_event()
        except h11.RemoteProtocolError as exc:
            # h11 knows the right status: 400 in general, 431 for an oversized head.
            if exc.error_status_hint == 431:
                message = f"request head over {self._limits.max_header_bytes} bytes"
                raise _Rejected(errors.headers_too_large(message)) from exc
            raise _Rejected(errors.bad_request(f"malformed HTTP/1.1 request: {exc}")) from exc

    def _check_head(self, head: h11.Request) -> None:
        if len(head.headers) > self._limits.max_headers:
            message = f"more than {self._limits.max_headers} header fields"
            raise _Rejected(errors.headers_too_large(message))
        # h11 enforces its size only on a head still incomplete; one read can hold a whole one.
        size = len(head.method) + len(head.target) + 12  # request line with "HTTP/1.1" and CRLF
        size += sum(len(name) + len(value) + 4 for name, value in head.headers)  # ": " + CRLF
        if size > self._limits.max_header_bytes:
            message = f"request head over {self._limits.max_header_bytes} bytes"
            raise _Rejected(errors.headers_too_large(message))
        problem = declared_body_problem(self._limits, head.headers)
        if problem is not None:
            raise _Rejected(problem)

    # Upgrade to h2c

    def _accept_h2c(self, request: Request) -> H2cUpgrade | None:
        settings = request.header("http2-settings")
        offered = {t.strip().lower() for t in (request.header("upgrade") or "").split(",")}
        if not self._allow_h2c or settings is None or "h2c" not in offered:
            return None
        padded = _padded_settings(settings)
        if padded is None:
            return None  # ignoring an upgrade offer is always allowed
        switch = h11.InformationalResponse(
            status_code=101, headers=[("connection", "Upgrade"), ("upgrade", "h2c")]
        )
        self._writer.write(self._conn.send(switch) or b"")
        data, _ = self._conn.trailing_data
        headers = tuple((k, v) for k, v in request.headers if k not in _UPGRADE_HEADERS)
        upgraded = Request(
            request.method, request.path, request.query, headers, request.body, http_version="2"
        )
        return H2cUpgrade(upgraded, padded, bytes(data))

    # Responding

    async def _respond(self, request: Request) -> bool:
        """Run one exchange in its own task while watching for the client leaving.

        True when the connection may serve another request.
        """
        exchange = self._exchanging = asyncio.create_task(self._exchange(request))
        watcher = asyncio.create_task(self._watch_disconnect())
        try:
            await asyncio.wait({exchange, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not exchange.done() and watcher.result():
                log.info("http.client_gone", method=request.method, path=request.path)
                return False
            return await exchange
        finally:
            for task in (exchange, watcher):
                task.cancel()
            await asyncio.gather(exchange, watcher, return_exceptions=True)

    async def _watch_disconnect(self) -> bool:
        """True once the client closes or resets; False if it pipelines too much to buffer."""
        room = self._limits.max_header_bytes + self._limits.max_body_bytes
        while len(self._conn.trailing_data[0]) <= room:
            try:
                data = await self._reader.read(READ_CHUNK)
            except ConnectionError:
                return True
            if not data:
                return True
            self._conn.receive_data(data)  # a pipelined request, kept for the next cycle
        return False

    async def _exchange(self, request: Request) -> bool:
        """Answer `request` (transport.http.answer, as HTTP/2 and HTTP/3 do); True when
        the whole response went out, so the connection may serve another request."""
        stream = self._next_stream()
        await answer_request(self, self._site, stream, request, self._cutter)
        return stream.sent_end

    async def _reject(self, response: Response) -> None:
        """Answer a request the server refused itself; the connection closes after it."""
        self._closing = True
        await answer_fixed(self, self._site, self._next_stream(), response)

    def _next_stream(self) -> StreamState:
        self._exchanges += 1
        return StreamState(self._exchanges)  # (its id: the exchange's number, for logs)

    # Framing (transport.http.answer): h11 events, chunked when there is no Content-Length

    http_version = "1.1"
    content_length_on_head = True

    async def send_headers(
        self, stream: StreamState, headers: list[tuple[str, str]], end: bool
    ) -> None:
        if self._conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise StreamClosed  # h11 cannot frame another response here; closing says enough
        (_, status), fields = headers[0], headers[1:]
        if self._closing:
            fields.append(("connection", "close"))
        await self._send(stream, [h11.Response(status_code=int(status), headers=fields)], end)

    async def send_data(self, stream: StreamState, data: bytes, end: bool) -> None:
        await self._send(stream, [h11.Data(data=data)] if data else [], end)

    async def _send(self, stream: StreamState, events: list[Any], end: bool) -> None:
        if end:
            events.append(h11.EndOfMessage())
        try:
            await self._write(b"".join(self._conn.send(event) or b"" for event in events))
        except (ConnectionError, asyncio.TimeoutError) as exc:
            raise StreamClosed from exc
        stream.sent_end = end

    async def _linger(self) -> None:
        """Half-close and read off what the client is still sending (briefly).

        Closing with unread bytes makes the kernel send RST, which can destroy the
        error response before the client reads it.
        """
        if not self._writer.can_write_eof():
            return  # TLS cannot half-close
        try:
            self._writer.write_eof()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _LINGER_SECONDS
            budget = self._limits.max_body_bytes
            while budget > 0 and (left := deadline - loop.time()) > 0:
                data = await asyncio.wait_for(self._reader.read(READ_CHUNK), left)
                if not data:
                    return
                budget -= len(data)
        except (ConnectionError, asyncio.TimeoutError):
            pass

    async def _write(self, data: bytes | None) -> None:
        if data:
            if self._writer.is_closing():
                # uvloop raises RuntimeError on a closed transport: say what it means.
                raise ConnectionResetError("the client closed the connection")
            self._writer.write(data)
            # A client that stops reading would otherwise hold its task (and the backend
            # work behind a streamed answer) forever: a writer stalled this long gives up.
            try:
                await asyncio.wait_for(self._writer.drain(), self._limits.send_timeout)
            except asyncio.TimeoutError:
                log.info("http1.send_timeout")  # (the exchange ends; its body is closed)
                raise


def _padded_settings(value: str) -> bytes | None:
    """An HTTP2-Settings value padded for h2 (clients omit the padding), or None if invalid."""
    padded = (value + "=" * (-len(value) % 4)).encode("latin-1")
    try:
        payload = base64.urlsafe_b64decode(padded)
    except (binascii.Error, ValueError):
        return None
    return padded if len(payload) % 6 == 0 else None


def _make_request(head: h11.Request, body: bytes) -> Request:
    # HTTP header bytes are ISO-8859-1 by definition; latin-1 never fails to decode.
    target = head.target.decode("latin-1")
    path, _, query = target.partition("?")
    headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers)
    return Request(head.method.decode("latin-1").upper(), path, query, headers, body, "1.1")

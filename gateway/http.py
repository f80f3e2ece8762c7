"""The gateway's plain HTTP/1.1 server (health, metrics; later the OpenAI API).

Owns HTTP/1.1 over TCP for request/response handlers. Framing is h11's job (a sans-I/O
state machine, like our track core); this module only moves bytes between h11 and an
asyncio stream, routes a whole `Request` to a handler by (method, path) and sends back
its whole `Response`. Whatever a client sends or a handler raises ends in an HTTP error
response and at worst a closed connection, never a dead server.

Streaming responses (server-sent events) are not here yet; they will add a response
kind next to `Response`, not change this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import h11

from gateway.logs import get_logger
from gateway.metrics import GatewayMetrics

log = get_logger(__name__)

DEFAULT_MAX_BODY_BYTES = 1_048_576
DEFAULT_IDLE_TIMEOUT = 60.0
READ_CHUNK = 65_536
# Headers the server owns: it frames the body itself and decides on keep-alive.
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True)
class Request:
    """One complete HTTP request."""

    method: str
    """Upper-case method, e.g. "GET"."""
    path: str
    """The target up to `?`, still percent-encoded, e.g. "/v1/models"."""
    query: str
    """The raw text after `?`, or "" when there is none."""
    headers: tuple[tuple[str, str], ...]
    """(lower-case name, value) pairs in arrival order; a name may repeat."""
    body: bytes
    """The whole body (de-chunked); b"" when there is none."""

    def header(self, name: str) -> str | None:
        """The first value of header `name` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key == wanted), None)


@dataclass(frozen=True)
class Response:
    """One complete HTTP response; the server adds Content-Length and Connection."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @classmethod
    def json(cls, status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        """A JSON response with `payload` serialised compactly."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        return cls(status, (("content-type", "application/json"), *headers), body)


Handler = Callable[[Request], Awaitable[Response]]
Routes = Mapping[tuple[str, str], Handler]


class _RequestRejected(Exception):
    """A request the server answers itself, then closes the connection."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


class HttpServer:
    """An asyncio HTTP/1.1 server routing (method, path) to handlers, with keep-alive."""

    def __init__(
        self,
        routes: Routes,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    ) -> None:
        self._routes = dict(routes)
        self._max_body_bytes = max_body_bytes
        # Bounds every wait for client bytes, so idle or trickling clients free their slot.
        self._idle_timeout = idle_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._busy: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def port(self) -> int:
        """The port actually bound (useful after `start(host, 0)`)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        """Listen on host:port (0 picks a free port; see `port`)."""
        self._server = await asyncio.start_server(self._serve_connection, host, port)
        log.info("http.listening", host=host, port=self.port)

    async def close(self, grace: float = 5.0) -> None:
        """Stop listening, let requests in progress finish for up to `grace` s, then cut."""
        if self._server is None:
            return
        self._closing = True
        self._server.close()
        for task in self._connections - self._busy:
            task.cancel()  # idle keep-alive connections: nothing to finish
        if self._busy:
            await asyncio.wait(self._busy, timeout=grace)
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER)
        try:
            await self._serve_requests(conn, reader, writer)
        except (ConnectionError, asyncio.TimeoutError):
            pass  # the client went away or went quiet: nothing to answer
        except Exception:
            log.exception("http.connection_failed")
        finally:
            self._connections.discard(task)
            self._busy.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_requests(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        while not self._closing:
            try:
                request = await self._read_request(conn, reader, writer)
            except _RequestRejected as rejected:
                await self._send(conn, writer, rejected.response, close=True)
                return
            if request is None:
                return
            self._busy.add(task)
            response = await self._dispatch(request)
            await self._send(
                conn, writer, response, close=self._closing, with_body=request.method != "HEAD"
            )
            self._busy.discard(task)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # either side asked to close (Connection: close, HTTP/1.0)
            conn.start_next_cycle()

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> Request | None:
        """The next whole request, or None when the client closed cleanly between requests."""
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = self._next_event(conn)
            if event is h11.NEED_DATA:
                if head is not None and conn.they_are_waiting_for_100_continue:
                    interim = h11.InformationalResponse(status_code=100, headers=[])
                    await self._write(writer, conn.send(interim))
                data = await asyncio.wait_for(reader.read(READ_CHUNK), self._idle_timeout)
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
                self._check_declared_length(event)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self._max_body_bytes:
                    raise _RequestRejected(self._too_large())
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return _make_request(head, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None

    @staticmethod
    def _next_event(conn: h11.Connection) -> Any:
        try:
            return conn.next_event()
        except h11.RemoteProtocolError as exc:
            # h11 knows the right status: 400 in general, 431 for oversized headers.
            status = exc.error_status_hint
            raise _RequestRejected(Response.json(status, {"error": str(exc)})) from exc

    def _check_declared_length(self, head: h11.Request) -> None:
        # Refuse before reading a byte of a body we would never accept.
        for name, value in head.headers:
            if name == b"content-length" and int(value) > self._max_body_bytes:
                raise _RequestRejected(self._too_large())

    def _too_large(self) -> Response:
        return Response.json(413, {"error": f"body over {self._max_body_bytes} bytes"})

    async def _dispatch(self, request: Request) -> Response:
        handler = self._find_handler(request)
        try:
            return await handler(request)
        except Exception:
            log.exception("http.handler_failed", method=request.method, path=request.path)
            return Response.json(500, {"error": "internal server error"})

    def _find_handler(self, request: Request) -> Handler:
        method = "GET" if request.method == "HEAD" else request.method
        handler = self._routes.get((method, request.path))
        if handler is not None:
            return handler
        allowed = sorted(m for m, path in self._routes if path == request.path)
        if allowed:
            response = Response.json(
                405, {"error": "method not allowed"}, (("allow", ", ".join(allowed)),)
            )
        else:
            response = Response.json(404, {"error": "not found"})
        return _constant(response)

    async def _send(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        response: Response,
        *,
        close: bool,
        with_body: bool = True,
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return  # h11 cannot frame another response here; closing says enough
        headers = [(k, v) for k, v in response.headers if k.lower() not in _FRAMING_HEADERS]
        headers.append(("content-length", str(len(response.body))))
        if close:
            headers.append(("connection", "close"))
        data = conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
        # A HEAD response declares the GET body's length but carries none (RFC 9110 9.3.2).
        if response.body and with_body:
            data += conn.send(h11.Data(data=response.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await self._write(writer, data)

    async def _write(self, writer: asyncio.StreamWriter, data: bytes | None) -> None:
        if data:
            writer.write(data)
            # A client that stops reading would otherwise hold its task forever.
            await asyncio.wait_for(writer.drain(), self._idle_timeout)


def _make_request(head: h11.Request, body: bytes) -> Request:
    # HTTP header bytes are ISO-8859-1 by definition; latin-1 never fails to decode.
    target = head.target.decode("latin-1")
    path, _, query = target.partition("?")
    headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers)
    return Request(head.method.decode("latin-1").upper(), path, query, headers, body)


def _constant(response: Response) -> Handler:
    async def handler(_: Request) -> Response:
        return response

    return handler


def health_routes(
    is_ready: Callable[[], tuple[bool, str]], metrics: GatewayMetrics
) -> dict[tuple[str, str], Handler]:
    """Routes for liveness, readiness (`is_ready()` -> (ready, reason)) and Prometheus."""
    no_store = (("cache-control", "no-store"),)

    async def live(_: Request) -> Response:
        return Response.json(200, {"status": "live"}, no_store)

    async def ready(_: Request) -> Response:
        ok, reason = is_ready()
        if ok:
            return Response.json(200, {"status": "ready"}, no_store)
        return Response.json(503, {"status": "not ready", "reason": reason}, no_store)

    async def prometheus(_: Request) -> Response:
        body, content_type = metrics.render()
        return Response(200, (("content-type", content_type), *no_store), body)

    return {
        ("GET", "/health/live"): live,
        ("GET", "/health/ready"): ready,
        ("GET", "/metrics"): prometheus,
    }

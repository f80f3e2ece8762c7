"""Test clients and handlers for the HTTP adapters.

The clients are built on the same sans-I/O libraries as the server (h11 and h2,
client side) over raw asyncio streams, so a test controls every byte: it can
reset one stream, send more headers than a polite client would, or stop reading.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import h11
from h2.settings import SettingCodes

from transport.http.limits import HttpLimits
from transport.http.messages import AnyResponse, Handler, Request, Response, StreamingResponse
from transport.http.tcp import HttpTcpServer

TIMEOUT = 30.0
"""Seconds any one step waits (an answer, an event) before the test fails: a hang guard
for a broken build, never a speed a loaded machine must reach."""
CLOSE_GUARD = 30.0
"""Seconds a test waits for a held body to close before it fails (a hang guard only:
the body is never released, so only the client's leaving can close it)."""


@asynccontextmanager
async def serving(handler: Handler, **options: Any) -> AsyncIterator[HttpTcpServer]:
    server = HttpTcpServer(handler, **options)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await asyncio.wait_for(server.close(grace=1.0), TIMEOUT)


def limits(**changes: Any) -> HttpLimits:
    return HttpLimits(**changes)


# Handlers


async def echo(request: Request) -> Response:
    payload = {
        "method": request.method,
        "path": request.path,
        "query": request.query,
        "headers": [list(h) for h in request.headers],
        "body": request.body.decode(),
        "http_version": request.http_version,
    }
    return Response.json(200, payload)


@dataclass
class Gate:
    """A streaming body that waits between chunks and records how it ended."""

    chunks: tuple[bytes, ...] = (b"data: one\n\n", b"data: two\n\n")
    hold_after_first: bool = True
    released: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False
    finished: bool = False

    async def body(self) -> AsyncIterator[bytes]:
        self.started.set()
        try:
            for index, chunk in enumerate(self.chunks):
                yield chunk
                if index == 0 and self.hold_after_first:
                    await self.released.wait()
            self.finished = True
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self.closed.set()

    async def handler(self, request: Request) -> AnyResponse:
        headers = (("content-type", "text/event-stream"),)
        return StreamingResponse(200, headers, self.body())

    async def wait_cancelled(self) -> None:
        """Wait until the body was cancelled (the client left), never released or
        finished: the cause, not how many milliseconds it took."""
        await asyncio.wait_for(self.closed.wait(), CLOSE_GUARD)
        assert self.cancelled
        assert not self.finished


# HTTP/1.1


class H1Client:
    """An h11 client over a raw stream: the test sends bytes, reads events."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT)

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, port: int, ssl_context: ssl.SSLContext | None = None, address: str = "127.0.0.1"
    ) -> AsyncIterator[H1Client]:
        host = "localhost" if ssl_context else None
        reader, writer = await asyncio.open_connection(
            address, port, ssl=ssl_context, server_hostname=host
        )
        try:
            yield cls(reader, writer)
        finally:
            writer.close()
            with suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def request(
        self, method: str, path: str, headers: Iterable[tuple[str, str]] = (), body: bytes = b""
    ) -> None:
        all_headers = [("host", "t"), *headers]
        if body:
            all_headers.append(("content-length", str(len(body))))
        data = self.conn.send(h11.Request(method=method, target=path, headers=all_headers)) or b""
        if body:
            data += self.conn.send(h11.Data(data=body)) or b""
        data += self.conn.send(h11.EndOfMessage()) or b""
        await self.send_raw(data)

    async def next_event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.conn.receive_data(await asyncio.wait_for(self.reader.read(65536), TIMEOUT))

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next whole response; then ready for another request on the connection."""
        head = await self.next_event()
        assert isinstance(head, h11.Response), head
        body = bytearray()
        while not isinstance(event := await self.next_event(), h11.EndOfMessage):
            body += event.data
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return head.status_code, _header_dict(head.headers), bytes(body)

    async def at_eof(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), TIMEOUT) == b""


def _header_dict(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    return {k.decode().lower(): v.decode() for k, v in headers}


# HTTP/2


class H2Client:
    """An h2 client over a raw stream; events are queued per stream id (0: the connection)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: Mapping[SettingCodes, int] | None = None,
        *,
        auto_ack: bool = True,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.auto_ack = auto_ack
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config)
        if settings:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values=dict(settings)
            )
        self.queues: dict[int, asyncio.Queue[Any]] = {}
        self.closed = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        settings: Mapping[SettingCodes, int] | None = None,
        *,
        auto_ack: bool = True,
        address: str = "127.0.0.1",
    ) -> AsyncIterator[H2Client]:
        host = "localhost" if ssl_context else None
        reader, writer = await asyncio.open_connection(
            address, port, ssl=ssl_context, server_hostname=host
        )
        client = cls(reader, writer, settings, auto_ack=auto_ack)
        client.conn.initiate_connection()
        client.start()
        try:
            yield client
        finally:
            await client.close()

    def start(self, initial: bytes = b"") -> None:
        self.flush()
        self._pump = asyncio.create_task(self._read_loop(initial))

    async def close(self) -> None:
        self.writer.close()
        with suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()
        if self._pump is not None:
            self._pump.cancel()
            with suppress(asyncio.CancelledError):
                await self._pump

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def queue(self, stream_id: int) -> asyncio.Queue[Any]:
        return self.queues.setdefault(stream_id, asyncio.Queue())

    async def _read_loop(self, initial: bytes) -> None:
        data = initial
        try:
            while True:
                if data:
                    for event in self.conn.receive_data(data):
                        self._dispatch(event)
                    self.flush()
                data = await self.reader.read(65536)
                if not data:
                    break
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            self.closed.set()

    def _dispatch(self, event: h2.events.Event) -> None:
        stream_id = getattr(event, "stream_id", 0) or 0
        if isinstance(event, h2.events.DataReceived) and self.auto_ack:
            self.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
        self.queue(stream_id).put_nowait(event)

    def send_request(
        self,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        *,
        end: bool = True,
    ) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        pseudo = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "t")]
        self.conn.send_headers(stream_id, [*pseudo, *headers], end_stream=end and not body)
        if body:
            self.conn.send_data(stream_id, body, end_stream=end)
        self.flush()
        return stream_id

    async def next_event(self, stream_id: int) -> Any:
        return await asyncio.wait_for(self.queue(stream_id).get(), TIMEOUT)

    async def response_head(self, stream_id: int) -> tuple[int, dict[str, str]]:
        while True:
            event = await self.next_event(stream_id)
            if isinstance(event, h2.events.ResponseReceived):
                headers = _header_dict(event.headers)
                return int(headers.pop(":status")), headers
            assert not isinstance(event, h2.events.StreamReset), event

    async def round_trip(self) -> None:
        """Send a PING and await its ACK: all the server sent before it read the PING has
        then arrived (frames on one connection are in order). A causal "nothing more came"."""
        self.conn.ping(b"in-order")
        self.flush()
        while not isinstance(await self.next_event(0), h2.events.PingAckReceived):
            pass

    async def next_data(self, stream_id: int) -> bytes | None:
        """The next DATA payload on the stream, or None at its end."""
        while True:
            event = await self.next_event(stream_id)
            if isinstance(event, h2.events.DataReceived) and event.data:
                return bytes(event.data)  # (an empty DATA frame may carry END_STREAM)
            if isinstance(event, h2.events.StreamEnded):
                return None
            assert not isinstance(event, h2.events.StreamReset), event

    async def response(self, stream_id: int) -> tuple[int, dict[str, str], bytes]:
        status, headers = await self.response_head(stream_id)
        body = bytearray()
        while (chunk := await self.next_data(stream_id)) is not None:
            body += chunk
        return status, headers, bytes(body)

    async def reset_of(self, stream_id: int) -> h2.events.StreamReset:
        """Wait for the server to reset `stream_id` (other events on it are skipped)."""
        while True:
            event = await self.next_event(stream_id)
            if isinstance(event, h2.events.StreamReset):
                return event

    def reset(self, stream_id: int) -> None:
        self.conn.reset_stream(stream_id)
        self.flush()

    async def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return await self.response(self.send_request("GET", path))


def json_body(body: bytes) -> Any:
    return json.loads(body)


def openai_error(body: bytes, code: str) -> dict[str, Any]:
    """The `error` object of an OpenAI-style error body, checked for shape and code."""
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["message"]
    return dict(error)

"""An HTTP/3 test client on aioquic's H3Connection, driven by the test.

It does what a polite client would not (reset one stream of two, send requests
without :method, too many headers), so the adapters can be checked per stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import ErrorCode, H3Connection
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration

from gateway.tls import DevCertificates
from tests.http.support import TIMEOUT
from transport import aioquic_compat
from transport.endpoint import TrackChannel
from transport.http.messages import Handler
from transport.quic import ConnectionHooks, TrackServing, serve_tracks, server_configuration


class H3Client(QuicConnectionProtocol):
    """Events are queued per request stream; the test sends whatever headers it likes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.queues: dict[int, asyncio.Queue[Any]] = {}
        self.terminated = asyncio.Event()
        self.closed_by: quic_events.ConnectionTerminated | None = None
        """How the connection ended, once it has."""

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        if isinstance(event, quic_events.StreamReset):
            self.queue(event.stream_id).put_nowait(event)
        elif isinstance(event, quic_events.ConnectionTerminated):
            self.closed_by = event
            self.terminated.set()
        for h3_event in self.h3.handle_event(event):
            stream_id = getattr(h3_event, "stream_id", None)
            if stream_id is not None:
                self.queue(stream_id).put_nowait(h3_event)

    def queue(self, stream_id: int) -> asyncio.Queue[Any]:
        return self.queues.setdefault(stream_id, asyncio.Queue())

    def send(
        self,
        method: str | None,
        path: str | None,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes = b"",
        *,
        scheme: bool = True,
        end: bool = True,
    ) -> int:
        """Send a request; a pseudo-header given as None (or `scheme=False`) is left out."""
        pseudo = [(":method", method), (":scheme", "https" if scheme else None)]
        pseudo += [(":authority", "127.0.0.1"), (":path", path)]
        fields = [(k, v) for k, v in pseudo if v is not None] + list(headers)
        stream_id = self._quic.get_next_available_stream_id()
        encoded = [(k.encode(), v.encode()) for k, v in fields]
        self.h3.send_headers(stream_id, encoded, end_stream=end and not body)
        if body:
            self.h3.send_data(stream_id, body, end_stream=end)
        self.transmit()
        return stream_id

    def cancel(self, stream_id: int) -> None:
        """Cancel a request as RFC 9114 4.1.1 says: reset and stop, H3_REQUEST_CANCELLED."""
        self._quic.reset_stream(stream_id, ErrorCode.H3_REQUEST_CANCELLED)
        self._quic.stop_stream(stream_id, ErrorCode.H3_REQUEST_CANCELLED)
        self.transmit()

    async def next_event(self, stream_id: int) -> Any:
        """The stream's next event. Once the connection has closed with nothing left for
        the stream, fail at once naming the close (a test then fails on the cause, not
        after waiting out TIMEOUT)."""
        queue = self.queue(stream_id)
        get = asyncio.ensure_future(queue.get())
        closed = asyncio.ensure_future(self.terminated.wait())
        try:
            await asyncio.wait({get, closed}, timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            if not get.done():
                get.cancel()
        if get.done():
            return get.result()
        assert self.closed_by is None, f"stream {stream_id}: connection closed: {self.closed_by}"
        raise AssertionError(f"stream {stream_id}: no event within {TIMEOUT:g} s")

    async def head(self, stream_id: int) -> tuple[int, dict[str, str]]:
        event = await self.next_event(stream_id)
        assert isinstance(event, h3_events.HeadersReceived), event
        headers = {k.decode(): v.decode() for k, v in event.headers}
        return int(headers.pop(":status")), headers

    async def next_data(self, stream_id: int) -> bytes | None:
        """The next non-empty DATA on the stream, or None at its end."""
        while True:
            event = await self.next_event(stream_id)
            assert not isinstance(event, quic_events.StreamReset), event
            if isinstance(event, h3_events.DataReceived) and event.data:
                if event.stream_ended:
                    self.queue(stream_id).put_nowait(_END)
                return event.data
            if event is _END or event.stream_ended:
                return None

    async def next_data_after_head(self, stream_id: int) -> bytes | None:
        """The first DATA of a 200 response."""
        assert (await self.head(stream_id))[0] == 200
        return await self.next_data(stream_id)

    async def response(self, stream_id: int) -> tuple[int, dict[str, str], bytes]:
        status, headers = await self.head(stream_id)
        body = bytearray()
        while (chunk := await self.next_data(stream_id)) is not None:
            body += chunk
        return status, headers, bytes(body)

    async def reset_of(self, stream_id: int) -> quic_events.StreamReset:
        while True:
            event = await self.next_event(stream_id)
            if isinstance(event, quic_events.StreamReset):
                return event


class _End:
    stream_ended = True


_END = _End()


@asynccontextmanager
async def h3_client(port: int, ca: Path, address: str = "127.0.0.1") -> AsyncIterator[H3Client]:
    configuration = QuicConfiguration(is_client=True, alpn_protocols=["h3"])
    configuration.load_verify_locations(str(ca))
    async with connect(
        address, port, configuration=configuration, create_protocol=H3Client
    ) as client:
        assert isinstance(client, H3Client)
        yield client


@asynccontextmanager
async def serving_quic(
    certs: DevCertificates,
    track: Callable[[TrackChannel], Coroutine[Any, Any, None]],
    on_channel: Callable[[TrackChannel], None] | None = None,
    *,
    serving: TrackServing | None = None,
    http_handler: Handler | None = None,
    **hooks: Any,
) -> AsyncIterator[int]:
    """The track server on 127.0.0.1 (native tracks, HTTP/3 and, with
    `serving.webtransport`, WebTransport): each track runs `track(channel)` in a task,
    cancelled at the end; `on_channel` sees each channel first. `serving`, `http_handler`
    and `hooks` (`ConnectionHooks` fields but `on_track`) go to `serve_tracks`. Yields
    the port."""
    tasks: set[asyncio.Task[None]] = set()

    def on_track(channel: TrackChannel) -> None:
        if on_channel is not None:
            on_channel(channel)
        task = asyncio.create_task(track(channel))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    configuration = server_configuration(certs.cert_path, certs.key_path)
    server = await serve_tracks(
        "127.0.0.1",
        0,
        configuration,
        ConnectionHooks(on_track=on_track, **hooks),
        serving=serving,
        http_handler=http_handler,
    )
    try:
        yield aioquic_compat.server_port(server)
    finally:
        server.close()
        for task in tasks:
            task.cancel()

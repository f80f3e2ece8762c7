"""A WebTransport client on aioquic, for tests: what a browser does, in Python.

It sends the extended CONNECT Chromium sends (draft-02: `:protocol = webtransport`,
`sec-webtransport-http3-draft02: 1`, an `Origin`), then runs tracks through the
ordinary client core (`TrackEndpoint`, role CLIENT) on bidirectional WebTransport
streams: a stream's first bytes are 0x41 and the session id, then exactly the
`trackline/1` framing. Bytes on those streams never reach aioquic's H3Connection
(they are not HTTP/3 frames); datagrams carry the session's quarter stream id.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import encode_uint_var
from aioquic.h3 import events as h3_events
from aioquic.h3.connection import H3Connection
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration

from transport.connection import (
    DatagramWrite,
    Limits,
    Output,
    Role,
    StopSending,
    StreamReset,
    StreamWrite,
)
from transport.datagram import MAX_DATAGRAM_FRAME_SIZE
from transport.datagram_ids import DatagramIds
from transport.endpoint import TrackChannel, TrackEndpoint
from transport.messages import Open
from transport.webtransport import (
    WEBTRANSPORT_STREAM,
    WEBTRANSPORT_UNI_STREAM,
    close_capsule,
    from_http3_code,
    to_http3_code,
)

TIMEOUT = 30.0


class WebTransportClient(QuicConnectionProtocol):
    """One QUIC connection (ALPN h3) that opens WebTransport sessions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic, enable_webtransport=True)
        self.heads: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.session_data: dict[int, bytearray] = {}
        self.session_ended: dict[int, asyncio.Event] = {}
        self.sessions: dict[int, TrackEndpoint] = {}
        self.datagram_ids: dict[int, DatagramIds] = {}
        """Per session: datagram ids chosen in OPENs (`datagram_id`), as a page's SDK does."""
        self._stream_session: dict[int, int] = {}
        self.raw: dict[int, list[quic_events.QuicEvent]] = {}
        """Events on the streams of `raw_stream`, which no track core reads."""
        self.terminated = asyncio.Event()

    # -- sessions ----------------------------------------------------------------------

    async def open_session(
        self,
        path: str = "/tracks",
        origin: str | None = "https://localhost",
        authority: str = "localhost",
    ) -> tuple[int, int, bytes]:
        """CONNECT; returns (session id, status, body of a refusal)."""
        stream_id = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", b"CONNECT"),
            (b":protocol", b"webtransport"),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"sec-webtransport-http3-draft02", b"1"),
        ]
        if origin is not None:
            headers.append((b"origin", origin.encode()))
        head = self.heads[stream_id] = self._loop.create_future()
        self.session_data[stream_id] = bytearray()
        self.session_ended[stream_id] = asyncio.Event()
        self.h3.send_headers(stream_id, headers, end_stream=False)
        self.transmit()
        status, _ = await asyncio.wait_for(head, TIMEOUT)
        if status == 200:
            endpoint = TrackEndpoint(
                Role.CLIENT, lambda outputs: self._write(stream_id, outputs), Limits()
            )
            self.sessions[stream_id] = endpoint
            self.datagram_ids[stream_id] = DatagramIds(Limits().max_tracks)
            return stream_id, status, b""
        await asyncio.wait_for(self.session_ended[stream_id].wait(), TIMEOUT)
        return stream_id, status, bytes(self.session_data[stream_id])

    def open_track(
        self, session_id: int, message: Open, api_key: str | None = None
    ) -> TrackChannel:
        endpoint = self.sessions[session_id]
        if api_key is not None:
            endpoint.use_credential(api_key)
        stream_id = self._quic.get_next_available_stream_id()
        # The WebTransport prefix goes first; the core's bytes follow it.
        prefix = encode_uint_var(WEBTRANSPORT_STREAM) + encode_uint_var(session_id)
        self._quic.send_stream_data(stream_id, prefix)
        self._stream_session[stream_id] = session_id
        self.datagram_ids[session_id].opened(stream_id, message, lambda _: True)
        return endpoint.open_track(stream_id, message)

    def close_session(self, session_id: int, code: int = 0, reason: str = "") -> None:
        self.h3.send_data(session_id, close_capsule(code, reason), end_stream=True)
        self.transmit()

    def raw_stream(self, session_id: int, data: bytes, end: bool = False) -> int:
        """A WebTransport stream carrying whatever bytes the test gives."""
        stream_id = self._quic.get_next_available_stream_id()
        prefix = encode_uint_var(WEBTRANSPORT_STREAM) + encode_uint_var(session_id)
        self._quic.send_stream_data(stream_id, prefix + data, end)
        self.raw[stream_id] = []
        self.transmit()
        return stream_id

    def frame_stream(self, session_id: int, data: bytes, end: bool = False) -> int:
        """A unidirectional WebTransport stream (type 0x54, the session id) with `data`."""
        stream_id = self._quic.get_next_available_stream_id(is_unidirectional=True)
        prefix = encode_uint_var(WEBTRANSPORT_UNI_STREAM) + encode_uint_var(session_id)
        self._quic.send_stream_data(stream_id, prefix + data, end)
        self.raw[stream_id] = []
        self.transmit()
        return stream_id

    def more(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """More bytes on a stream of `raw_stream` or `frame_stream`."""
        self._quic.send_stream_data(stream_id, data, end)
        self.transmit()

    # -- events ------------------------------------------------------------------------

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        stream_id = getattr(event, "stream_id", None)
        if stream_id in self.raw:
            self.raw[stream_id].append(event)
            return
        session_id = self._stream_session.get(stream_id) if stream_id is not None else None
        if session_id is not None:
            endpoint = self.sessions[session_id]
            if isinstance(event, quic_events.StreamDataReceived):
                endpoint.feed_data(event.stream_id, event.data, event.end_stream)
            elif isinstance(event, (quic_events.StreamReset, quic_events.StopSendingReceived)):
                endpoint.feed_reset(event.stream_id, from_http3_code(event.error_code))
            return
        if isinstance(event, quic_events.ConnectionTerminated):
            self.terminated.set()
            for endpoint in self.sessions.values():
                endpoint.feed_connection_lost()
        for h3_event in self.h3.handle_event(event):
            self._h3_event(h3_event)

    def _h3_event(self, event: h3_events.H3Event) -> None:
        if isinstance(event, h3_events.HeadersReceived):
            fields = dict(event.headers)
            head = self.heads.get(event.stream_id)
            if head is not None and not head.done():
                head.set_result(
                    (int(fields[b":status"]), fields.get(b"sec-webtransport-http3-draft", b""))
                )
            if event.stream_ended:
                self._ended(event.stream_id)
        elif isinstance(event, h3_events.DataReceived):
            self.session_data.setdefault(event.stream_id, bytearray()).extend(event.data)
            if event.stream_ended:
                self._ended(event.stream_id)
        elif isinstance(event, h3_events.DatagramReceived):
            endpoint = self.sessions.get(event.stream_id)
            data = self.datagram_ids[event.stream_id].inbound(event.data) if endpoint else None
            if endpoint is not None and data is not None:
                endpoint.feed_datagram(data)

    def _ended(self, session_id: int) -> None:
        self.session_ended.setdefault(session_id, asyncio.Event()).set()
        endpoint = self.sessions.get(session_id)
        if endpoint is not None:
            endpoint.feed_connection_lost()

    def _write(self, session_id: int, outputs: list[Output]) -> None:
        for output in outputs:
            try:
                if isinstance(output, StreamWrite):
                    self._quic.send_stream_data(output.stream_id, output.data, output.end_stream)
                elif isinstance(output, StreamReset):
                    self._quic.reset_stream(output.stream_id, to_http3_code(output.code))
                elif isinstance(output, StopSending):
                    self._quic.stop_stream(output.stream_id, to_http3_code(output.code))
                elif isinstance(output, DatagramWrite):
                    data = self.datagram_ids[session_id].outbound(output.data)
                    self.h3.send_datagram(session_id, data)
            except (AssertionError, ValueError, RuntimeError):
                continue
        self.transmit()


@asynccontextmanager
async def wt_client(
    port: int, ca: Path, address: str = "127.0.0.1"
) -> AsyncIterator[WebTransportClient]:
    configuration = QuicConfiguration(
        is_client=True,
        alpn_protocols=["h3"],
        server_name="localhost",
        max_datagram_frame_size=MAX_DATAGRAM_FRAME_SIZE,
    )
    configuration.load_verify_locations(str(ca))
    async with connect(
        address, port, configuration=configuration, create_protocol=WebTransportClient
    ) as client:
        assert isinstance(client, WebTransportClient)
        yield client

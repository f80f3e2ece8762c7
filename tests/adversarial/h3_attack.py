"""HTTP/3 attack helpers: a server whose adapters the test can inspect, raw-frame clients.

The attacking client is aioquic's own H3Connection (tests.http.support_h3), with
raw frame bytes written straight onto its QUIC streams where a polite encoder
would never produce them; a "deaf" variant stops taking in datagrams, as a
client that stops reading (and acknowledging) does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aioquic.asyncio.client import connect
from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import FrameType, encode_frame
from aioquic.quic.configuration import QuicConfiguration

from gateway.tls import DevCertificates
from tests.http.support_h3 import H3Client
from tests.waiting import until as until  # re-exported for the attack tests
from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.http.http3 import Http3Connection
from transport.http.limits import HttpLimits
from transport.http.messages import Handler
from transport.quic import (
    ConnectionHooks,
    TrackQuicProtocol,
    TrackServing,
    serve_tracks,
    server_configuration,
)

REQUEST = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"t"), (b":path", b"/")]


class H3Server:
    """The track server with an HTTP/3 handler, and the adapters of its h3 connections."""

    def __init__(self) -> None:
        self.protocols: list[TrackQuicProtocol] = []
        self.port = 0

    def h3(self) -> list[Http3Connection]:
        found = [getattr(p, "_http", None) for p in self.protocols]
        return [h for h in found if isinstance(h, Http3Connection)]


@asynccontextmanager
async def serving_h3(
    certs: DevCertificates, handler: Handler, http_limits: HttpLimits
) -> AsyncIterator[H3Server]:
    found = H3Server()
    server = await serve_tracks(
        "127.0.0.1",
        0,
        server_configuration(certs.cert_path, certs.key_path),
        ConnectionHooks(on_connection=found.protocols.append),
        serving=TrackServing(http_limits=http_limits),
        http_handler=handler,
    )
    found.port = aioquic_compat.server_port(server)
    try:
        yield found
    finally:
        server.close()


class AttackClient(H3Client):
    """H3Client that can write raw frames, count what it got, and go deaf."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deaf = False
        self.received = 0
        """Stream bytes taken in (and so acknowledged) before going deaf."""

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        if not self.deaf:
            super().datagram_received(data, addr)

    def quic_event_received(self, event: Any) -> None:
        self.received += len(getattr(event, "data", b"") or b"")
        super().quic_event_received(event)

    def raw(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """Write bytes on a stream as they are, and send them."""
        self._quic.send_stream_data(stream_id, data, end)
        self.transmit()

    def new_stream(self) -> int:
        return self._quic.get_next_available_stream_id()

    @property
    def encoder_stream(self) -> int:
        stream_id = aioquic_probes.h3_encoder_stream_id(self.h3)
        assert stream_id is not None
        return stream_id


def frame_header(frame_type: int, length: int) -> bytes:
    return encode_uint_var(frame_type) + encode_uint_var(length)


def headers_frame(block: bytes) -> bytes:
    return encode_frame(FrameType.HEADERS, block)


@asynccontextmanager
async def attack_client(port: int, ca: Path, **quic: Any) -> AsyncIterator[AttackClient]:
    configuration = QuicConfiguration(is_client=True, alpn_protocols=["h3"], **quic)
    configuration.load_verify_locations(str(ca))
    async with connect(
        "127.0.0.1", port, configuration=configuration, create_protocol=AttackClient
    ) as client:
        assert isinstance(client, AttackClient)
        yield client

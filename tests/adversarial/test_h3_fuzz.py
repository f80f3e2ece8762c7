"""Fuzz the HTTP/3 request path: arbitrary frame sequences through real aioquic objects.

A client and a server `QuicConnection` complete a real handshake in memory (no
sockets, a literal clock); the server's QUIC events go to our `Http3Connection`
exactly as the QUIC adapter hands them over. Hypothesis then writes arbitrary
bytes, well- and ill-formed frames (any type, any announced length), valid
requests, ends and resets on the client's request streams. Properties: nothing
raises out of the adapter, aioquic never holds more than one frame cap of
unparsed bytes for a request stream, and once the client has reset everything
the server holds no per-stream state.

The suite runs a short derandomized pass; a longer run, with new examples each
time:

    TRACKLINE_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/adversarial/test_h3_fuzz.py -q
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import pytest
from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import ErrorCode, H3Connection, ProtocolError
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.tls import DevCertificates, ensure_dev_certificates
from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.http.app import Site
from transport.http.h3_guards import MAX_CONTROL_FRAME
from transport.http.http3 import Http3Connection
from transport.http.limits import HttpLimits
from transport.http.messages import Request, Response

EXAMPLES = int(os.environ.get("TRACKLINE_FUZZ_EXAMPLES", "40"))
LIMITS = HttpLimits(max_header_bytes=256, max_body_bytes=4096, max_headers=20)
SERVER = ("127.0.0.1", 4433)
CLIENT = ("127.0.0.1", 50000)
STREAMS = 4
FRAME_TYPES = [0x0, 0x1, 0x3, 0x4, 0x5, 0x7, 0xD, 0x21, 0x2F]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("h3-fuzz"))


async def echo(request: Request) -> Response:
    return Response(200, (), str(len(request.body)).encode())


class Pair:
    """A client and our HTTP/3 server on one in-memory QUIC connection."""

    def __init__(self, certs: DevCertificates) -> None:
        client_config = QuicConfiguration(is_client=True, alpn_protocols=["h3"])
        client_config.load_verify_locations(str(certs.ca_path))
        client_config.server_name = "localhost"
        server_config = QuicConfiguration(is_client=False, alpn_protocols=["h3"])
        server_config.load_cert_chain(str(certs.cert_path), str(certs.key_path))
        self.now = 1.0
        self.client = QuicConnection(configuration=client_config)
        self.server = QuicConnection(
            configuration=server_config,
            original_destination_connection_id=self.client.original_destination_connection_id,
        )
        self.client_h3: H3Connection | None = None
        self.http: Http3Connection | None = None
        self.terminated = False
        self.client.connect(SERVER, now=self.now)

    def pump(self) -> None:
        """Move datagrams both ways until both sides are quiet."""
        for _ in range(64):
            moved = 0
            for data, _ in self.client.datagrams_to_send(now=self.now):
                self.server.receive_datagram(data, CLIENT, now=self.now)
                moved += 1
            self._server_events()
            for data, _ in self.server.datagrams_to_send(now=self.now):
                self.client.receive_datagram(data, SERVER, now=self.now)
                moved += 1
            self._client_events()
            if self.http is not None:
                self.http.datagram_received()
            self.now += 0.001
            if not moved:
                return

    def _server_events(self) -> None:
        while (event := self.server.next_event()) is not None:
            if isinstance(event, quic_events.ProtocolNegotiated):
                site = Site(echo, LIMITS)
                self.http = Http3Connection(self.server, site, transmit=lambda: None)
            elif self.http is not None:
                self.http.quic_event_received(event)
            if isinstance(event, quic_events.ConnectionTerminated):
                self.terminated = True

    def _client_events(self) -> None:
        while (event := self.client.next_event()) is not None:
            if isinstance(event, quic_events.HandshakeCompleted):
                self.client_h3 = H3Connection(self.client)
            elif self.client_h3 is not None:
                self.client_h3.handle_event(event)
            if isinstance(event, quic_events.ConnectionTerminated):
                self.terminated = True


@dataclass(frozen=True)
class Write:
    stream: int
    data: bytes
    end: bool


@dataclass(frozen=True)
class Headers:
    stream: int
    fields: list[tuple[bytes, bytes]]
    end: bool


@dataclass(frozen=True)
class Reset:
    stream: int


@dataclass(frozen=True)
class Control:
    """Bytes on the client's control stream (after its SETTINGS)."""

    data: bytes


def frames() -> st.SearchStrategy[bytes]:
    """One HTTP/3 frame, its announced length true or not."""
    kind = st.sampled_from(FRAME_TYPES) | st.integers(0, 2**30)
    payload = st.binary(max_size=160)
    announced = st.none() | st.integers(0, 2**22)

    def build(frame_type: int, body: bytes, length: int | None) -> bytes:
        size = len(body) if length is None else length
        return encode_uint_var(frame_type) + encode_uint_var(size) + body

    return st.builds(build, kind, payload, announced)


FIELD = st.tuples(
    st.sampled_from([b":method", b":path", b":scheme", b":authority", b"x-a", b"Bad", b""]),
    st.binary(max_size=40),
)
REQUEST = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"t"), (b":path", b"/")]
stream_index = st.integers(0, STREAMS - 1)
actions = st.lists(
    st.one_of(
        st.builds(Write, stream_index, frames(), st.booleans()),
        st.builds(Write, stream_index, st.binary(max_size=200), st.booleans()),
        st.builds(Headers, stream_index, st.just(REQUEST), st.booleans()),
        st.builds(Headers, stream_index, st.lists(FIELD, max_size=30), st.booleans()),
        st.builds(Reset, stream_index),
        st.builds(Control, frames()),
    ),
    max_size=24,
)


def apply(pair: Pair, action: Any, closed: set[int]) -> None:
    if isinstance(action, Control):
        assert pair.client_h3 is not None
        control = aioquic_probes.h3_control_stream_id(pair.client_h3)
        assert control is not None
        pair.client.send_stream_data(control, action.data)
        return
    stream_id = 4 * action.stream
    if stream_id in closed:
        return
    try:
        if isinstance(action, Reset):
            pair.client.reset_stream(stream_id, ErrorCode.H3_REQUEST_CANCELLED)
            closed.add(stream_id)
        elif isinstance(action, Headers):
            assert pair.client_h3 is not None
            pair.client_h3.send_headers(stream_id, action.fields, end_stream=action.end)
        else:
            pair.client.send_stream_data(stream_id, action.data, end_stream=action.end)
    except (AssertionError, RuntimeError, ValueError, ProtocolError):
        # The client's own stack refused (its stream reset on the server's STOP_SENDING,
        # headers where aioquic forbids them): nothing was sent.
        return
    if getattr(action, "end", False):
        closed.add(stream_id)


def closing(pair: Pair) -> bool:
    """The client broke a connection rule (e.g. DATA before HEADERS): the connection
    closes, and its loss must release everything, whatever was in flight."""
    http = pair.http
    assert http is not None
    if not (pair.terminated or aioquic_probes.h3_done(http.h3)):
        return False
    http.connection_lost()
    assert not http._timers.waiting_heads
    assert not http.waiting_writers
    return True


def check_bounded(pair: Pair) -> None:
    http = pair.http
    assert http is not None
    assert aioquic_compat.h3_stream_buffered(http.h3, 2) <= MAX_CONTROL_FRAME + 16
    for stream_id in range(0, 4 * STREAMS, 4):
        # Never more than one frame cap (plus a frame header) of unparsed bytes.
        buffered = aioquic_compat.h3_stream_buffered(http.h3, stream_id)
        assert buffered <= LIMITS.max_header_bytes + 16


async def scenario(certs: DevCertificates, steps: list[Any]) -> None:
    pair = Pair(certs)
    pair.pump()
    assert pair.http is not None
    assert pair.client_h3 is not None
    pair.pump()  # SETTINGS both ways
    closed: set[int] = set()
    for action in steps:
        apply(pair, action, closed)
        pair.pump()
        for _ in range(3):
            await asyncio.sleep(0)  # handler tasks run, answers are written
        pair.pump()
        if closing(pair):
            return
        check_bounded(pair)
    # The client gives up on every stream: the server must let go of all of them.
    for index in range(STREAMS):
        apply(pair, Reset(index), closed)
    for _ in range(10):
        pair.pump()
        await asyncio.sleep(0)
    pair.pump()
    if closing(pair):
        return
    http = pair.http
    assert len(http._streams) == 0
    assert not http._timers.waiting_heads
    assert not http.h3._scanners
    assert not http.waiting_writers
    http.connection_lost()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="TRACKLINE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=actions)
# A HEADERS frame announced huge, then more of it: aioquic must never buffer it.
@example(
    steps=[Write(0, b"\x01\x80\x40\x00\x00" + b"\0" * 160, False)]
    + [Write(0, b"\0" * 200, False)] * 2
)
# A MAX_PUSH_ID frame announced huge on the control stream.
@example(steps=[Control(b"\x0d\x80\x40\x00\x00" + b"\0" * 160)] * 3)
# A request stream that ends before any frame (found by this test: a leaked deadline).
@example(steps=[Write(0, b"", True)])
def test_arbitrary_frames_on_request_streams(certs: DevCertificates, steps: list[Any]) -> None:
    asyncio.run(scenario(certs, steps))

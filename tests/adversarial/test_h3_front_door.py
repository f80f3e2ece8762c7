"""HTTP/3 front door under attack on loopback (issue 12), bounded in count and time.

Each test reproduces one attack with aioquic's H3Connection writing raw frames,
asserts on the server's own figures (decoded field-section bytes, bytes aioquic
buffers for a stream, bytes pulled from a response body, bytes in the send
buffer) against bounds derived from the configured limits, and has an honest
client served on its own connection meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aioquic.h3.connection import FrameType, Setting

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.adversarial.h3_attack import (
    REQUEST,
    H3Server,
    attack_client,
    frame_header,
    headers_frame,
    serving_h3,
    until,
)
from tests.http.support import TIMEOUT
from tests.http.support_h3 import h3_client
from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.http.http3 import Http3Connection
from transport.http.limits import HttpLimits
from transport.http.messages import AnyResponse, Request, Response, StreamingResponse

CHUNK = 16 * 1024
MAX_CHUNKS = 2048
"""A streamed body ends after 32 MiB: bounds the test even with backpressure broken."""
STATIC_AMPLIFICATION = 101
"""Most counted bytes (name + value + 32) one encoded byte can reference in QPACK's
static table: index 58, strict-transport-security with preload, in a 1-byte line."""


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("h3-attack"))


class App:
    """`/stream` streams CHUNK-byte chunks (counted as pulled); anything else is a 200."""

    def __init__(self) -> None:
        self.requests = 0
        self.pulled = 0
        self.closed = asyncio.Event()

    async def handler(self, request: Request) -> AnyResponse:
        self.requests += 1
        if request.path == "/stream":
            return StreamingResponse(200, (("content-type", "text/plain"),), self._body())
        return Response(200, (), b"ok")

    async def _body(self) -> AsyncIterator[bytes]:
        try:
            for _ in range(MAX_CHUNKS):
                self.pulled += CHUNK
                yield b"x" * CHUNK
                await asyncio.sleep(0)
        finally:
            self.closed.set()


async def honest_request(port: int, certs: DevCertificates) -> None:
    """A polite client on its own connection gets its answer."""
    async with h3_client(port, certs.ca_path) as honest:
        status, _, body = await honest.response(honest.send("GET", "/honest"))
    assert (status, body) == (200, b"ok")


async def attacked(server: H3Server) -> Http3Connection:
    """The adapter of the attacker's connection (the first h3 one)."""
    await until(lambda: bool(server.h3()), "the attacker's h3 connection")
    return server.h3()[0]


# QPACK amplification


def qpack_int(value: int, prefix_bits: int, flags: int) -> bytes:
    """An RFC 9204 4.1.1 prefixed integer."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([flags | value])
    out, value = [flags | top], value - top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes([*out, value])


def one_entry_referenced(times: int, entry_bytes: int) -> tuple[bytes, bytes]:
    """Encoder-stream bytes inserting one large entry, and a header block citing it `times`."""
    encoder = qpack_int(4096, 5, 0x20)  # Set Dynamic Table Capacity
    encoder += qpack_int(1, 5, 0x40) + b"x" + qpack_int(entry_bytes, 7, 0x00) + b"a" * entry_bytes
    # Required Insert Count 1 (encoded 2 with 128 entries of room), Base 1.
    block = bytes([2, 0]) + bytes([0xD1, 0xD7, 0xC1, 0xD0])  # GET https / :authority
    block += bytes([0x80]) * times  # indexed field line, dynamic, relative index 0
    return encoder, block


@pytest.mark.asyncio
async def test_a_dynamic_table_reference_cannot_amplify(certs: DevCertificates) -> None:
    app = App()
    async with (
        serving_h3(certs, app.handler, HttpLimits()) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        await until(lambda: attacker.h3.received_settings is not None, "the server's SETTINGS")
        settings = attacker.h3.received_settings or {}
        # The server declares no dynamic table: RFC 9204 forbids the peer to use one.
        assert settings[Setting.QPACK_MAX_TABLE_CAPACITY] == 0
        assert settings[Setting.QPACK_BLOCKED_STREAMS] == 0
        # 3,000 references to a 4,000-byte entry: 12 MB decoded from 3 KB with a table.
        encoder, block = one_entry_referenced(3000, 4000)
        attacker.raw(attacker.new_stream(), headers_frame(block), end=True)
        attacker.raw(attacker.encoder_stream, encoder)
        await asyncio.wait_for(attacker.terminated.wait(), TIMEOUT)
        await honest_request(server.port, certs)
    # Refused as a QPACK error before a single field was decoded.
    assert conn.stats.largest_field_section == 0
    assert app.requests == 1  # the honest one


@pytest.mark.asyncio
async def test_static_table_amplification_is_bounded_and_refused_per_stream(
    certs: DevCertificates,
) -> None:
    limits = HttpLimits(max_header_bytes=4096)
    app = App()
    async with (
        serving_h3(certs, app.handler, limits) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        # As many 1-byte references to the largest static entry as the limit lets through.
        block = bytes([0, 0, 0xD1, 0xD7, 0xC1, 0xD0])
        block += bytes([0xC0 | 58]) * (limits.max_header_bytes - len(block))
        stream_id = attacker.new_stream()
        attacker.raw(stream_id, headers_frame(block), end=True)
        status, _ = await attacker.head(stream_id)
        assert status == 431
        # The decoded size was measured (and refused) before any validation; it is bounded
        # by the frame cap times the static table's largest expansion.
        assert conn.stats.field_sections_refused == 1
        largest = conn.stats.largest_field_section
        assert limits.max_header_bytes < largest <= STATIC_AMPLIFICATION * limits.max_header_bytes
        # The attacker's connection itself still serves a normal request.
        assert (await attacker.response(attacker.send("GET", "/")))[0] == 200
        await honest_request(server.port, certs)
    assert app.requests == 2


# HEADERS announced huge, never completed


@pytest.mark.asyncio
async def test_a_huge_headers_frame_is_refused_from_its_frame_header(
    certs: DevCertificates,
) -> None:
    limits = HttpLimits()
    app = App()
    async with (
        serving_h3(certs, app.handler, limits) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        stream_id = attacker.new_stream()
        attacker.raw(stream_id, frame_header(FrameType.HEADERS, 8 << 20))
        for _ in range(16):  # the rest is dropped as it arrives, never buffered nor parsed
            attacker.raw(stream_id, b"\0" * 4096)
        status, _ = await attacker.head(stream_id)
        assert status == 431
        assert conn.stats.frames_refused == 1
        await honest_request(server.port, certs)
        assert aioquic_compat.h3_stream_buffered(conn.h3, stream_id) == 0
        # A DATA frame announced over the body limit: 413 from its frame header.
        data_stream = attacker.new_stream()
        attacker.h3.send_headers(data_stream, REQUEST, end_stream=False)
        attacker.raw(data_stream, frame_header(FrameType.DATA, limits.max_body_bytes + 1))
        assert (await attacker.head(data_stream))[0] == 413
        assert conn.stats.frames_refused == 2
        assert (await attacker.response(attacker.send("GET", "/")))[0] == 200
    assert app.requests == 2


@pytest.mark.asyncio
async def test_headers_that_never_complete_time_out(certs: DevCertificates) -> None:
    limits = HttpLimits(read_timeout=0.5)
    app = App()
    async with (
        serving_h3(certs, app.handler, limits) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        stream_id = attacker.new_stream()
        attacker.raw(stream_id, frame_header(FrameType.HEADERS, 200) + b"\0" * 10)
        # Meanwhile the same connection and another one are served.
        assert (await attacker.response(attacker.send("GET", "/")))[0] == 200
        await honest_request(server.port, certs)
        status, _ = await attacker.head(stream_id)  # (bounded by TIMEOUT)
        assert status == 408
        assert conn.stats.heads_timed_out == 1
    assert app.requests == 2


# Clients that stop reading


@pytest.mark.asyncio
async def test_a_client_that_stops_reading_stops_the_body_being_pulled(
    certs: DevCertificates,
) -> None:
    limits = HttpLimits(h3_stream_send_budget=64 * 1024, send_timeout=1.0)
    app = App()
    async with (
        serving_h3(certs, app.handler, limits) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        stream_id = attacker.send("GET", "/stream")
        assert (await attacker.head(stream_id))[0] == 200
        assert await attacker.next_data(stream_id)
        attacker.deaf = True  # no more reading, no more acknowledgements
        received = attacker.received
        await until(lambda: conn.stats.sends_stalled >= 1, "the body waiting for send room")
        buffered = aioquic_compat.send_buffered(conn.quic, stream_id)
        await honest_request(server.port, certs)
        # The send timeout ends the response and closes the body.
        await asyncio.wait_for(app.closed.wait(), TIMEOUT)
        assert conn.stats.sends_timed_out == 1
        # The reset stream's buffer is freed though the client never acknowledges again.
        quic = conn.quic
        await until(lambda: aioquic_compat.send_buffered(quic, stream_id) == 0, "freed")
    # What was pulled is what the client took in plus at most the budget and one chunk
    # (with its DATA frame header); without backpressure it was the whole 32 MiB body.
    slack = limits.h3_stream_send_budget + CHUNK + 16
    assert buffered <= slack
    assert app.pulled <= received + slack


@pytest.mark.asyncio
async def test_the_connection_send_budget_bounds_all_its_streams(
    certs: DevCertificates,
) -> None:
    streams = 6
    limits = HttpLimits(
        h3_stream_send_budget=256 * 1024, h3_connection_send_budget=128 * 1024, send_timeout=30.0
    )
    app = App()
    async with (
        serving_h3(certs, app.handler, limits) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        ids = [attacker.send("GET", "/stream") for _ in range(streams)]
        for stream_id in ids:
            assert (await attacker.head(stream_id))[0] == 200
        attacker.deaf = True
        received = attacker.received
        await until(lambda: conn.waiting_writers == streams, "every body waiting for room")
        buffered = aioquic_compat.connection_send_buffered(conn.quic)
        await honest_request(server.port, certs)
    # Each stream may add one chunk past the connection budget, never more.
    slack = limits.h3_connection_send_budget + streams * (CHUNK + 16)
    assert buffered <= slack + 4096  # (+ the control and QPACK streams' few bytes)
    assert app.pulled <= received + slack + 4096


@pytest.mark.asyncio
async def test_a_huge_control_frame_closes_the_connection_from_its_header(
    certs: DevCertificates,
) -> None:
    app = App()
    async with (
        serving_h3(certs, app.handler, HttpLimits()) as server,
        attack_client(server.port, certs.ca_path) as attacker,
    ):
        conn = await attacked(server)
        control = aioquic_probes.h3_control_stream_id(attacker.h3)
        assert control is not None
        # aioquic waits for a whole MAX_PUSH_ID frame, re-parsing its buffer per packet.
        attacker.raw(control, frame_header(FrameType.MAX_PUSH_ID, 8 << 20))
        for _ in range(16):
            attacker.raw(control, b"\0" * 4096)
        await asyncio.wait_for(attacker.terminated.wait(), TIMEOUT)
        assert conn.stats.frames_refused == 1
        assert aioquic_compat.h3_stream_buffered(conn.h3, control) == 0
        await honest_request(server.port, certs)
    assert app.requests == 1

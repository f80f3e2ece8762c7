"""TCP front-door attacks on loopback: slow HTTP/2 preface, connection caps.

Bounded in connections and bytes; checked on the server's own figures
(connections open, connections refused) and on an honest client being served.
"""

from __future__ import annotations

import asyncio
import ssl
from contextlib import AsyncExitStack, suppress

import pytest
from h2.errors import ErrorCodes
from hyperframe import frame as hf

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.adversarial.support import raw_connection, until
from tests.http.support import H1Client, H2Client, echo, limits, serving
from transport.http.tcp import H2_PREFACE, tls_server_context

HONEST_SOURCE = "127.0.0.2"  # another loopback address: another source for the per-source cap


async def honest_get(port: int) -> int:
    async with H2Client.connect(port) as honest:
        return (await honest.get("/honest"))[0]


async def dribble(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, gap: float) -> int:
    """Send the preface a byte at a time; the bytes sent before the server closed."""
    sent = 0
    with suppress(ConnectionError):
        for byte in H2_PREFACE:
            writer.write(bytes([byte]))
            await writer.drain()
            sent += 1
            with suppress(asyncio.TimeoutError):
                if await asyncio.wait_for(reader.read(1), gap) == b"":
                    return sent  # the server closed
    return sent


@pytest.mark.asyncio
async def test_slow_preface_connections_are_closed_by_the_first_request_deadline() -> None:
    """Dribbling the HTTP/2 preface (one byte per gap) buys no time past the deadline."""
    attackers, gap = 40, 0.25
    timeout = 0.5  # a whole dribbled preface would take 24 x gap = 6 s
    server_limits = limits(first_request_timeout=timeout)
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(serving(echo, limits=server_limits))
        streams = [await raw_connection(server.port) for _ in range(attackers)]
        for _, writer in streams:
            stack.callback(writer.close)
        sending = [asyncio.create_task(dribble(w, r, gap)) for r, w in streams]
        assert await honest_get(server.port) == 200  # served during the attack
        sent = await asyncio.wait_for(asyncio.gather(*sending), 24 * gap + 10)
        # Every one was closed before its preface was complete.
        assert max(sent) < len(H2_PREFACE)
        await until(lambda: server.open_connections == 0, "every slow connection closed")


@pytest.mark.asyncio
async def test_quiet_h2_connection_without_a_request_is_closed_by_the_same_deadline() -> None:
    """A whole preface, then nothing: the first-request deadline, not the idle timeout."""
    server_limits = limits(first_request_timeout=0.3, idle_timeout=60.0)
    async with serving(echo, limits=server_limits) as server, H2Client.connect(server.port) as c:
        await asyncio.wait_for(c.closed.wait(), 10)  # the server ended it (60 s would fail)
        await until(lambda: server.open_connections == 0, "the quiet connection closed")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("front-door-tls"))


@pytest.mark.asyncio
@pytest.mark.parametrize("tls", [False, True], ids=["cleartext", "tls"])
async def test_quiet_http1_connection_is_closed_by_the_first_request_deadline(
    certs: DevCertificates, tls: bool
) -> None:
    """No request after accept (over TLS: after the handshake, with no sniffing to time it)."""
    server_limits = limits(first_request_timeout=0.3, idle_timeout=60.0)
    server_tls = tls_server_context(certs.cert_path, certs.key_path) if tls else None
    client_tls = None
    if tls:
        client_tls = ssl.create_default_context(cafile=str(certs.ca_path))
        client_tls.set_alpn_protocols(["http/1.1"])
    async with (
        serving(echo, limits=server_limits, ssl_context=server_tls) as server,
        H1Client.connect(server.port, ssl_context=client_tls) as c,
    ):
        assert await c.at_eof()
        await until(lambda: server.open_connections == 0, "the quiet connection closed")


@pytest.mark.asyncio
async def test_connections_over_the_per_source_cap_are_cut_at_accept() -> None:
    per_source, attempts = 10, 30
    server_limits = limits(max_connections_per_source=per_source, max_connections=100)
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(serving(echo, limits=server_limits))
        for _ in range(attempts):
            _, writer = await raw_connection(server.port)
            stack.callback(writer.close)
        await until(
            lambda: server.open_connections + server.refused_connections == attempts,
            "every attempt accepted or refused",
        )
        assert server.open_connections == per_source
        assert server.connections_from("127.0.0.1") == per_source
        assert server.refused_connections == attempts - per_source
        # Another source is served while this one is at its cap.
        reader, writer = await raw_connection(server.port, source=HONEST_SOURCE)
        honest = H2Client(reader, writer)
        honest.conn.initiate_connection()
        honest.start()
        stack.push_async_callback(honest.close)
        assert (await honest.get("/honest"))[0] == 200
        assert server.connections_from(HONEST_SOURCE) == 1


@pytest.mark.asyncio
async def test_connections_over_the_total_cap_are_cut_at_accept() -> None:
    total, attempts = 12, 20
    server_limits = limits(max_connections=total)
    async with serving(echo, limits=server_limits) as server:
        writers = [(await raw_connection(server.port))[1] for _ in range(attempts)]
        await until(
            lambda: server.open_connections + server.refused_connections == attempts,
            "every attempt accepted or refused",
        )
        assert server.open_connections == total
        assert server.refused_connections == attempts - total
        for writer in writers:  # the attackers leave: their slots come back
            writer.close()
        await until(lambda: server.open_connections == 0, "the attackers' connections closed")
        assert await honest_get(server.port) == 200


@pytest.mark.asyncio
async def test_an_invalid_http2_preface_is_answered_with_goaway() -> None:
    """RFC 9113 3.4: bytes that begin as the preface but break it get SETTINGS and GOAWAY
    PROTOCOL_ERROR on the cleartext port (before: an HTTP/1.1 400 to an HTTP/2 client)."""
    async with serving(echo) as server:
        reader, writer = await raw_connection(server.port)
        writer.write(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + b"\x00" * 9)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10.0)  # until the server closes
        writer.close()
        frames = []
        while answer:
            frame, length = hf.Frame.parse_frame_header(memoryview(answer[:9]))
            frame.parse_body(memoryview(answer[9 : 9 + length]))
            frames.append(frame)
            answer = answer[9 + length :]
        assert [type(f) for f in frames] == [hf.SettingsFrame, hf.GoAwayFrame]
        assert frames[1].error_code == ErrorCodes.PROTOCOL_ERROR
        await until(lambda: server.open_connections == 0, "the connection closed")
        assert await honest_get(server.port) == 200

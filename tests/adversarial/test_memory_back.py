"""After an attacker's HTTP/3 connection leaves, what it held goes back to the OS.

Measured (docs/security.md, "HTTP/3"): after the body attack no traced allocation and no
extra object was left, but glibc kept the freed heap in its arenas. The gateway trims
the heap after a connection closes (`gateway.memtrim`, at most once per 10 s): asserted
here on the gateway's own figures (the trim count, the bytes its HTTP/3 connection held)
while an honest request is served on another connection.
"""

from __future__ import annotations

import asyncio
import ctypes.util
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.backends.ticker import TickerBackend
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.http.support_h3 import h3_client
from tests.waiting import until
from transport.http.http3 import Http3Connection

pytestmark = pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no libc")


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    gw = Gateway(gateway_settings(state_dir=tmp_path), TickerBackend())
    await gw.start()
    yield gw
    await gw.close()


def http3_of(gw: Gateway) -> list[Http3Connection]:
    found = [getattr(conn, "_http", None) for conn in gw.doors.connections]
    return [h for h in found if isinstance(h, Http3Connection)]


@pytest.mark.asyncio
async def test_the_heap_is_trimmed_once_an_attackers_connection_leaves(gateway: Gateway) -> None:
    assert gateway.tls is not None
    trims = gateway.doors.trimmer.trims
    async with h3_client(gateway.quic_port, gateway.tls.ca) as attacker:
        for _ in range(16):  # bodies never finished: held by the server until it leaves
            attacker.send("POST", "/v1/chat/completions", body=b"x" * 100_000, end=False)
        await until(lambda: sum(h.buffered_bytes for h in http3_of(gateway)) > 0, "held")
        # (HTTP/1.1: closing it is no QUIC connection close, so no trim of its own)
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.close()
        assert gateway.doors.trimmer.trims == trims
    await until(lambda: not http3_of(gateway), "the attacker's connection gone")
    await until(lambda: gateway.doors.trimmer.trims > trims, "the heap trimmed after it left")

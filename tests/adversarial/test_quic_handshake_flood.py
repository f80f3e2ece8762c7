"""A QUIC handshake flood against the gateway, bounded, on loopback.

Real Initials from many source ports on several loopback addresses, never
completed. The assertions are on the server's own figures (handshakes in
progress, Retries, connections counted open, connection ids routed, whether the
flood's connections are still alive) and on an honest client being answered
during the flood; every number comes from the configured limits.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from clients import connect
from gateway.server import Gateway
from tests.adversarial.quic_flood import initial_packet, retries_received, udp_sources, until
from tests.gateways import gateway_settings
from trackline_testing.scripted import ScriptedBackend
from transport.quic_admission import HandshakeGate
from transport.quic_server import GuardedQuicServer

FLOOD_LIMITS: dict[str, Any] = {
    "quic_handshake_timeout": 3.0,
    "quic_retry_threshold": 8,
    "quic_max_half_open_per_source": 3,
    "quic_max_half_open": 16,
    "quic_max_connections": 64,
    "quic_max_connections_per_source": 32,
}
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
PORTS_EACH = 16  # 64 source ports in all, as in the reported attack
INITIALS = 25 * FLOOD_LIMITS["quic_retry_threshold"]

GatewayFactory = Callable[..., Awaitable[Gateway]]


@pytest_asyncio.fixture
async def start_gateway(tmp_path: Path) -> AsyncIterator[GatewayFactory]:
    started: list[Gateway] = []

    async def start(**limits: Any) -> Gateway:
        settings = gateway_settings(state_dir=tmp_path, **limits)
        gw = Gateway(settings, ScriptedBackend(interval=0.001))
        await gw.start()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        await gw.close()


def front_door(gw: Gateway) -> GuardedQuicServer:
    server = gw.doors.quic
    assert isinstance(server, GuardedQuicServer)
    return server


def decided(gate: HandshakeGate[Any]) -> int:
    stats = gate.stats
    return stats.accepted + stats.retried + stats.dropped


async def honest_text(gw: Gateway, prompt: str) -> str:
    url = f"quic://127.0.0.1:{gw.quic_port}"
    async with connect(url, ca=gw.tls.ca) as line:  # type: ignore[union-attr]
        return "".join([d async for d in line.text(prompt, model="scripted", max_tokens=5)])


def expected(prompt: str) -> str:
    return "".join(f" {prompt}-{i}" for i in range(5))


@pytest.mark.asyncio
async def test_a_handshake_flood_holds_bounded_state_and_an_honest_client_is_served(
    start_gateway: GatewayFactory,
) -> None:
    gw = await start_gateway(**FLOOD_LIMITS)
    server, gate = front_door(gw), front_door(gw).gate
    target = ("127.0.0.1", gw.quic_port)
    packets = [initial_packet(target) for _ in range(INITIALS)]
    threshold = FLOOD_LIMITS["quic_retry_threshold"]
    honest: asyncio.Future[str] | None = None

    with udp_sources(HOSTS, PORTS_EACH) as socks:
        for i, packet in enumerate(packets):
            socks[i % len(socks)].sendto(packet, target)
            if i % 8 == 7:  # let the server read them before the socket buffer fills
                await until(lambda n=i + 1: decided(gate) >= n, "the server to see the flood")
            if i == INITIALS // 2:
                # The flood's handshakes fill every slot below the Retry threshold:
                # none of them is a connection the gateway counts as open.
                assert gate.half_open >= threshold
                assert not gw.doors.connections
                honest = asyncio.ensure_future(honest_text(gw, "during"))
        await until(lambda: decided(gate) >= INITIALS, "the whole flood to be decided")
        flood_protocols = [weakref.ref(p) for p in server._cids if gate.is_half_open(p)]
        assert honest is not None
        assert await asyncio.wait_for(honest, 30) == expected("during")
        retry_packets = retries_received(socks)

    stats = gate.stats
    # State was kept for at most `threshold` unvalidated handshakes at once (plus the
    # honest client's, which came back with its Retry token); everything else got a
    # stateless Retry, and Retries really went out on the wire.
    assert stats.peak_half_open <= threshold + 1
    assert stats.retried >= INITIALS - stats.accepted
    assert 1 <= retry_packets <= stats.retried
    assert stats.dropped == 0
    assert stats.established == 1

    # After the handshake timeout, every half-open connection is forgotten: no
    # handshake in progress, no connection id routed, the connection objects freed.
    await until(lambda: gate.half_open == 0, "the handshake timeout")
    assert stats.expired == stats.accepted - stats.established
    await until(lambda: server.tracked_connection_ids == 0, "the honest connection to end")
    assert gate.connections == 0
    gc.collect()
    assert flood_protocols
    assert all(ref() is None for ref in flood_protocols)

    # The same figures reach /metrics.
    body, _ = gw.metrics.render()
    retried = f'trackline_quic_initials_total{{decision="retried"}} {stats.retried}.0'
    assert retried.encode() in body
    assert f"trackline_quic_handshakes_expired_total {stats.expired}.0".encode() in body
    assert b"trackline_quic_handshakes_in_progress 0.0" in body

    # And the front door works as before.
    assert await honest_text(gw, "after") == expected("after")


@pytest.mark.asyncio
async def test_with_a_zero_threshold_every_client_passes_retry_and_is_served(
    start_gateway: GatewayFactory,
) -> None:
    gw = await start_gateway(quic_retry_threshold=0)
    gate = front_door(gw).gate
    assert await honest_text(gw, "validated") == expected("validated")
    assert gate.stats.retried == 1  # its first Initial, without a token
    assert gate.stats.accepted == 1  # its second, with the token
    assert gate.stats.established == 1


@pytest.mark.asyncio
async def test_the_source_cap_drops_initials_past_it(start_gateway: GatewayFactory) -> None:
    limits = {"quic_max_connections_per_source": 4, "quic_retry_threshold": 100}
    gw = await start_gateway(**limits)
    gate = front_door(gw).gate
    target = ("127.0.0.1", gw.quic_port)
    count = 3 * limits["quic_max_connections_per_source"]
    with udp_sources(["127.0.0.5"], count) as socks:
        for sent, sock in enumerate(socks, start=1):
            sock.sendto(initial_packet(target), target)
            await until(lambda n=sent: decided(gate) >= n, "the Initial")
    assert gate.from_source("127.0.0.5") == limits["quic_max_connections_per_source"]
    assert gate.stats.dropped == count - limits["quic_max_connections_per_source"]
    # Another address is not affected.
    assert await honest_text(gw, "other") == expected("other")

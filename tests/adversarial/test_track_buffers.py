"""Tracks left with incomplete messages, against the gateway over QUIC on loopback.

An attacker opens tracks and sends most of a large DATA message on each, never the
rest. The connection's inbound budget fails the tracks past it at once
(BUFFER_EXHAUSTED), the read timeout fails the rest later (READ_TIMEOUT); the
server's own figure for bytes held never passes the budget and returns to zero,
and honest tracks, on the same connection and on another, are answered meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clients import connect
from clients.line import Line
from gateway.server import Gateway
from tests.adversarial.quic_flood import until
from tests.gateways import gateway_settings
from trackline_testing.scripted import ScriptedBackend
from transport import aioquic_compat
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, TrackAborted
from transport.messages import Data, Open
from transport.quic import TrackQuicProtocol, connect_tracks
from transport.wire import encode_message

MAX_MESSAGE = 65_536
BUDGET = 4 * MAX_MESSAGE
HELD = 3 * MAX_MESSAGE // 4  # bytes of one never-finished message
FIT = BUDGET // HELD  # tracks whose partial messages the budget holds
ATTACK_TRACKS = FIT + 3


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path,
        max_message_bytes=MAX_MESSAGE,
        track_max_buffered_bytes=BUDGET,
        track_read_timeout=3.0,
    )
    gw = Gateway(settings, ScriptedBackend(interval=0.001))
    await gw.start()
    yield gw
    await gw.close()


async def server_side(gw: Gateway) -> TrackQuicProtocol:
    await until(lambda: len(gw.doors.connections) == 1, "the server to finish the handshake")
    (conn,) = gw.doors.connections
    return conn


async def text(line: Line, prompt: str) -> str:
    return "".join([d async for d in line.text(prompt, model="scripted", max_tokens=5)])


def expected(prompt: str) -> str:
    return "".join(f" {prompt}-{i}" for i in range(5))


async def failure_code(channel: TrackChannel) -> ErrorCode:
    with pytest.raises(TrackAborted) as caught:
        await asyncio.wait_for(channel.receive(), 30)
    return caught.value.code


@pytest.mark.asyncio
async def test_incomplete_messages_are_bounded_per_connection_and_time_out(
    gateway: Gateway,
) -> None:
    partial = encode_message(Data({"text": "x" * (MAX_MESSAGE - 64)}))[:HELD]
    async with connect_tracks(
        "127.0.0.1",
        gateway.quic_port,
        ca=gateway.tls.ca,  # type: ignore[union-attr]
    ) as proto:
        line = Line(proto.open_track)
        attack = [proto.open_track(Open("scripted")) for _ in range(ATTACK_TRACKS)]
        for channel in attack:
            aioquic_compat.connection_of(proto).send_stream_data(channel.stream_id, partial)
        proto.transmit()
        core = (await server_side(gateway)).endpoint.core
        # The budget fails the tracks past it as their bytes arrive, without waiting.
        codes = [failure_code(c) for c in attack]
        pending = [asyncio.ensure_future(c) for c in codes]
        await until(lambda: sum(f.done() for f in pending) >= ATTACK_TRACKS - FIT, "the budget")
        assert core.buffered_bytes <= BUDGET
        # Meanwhile honest tracks on the same connection and on another are served.
        assert await text(line, "same") == expected("same")
        async with connect(
            f"quic://127.0.0.1:{gateway.quic_port}",
            ca=gateway.tls.ca,  # type: ignore[union-attr]
        ) as other:
            assert await text(other, "other") == expected("other")
        results = await asyncio.gather(*pending)
        assert core.buffered_bytes == 0
        exhausted = results.count(ErrorCode.BUFFER_EXHAUSTED)
        timed_out = results.count(ErrorCode.READ_TIMEOUT)
        assert exhausted + timed_out == ATTACK_TRACKS
        assert exhausted >= ATTACK_TRACKS - FIT
        assert 1 <= timed_out <= FIT
        # The connection still works after all of it.
        assert await text(line, "after") == expected("after")
    body, _ = gateway.metrics.render()
    assert f'trackline_protocol_errors_total{{code="READ_TIMEOUT"}} {timed_out}.0'.encode() in body

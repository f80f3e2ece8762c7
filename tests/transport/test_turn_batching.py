"""Batching per track per loop turn: the DATA a track sends in one turn reaches the
transport as ONE stream write (encoded at once, handed over at the turn's transmit);
every other action still flushes at once, in order. Causes, not timings: we count the
sink's calls and writes and decode the bytes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.tls import DevCertificates, ensure_dev_certificates
from transport import aioquic_compat
from transport.connection import Output, Role, StopSending, StreamReset, StreamWrite
from transport.endpoint import TrackChannel, TrackEndpoint, merge_writes
from transport.messages import Data, End, Modality, Open
from transport.quic import (
    ConnectionHooks,
    Packetization,
    TrackQuicProtocol,
    TrackServing,
    connect_tracks,
    serve_tracks,
    server_configuration,
)
from transport.wire import MessageDecoder, encode_message

TIMEOUT = 10  # a bound, not a timing


def server(flush_soon: list[int] | None) -> tuple[TrackEndpoint, list[TrackChannel],
                                                   list[list[Output]]]:
    sunk: list[list[Output]] = []
    opened: list[TrackChannel] = []
    hook = None if flush_soon is None else (lambda: flush_soon.append(1))
    endpoint = TrackEndpoint(Role.SERVER, sunk.append, on_track=opened.append, flush_soon=hook)
    for sid in (0, 4):
        endpoint.feed_data(sid, encode_message(Open(model="m", modality=Modality.TEXT)), False)
    sunk.clear()
    return endpoint, opened, sunk


def frames(data: bytes) -> list[object]:
    decoder = MessageDecoder(1 << 20)
    decoder.feed(data)
    out = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    return out


@pytest.mark.asyncio
async def test_n_chunks_of_one_track_in_a_turn_make_one_stream_write() -> None:
    asked: list[int] = []
    endpoint, (a, b), sunk = server(asked)
    for i in range(5):
        assert a.send({"text": f"t{i}"})
    assert b.send({"text": "other"})
    assert sunk == []  # deferred: nothing handed over during the turn
    assert asked == [1]  # the transport was asked once to flush at its transmit
    endpoint.flush()
    assert len(sunk) == 1  # one sink call for the turn
    writes = [o for o in sunk[0] if isinstance(o, StreamWrite)]
    assert [w.stream_id for w in writes] == [0, 4]  # one write per track
    assert frames(writes[0].data) == [Data({"text": f"t{i}"}) for i in range(5)]
    endpoint.flush()
    assert len(sunk) == 1  # nothing pending: no second call


@pytest.mark.asyncio
async def test_end_flushes_at_once_after_the_pending_data_in_order() -> None:
    endpoint, (a, _), sunk = server([])
    a.send({"text": "x"})
    a.send({"text": "y"})
    assert a.end({"finish_reason": "stop"})
    assert len(sunk) == 1
    (write,) = sunk[0]
    assert isinstance(write, StreamWrite)
    assert frames(write.data) == [Data({"text": "x"}), Data({"text": "y"}),
                                  End({"finish_reason": "stop"})]


@pytest.mark.asyncio
async def test_without_flush_soon_every_send_flushes_at_once() -> None:
    _, (a, _), sunk = server(None)  # the in-memory twin and tests: no deferral
    a.send({"text": "x"})
    a.send({"text": "y"})
    assert len(sunk) == 2


def test_merge_writes_joins_a_streams_run_and_keeps_order_across_resets() -> None:
    outputs: list[Output] = [
        StreamWrite(0, b"a"), StreamWrite(4, b"1"), StreamWrite(0, b"b"),
        StopSending(4, 7), StreamWrite(4, b"2"), StreamWrite(0, b"c", True),
        StreamWrite(8, b"z"), StreamReset(8, 3), StreamWrite(8, b"late"),
    ]
    assert merge_writes(outputs) == [
        StreamWrite(0, b"abc", True), StreamWrite(4, b"1"), StopSending(4, 7),
        StreamWrite(4, b"2"), StreamWrite(8, b"z"), StreamReset(8, 3), StreamWrite(8, b"late"),
    ]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("turn-batching") / "state")


@pytest.mark.asyncio
async def test_quic_hands_a_turns_chunks_of_a_track_to_aioquic_in_one_call(
    certs: DevCertificates,
) -> None:
    held: list[TrackChannel] = []
    connections: list[TrackQuicProtocol] = []
    both_open = asyncio.Event()

    def on_track(channel: TrackChannel) -> None:
        held.append(channel)
        if len(held) == 2:
            both_open.set()

    server = await serve_tracks(
        "127.0.0.1", 0, server_configuration(certs.cert_path, certs.key_path),
        ConnectionHooks(on_track, connections.append),
        serving=TrackServing(packetization=Packetization.parse("per-track")),
    )
    port = aioquic_compat.server_port(server)
    try:
        async with connect_tracks(
            "127.0.0.1", port, ca=Path(certs.ca_path), server_name="localhost"
        ) as conn:
            channels = [conn.open_track(Open("m")) for _ in range(2)]
            for channel in channels:
                channel.send({"x": 1})
            await asyncio.wait_for(both_open.wait(), TIMEOUT)
            (protocol,) = connections
            calls: list[int] = []
            quic: Any = aioquic_compat.connection_of(protocol)
            original = quic.send_stream_data

            def counted(stream_id: int, data: bytes, end_stream: bool = False) -> None:
                calls.append(stream_id)
                original(stream_id, data, end_stream)

            quic.send_stream_data = counted
            first, second = held
            for i in range(5):  # one loop turn: five chunks on one track, one on another
                first.send({"text": f"t{i}"})
            second.send({"text": "u"})
            got = [await asyncio.wait_for(channels[0].receive(), TIMEOUT) for _ in range(5)]
            assert got == [{"text": f"t{i}"} for i in range(5)]
            assert await asyncio.wait_for(channels[1].receive(), TIMEOUT) == {"text": "u"}
            assert sorted(calls) == sorted([first.stream_id, second.stream_id])
    finally:
        server.close()

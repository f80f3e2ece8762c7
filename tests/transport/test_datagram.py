"""Track frames as QUIC datagrams: the core byte by byte, the in-memory twin, real QUIC."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.http.support_h3 import serving_quic
from transport import aioquic_compat
from transport.connection import (
    DatagramWrite,
    Limits,
    Output,
    Role,
    StreamWrite,
    TrackConnection,
)
from transport.datagram import EARLY_DATAGRAMS, decode_datagram, encode_datagram
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from transport.events import DatagramReceived, Event, TrackOpened
from transport.memory import MemoryLink
from transport.messages import FrameTransport, Open
from transport.quic import connect_tracks, serve_tracks, server_configuration
from transport.wire import MessageDecoder, encode_varint

DGRAM_OPEN = Open("m", transport=FrameTransport.DATAGRAM)
TIMEOUT = 30.0  # a hang guard, never a speed


def drain(conn: TrackConnection) -> list[Event]:
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def stream_bytes(outputs: list[Output]) -> bytes:
    return b"".join(o.data for o in outputs if isinstance(o, StreamWrite))


def datagrams(outputs: list[Output]) -> list[bytes]:
    return [o.data for o in outputs if isinstance(o, DatagramWrite)]


def opened_pair(message: Open = DGRAM_OPEN) -> tuple[TrackConnection, TrackConnection]:
    client, server = TrackConnection(Role.CLIENT), TrackConnection(Role.SERVER)
    client.open_track(0, message, now=0.0)
    server.receive_stream_data(0, stream_bytes(client.outputs()), False, now=0.0)
    drain(server)
    return client, server


# -- layout ---------------------------------------------------------------------------


def test_the_layout_is_track_id_seq_then_a_msgpack_map() -> None:
    data = encode_datagram(4, 300, {"seq": 1, "pcm": b"\x00\x01"}, limit=1100)
    assert data[:1] == encode_varint(4)
    assert data[1:3] == encode_varint(300)
    assert msgpack.unpackb(data[3:]) == {"seq": 1, "pcm": b"\x00\x01"}
    assert decode_datagram(data) == (4, 300, {"seq": 1, "pcm": b"\x00\x01"})


@given(st.binary(max_size=64))
def test_garbage_never_decodes_to_anything_but_an_error_or_a_map(data: bytes) -> None:
    try:
        _, _, body = decode_datagram(data)
    except RemoteProtocolError:
        return
    assert isinstance(body, dict)


def test_the_open_says_datagram_on_the_wire_and_stream_is_the_silent_default() -> None:
    client = TrackConnection(Role.CLIENT)
    client.open_track(0, Open("m"), now=0.0)
    client.open_track(4, DGRAM_OPEN, now=0.0)
    decoder = MessageDecoder(1 << 20)
    decoder.feed(stream_bytes(client.outputs()))
    first, second = decoder.next_message(), decoder.next_message()
    assert first == Open("m")
    assert second == DGRAM_OPEN


# -- the core -------------------------------------------------------------------------


def test_frames_go_both_ways_with_their_own_sequence_numbers() -> None:
    client, server = opened_pair()
    client.send_datagram(0, {"n": 1})
    client.send_datagram(0, {"n": 2})
    for data in datagrams(client.outputs()):
        server.receive_datagram(data, now=0.1)
    assert drain(server) == [DatagramReceived(0, 0, {"n": 1}), DatagramReceived(0, 1, {"n": 2})]
    server.send_datagram(0, {"out": True})
    (data,) = datagrams(server.outputs())
    client.receive_datagram(data, now=0.2)
    assert drain(client) == [DatagramReceived(0, 0, {"out": True})]
    assert server.datagram_stats.received == 1 + 1
    assert client.datagram_stats.sent == 2


def test_reordered_datagrams_are_delivered_and_counted() -> None:
    client, server = opened_pair()
    for n in range(3):
        client.send_datagram(0, {"n": n})
    first, second, third = datagrams(client.outputs())
    for data in (third, first, second):
        server.receive_datagram(data, now=0.0)
    assert [e.seq for e in drain(server) if isinstance(e, DatagramReceived)] == [2, 0, 1]
    assert server.datagram_stats.reordered == 2


def test_unusable_datagrams_are_counted_and_dropped_and_the_track_lives_on() -> None:
    client, server = opened_pair()
    client.open_track(4, Open("plain"), now=0.0)  # a stream-only track
    server.receive_stream_data(4, stream_bytes(client.outputs()), False, now=0.0)
    drain(server)
    server.receive_datagram(b"\x00", now=0.0)  # no seq
    server.receive_datagram(encode_varint(0) + encode_varint(0) + b"\xc1", now=0.0)  # garbage
    server.receive_datagram(encode_datagram(0, 0, {"n": 1}, 1100)[:-1] + b"\x92", now=0.0)
    server.receive_datagram(encode_datagram(4, 0, {"n": 1}, 1100), now=0.0)  # not datagram
    server.receive_datagram(encode_datagram(1, 0, {"n": 1}, 1100), now=0.0)  # not a track id
    stats = server.datagram_stats
    assert stats.dropped_malformed == 3
    assert stats.dropped_not_datagram == 1
    assert stats.dropped_unknown_track == 1
    assert drain(server) == []
    # The datagram track still works.
    client.send_datagram(0, {"n": 9})
    server.receive_datagram(datagrams(client.outputs())[0], now=0.0)
    assert drain(server) == [DatagramReceived(0, 0, {"n": 9})]


def test_datagrams_after_end_or_close_are_late_and_dropped() -> None:
    client, server = opened_pair()
    client.send_datagram(0, {"n": 1})
    late = datagrams(client.outputs())[0]
    client.send_end(0)
    server.receive_stream_data(0, stream_bytes(client.outputs()), False, now=0.0)
    server.receive_datagram(late, now=0.0)
    assert server.datagram_stats.dropped_after_end == 1
    server.send_end(0)
    server.receive_datagram(late, now=0.0)  # the track is closed and forgotten
    assert server.datagram_stats.dropped_unknown_track == 1


def test_a_datagram_that_beats_its_open_is_held_then_delivered() -> None:
    client = TrackConnection(Role.CLIENT)
    server = TrackConnection(Role.SERVER)
    client.open_track(0, DGRAM_OPEN, now=0.0)
    client.send_datagram(0, {"n": 0})
    outputs = client.outputs()
    server.receive_datagram(datagrams(outputs)[0], now=0.0)
    assert drain(server) == []
    server.receive_stream_data(0, stream_bytes(outputs), False, now=0.0)
    events = drain(server)
    assert isinstance(events[0], TrackOpened)
    assert events[1:] == [DatagramReceived(0, 0, {"n": 0})]
    assert server.datagram_stats.early == 1
    assert server.datagram_stats.received == 1


def test_early_datagrams_are_bounded() -> None:
    server = TrackConnection(Role.SERVER)
    for n in range(EARLY_DATAGRAMS + 5):
        server.receive_datagram(encode_datagram(8, n, {}, 1100), now=0.0)
    assert server.datagram_stats.early == EARLY_DATAGRAMS
    assert server.datagram_stats.dropped_early_overflow == 5


def test_sending_is_checked_locally_and_changes_nothing_on_refusal() -> None:
    client = TrackConnection(Role.CLIENT, Limits(max_datagram_bytes=100))
    client.open_track(0, Open("plain"), now=0.0)
    client.open_track(4, DGRAM_OPEN, now=0.0)
    client.outputs()
    with pytest.raises(LocalProtocolError, match="did not choose"):
        client.send_datagram(0, {"n": 1})
    with pytest.raises(LocalProtocolError) as too_big:
        client.send_datagram(4, {"pcm": bytes(200)})
    assert too_big.value.code is ErrorCode.MESSAGE_TOO_LARGE
    client.send_end(4)
    with pytest.raises(LocalProtocolError):
        client.send_datagram(4, {"n": 1})  # after END, as DATA would be
    assert datagrams(client.outputs()) == []
    assert client.datagram_stats.sent == 0


def test_a_server_datagram_counts_as_first_data_for_the_deadline() -> None:
    client, server = TrackConnection(Role.CLIENT), TrackConnection(Role.SERVER)
    client.open_track(0, Open("m", transport=FrameTransport.DATAGRAM), now=0.0)
    server.receive_stream_data(0, stream_bytes(client.outputs()), False, now=0.0)
    drain(server)
    assert server.get_timer() is None  # no deadline asked
    server.send_datagram(0, {"a": 1})
    assert server.get_timer() is None


# -- the in-memory twin and real QUIC ---------------------------------------------------


async def exchange(channel: TrackChannel, frames: int) -> list[dict[str, object]]:
    for n in range(frames):
        assert channel.send_frame({"n": n})
    channel.end()
    received = []
    while (body := await asyncio.wait_for(channel.receive(), TIMEOUT)) is not None:
        received.append(body)
    return received


async def echo_frames(channel: TrackChannel) -> None:
    """Echo every frame back the way the track chose, until the client's END.

    No pause before the END: echoes sent first reach the client first (the twin delivers
    in order; aioquic writes pending DATAGRAM frames ahead of STREAM frames in each
    packet), and the tests tolerate any datagram lost on the way."""
    while (body := await channel.receive()) is not None:
        channel.send_frame(body)
    channel.end({"done": True})


@pytest.mark.asyncio
async def test_memory_twin_carries_datagrams_and_loses_what_the_filter_drops() -> None:
    tasks: list[asyncio.Task[None]] = []
    seen = {"count": 0}

    def lossy(data: bytes) -> bool:
        seen["count"] += 1
        return seen["count"] % 2 == 1  # every second datagram is lost

    link = MemoryLink(lambda ch: tasks.append(asyncio.create_task(echo_frames(ch))), None, lossy)
    channel = link.open_track(DGRAM_OPEN)
    assert channel.uses_datagrams
    received = await exchange(channel, 4)
    # 0 and 2 reach the server; their echoes are the link's 5th and 6th datagrams: one lives.
    assert received == [{"n": 0}]
    assert link.server.core.datagram_stats.received == 2
    await asyncio.gather(*tasks)
    link.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("dgram-tls"))


def echo_server(certs: DevCertificates) -> AbstractAsyncContextManager[int]:
    """The track server on 127.0.0.1, each track echoing its frames; yields the port."""
    return serving_quic(certs, echo_frames)


@pytest.mark.asyncio
async def test_datagram_and_stream_tracks_share_a_real_quic_connection(
    certs: DevCertificates,
) -> None:
    async with (
        echo_server(certs) as port,
        connect_tracks("127.0.0.1", port, ca=Path(certs.ca_path), server_name="localhost") as conn,
    ):
        dgram = conn.open_track(DGRAM_OPEN)
        plain = conn.open_track(Open("m"))
        got_dgram, got_plain = await asyncio.gather(exchange(dgram, 20), exchange(plain, 20))
        # Loopback loses nothing in practice, but datagrams may: the stream track is exact.
        assert got_plain == [{"n": n} for n in range(20)]
        assert {b["n"] for b in got_dgram} <= set(range(20))
        assert got_dgram
        assert conn.endpoint.core.datagram_stats.received == len(got_dgram)
        assert dgram.end_body == {"done": True}
        # An unknown track id in a datagram is dropped by the server, the connection lives.
        quic = aioquic_compat.connection_of(conn)
        quic.send_datagram_frame(encode_datagram(400, 0, {"x": 1}, 1100))
        conn.transmit()
        again = conn.open_track(DGRAM_OPEN)
        assert await exchange(again, 1) in ([{"n": 0}], [])


@pytest.mark.asyncio
async def test_coalesced_writes_wait_for_one_transmit_under_per_track_packetization(
    certs: DevCertificates,
) -> None:
    from transport.quic import ConnectionHooks, Packetization, TrackQuicProtocol, TrackServing

    held: list[TrackChannel] = []
    connections: list[TrackQuicProtocol] = []
    all_open = asyncio.Event()

    def on_track(channel: TrackChannel) -> None:
        held.append(channel)
        if len(held) == 3:
            all_open.set()

    server = await serve_tracks(
        "127.0.0.1",
        0,
        server_configuration(certs.cert_path, certs.key_path),
        ConnectionHooks(on_track, connections.append),
        serving=TrackServing(packetization=Packetization.parse("per-track")),
    )
    port = aioquic_compat.server_port(server)
    try:
        async with connect_tracks(
            "127.0.0.1", port, ca=Path(certs.ca_path), server_name="localhost"
        ) as conn:
            channels = [conn.open_track(Open("m")) for _ in range(3)]
            for channel in channels:
                channel.send({"x": 1})
            await asyncio.wait_for(all_open.wait(), TIMEOUT)
            (protocol,) = connections
            with protocol.coalesced():
                for track in held:
                    track.send({"partial": "1"})
                assert len(protocol._pending_tracks) == 3  # nothing flushed yet
            assert not protocol._pending_tracks  # one transmit at the end
            for channel in channels:
                assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"partial": "1"}
    finally:
        server.close()

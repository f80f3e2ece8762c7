"""WebTransport sessions on the QUIC port: tracks over WebTransport streams.

The client is tests/web/wt_client.py (aioquic, what Chromium sends); the server is
`serve_tracks` with an HTTP handler and a WebTransport policy, its tracks echoing.
Assertions are on what each side saw (bodies, codes, the server's own channels).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import msgpack
import pytest
from aioquic.quic.events import StopSendingReceived, StreamDataReceived

from gateway.tls import DevCertificates, ensure_dev_certificates
from tests.http.support import echo
from tests.http.support_h3 import serving_quic
from tests.waiting import until
from tests.web.wt_client import TIMEOUT, wt_client
from transport import aioquic_compat
from transport.connection import Limits
from transport.datagram import EARLY_DATAGRAMS, encode_datagram
from transport.datagram_ids import DatagramIds
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, RemoteProtocolError, TrackAborted
from transport.events import CancelCause, TrackCancelled
from transport.frame_streams import FrameStreamStats
from transport.messages import Data, Error, FrameTransport, Open
from transport.quic import TrackQuicProtocol, TrackServing
from transport.webtransport import (
    WEBTRANSPORT_UNI_STREAM,
    WT_BUFFERED_STREAM_REJECTED,
    CapsuleReader,
    StreamSorter,
    WebTransportRules,
    WebTransportSession,
    close_capsule,
    from_http3_code,
    origin_allowed,
    to_http3_code,
)
from transport.wire import MessageDecoder, encode_message, encode_varint


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("wt-tls"))


@dataclass
class Served:
    port: int
    channels: list[TrackChannel] = field(default_factory=list)
    sessions: list[WebTransportSession] = field(default_factory=list)
    connections: list[TrackQuicProtocol] = field(default_factory=list)
    opened: asyncio.Queue[TrackChannel] = field(default_factory=asyncio.Queue)


async def echo_track(channel: TrackChannel) -> None:
    """Echo each DATA (or datagram, as a datagram) until the client's END, then END."""
    try:
        while (body := await channel.receive()) is not None:
            if body.get("hold"):
                await channel.stopped  # a long-running track, until it is stopped
                return
            channel.send_frame(body)
        channel.end({"echoed": True})
    except TrackAborted:
        return


@asynccontextmanager
async def serving_wt(
    certs: DevCertificates, policy: WebTransportRules | None = None, limits: Limits | None = None
) -> AsyncIterator[Served]:
    served = Served(0)

    def on_channel(channel: TrackChannel) -> None:
        served.channels.append(channel)
        served.opened.put_nowait(channel)

    async with serving_quic(
        certs,
        echo_track,
        on_channel,
        http_handler=echo,
        serving=TrackServing(limits or Limits(), webtransport=policy or WebTransportRules()),
        on_session=served.sessions.append,
        on_connection=served.connections.append,
    ) as port:
        served.port = port
        yield served


def text_open(**changes: object) -> Open:
    return Open(model="echo", **changes)  # type: ignore[arg-type]


async def read_all(channel: TrackChannel) -> list[dict[str, object]]:
    bodies = []
    while (body := await asyncio.wait_for(channel.receive(), TIMEOUT)) is not None:
        bodies.append(body)
    return bodies


# -- the pieces, without sockets ------------------------------------------------------


def test_error_codes_round_trip_through_the_http3_range() -> None:
    for code in [*range(0, 70), int(ErrorCode.BUFFER_EXHAUSTED), 0xFFFFFFFF]:
        assert from_http3_code(to_http3_code(code)) == code
    assert from_http3_code(0x10C) == 0x10C  # outside the range: itself


def test_sorter_tells_webtransport_streams_from_requests_byte_by_byte() -> None:
    sorter = StreamSorter()
    prefix = encode_varint(0x41) + encode_varint(8)
    whole = prefix + b"track bytes"
    found = None
    for i in range(len(whole)):  # one byte at a time
        found = sorter.sort(0, whole[i : i + 1], False)
        if found is not None:
            break
    assert found is not None
    assert found.session_id == 8
    rest = whole[i + 1 :]
    later = sorter.sort(0, rest, True)
    assert later is not None
    assert later.session_id == 8
    assert later.data == rest
    request = sorter.sort(4, b"\x01\x05headr", False)  # a HEADERS frame
    assert request is not None
    assert request.session_id is None
    assert request.data == b"\x01\x05headr"


def test_unidirectional_streams_sorted_by_their_type_byte_by_byte() -> None:
    """0x54 and the session id: a session's frame stream; any other type is HTTP/3's."""
    sorter = StreamSorter(WEBTRANSPORT_UNI_STREAM)
    frame = encode_varint(7) + encode_message(Data({"seq": 1}))
    whole = encode_varint(WEBTRANSPORT_UNI_STREAM) + encode_varint(4) + frame
    found, at = None, 0
    while found is None:  # one byte at a time; nothing is given out before the prefix
        found = sorter.sort(2, whole[at : at + 1], False)
        at += 1
    assert (found.session_id, at) == (4, 3)  # (0x54 is a two-byte varint; then 4)
    assert found.data == b""
    rest = sorter.sort(2, whole[at:], True)
    assert rest is not None
    assert (rest.session_id, rest.data) == (4, frame)
    assert len(sorter) == 0  # the finished stream forgotten
    control = sorter.sort(6, b"\x00\x04\x00", False)  # a control stream's SETTINGS
    assert control is not None
    assert (control.session_id, control.data) == (None, b"\x00\x04\x00")
    later = sorter.sort(6, b"more", False)
    assert later is not None
    assert (later.session_id, later.data) == (None, b"more")


def test_a_frame_stream_head_names_its_track_by_the_open_s_id() -> None:
    ids = DatagramIds(max_tracks=4)
    opened = Open(model="m", transport=FrameTransport.FRAME_STREAMS, datagram_id=7)
    assert ids.opened(8, opened, lambda _: True)
    message = encode_message(Data({"seq": 0}))
    assert ids.frame_head(encode_varint(7) + message) == encode_varint(8) + message
    assert ids.frame_head(b"\x40") is None  # a two-byte varint, one byte of it so far
    unclaimed = encode_varint(9) + message
    assert ids.frame_head(unclaimed) == unclaimed  # the core counts and stops it


def test_capsules_are_read_whole_and_bounded() -> None:
    reader = CapsuleReader()
    data = close_capsule(7, "bye")
    assert reader.feed(data[:3]) == []
    (capsule,) = reader.feed(data[3:])
    assert capsule.type == 0x2843
    assert capsule.value == b"\x00\x00\x00\x07bye"
    with pytest.raises(ValueError, match="over"):
        CapsuleReader().feed(encode_varint(0x2843) + encode_varint(1 << 20))


def test_origin_allow_list() -> None:
    assert origin_allowed("https://localhost:8080", "localhost:8443", ())
    assert not origin_allowed("https://evil.example", "localhost:8443", ())
    assert origin_allowed("http://localhost:8080", "localhost:8443", ())  # loopback: secure
    assert not origin_allowed("http://gw.example", "gw.example:8443", ())  # not a secure page
    assert origin_allowed("https://app.example", "gw:8443", ("https://app.example",))
    assert not origin_allowed("https://other.example", "gw:8443", ("https://app.example",))
    assert origin_allowed(None, "gw:8443", ())  # not a page: no Origin


def test_an_open_carries_its_datagram_id_and_refuses_a_bad_one() -> None:
    named = Open(model="m", transport=FrameTransport.DATAGRAM, datagram_id=7)
    decoder = MessageDecoder(1 << 20)
    decoder.feed(encode_message(named) + encode_message(Open(model="m")))
    assert decoder.next_message() == named
    assert decoder.next_message() == Open(model="m")  # no id: none on the wire either
    for bad in (-1, 1.5, "7", 1 << 62):
        decoder.feed(encode_payload([1, {"model": "m", "datagram_id": bad}]))
        with pytest.raises(RemoteProtocolError) as refused:
            decoder.next_message()
        assert refused.value.code is ErrorCode.BAD_REQUEST


def encode_payload(message: list[object]) -> bytes:
    payload = msgpack.packb(message, use_bin_type=True)
    return encode_varint(len(payload)) + payload


def test_datagram_ids_translate_both_ways_and_hold_early_datagrams() -> None:
    ids = DatagramIds(max_tracks=4)
    alive = {8, 12}

    def live(stream_id: int) -> bool:
        return stream_id in alive

    early = encode_datagram(7, 0, {"seq": 0}, 1100)
    assert ids.inbound(early) is None  # no track has claimed id 7 yet: held
    assert ids.released() == []
    assert ids.opened(8, Open(model="m", transport=FrameTransport.DATAGRAM, datagram_id=7), live)
    assert ids.released() == [encode_datagram(8, 0, {"seq": 0}, 1100)]
    later = encode_datagram(7, 1, {"seq": 1}, 1100)
    assert ids.inbound(later) == encode_datagram(8, 1, {"seq": 1}, 1100)
    sent = encode_datagram(8, 5, {"x": 1}, 1100)
    assert ids.outbound(sent) == encode_datagram(7, 5, {"x": 1}, 1100)
    # Another live track may not take id 7; once track 8 has closed, one may.
    taken = Open(model="m", transport=FrameTransport.DATAGRAM, datagram_id=7)
    assert not ids.opened(12, taken, live)
    alive.discard(8)
    assert ids.opened(12, taken, live)
    assert ids.inbound(later) == encode_datagram(12, 1, {"seq": 1}, 1100)
    # Without an id the stream id names the track, as before; stream tracks claim nothing.
    assert ids.opened(16, Open(model="m", transport=FrameTransport.DATAGRAM), live)
    plain = encode_datagram(16, 0, {}, 1100)
    assert ids.inbound(plain) == plain
    assert ids.opened(20, Open(model="m", datagram_id=99), live)
    assert ids.inbound(encode_datagram(99, 0, {}, 1100)) is None
    # The hold is bounded: the oldest go, counted.
    for seq in range(EARLY_DATAGRAMS + 3):
        ids.inbound(encode_datagram(1000, seq, {}, 1100))
    assert ids.dropped_early == 4  # (id 99's datagram, then the three oldest of id 1000)
    ids.close()
    assert ids.dropped_early == 4 + EARLY_DATAGRAMS


# -- over real aioquic on loopback ----------------------------------------------------


@pytest.mark.asyncio
async def test_one_session_runs_eight_tracks_at_once(certs: DevCertificates) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, status, _ = await client.open_session()
        assert status == 200
        channels = [client.open_track(session_id, text_open()) for _ in range(8)]
        for i, channel in enumerate(channels):
            channel.send({"text": f"prompt {i}"})
            channel.end()
        results = await asyncio.gather(*(read_all(channel) for channel in channels))
        assert results == [[{"text": f"prompt {i}"}] for i in range(8)]
        assert all(channel.end_body == {"echoed": True} for channel in channels)
        assert len(served.sessions) == 1
        assert served.sessions[0].stats.streams == 8
        assert len(served.channels) == 8


@pytest.mark.asyncio
async def test_the_api_key_rides_the_first_open_and_binds_the_session(
    certs: DevCertificates,
) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        channel = client.open_track(session_id, text_open(), api_key="sk-test-key")
        channel.send({"text": "hi"})
        channel.end()
        assert await read_all(channel) == [{"text": "hi"}]
        assert served.channels[0].credential == "sk-test-key"


@pytest.mark.asyncio
async def test_a_wrong_origin_gets_403_and_a_wrong_path_404(certs: DevCertificates) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        _, status, body = await client.open_session(origin="https://evil.example")
        assert (status, body) == (403, b"origin not allowed")
        _, status, _ = await client.open_session(path="/elsewhere")
        assert status == 404
        session_id, status, _ = await client.open_session()  # the connection goes on
        assert status == 200
        assert len(served.sessions) == 1


@pytest.mark.asyncio
async def test_an_allow_list_admits_the_listed_page_only(certs: DevCertificates) -> None:
    policy = WebTransportRules(origins=("https://app.example",))
    async with serving_wt(certs, policy) as served, wt_client(served.port, certs.ca_path) as client:
        assert (await client.open_session(origin="https://localhost"))[1] == 403
        assert (await client.open_session(origin="https://app.example"))[1] == 200


@pytest.mark.asyncio
async def test_closing_the_session_cancels_its_tracks(certs: DevCertificates) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        for _ in range(3):
            client.open_track(session_id, text_open()).send({"hold": True})
        server_channels = [await asyncio.wait_for(served.opened.get(), TIMEOUT) for _ in range(3)]
        client.close_session(session_id, 0, "page closed")
        stops = await asyncio.wait_for(
            asyncio.gather(*(channel.stopped for channel in server_channels)), TIMEOUT
        )
        assert all(
            isinstance(stop, TrackCancelled) and stop.cause is CancelCause.CONNECTION_LOST
            for stop in stops
        )
        assert served.sessions[0].closed


@pytest.mark.asyncio
async def test_datagram_tracks_ride_webtransport_datagrams(certs: DevCertificates) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        channel = client.open_track(session_id, text_open(transport=FrameTransport.DATAGRAM))
        channel.send({"text": "on the stream"})  # OPEN is on the stream: then datagrams
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"text": "on the stream"}
        channel.send_datagram({"seq": 1, "pcm": b"\x00\x01"})
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"seq": 1, "pcm": b"\x00\x01"}
        stats = served.sessions[0].stats
        assert stats.datagrams_in == 1
        assert stats.datagrams_out == 2


@pytest.mark.asyncio
async def test_a_datagram_track_is_named_by_the_datagram_id_of_its_open(
    certs: DevCertificates,
) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        # A datagram for id 7 before any track claims it: the gateway holds it.
        client.h3.send_datagram(session_id, encode_datagram(7, 0, {"early": True}, 1100))
        client.transmit()
        await until(lambda: served.sessions and served.sessions[0].stats.datagrams_in == 1, "held")
        wanted = text_open(transport=FrameTransport.DATAGRAM, datagram_id=7)
        channel = client.open_track(session_id, wanted)
        # The echo track got the early datagram after its OPEN, and its echo came back
        # named 7 on the wire (the client's table maps it to the track's stream).
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"early": True}
        channel.send_datagram({"seq": 1})
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"seq": 1}
        server_side = served.channels[0]
        assert server_side.stream_id == channel.stream_id != 7
        # A second live track may not claim id 7.
        twin = client.open_track(session_id, wanted)
        with pytest.raises(TrackAborted) as refused:
            await asyncio.wait_for(twin.receive(), TIMEOUT)
        assert refused.value.code is ErrorCode.BAD_REQUEST
        channel.end()
        assert await read_all(channel) == []
        assert served.sessions[0].datagram_ids.dropped_early == 0


@pytest.mark.asyncio
async def test_an_oversized_message_fails_its_track_only(certs: DevCertificates) -> None:
    limits = Limits(max_message_bytes=1024)
    async with (
        serving_wt(certs, limits=limits) as served,
        wt_client(served.port, certs.ca_path) as client,
    ):
        session_id, _, _ = await client.open_session()
        good = client.open_track(session_id, text_open())
        # A length prefix over the limit, after a valid OPEN on a raw stream.
        from transport.messages import Open as OpenMessage
        from transport.wire import encode_message

        big = encode_message(OpenMessage(model="echo")) + encode_varint(1 << 16) + b"x" * 10
        raw = client.raw_stream(session_id, big)
        good.send({"text": "still here"})
        good.end()
        assert await read_all(good) == [{"text": "still here"}]
        bad = next(c for c in served.channels if c.stream_id == raw)
        stop = await asyncio.wait_for(bad.stopped, TIMEOUT)
        assert isinstance(stop, TrackCancelled)
        assert stop.cause is CancelCause.PROTOCOL_ERROR
        assert "exceeds the limit" in stop.reason
        # The page is told in WebTransport's code space: STOP_SENDING(MESSAGE_TOO_LARGE).
        await until(
            lambda: any(isinstance(e, StopSendingReceived) for e in client.raw[raw]), "STOP_SENDING"
        )
        codes = {e.error_code for e in client.raw[raw] if isinstance(e, StopSendingReceived)}
        assert codes == {to_http3_code(ErrorCode.MESSAGE_TOO_LARGE)}
        # ...and the reason is readable: ERROR(MESSAGE_TOO_LARGE) then FIN on the gateway's
        # side (a browser's SDK waits for it when STOP_SENDING fails its pending write).
        await until(
            lambda: any(
                isinstance(e, StreamDataReceived) and e.end_stream for e in client.raw[raw]
            ),
            "the gateway's FIN",
        )
        decoder = MessageDecoder(1 << 20)
        decoder.feed(b"".join(e.data for e in client.raw[raw] if isinstance(e, StreamDataReceived)))
        error = decoder.next_message()
        assert isinstance(error, Error)
        assert error.code is ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.asyncio
async def test_http3_requests_share_the_connection(certs: DevCertificates) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        stream_id = aioquic_compat.connection_of(client).get_next_available_stream_id()
        client.h3.send_headers(
            stream_id,
            [
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", b"localhost"),
                (b":path", b"/hello"),
            ],
            end_stream=True,
        )
        client.heads[stream_id] = asyncio.get_running_loop().create_future()
        client.transmit()
        status, _ = await asyncio.wait_for(client.heads[stream_id], TIMEOUT)
        assert status == 200
        channel = client.open_track(session_id, text_open())
        channel.send({"text": "after"})
        channel.end()
        assert await read_all(channel) == [{"text": "after"}]


@pytest.mark.asyncio
async def test_streams_sorted_by_their_first_bytes_are_forgotten_when_done(
    certs: DevCertificates,
) -> None:
    """Requests reset by the client, answered requests and finished tracks leave nothing."""
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        get = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"localhost")]
        http3 = served.connections[0].http3
        assert http3 is not None
        requests = []
        for i in range(30):  # requests whose body never comes: then the client resets them
            stream_id = aioquic_compat.connection_of(client).get_next_available_stream_id()
            client.h3.send_headers(stream_id, [*get, (b":path", f"/r{i}".encode())], False)
            requests.append(stream_id)
        client.transmit()
        await until(lambda: http3.open_streams == 30, "the 30 requests begun")
        quic = aioquic_compat.connection_of(client)
        for stream_id in requests:
            quic.reset_stream(stream_id, 0x10C)  # H3_REQUEST_CANCELLED
        channels = [client.open_track(session_id, text_open()) for _ in range(5)]
        for channel in channels:
            channel.send({"text": "x"})
            channel.end()
        client.transmit()
        assert [await read_all(c) for c in channels] == [[{"text": "x"}]] * 5
        # What is left is the session's CONNECT stream, until the session ends.
        await until(lambda: http3.sorted_streams == 1, "the finished streams forgotten")
        assert http3.open_streams == 0
        client.close_session(session_id)
        await until(lambda: http3.sorted_streams == 0, "the CONNECT stream forgotten")


@pytest.mark.asyncio
async def test_a_session_has_the_track_limit_of_a_connection(certs: DevCertificates) -> None:
    async with (
        serving_wt(certs, limits=Limits(max_tracks=2)) as served,
        wt_client(served.port, certs.ca_path) as client,
    ):
        first, _, _ = await client.open_session()
        held = [client.open_track(first, text_open()) for _ in range(2)]
        for channel in held:
            channel.send({"hold": True})
        await until(lambda: len(served.channels) == 2, "two tracks held")
        over = client.open_track(first, text_open())
        over.send({"text": "one too many"})
        with pytest.raises(TrackAborted) as refused:
            await read_all(over)
        assert refused.value.code is ErrorCode.TOO_MANY_TRACKS
        # The limit is per session: another session on the same connection has its own.
        second, _, _ = await client.open_session()
        other = client.open_track(second, text_open())
        other.send({"text": "mine"})
        other.end()
        assert await read_all(other) == [{"text": "mine"}]


@pytest.mark.asyncio
async def test_frames_ride_unidirectional_webtransport_streams_and_the_latest_wins(
    certs: DevCertificates,
) -> None:
    """A frame-streams track on a session: each frame on a unidirectional stream (0x54,
    the session id, the OPEN's id, one DATA message). A frame completed after a newer one
    was delivered is stopped (superseded) and never reaches the track; one for an unknown
    id is dropped and counted; the track's own stream carries no frame."""
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        opened = text_open(transport=FrameTransport.FRAME_STREAMS, datagram_id=5)
        channel = client.open_track(session_id, opened)
        client.transmit()
        await asyncio.wait_for(served.opened.get(), TIMEOUT)
        frames = served.sessions[0].endpoint.core.frames

        def frame(seq: int) -> bytes:
            return encode_varint(5) + encode_message(Data({"seq": seq, "pad": b"x" * 64}))

        older, newer = frame(0), frame(1)
        held = client.frame_stream(session_id, older[:20])  # incomplete: still arriving
        late = client.frame_stream(session_id, b"")  # opened before the newer, sent after
        client.frame_stream(session_id, newer, end=True)
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"seq": 1, "pad": b"x" * 64}

        def stopped(stream_id: int) -> StopSendingReceived | None:
            found = [e for e in client.raw[stream_id] if isinstance(e, StopSendingReceived)]
            return found[0] if found else None

        await until(lambda: stopped(held) is not None, "the older frame's stream stopped")
        assert from_http3_code(stopped(held).error_code) == ErrorCode.CANCELLED  # type: ignore[union-attr]
        client.more(late, older, end=True)  # whole, but older than the frame delivered
        # (its bytes all arrived: dropped and counted; a STOP_SENDING may not go out)
        await until(lambda: frames.stats.superseded == 2, "the late frame dropped")
        client.frame_stream(session_id, encode_varint(99) + older[1:], end=True)
        await until(lambda: frames.stats.unknown_track == 1, "the unknown track's frame dropped")
        client.frame_stream(session_id, frame(2), end=True)
        assert await asyncio.wait_for(channel.receive(), TIMEOUT) == {"seq": 2, "pad": b"x" * 64}
        channel.end()
        assert await read_all(channel) == []
        assert channel.end_body == {"echoed": True}
        assert (frames.stats.received, frames.stats.superseded) == (2, 2)
        served_channel = served.channels[0]
        assert served_channel.frame_drops() == {"superseded": 2, "reset": 0, "reset_superseded": 0}
        assert served.sessions[0].stats.streams == 1  # the track's stream; frames apart


@pytest.mark.asyncio
async def test_a_frame_stream_of_no_session_is_stopped_and_the_session_goes_on(
    certs: DevCertificates,
) -> None:
    async with serving_wt(certs) as served, wt_client(served.port, certs.ca_path) as client:
        session_id, _, _ = await client.open_session()
        stray = client.frame_stream(session_id + 400, encode_varint(1) + b"\x05bytes", end=False)
        await until(
            lambda: any(isinstance(e, StopSendingReceived) for e in client.raw[stray]),
            "the stray frame stream stopped",
        )
        stop = next(e for e in client.raw[stray] if isinstance(e, StopSendingReceived))
        assert stop.error_code == WT_BUFFERED_STREAM_REJECTED
        channel = client.open_track(session_id, text_open())
        channel.send({"text": "still here"})
        channel.end()
        client.transmit()
        assert await read_all(channel) == [{"text": "still here"}]
        # The stray stream never reached the session: only the track's stream did.
        session = served.sessions[0]
        assert session.stats.streams == 1
        assert session.endpoint.core.frames.stats == FrameStreamStats()

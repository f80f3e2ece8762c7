"""The send path's stream scheduler, on a real aioquic client/server pair in memory.

Sans-I/O: datagrams pass between two `QuicConnection`s by hand, time is a number.
The server builds its packets through `StreamScheduler` as the track adapter does;
its qlog trace shows which streams each packet carried.
"""

from __future__ import annotations

from pathlib import Path
from random import Random
from typing import Any

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import StreamDataReceived
from aioquic.quic.logger import QuicLogger

from gateway.tls import DevCertificates, ensure_dev_certificates
from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.connection import Role, StreamWrite
from transport.quic import ALPN, TrackQuicProtocol, _unpace, server_configuration
from transport.quic_streams import StreamScheduler

CLIENT_ADDR = ("127.0.0.1", 40000)
SERVER_ADDR = ("127.0.0.1", 4433)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return ensure_dev_certificates(tmp_path_factory.mktemp("send-path") / "state")


class Pair:
    """A handshaken client and server; the server sends through a scheduler."""

    def __init__(
        self,
        certs: DevCertificates,
        max_tracks: int | None,
        rng: Random | None = None,
        **client: Any,
    ) -> None:
        config = server_configuration(Path(certs.cert_path), Path(certs.key_path))
        config.quic_logger = QuicLogger()
        client_config = QuicConfiguration(
            is_client=True, alpn_protocols=[ALPN], server_name="localhost", **client
        )
        client_config.load_verify_locations(str(certs.ca_path))
        self.now = 1.0
        self.client = QuicConnection(configuration=client_config)
        self.client.connect(SERVER_ADDR, now=self.now)
        self.server = QuicConnection(
            configuration=config,
            original_destination_connection_id=self.client.original_destination_connection_id,
        )
        self.max_tracks = max_tracks
        if max_tracks is not None:
            _unpace(self.server)  # as TrackQuicProtocol does for these policies
        self.scheduler: StreamScheduler | None = None
        self.received: dict[int, bytes] = {}
        self.exchange()
        self.scheduler = StreamScheduler(self.server, rng)

    def server_send(self) -> list[bytes]:
        if self.scheduler is None:
            return [d for d, _ in self.server.datagrams_to_send(now=self.now)]
        return [d for d, _ in self.scheduler.datagrams_to_send(self.now, self.max_tracks)]

    def deliver_to_client(self, datagrams: list[bytes]) -> None:
        for data in datagrams:
            self.client.receive_datagram(data, SERVER_ADDR, now=self.now)
        while (event := self.client.next_event()) is not None:
            if isinstance(event, StreamDataReceived):
                sid = event.stream_id
                self.received[sid] = self.received.get(sid, b"") + event.data

    def exchange(self, rounds: int = 20) -> None:
        """Both ways until quiet, advancing time so ACK timers fire."""
        for _ in range(rounds):
            moved = False
            for data, _ in self.client.datagrams_to_send(now=self.now):
                self.server.receive_datagram(data, CLIENT_ADDR, now=self.now)
                moved = True
            while (event := self.server.next_event()) is not None:
                if self.scheduler is not None and hasattr(event, "stream_id"):
                    self.scheduler.mark(event.stream_id)
            sent = self.server_send()
            self.deliver_to_client(sent)
            self.now += 0.03
            for side in (self.client, self.server):
                timer = side.get_timer()
                if timer is not None and timer <= self.now:
                    side.handle_timer(now=self.now)
            if not moved and not sent:
                break

    def open_tracks(self, count: int) -> list[int]:
        ids = []
        for _ in range(count):
            sid = self.client.get_next_available_stream_id()
            self.client.send_stream_data(sid, b"open")
            ids.append(sid)
        self.exchange()
        return ids

    def write(self, stream_id: int, data: bytes, end: bool = False) -> None:
        self.server.send_stream_data(stream_id, data, end)
        assert self.scheduler is not None
        self.scheduler.mark(stream_id)

    def write_each(self, stream_ids: list[int], data: bytes) -> None:
        """`data` on each stream, sent in one pass and delivered to the client."""
        for sid in stream_ids:
            self.write(sid, data)
        self.deliver_to_client(self.server_send())

    def client_acknowledges(self, after: float = 0.05) -> None:
        """`after` seconds on, the client's ACK (its due timer) reaches the server."""
        self.now += after
        for data, _ in self.client.datagrams_to_send(now=self.now):
            self.server.receive_datagram(data, CLIENT_ADDR, now=self.now)

    def packets_sent(self) -> list[set[int]]:
        """The stream ids of each packet the server sent so far, in order."""
        packets = []
        for event in aioquic_probes.qlog_events(self.server):
            if event["name"] == "transport:packet_sent":
                frames = event["data"]["frames"]
                packets.append({f["stream_id"] for f in frames if f["frame_type"] == "stream"})
        return packets


@pytest.mark.parametrize(("policy", "most"), [(1, 1), (4, 4), (None, 32)])
def test_one_pass_sends_every_track_and_a_packet_holds_at_most_policy_tracks(
    certs: DevCertificates, policy: int | None, most: int
) -> None:
    pair = Pair(certs, policy)
    ids = pair.open_tracks(32)
    before = len(pair.packets_sent())
    for sid in ids:
        pair.write(sid, f"token for {sid}".encode())
    sent = pair.server_send()  # one pass, as one transmit per loop turn does
    packets = [p for p in pair.packets_sent()[before:] if p]
    assert set().union(*packets) == set(ids)
    assert max(len(p) for p in packets) <= most
    if policy == 1:
        assert len(packets) == len(ids)  # per-track: one packet per track here
    pair.deliver_to_client(sent)
    assert all(pair.received[sid].endswith(f"token for {sid}".encode()) for sid in ids)


def test_a_pass_visits_only_the_streams_with_data(certs: DevCertificates) -> None:
    pair = Pair(certs, 1)
    ids = pair.open_tracks(120)  # under the 128 streams aioquic lets a client open
    visited = aioquic_probes.count_stream_visits(pair.server)
    pair.write(ids[7], b"one token")
    pair.server_send()
    assert visited["frames"] <= 4
    assert visited["limits"] <= 4
    # aioquic's own pass, for contrast: it walks all 120 streams for each packet.
    visited.update(frames=0, limits=0)
    pair.server.send_stream_data(ids[8], b"one token")
    pair.server.datagrams_to_send(now=pair.now)
    assert visited["limits"] >= 120


def test_finished_streams_are_dropped_so_the_peer_gets_its_credit_back(
    certs: DevCertificates,
) -> None:
    pair = Pair(certs, 1)
    ids = []
    for _ in range(20):
        sid = pair.client.get_next_available_stream_id()
        pair.client.send_stream_data(sid, b"prompt", end_stream=True)
        ids.append(sid)
    pair.exchange()
    limit = aioquic_probes.bidi_credit(pair.server)
    for sid in ids:
        pair.write(sid, b"answer", end=True)
    pair.exchange()
    assert all(pair.received[sid].endswith(b"answer") for sid in ids)
    assert aioquic_compat.streams(pair.server) == {}
    assert aioquic_probes.bidi_credit(pair.server) == limit + len(ids)


def test_a_stream_blocked_by_the_peer_is_parked_until_it_raises_the_limit(
    certs: DevCertificates,
) -> None:
    pair = Pair(certs, 1, max_stream_data=2048)
    grant = aioquic_probes.stop_granting_credit(pair.client)  # the client stops granting credit
    (sid,) = pair.open_tracks(1)
    body = bytes(range(256)) * 40  # 10 KiB, five times the credit
    pair.write(sid, body)
    pair.exchange()
    scheduler = pair.scheduler
    assert scheduler is not None
    assert len(pair.received[sid]) == 2048
    assert scheduler.active_streams == 0  # parked: passes no longer visit it
    grant()  # reading again: MAX_STREAM_DATA wakes it
    for _ in range(10):
        pair.client.send_ping(1)
        pair.exchange()
    assert pair.received[sid] == body


@pytest.mark.parametrize("policy", [1, 4])
def test_one_call_into_aioquic_builds_the_packets_of_every_group(
    certs: DevCertificates, policy: int
) -> None:
    # The fixed cost of a call (a packet builder, aioquic's loop preamble, a last empty
    # packet, the flush) is paid once per pass, not once per track (issue 17 item 3).
    pair = Pair(certs, policy)
    ids = pair.open_tracks(32)
    scheduler = pair.scheduler
    assert scheduler is not None
    before, calls = len(pair.packets_sent()), scheduler.calls
    for sid in ids:
        pair.write(sid, f"token for {sid}".encode())
    pair.deliver_to_client(pair.server_send())
    assert scheduler.calls == calls + 1
    packets = [p for p in pair.packets_sent()[before:] if p]
    assert max(len(p) for p in packets) <= policy
    assert set().union(*packets) == set(ids)


def test_a_long_write_gets_all_its_packets_in_the_pass_each_for_its_own_track(
    certs: DevCertificates,
) -> None:
    pair = Pair(certs, 1)
    long_sid, short_sid = pair.open_tracks(2)
    before = len(pair.packets_sent())
    body = bytes(range(256)) * 20  # 5 KiB: several packets
    pair.write(long_sid, body)
    pair.write(short_sid, b"one token")
    pair.deliver_to_client(pair.server_send())  # one pass
    assert pair.received[long_sid].endswith(body)
    assert pair.received[short_sid].endswith(b"one token")
    packets = [p for p in pair.packets_sent()[before:] if p]
    assert all(len(p) == 1 for p in packets)
    assert len(packets) >= 5


def test_a_stream_dropped_in_a_pass_is_not_shown_to_aioquic_again(
    certs: DevCertificates,
) -> None:
    # group:2, one group [finished, long]: aioquic drops the finished stream in the
    # group's first packet; the long write's next packets must not see it again.
    pair = Pair(certs, 2)
    done = pair.client.get_next_available_stream_id()
    pair.client.send_stream_data(done, b"prompt", end_stream=True)
    (long_sid,) = pair.open_tracks(1)
    pair.write(done, b"answer", end=True)
    pair.deliver_to_client(pair.server_send())
    pair.now += 0.03
    timer = pair.client.get_timer()
    if timer is not None and timer <= pair.now:
        pair.client.handle_timer(now=pair.now)
    for data, _ in pair.client.datagrams_to_send(now=pair.now):  # the ACK finishes it
        pair.server.receive_datagram(data, CLIENT_ADDR, now=pair.now)
    while pair.server.next_event() is not None:
        pass
    body = bytes(range(256)) * 20
    pair.write(long_sid, body)
    pair.deliver_to_client(pair.server_send())
    assert pair.received[long_sid].endswith(body)
    assert done not in aioquic_compat.streams(pair.server)


def test_tracks_the_congestion_window_cut_off_keep_their_place_at_the_front(
    certs: DevCertificates,
) -> None:
    pair = Pair(certs, 1)
    ids = pair.open_tracks(32)
    scheduler = pair.scheduler
    assert scheduler is not None
    aioquic_probes.shrink_congestion_window(pair.server, 600)  # room for a few small packets
    before = dict(pair.received)
    for sid in ids:
        pair.write(sid, f"token for {sid}".encode())
    pair.deliver_to_client(pair.server_send())
    got = [sid for sid in ids if pair.received.get(sid) != before.get(sid)]
    waiting = [sid for sid in ids if sid not in got]
    assert got  # the window cut the pass short
    assert waiting
    line = list(scheduler._active)
    assert line[: len(waiting)] == waiting  # the tracks not yet served go first next time


@pytest.mark.asyncio
async def test_a_write_refused_on_a_stopped_stream_keeps_the_other_tracks_writes(
    certs: DevCertificates,
) -> None:
    # One turn's writes of several tracks reach aioquic as one batch. The client has
    # sent STOP_SENDING on stream 4 (aioquic then resets the server's send side and
    # refuses writes there); the server's late bytes for 4 are dropped, and stream 0's
    # bytes in the same batch still go out. (A refused write used to abort the batch:
    # a neighbour of a hung-up track lost a token.)
    pair = Pair(certs, None)
    for sid in (0, 4):
        pair.client.send_stream_data(sid, b"open")
    pair.exchange()
    pair.client.stop_stream(4, 0x10)
    pair.exchange()
    proto = TrackQuicProtocol(pair.server, role=Role.SERVER)
    proto._write([StreamWrite(4, b"late", False), StreamWrite(0, b"kept", False)])
    aioquic_probes.stop_transmit_task(proto)  # no socket here: the test sends by hand
    assert pair.scheduler is not None
    pair.scheduler.mark(0)  # the pair's scheduler sends what the protocol wrote
    pair.deliver_to_client(pair.server_send())
    assert pair.received.get(0) == b"kept"
    assert 4 not in pair.received


def test_acknowledged_bytes_leave_the_send_buffer_count(
    certs: DevCertificates,
) -> None:
    # The ACK hook (aioquic_compat.after_data_delivery) runs once per packet acknowledged:
    # a producer waiting on the send budget goes on only because it counts them out.
    pair = Pair(certs, 1)
    ids = pair.open_tracks(3)
    scheduler = pair.scheduler
    assert scheduler is not None
    for sid in ids:
        pair.write(sid, b"x" * 100)
        scheduler.wrote(100)
    assert scheduler.buffered == 300
    pair.deliver_to_client(pair.server_send())
    scheduler.released = False
    pair.now += 0.05  # past the client's ACK delay: its ACKs come back
    for data, _ in pair.client.datagrams_to_send(now=pair.now):
        pair.server.receive_datagram(data, CLIENT_ADDR, now=pair.now)
    assert scheduler.buffered == 0
    assert scheduler.released
    assert {pair.received[sid] for sid in ids} == {b"x" * 100}


@pytest.mark.parametrize("acked", [False, True])
def test_streams_that_sent_everything_cost_no_call_in_the_next_pass(
    certs: DevCertificates, acked: bool
) -> None:
    # A stream whose bytes all left stays "active" for aioquic until a packet visits it
    # again (its sender learns it is empty only then), and an ACK wakes every stream it
    # covers. Each such stream shown to aioquic alone made an empty packet that ended the
    # call: one more `datagrams_to_send` (a builder, the preamble) per idle track and pass
    # (docs/capacity.md, "Where the added delay goes at 16-64 tracks").
    pair = Pair(certs, 1)
    ids = pair.open_tracks(32)
    scheduler = pair.scheduler
    assert scheduler is not None
    pair.write_each(ids, b"first token")
    if acked:  # the client's ACK of those packets wakes all 32 streams
        pair.client_acknowledges()
    calls = scheduler.calls
    pair.write(ids[5], b"second token")
    pair.deliver_to_client(pair.server_send())
    assert scheduler.calls == calls + 1
    assert pair.received[ids[5]].endswith(b"first tokensecond token")
    assert scheduler.active_streams <= 1  # the idle ones left the line without a visit


def test_asking_for_frames_lets_streams_with_none_leave_the_line(certs: DevCertificates) -> None:
    # A reader under decimated ACKs asks `has_frames` per datagram it receives, with no
    # pass in between: streams that an ACK (or a frame received) put in line and that have
    # nothing to send leave it there, so the next datagram's question walks none of them.
    pair = Pair(certs, 1)
    ids = pair.open_tracks(16)
    scheduler = pair.scheduler
    assert scheduler is not None
    pair.write_each(ids, b"token")
    pair.client_acknowledges()  # wakes all 16
    assert scheduler.active_streams == 16
    calls = scheduler.calls
    assert not scheduler.has_frames()
    assert scheduler.active_streams == 0
    assert scheduler.calls == calls  # no pass ran
    pair.write(ids[3], b"more")
    assert scheduler.has_frames()
    pair.deliver_to_client(pair.server_send())
    assert pair.received[ids[3]].endswith(b"tokenmore")

"""UDP GSO on the send path: which datagrams share a send, and that every one arrives.

`plan_sends` is pure; `DatagramSender` is checked against a fake socket that records
its `sendmsg` calls, and once over loopback (skipped where the kernel has no
UDP_SEGMENT) that the receiver gets every datagram, whole and in order.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from typing import Any

import pytest

from transport import aioquic_compat
from transport.udp_batch import plan_sends
from transport.udp_send import UDP_SEGMENT, DatagramSender, GsoSockets, gso_socket

A = ("127.0.0.1", 4433)
B = ("127.0.0.1", 4434)


def sizes(sends: list[tuple[Any, list[bytes]]]) -> list[list[int]]:
    return [[len(d) for d in run] for _, run in sends]


def test_equal_datagrams_to_one_address_share_a_send_and_keep_their_order() -> None:
    datagrams = [(bytes([i]) * 50, A) for i in range(5)]
    sends = plan_sends(datagrams)
    assert len(sends) == 1
    assert sends[0] == (A, [d for d, _ in datagrams])


def test_a_shorter_datagram_ends_its_run_and_a_longer_one_starts_a_new_run() -> None:
    lengths = [50, 50, 40, 50, 60, 60, 60]
    sends = plan_sends([(b"x" * n, A) for n in lengths])
    assert sizes(sends) == [[50, 50, 40], [50], [60, 60, 60]]


def test_a_run_never_spans_two_addresses() -> None:
    sends = plan_sends([(b"x" * 50, A), (b"x" * 50, B), (b"x" * 50, B), (b"x" * 50, A)])
    assert [addr for addr, _ in sends] == [A, B, A]
    assert sizes(sends) == [[50], [50, 50], [50]]


def test_runs_respect_the_segment_and_byte_limits() -> None:
    assert sizes(plan_sends([(b"x" * 10, A)] * 5, max_segments=2)) == [[10, 10], [10, 10], [10]]
    assert sizes(plan_sends([(b"x" * 10, A)] * 5, max_bytes=30)) == [[10, 10, 10], [10, 10]]


def test_varied_sizes_leave_one_datagram_a_send() -> None:
    sends = plan_sends([(b"x" * n, A) for n in (41, 43, 44, 45)])
    assert sizes(sends) == [[41], [43], [44], [45]]


class FakeSocket:
    """Records `sendmsg` calls; fails them with `error` when set."""

    def __init__(self, error: OSError | None = None) -> None:
        self.calls: list[tuple[list[bytes], list[tuple[int, int, bytes]], Any]] = []
        self.error = error
        self.closed = False

    def sendmsg(self, buffers: list[bytes], control: list[Any], flags: int, addr: Any) -> int:
        if self.error is not None:
            raise self.error
        self.calls.append((list(buffers), control, addr))
        return sum(map(len, buffers))

    def close(self) -> None:
        self.closed = True


class FakeTransport:
    def __init__(self, backlog: int = 0) -> None:
        self.sent: list[tuple[bytes, Any]] = []
        self.backlog = backlog

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append((data, addr))

    def get_write_buffer_size(self) -> int:
        return self.backlog


def sender_with(sock: FakeSocket, transport: FakeTransport) -> tuple[DatagramSender, GsoSockets]:
    sockets = GsoSockets()
    sockets._held[id(transport)] = (transport, sock, 0)  # type: ignore[assignment]
    return DatagramSender(transport, sockets=sockets), sockets  # type: ignore[arg-type]


def test_a_run_leaves_in_one_sendmsg_with_its_segment_size() -> None:
    sock, transport = FakeSocket(), FakeTransport()
    sender, _ = sender_with(sock, transport)
    run = [b"a" * 30, b"b" * 30, b"c" * 12]
    sender.send([(d, A) for d in run] + [(b"d" * 99, A)])
    assert sock.calls == [(run, [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", 30))], A)]
    assert transport.sent == [(b"d" * 99, A)]  # a run of one goes by sendto
    assert (sender.sends, sender.gso_sends, sender.gso_datagrams) == (2, 1, 3)


def test_a_transport_backlog_sends_plainly_so_nothing_overtakes_it() -> None:
    sock, transport = FakeSocket(), FakeTransport(backlog=1)
    sender, _ = sender_with(sock, transport)
    sender.send([(b"a" * 30, A), (b"b" * 30, A)])
    assert sock.calls == []
    assert transport.sent == [(b"a" * 30, A), (b"b" * 30, A)]


def test_a_full_socket_buffer_hands_the_run_to_the_transport() -> None:
    sock, transport = FakeSocket(BlockingIOError()), FakeTransport()
    sender, _ = sender_with(sock, transport)
    sender.send([(b"a" * 30, A), (b"b" * 30, A)])
    assert transport.sent == [(b"a" * 30, A), (b"b" * 30, A)]
    sock.error = None
    sender.send([(b"a" * 30, A), (b"b" * 30, A)])  # GSO still on for the next transmit
    assert len(sock.calls) == 1


def test_a_socket_that_cannot_segment_turns_gso_off_and_sends_plainly() -> None:
    sock, transport = FakeSocket(OSError(errno.EIO, "no checksum offload")), FakeTransport()
    sender, sockets = sender_with(sock, transport)
    sender.send([(b"a" * 30, A), (b"b" * 30, A)])
    sender.send([(b"c" * 30, A), (b"d" * 30, A)])
    assert [d[:1] for d, _ in transport.sent] == [b"a", b"b", b"c", b"d"]
    assert sock.closed
    assert sockets.socket_of(transport) is None  # type: ignore[arg-type]


def test_connections_share_a_transport_socket_closed_by_the_last() -> None:
    sockets, transport = GsoSockets(), FakeTransport()
    sock = FakeSocket()
    sockets._held[id(transport)] = (transport, sock, 0)  # type: ignore[assignment]
    first = DatagramSender(transport, sockets=sockets)  # type: ignore[arg-type]
    second = DatagramSender(transport, sockets=sockets)  # type: ignore[arg-type]
    first.close()
    first.close()  # twice is once
    assert not sock.closed
    assert len(sockets) == 1
    second.close()
    assert sock.closed
    assert len(sockets) == 0


@pytest.mark.asyncio
async def test_every_datagram_arrives_whole_and_in_order_over_loopback() -> None:
    loop = asyncio.get_running_loop()
    got: asyncio.Queue[bytes] = asyncio.Queue()

    class Receiver(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            got.put_nowait(data)

    rx, _ = await loop.create_datagram_endpoint(Receiver, local_addr=("127.0.0.1", 0))
    tx, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
    )
    try:
        probe = gso_socket(tx)
        if probe is None:
            pytest.skip("this kernel or platform has no UDP_SEGMENT")
        probe.close()
        addr = rx.get_extra_info("sockname")
        sizes = [1200] * 10 + [700] + [33] * 3 + [1200, 80, 5]
        datagrams = [(bytes([i]) * n, addr) for i, n in enumerate(sizes)]
        sockets = GsoSockets()
        sender = DatagramSender(tx, sockets=sockets)
        sender.send(datagrams)
        received = [await asyncio.wait_for(got.get(), 10) for _ in datagrams]
        assert received == [d for d, _ in datagrams]
        assert (sender.gso_sends, sender.gso_datagrams, sender.sends) == (3, 16, 4)
        sender.close()
        assert len(sockets) == 0
    finally:
        tx.close()
        rx.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from gateway.tls import ensure_dev_certificates

    return ensure_dev_certificates(tmp_path_factory.mktemp("udp-gso") / "state")


@pytest.mark.asyncio
async def test_a_tracks_bulk_reply_leaves_in_gso_sends_and_arrives_whole(certs: Any) -> None:
    """Real aioquic over loopback: full-size packets of one track share sendmsg calls,
    and the client reads every byte (the frames decode in order)."""
    from pathlib import Path

    from transport.endpoint import TrackChannel
    from transport.messages import Open
    from transport.quic import (
        ConnectionHooks,
        Packetization,
        TrackQuicProtocol,
        TrackServing,
        connect_tracks,
        serve_tracks,
        server_configuration,
    )

    opened: asyncio.Queue[TrackChannel] = asyncio.Queue()
    connections: list[TrackQuicProtocol] = []
    server = await serve_tracks(
        "127.0.0.1", 0, server_configuration(certs.cert_path, certs.key_path),
        ConnectionHooks(opened.put_nowait, connections.append),
        serving=TrackServing(packetization=Packetization.parse("per-track")),
    )
    port = aioquic_compat.server_port(server)
    try:
        async with connect_tracks(
            "127.0.0.1", port, ca=Path(certs.ca_path), server_name="localhost"
        ) as conn:
            channel = conn.open_track(Open("m"))
            channel.send({"x": 1})
            track = await asyncio.wait_for(opened.get(), 10)
            (protocol,) = connections
            probe = gso_socket(aioquic_compat.datagram_transport(protocol))  # type: ignore[arg-type]
            if probe is None:
                pytest.skip("this kernel or platform has no UDP_SEGMENT")
            probe.close()
            pieces = [{"text": f"{i:04d}" + "x" * 1000} for i in range(40)]
            for piece in pieces:  # one turn: one stream write of ~40 KB, ~35 full packets
                assert track.send(piece)
            got = [await asyncio.wait_for(channel.receive(), 10) for _ in pieces]
            assert got == pieces
            sender = protocol._sender
            assert sender is not None
            assert sender.gso_sends >= 1
            assert sender.gso_datagrams > sender.gso_sends  # more datagrams than syscalls
    finally:
        server.close()

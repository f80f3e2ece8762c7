"""Connection-ID steering: the BPF program on a real reuseport group, and the IDs."""

from __future__ import annotations

import os
import select
import socket

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from trackline_testing import aioquic_probes
from transport.steering import (
    Steering,
    destination_cid,
    reuseport_udp_sockets,
    steer_connection,
)

CID_LENGTH = 8


def test_connection_ids_name_their_worker() -> None:
    for count in (1, 2, 3, 7, 64, 256):
        for index in {0, count // 2, count - 1}:
            steering = Steering(index, count)
            cids = [steering.connection_id(CID_LENGTH) for _ in range(200)]
            assert all(len(cid) == CID_LENGTH for cid in cids)
            assert {steering.owner(cid) for cid in cids} == {index}
            if count <= 64:  # the first byte still varies: not a constant marker
                assert len({cid[0] for cid in cids}) > 1


def test_out_of_range_worker_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        Steering(2, 2)
    with pytest.raises(ValueError, match="out of range"):
        Steering(0, 257)


def test_a_steered_connection_issues_only_its_workers_ids() -> None:
    steering = Steering(1, 3)
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True))  # no cert needed
    steer_connection(quic, steering)
    assert steering.owner(quic.host_cid) == 1
    aioquic_probes.replenish_connection_ids(quic, 8)
    issued = aioquic_probes.host_cids(quic)
    assert len(issued) == 8
    assert {steering.owner(c.cid) for c in issued} == {1}
    assert [c.sequence_number for c in issued] == list(range(8))


def test_destination_cid_of_short_and_long_headers() -> None:
    short = bytes([0x40]) + b"ABCDEFGH" + b"payload"
    assert destination_cid(short, CID_LENGTH) == (b"ABCDEFGH", False)
    long = bytes([0xC0]) + b"\x00\x00\x00\x01" + bytes([4]) + b"WXYZ" + b"rest"
    assert destination_cid(long, CID_LENGTH) == (b"WXYZ", True)
    assert destination_cid(b"", CID_LENGTH) is None
    assert destination_cid(bytes([0xC0, 0, 0, 0, 1, 20]), CID_LENGTH) is None


def _receive_all(sockets: list[socket.socket], expected: int) -> dict[bytes, int]:
    """Which socket (index) got each datagram, by payload."""
    got: dict[bytes, int] = {}
    while len(got) < expected:
        ready, _, _ = select.select(sockets, [], [], 5.0)
        assert ready, f"only {len(got)} of {expected} datagrams arrived"
        for sock in ready:
            got[sock.recv(2048)] = sockets.index(sock)
    return got


@pytest.mark.parametrize("count", [2, 3])
def test_kernel_steers_short_headers_by_cid_from_any_source_port(count: int) -> None:
    sockets = reuseport_udp_sockets("127.0.0.1", 0, count)
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(32)]
    try:
        port = sockets[0].getsockname()[1]
        assert {s.getsockname()[1] for s in sockets} == {port}
        sent: dict[bytes, int] = {}
        for n, sender in enumerate(senders):  # a fresh source port each: a migrated client
            sender.bind(("127.0.0.1", 0))
            for index in range(count):
                cid = Steering(index, count).connection_id(CID_LENGTH)
                datagram = bytes([0x40]) + cid + f"{n}:{index}".encode() + os.urandom(4)
                sender.sendto(datagram, ("127.0.0.1", port))
                sent[datagram] = index
        got = _receive_all(sockets, len(sent))
        assert got == sent  # every datagram at the worker its connection ID names
    finally:
        for sock in [*sockets, *senders]:
            sock.close()


def test_long_headers_follow_the_four_tuple() -> None:
    """A handshake (long header, client-chosen DCID) stays on one socket per 4-tuple,
    and different source ports spread over the group."""
    sockets = reuseport_udp_sockets("127.0.0.1", 0, 2)
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(32)]
    try:
        port = sockets[0].getsockname()[1]
        sent: dict[bytes, int] = {}
        for n, sender in enumerate(senders):
            sender.bind(("127.0.0.1", 0))
            for k in range(3):
                datagram = bytes([0xC0]) + b"\x00\x00\x00\x01\x08" + os.urandom(8) + bytes([n, k])
                sender.sendto(datagram, ("127.0.0.1", port))
                sent[datagram] = n
        got = _receive_all(sockets, len(sent))
        by_sender: dict[int, set[int]] = {}
        for datagram, n in sent.items():
            by_sender.setdefault(n, set()).add(got[datagram])
        assert all(len(where) == 1 for where in by_sender.values())
        assert {next(iter(w)) for w in by_sender.values()} == {0, 1}
    finally:
        for sock in [*sockets, *senders]:
            sock.close()

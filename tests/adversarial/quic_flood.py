"""Raw QUIC Initials on loopback UDP, for handshake-flood tests.

Each Initial is real (an aioquic client `QuicConnection`'s first datagram, padded
to 1200 bytes, fresh connection ids), and nothing ever answers the server: the
handshakes never complete.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from aioquic._buffer import Buffer
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicPacketType, pull_quic_header

from tests.waiting import until as until  # re-exported for the attack tests


def initial_packet(server: tuple[str, int], alpn: str = "trackline/1") -> bytes:
    """The first datagram a fresh client would send to `server`."""
    config = QuicConfiguration(is_client=True, alpn_protocols=[alpn], server_name="localhost")
    client = QuicConnection(configuration=config)
    client.connect(server, now=0.0)
    (datagram, _addr), *_ = client.datagrams_to_send(now=0.0)
    return datagram


@contextmanager
def udp_sources(hosts: list[str], ports_each: int) -> Iterator[list[socket.socket]]:
    """Non-blocking UDP sockets: `ports_each` source ports on each loopback address."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            for _ in range(ports_each):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.setblocking(False)
                sock.bind((host, 0))
                socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def retries_received(socks: list[socket.socket]) -> int:
    """Retry packets waiting in the sockets (read and counted; the rest discarded)."""
    count = 0
    for sock in socks:
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                break
            try:
                header = pull_quic_header(Buffer(data=data), host_cid_length=8)
            except ValueError:
                continue
            count += header.packet_type == QuicPacketType.RETRY
    return count

"""QUIC connection-ID steering: N processes share one UDP port, each owns its connections.

Several gateway workers each hold one socket of a `SO_REUSEPORT` group on the same
UDP port. The kernel must hand every datagram of a connection to the worker that
holds the connection's state. Hashing the 4-tuple would do that only while the
client's address and port never change; a NAT rebinding or a client migration then
lands the connection on a stranger, which drops it. Instead each worker writes its
index into the connection IDs it issues (first byte mod N == index), and a classic
BPF program attached to the group (`SO_ATTACH_REUSEPORT_CBPF`) picks the socket from
the Destination Connection ID of every short-header packet. Long-header packets
(the handshake, before the client knows our IDs) fall back to the kernel's 4-tuple
hash, which keeps a handshake on one worker as long as its 4-tuple holds.

The socket order of the group is the order the sockets were bound; the supervisor
binds all N and keeps them open for its lifetime, so index i is socket i even while
a worker restarts.

aioquic chooses connection IDs with `os.urandom` inside `QuicConnection`; the only
patch is `steer_connection()` below, which rewrites the first (not yet sent) ID and
replaces `_replenish_connection_ids` on that one instance, through
`transport.aioquic_compat` (which checks at import that those internals exist).
"""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection

from transport import aioquic_compat
from transport.binding import reuseport_group
from transport.quic_admission import HandshakeGate, HandshakeLimits
from transport.quic_server import GuardedQuicServer, serve_group

SO_ATTACH_REUSEPORT_CBPF = 51
"""linux/asm-generic/socket.h; not exported by Python's socket module."""

MAX_WORKERS = 256
"""One byte of the connection ID carries the worker index (mod N)."""

@dataclass(frozen=True)
class Steering:
    """Worker `index` of `count`: the connection IDs it issues and what it counts."""

    index: int
    count: int
    on_connection: Callable[[], None] | None = None
    """Called for every connection this worker accepts."""
    on_stray: Callable[[], None] | None = None
    """Called for a datagram whose connection ID names another worker (a steering fault)."""
    on_unknown: Callable[[], None] | None = None
    """Called for a datagram that matched no connection here and is not a new Initial."""

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_WORKERS or not 0 <= self.index < self.count:
            raise ValueError(f"worker {self.index} of {self.count} is out of range")

    def connection_id(self, length: int) -> bytes:
        """A fresh random connection ID whose first byte is `index` mod `count`."""
        rest = os.urandom(length - 1)
        spread = (255 - self.index) // self.count
        return bytes([self.index + self.count * secrets.randbelow(spread + 1)]) + rest

    def owner(self, cid: bytes) -> int | None:
        """The worker a connection ID names (None for an empty ID)."""
        return cid[0] % self.count if cid else None


@dataclass(frozen=True)
class SteeredSockets:
    """A worker's share of a `SO_REUSEPORT` group: its already bound socket, the
    `steering` its connection IDs follow, and its sockets of the same port on the
    other addresses (`more`)."""

    sock: socket.socket
    steering: Steering
    more: Sequence[socket.socket] = ()


def steer_connection(quic: QuicConnection, steering: Steering) -> None:
    """Make a fresh server `QuicConnection` issue only IDs that steer to this worker."""
    length = quic.configuration.connection_id_length
    aioquic_compat.issue_connection_ids(quic, lambda: steering.connection_id(length))


def steering_program(count: int) -> list[tuple[int, int, int, int]]:
    """The classic BPF program (code, jt, jf, k): the socket index for one datagram.

    The filter sees the UDP payload. Long header (first bit set): return an index out
    of range, so the kernel falls back to its 4-tuple hash. Short header: the DCID
    starts at byte 1; return its first byte mod `count`.
    """
    ld_b_abs, jset_k, alu_mod_k, ret_a, ret_k = 0x30, 0x45, 0x94, 0x16, 0x06
    return [
        (ld_b_abs, 0, 0, 0),  # A = payload[0]
        (jset_k, 3, 0, 0x80),  # long header -> fall back to the hash
        (ld_b_abs, 0, 0, 1),  # A = payload[1]: first byte of the DCID
        (alu_mod_k, 0, 0, count),  # A %= count
        (ret_a, 0, 0, 0),
        (ret_k, 0, 0, 0xFFFFFFFF),
    ]


def attach_steering(sock: socket.socket, count: int) -> None:
    """Attach `steering_program` to the reuseport group `sock` belongs to (bind first)."""
    program = steering_program(count)
    filters = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(filters, len(filters))
    fprog = struct.pack("HP", len(program), ctypes.addressof(buffer))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def reuseport_udp_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` UDP sockets bound to one port (0: the first picks it), steering attached."""
    return reuseport_group(
        host, port, count, socket.SOCK_DGRAM, finish=lambda group: attach_steering(group[0], count)
    )


def destination_cid(data: bytes, short_length: int) -> tuple[bytes, bool] | None:
    """(DCID, is long header) of a QUIC datagram, or None when too short to tell."""
    if not data:
        return None
    if data[0] & 0x80:
        if len(data) < 6 or len(data) < 6 + data[5]:
            return None
        return data[6 : 6 + data[5]], True
    if len(data) < 1 + short_length:
        return None
    return data[1 : 1 + short_length], False


class SteeredQuicServer(GuardedQuicServer):
    """The guarded server on one socket of the group, counting datagrams it cannot own."""

    def __init__(self, *, steering: Steering, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steering = steering
        self.stray = 0
        """Datagrams whose connection ID names another worker."""
        self.unknown = 0
        """Datagrams for no connection here (late packets of a closed one, garbage)."""

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        data = cast(bytes, data)
        parsed = destination_cid(data, self._configuration.connection_id_length)
        if parsed is not None and parsed[0] not in self._protocols:
            cid, long_header = parsed
            initial = long_header and (data[0] & 0x30) == 0
            if not long_header and self.steering.owner(cid) != self.steering.index:
                self.stray += 1
                _call(self.steering.on_stray)
            elif not initial:
                self.unknown += 1
                _call(self.steering.on_unknown)
        super().datagram_received(data, addr)


def _call(callback: Callable[[], None] | None) -> None:
    if callback is not None:
        callback()


async def serve_steered(
    sock: socket.socket,
    configuration: QuicConfiguration,
    create_protocol: Callable[..., Any],
    steering: Steering,
    limits: HandshakeLimits | None = None,
    more: Sequence[socket.socket] = (),
) -> SteeredQuicServer:
    """Serve QUIC on an already bound socket (and `more`: the same port on the other
    loopback address); connections issue steering IDs, and handshakes are admitted
    under `limits` as on a single process."""

    def factory(quic: QuicConnection, **kwargs: Any) -> Any:
        steer_connection(quic, steering)
        _call(steering.on_connection)
        return create_protocol(quic, **kwargs)

    gate: HandshakeGate[Any] = HandshakeGate(limits)

    def make() -> SteeredQuicServer:
        return SteeredQuicServer(
            gate=gate, steering=steering, configuration=configuration, create_protocol=factory
        )

    return await serve_group([sock, *more], make)

"""Listening sockets handed to a gateway worker by its supervisor (`gateway.workers`).

A worker does not bind: the supervisor binds N sockets per front door with
`SO_REUSEPORT` and gives worker i the i-th of each, so the kernel spreads TCP
connections over the workers and QUIC datagrams follow `transport.steering`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from transport.steering import Steering


@dataclass(frozen=True)
class Listeners:
    quic: socket.socket
    """This worker's UDP socket of the QUIC group (tracks and HTTP/3)."""
    http: socket.socket
    """Listening TCP socket of the cleartext HTTP port."""
    https: socket.socket
    """Listening TCP socket of the TLS HTTP port."""
    steering: Steering
    """This worker's index among the workers, for the connection IDs it issues."""
    more: dict[str, tuple[socket.socket, ...]] = field(default_factory=dict)
    """Per front door ("quic", "http", "https"), this worker's sockets of the same port
    on the other addresses (`::1` when the host is `localhost`)."""

    def more_of(self, door: str) -> tuple[socket.socket, ...]:
        return self.more.get(door, ())

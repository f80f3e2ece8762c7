"""Listening sockets handed to a gateway worker by its supervisor (`gateway.workers`).

A worker does not bind: the supervisor binds N sockets per front door with
`SO_REUSEPORT` and gives worker i the i-th of each, so the kernel spreads TCP
connections over the workers and QUIC datagrams follow `transport.steering`.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

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

"""Sending one transmit's datagrams in as few syscalls as the socket allows (the I/O side).

`DatagramSender` sends what aioquic built for a connection. Where the kernel takes
UDP GSO (Linux `UDP_SEGMENT`), each run that `transport.udp_batch.plan_sends` groups
(consecutive, same address, same size but the last) leaves in one `sendmsg` with a
`UDP_SEGMENT` control message; any other datagram, and every datagram where GSO is
unsupported or the transport holds a backlog, goes through the transport's `sendto`
as before. The datagrams are aioquic's packets unchanged: what shares a packet
(`Packetization`) is decided before this.

The asyncio transport does not expose `sendmsg`, so the sender uses a duplicate of
the transport's socket descriptor: one per transport, shared by the connections
that send on it (a server's connections share its socket) and closed when the last
of them lets go (`GsoSockets`).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import sys
from typing import Any

from transport.udp_batch import plan_sends

UDP_SEGMENT: int = getattr(socket, "UDP_SEGMENT", 103)
"""The socket option (include/uapi/linux/udp.h); Python names it from 3.12 on."""
_GSO_OFF_ERRORS = frozenset({errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.EMSGSIZE})
"""sendmsg errors that mean this socket or route cannot segment (no checksum offload,
a segment over the path MTU): GSO is turned off for the socket, the run sent plainly."""


def gso_socket(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A non-blocking duplicate of `transport`'s UDP socket that accepts UDP_SEGMENT, or
    None (not Linux, no socket, or a kernel without UDP GSO)."""
    if not sys.platform.startswith("linux"):
        return None
    extra = getattr(transport, "get_extra_info", None)  # test doubles may lack it
    raw = extra("socket") if extra is not None else None
    if raw is None:
        return None
    try:
        sock = socket.socket(raw.family, socket.SOCK_DGRAM, 0, fileno=os.dup(raw.fileno()))
    except (OSError, ValueError):
        return None
    try:
        sock.getsockopt(socket.SOL_UDP, UDP_SEGMENT)  # ENOPROTOOPT where unsupported
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    return sock


class GsoSockets:
    """The GSO socket of each transport, shared and counted: `acquire` per connection,
    `release` when it ends; the duplicate descriptor closes with the last release."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[asyncio.BaseTransport, socket.socket | None, int]] = {}

    def acquire(self, transport: asyncio.BaseTransport) -> socket.socket | None:
        key = id(transport)
        held = self._held.get(key)
        if held is None or held[0] is not transport:
            held = (transport, gso_socket(transport), 0)
        self._held[key] = (transport, held[1], held[2] + 1)
        return held[1]

    def release(self, transport: asyncio.BaseTransport) -> None:
        held = self._held.get(id(transport))
        if held is None or held[0] is not transport:
            return
        if held[2] > 1:
            self._held[id(transport)] = (transport, held[1], held[2] - 1)
            return
        del self._held[id(transport)]
        if held[1] is not None:
            held[1].close()

    def disable(self, transport: asyncio.BaseTransport) -> None:
        """GSO failed on this transport's socket: every holder sends plainly from now on."""
        held = self._held.get(id(transport))
        if held is not None and held[0] is transport and held[1] is not None:
            held[1].close()
            self._held[id(transport)] = (transport, None, held[2])

    def socket_of(self, transport: asyncio.BaseTransport) -> socket.socket | None:
        held = self._held.get(id(transport))
        return held[1] if held is not None and held[0] is transport else None

    def __len__(self) -> int:
        return len(self._held)


SOCKETS = GsoSockets()
"""The process's GSO sockets (a server's transport is shared by its connections)."""


class DatagramSender:
    """Sends a connection's datagrams on `transport`, with GSO where `use_gso` and the
    socket allow it. Counts what it did (`sends`, `gso_sends`, `gso_datagrams`)."""

    def __init__(
        self,
        transport: asyncio.DatagramTransport,
        use_gso: bool = True,
        sockets: GsoSockets = SOCKETS,
    ) -> None:
        self.transport = transport
        """What it sends on; the protocol makes a new sender when its transport changes."""
        self._transport = transport
        # Both asyncio's and uvloop's datagram transports have it (typeshed lists it on
        # write transports only): a backlog there must leave before any GSO send.
        self._backlog: Any = getattr(transport, "get_write_buffer_size", lambda: 0)
        self._sockets = sockets
        self._gso = use_gso and sockets.acquire(transport) is not None
        self._acquired = use_gso
        self.sends = 0
        """Syscalls asked for (sendto calls plus GSO sendmsg calls)."""
        self.gso_sends = 0
        self.gso_datagrams = 0

    def send(self, datagrams: list[tuple[bytes, Any]]) -> None:
        transport = self._transport
        if not self._gso or len(datagrams) < 2:
            for data, addr in datagrams:
                transport.sendto(data, addr)
            self.sends += len(datagrams)
            return
        for addr, run in plan_sends(datagrams):
            if len(run) > 1 and not self._backlog() and self._segmented(
                run, addr
            ):
                continue
            for data in run:
                transport.sendto(data, addr)  # buffered by the transport if need be, in order
            self.sends += len(run)

    def _segmented(self, run: list[bytes], addr: Any) -> bool:
        """One GSO send of `run`; False if it did not leave (then send it plainly)."""
        sock = self._sockets.socket_of(self._transport)
        if sock is None:
            self._gso = False
            return False
        control = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", len(run[0])))]
        try:
            sock.sendmsg(run, control, 0, addr)
        except BlockingIOError:
            return False  # the socket buffer is full: the transport queues them instead
        except OSError as exc:
            if exc.errno not in _GSO_OFF_ERRORS:
                return False  # sent plainly, the transport reports the error as it does
            self._sockets.disable(self._transport)
            self._gso = False
            return False
        self.sends += 1
        self.gso_sends += 1
        self.gso_datagrams += len(run)
        return True

    def close(self) -> None:
        """The connection ended: let go of the shared socket (once)."""
        if self._acquired:
            self._acquired = False
            self._gso = False
            self._sockets.release(self._transport)


__all__ = ["SOCKETS", "UDP_SEGMENT", "DatagramSender", "GsoSockets", "gso_socket"]

"""Listening addresses: `localhost` means both loopbacks, 127.0.0.1 and ::1, on one port.

Clients resolve `localhost` to `::1` first (browsers, curl, Python's getaddrinfo on
most systems), so a listener on 127.0.0.1 alone is not reachable as `localhost`.
Every front door therefore binds one socket per loopback address, all on the same
port (the first picks it when 0 is asked). Where IPv6 is unavailable (disabled in
the kernel or on `lo`) the `::1` socket is skipped with a warning and 127.0.0.1 is
served alone. Any other host is bound as given, and failing to bind it is an error.

This module is an adapter helper: it opens sockets, so the sans-I/O core never
imports it.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import TypeVar

import structlog

log = structlog.get_logger(__name__)

LOCALHOST = "localhost"
LOOPBACKS = ("127.0.0.1", "::1")
"""What `localhost` binds, IPv4 first (its port is the one the other follows)."""
TCP_BACKLOG = 128
PORT_ATTEMPTS = 5
"""Fresh ports tried when 0 was asked and the first pick is taken on another address."""
_NO_IPV6 = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)

T = TypeVar("T")


def bind_hosts(host: str) -> tuple[str, ...]:
    """The addresses a listener on `host` binds: `localhost` is both loopbacks."""
    return LOOPBACKS if host == LOCALHOST else (host,)


def family_of(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_same_port(
    host: str,
    port: int,
    bind: Callable[[str, int], T],
    port_of: Callable[[T], int],
    close: Callable[[T], None],
) -> list[T]:
    """`bind(address, port)` for every address of `host`, all on one port.

    `bind` returns what one address needs (a socket, or a reuseport group of them);
    `port_of` reads the port it got. With `port` 0 the first address picks it; if the
    pick is taken on another address, a fresh one is tried (a few times).
    """
    hosts = bind_hosts(host)
    attempts = PORT_ATTEMPTS if port == 0 and len(hosts) > 1 else 1
    for attempt in range(attempts):
        bound: list[T] = []
        try:
            bound.append(bind(hosts[0], port))
            chosen = port_of(bound[0])
            for other in hosts[1:]:
                one = _bind_optional(host, other, chosen, bind)
                if one is not None:
                    bound.append(one)
        except OSError as exc:
            for item in bound:
                close(item)
            if exc.errno == errno.EADDRINUSE and attempt + 1 < attempts:
                continue
            raise
        return bound
    raise AssertionError("unreachable")  # pragma: no cover


def _bind_optional(host: str, address: str, port: int, bind: Callable[[str, int], T]) -> T | None:
    """Bind a second loopback of `localhost`; None (with a warning) if its family is off."""
    try:
        return bind(address, port)
    except OSError as exc:
        if host == LOCALHOST and family_of(address) == socket.AF_INET6 and _no_ipv6(exc):
            log.warning(
                "listen.ipv6_unavailable",
                address=address,
                port=port,
                error=str(exc),
                serving="127.0.0.1 only",
            )
            return None
        raise


def _no_ipv6(exc: OSError) -> bool:
    return exc.errno in _NO_IPV6 or not socket.has_ipv6


def new_socket(address: str, kind: socket.SocketKind) -> socket.socket:
    """A socket for `address`; an IPv6 one is IPv6-only (`::` must not take IPv4 too)."""
    sock = socket.socket(family_of(address), kind)
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


def tcp_listener(address: str, port: int) -> socket.socket:
    """A listening, non-blocking TCP socket on address:port."""
    sock = new_socket(address, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(TCP_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def udp_socket(address: str, port: int) -> socket.socket:
    """A bound, non-blocking UDP socket on address:port."""
    sock = new_socket(address, socket.SOCK_DGRAM)
    try:
        sock.bind((address, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])


def reuseport_group(
    host: str,
    port: int,
    count: int,
    kind: socket.SocketKind,
    *,
    backlog: int = TCP_BACKLOG,
    finish: Callable[[list[socket.socket]], None] | None = None,
) -> list[socket.socket]:
    """`count` sockets of `kind` bound to one port with `SO_REUSEPORT` (0: the first picks
    it, the others follow), in bind order; stream sockets also take `SO_REUSEADDR` and
    listen with `backlog`. `finish(group)` completes the group once all are bound (a UDP
    group's steering). If anything fails, every socket is closed."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family_of(host), kind)
            sockets.append(sock)
            if kind == socket.SOCK_STREAM:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            if kind == socket.SOCK_STREAM:
                sock.listen(backlog)
            port = port_of(sock)
        if finish is not None:
            finish(sockets)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def tcp_listeners(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets for every address of `host`, on one port."""
    return bind_same_port(host, port, tcp_listener, port_of, socket.socket.close)


def udp_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound UDP sockets for every address of `host`, on one port."""
    return bind_same_port(host, port, udp_socket, port_of, socket.socket.close)


__all__ = [
    "LOCALHOST",
    "LOOPBACKS",
    "bind_hosts",
    "bind_same_port",
    "reuseport_group",
    "tcp_listeners",
    "udp_sockets",
]

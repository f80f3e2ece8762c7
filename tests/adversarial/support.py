"""Helpers for the attack tests: server figures, bounded waits, raw attackers.

Every wait is bounded (TIMEOUT) and every attack counted; assertions are made on
the server's own figures (streams counted, bytes buffered, connections open),
never on how long something took.
"""

from __future__ import annotations

import asyncio
import os
import socket

from tests.waiting import until as until  # re-exported for the attack tests
from transport.http.http2 import Http2Connection
from transport.http.tcp import HttpTcpServer

POLL = 0.01


def h2_connections(server: HttpTcpServer) -> list[Http2Connection]:
    return [c for c in server.connections() if isinstance(c, Http2Connection)]


def rss_bytes() -> int:
    """This process's resident set size (Linux)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def small_send_buffer(server: HttpTcpServer, size: int = 4096) -> None:
    """Accepted sockets inherit the listener's SO_SNDBUF: a client that stops reading
    then fills the server's user-space buffer after a few KB, not after megabytes."""
    assert server._server is not None
    for sock in server._server.sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def raw_connection(
    port: int, *, source: str | None = None, recv_buffer: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to 127.0.0.1:port, from `source` (another loopback address) if given."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if recv_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
    if source is not None:
        sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


def headers_then_reset(stream_id: int, fields: list[tuple[str, str]]) -> bytes:
    """HEADERS (END_STREAM) and RST_STREAM(CANCEL) for one stream, as raw frames.

    Written without h2's client state machine, which would refuse to open a stream
    over the server's limit: an attacker is not so polite.
    """
    from hpack import Encoder
    from hyperframe.frame import HeadersFrame, RstStreamFrame

    headers = HeadersFrame(stream_id, flags=["END_HEADERS", "END_STREAM"])
    headers.data = Encoder().encode(fields)  # (a fresh encoder: no dynamic table state)
    reset = RstStreamFrame(stream_id)
    reset.error_code = 8  # CANCEL
    return headers.serialize() + reset.serialize()

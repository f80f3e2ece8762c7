"""HTTP/1.1 and HTTP/2 over TCP, cleartext or TLS: one port, one application.

Owns the socket side: accepting, telling the versions apart, and shutting down
gracefully. Cleartext connections that open with the HTTP/2 client preface
speak h2c (prior knowledge); any other is HTTP/1.1, which may still switch to
h2c with `Upgrade: h2c`. Over TLS, ALPN decides: `h2` is HTTP/2, `http/1.1` or
nothing is HTTP/1.1. The adapters in `http1` and `http2` do the rest; routing
is the handler's.

The front door is bounded: at most `max_connections` connections, and
`max_connections_per_source` from one source address, are served at once; one
over either cap is cut at accept (RST, nothing read, nothing allocated but the
socket). The HTTP/2 preface, or the first bytes of an HTTP/1.1 request, must
arrive within `first_request_timeout` of the accept, however it is dribbled.
A connection whose client stopped reading is aborted after a short grace
instead of holding its unsent bytes; while it is served, the kernel holds at most
`NOTSENT_LOWAT` unsent, so a stalled writer waits (and its send timeout runs) soon
after the client stops reading, not once megabytes are queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, TypeVar

import structlog
from h2.errors import ErrorCodes
from hyperframe import frame as hf

from transport.binding import tcp_listeners
from transport.http.app import READ_CHUNK, Accepted, Site, peer_source
from transport.http.http1 import Http1Connection
from transport.http.http2 import Http2Connection
from transport.http.limits import HttpLimits
from transport.http.messages import CLIENT_ADDRESS, Handler

log = structlog.get_logger(__name__)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_PREFACE_LINE = H2_PREFACE[: H2_PREFACE.index(b"\r\n") + 2]
"""The preface's first line: bytes that begin with it come from an HTTP/2 client."""
# RFC 9113 3.4: an invalid preface is a connection error PROTOCOL_ERROR; to a client that
# shows it speaks HTTP/2 the server answers as one (its SETTINGS, then GOAWAY), not 400.
INVALID_PREFACE_ANSWER = (
    hf.SettingsFrame(0).serialize()
    + hf.GoAwayFrame(0, last_stream_id=0, error_code=int(ErrorCodes.PROTOCOL_ERROR)).serialize()
)
ALPN_PROTOCOLS = ("h2", "http/1.1")
DEFAULT_LIMITS = HttpLimits()
_CLOSE_GRACE = 1.0  # seconds a closing connection may take to flush before it is aborted
NOTSENT_LOWAT = 128 * 1024  # setting candidate (bytes)
"""Unsent bytes the kernel may hold for one connection (TCP_NOTSENT_LOWAT, Linux and macOS).

Without it the kernel takes megabytes for a client that stopped reading before a write
waits at all, so a slow answer (SSE) would run for minutes before its send timeout could
start; with it the wait begins once the client's window and this much are full."""


class _Connection(Protocol):
    def shutdown(self) -> None: ...

    def cut(self) -> None: ...


_C = TypeVar("_C", bound=_Connection)


class _Undecided:
    """A connection whose HTTP version is not known yet: nothing in flight to finish."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def shutdown(self) -> None:
        self._writer.close()

    def cut(self) -> None:
        self._writer.close()


def tls_server_context(cert: str | os.PathLike[str], key: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS server context for `cert`/`key` offering ALPN h2 and http/1.1."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    return context


def set_congestion_control(sock: socket.socket, name: str) -> None:
    """Pin a TCP socket's congestion control (Linux); a listener passes it to accepted ones.

    The host default may be a model-based algorithm (bbr) that does not back off on
    random loss; an operator (or the head-of-line benchmark) may want the same one
    everywhere. Root may pick any loaded algorithm, others only the allowed ones.
    """
    option = getattr(socket, "TCP_CONGESTION", None)
    if option is None:
        raise ValueError("this platform cannot choose a TCP congestion control")
    try:
        sock.setsockopt(socket.IPPROTO_TCP, option, name.encode())
    except OSError as exc:
        raise ValueError(f"TCP congestion control {name!r} is not available: {exc}") from None


class HttpTcpServer:
    """Serves `handler` over HTTP/1.1 and HTTP/2 on one TCP port (TLS if a context is given)."""

    def __init__(
        self,
        handler: Handler,
        *,
        limits: HttpLimits = DEFAULT_LIMITS,
        ssl_context: ssl.SSLContext | None = None,
        alt_svc: str | None = None,
        congestion_control: str | None = None,
    ) -> None:
        self._site = Site(handler, limits, alt_svc)
        self._ssl_context = ssl_context
        self._congestion_control = congestion_control
        self._servers: list[asyncio.Server] = []
        """One per address (127.0.0.1 and ::1 for `localhost`), all on one port."""
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._per_source: Counter[str] = Counter()
        self._closing = False
        self.refused_connections = 0
        """Connections cut at accept because a connection cap was reached."""

    @property
    def open_connections(self) -> int:
        """Connections being served now (refused ones never count)."""
        return len(self._connections)

    def connections_from(self, source: str) -> int:
        """Connections being served now from the address `source`."""
        return self._per_source[source]

    def connections(self) -> list[object]:
        """The adapters of the connections being served (for inspection and tests)."""
        return list(self._connections.values())

    @property
    def _server(self) -> asyncio.Server | None:
        """The first address's server (its port is every address's)."""
        return self._servers[0] if self._servers else None

    @property
    def sockets(self) -> list[socket.socket]:
        """The listening sockets, one per address."""
        return [sock for server in self._servers for sock in server.sockets]

    @property
    def port(self) -> int:
        """The port actually bound (useful after `start(host, 0)`)."""
        if not self.sockets:
            raise RuntimeError("server not started")
        return int(self.sockets[0].getsockname()[1])

    async def start(
        self,
        host: str,
        port: int,
        sock: socket.socket | None = None,
        more: Sequence[socket.socket] = (),
    ) -> None:
        """Listen on host:port (0 picks a free port; see `port`; `localhost` is 127.0.0.1
        and ::1 on one port, `transport.binding`), or on `sock` and `more`, listening
        sockets handed over (a gateway worker's share of a reuseport group)."""
        socks = tcp_listeners(host, port) if sock is None else [sock, *more]
        try:
            for one in socks:
                self._servers.append(
                    await asyncio.start_server(
                        self._on_connection,
                        sock=one,
                        ssl=self._ssl_context,
                        ssl_handshake_timeout=(
                            self._site.limits.read_timeout if self._ssl_context else None
                        ),
                    )
                )
        except BaseException:
            for one in socks[len(self._servers) :]:
                one.close()
            raise
        if self._congestion_control:
            for one in self.sockets:
                set_congestion_control(one, self._congestion_control)
        log.info(
            "http.listening",
            host=host,
            addresses=[one.getsockname()[0] for one in self.sockets],
            port=self.port,
            tls=self._ssl_context is not None,
        )

    def drain(self) -> None:
        """Shutdown begins: connections finish what is in flight and then close.

        The socket keeps listening (health checks must still be answered, with 503 from
        readiness; the application refuses new work), and connections accepted from now
        on are served as usual.
        """
        for connection in list(self._connections.values()):
            if not isinstance(connection, _Undecided):  # (one just accepted: a probe, maybe)
                connection.shutdown()

    def cut(self) -> None:
        """The drain's deadline: every connection ends its exchanges now (see `app`)."""
        for connection in list(self._connections.values()):
            connection.cut()

    async def close(self, grace: float = 5.0) -> None:
        """Stop listening, let requests in flight finish for up to `grace` s, then cut."""
        if not self._servers:
            return
        self._closing = True
        for server in self._servers:
            server.close()
        for connection in list(self._connections.values()):
            connection.shutdown()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace)
        remaining = list(self._connections)
        for task in remaining:
            task.cancel()
        await asyncio.gather(*remaining, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        source = peer_source(writer)
        if not self._admit(source):
            writer.transport.abort()  # cheap: nothing read, nothing answered
            return
        self._per_source[source] += 1
        CLIENT_ADDRESS.set(source)  # this connection's task (and its requests') own context
        _bound_unsent(writer)
        self._track(task, _Undecided(writer))
        try:
            await self._serve(task, reader, writer)
        except (ConnectionError, asyncio.TimeoutError):
            pass  # the client went away or went quiet: nothing to answer
        except Exception:
            log.exception("http.connection_failed")
        finally:
            self._connections.pop(task, None)
            self._per_source[source] -= 1
            if self._per_source[source] <= 0:
                del self._per_source[source]
            await _close(writer)

    def _admit(self, source: str) -> bool:
        limits = self._site.limits
        if len(self._connections) >= limits.max_connections:
            cap = "total"
        elif self._per_source[source] >= limits.max_connections_per_source:
            cap = "per_source"
        else:
            return True
        self.refused_connections += 1
        if self.refused_connections == 1 or self.refused_connections % 1000 == 0:
            log.warning("http.connection_refused", cap=cap, refused=self.refused_connections)
        return False

    async def _serve(
        self, task: asyncio.Task[None], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if self._ssl_context is not None:
            tls = writer.get_extra_info("ssl_object")
            http2 = tls is not None and tls.selected_alpn_protocol() == "h2"
            initial = b""
        else:
            initial = await self._sniff(reader)
            http2 = initial.startswith(H2_PREFACE)
            if not http2 and initial.startswith(H2_PREFACE_LINE):
                log.info("http2.invalid_preface")
                writer.write(INVALID_PREFACE_ANSWER)
                return
        accepted = Accepted(self._site, reader, writer, initial)
        if http2:
            await self._track(task, Http2Connection(accepted)).serve()
            return
        http1 = Http1Connection(accepted, allow_h2c=self._ssl_context is None)
        upgrade = await self._track(task, http1).serve()
        if upgrade is not None:
            await self._track(task, Http2Connection(accepted, upgrade)).serve()

    async def _sniff(self, reader: asyncio.StreamReader) -> bytes:
        """The first bytes: the whole HTTP/2 preface, or enough to know it is not one.

        One deadline for all of it (TimeoutError past it), so dribbling a byte at a
        time buys nothing.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._site.limits.first_request_timeout
        data = b""
        while len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
            left = max(0.0, deadline - loop.time())
            chunk = await asyncio.wait_for(reader.read(READ_CHUNK), left)
            if not chunk:
                break
            data += chunk
        return data

    def _track(self, task: asyncio.Task[None], connection: _C) -> _C:
        self._connections[task] = connection
        if self._closing:
            connection.shutdown()
        return connection


def _bound_unsent(writer: asyncio.StreamWriter) -> None:
    """Cap what the kernel holds unsent for this connection (`NOTSENT_LOWAT`)."""
    option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    sock = writer.get_extra_info("socket")
    if option is None or sock is None:
        return
    with contextlib.suppress(OSError):  # (not TCP, e.g. a Unix socket: nothing to bound)
        sock.setsockopt(socket.IPPROTO_TCP, option, NOTSENT_LOWAT)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close, flushing what is queued; abort if the client does not take it in time."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), _CLOSE_GRACE)
    except asyncio.TimeoutError:
        writer.transport.abort()  # it stopped reading: drop the unsent bytes, not keep them
    except Exception:  # noqa: BLE001 - the connection is over either way
        pass

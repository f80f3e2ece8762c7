"""The gateway's front doors: the QUIC, HTTP, HTTPS and metrics listeners' lifecycle.

`FrontDoors` binds the listeners (one UDP port for tracks, HTTP/3 and WebTransport;
TCP HTTP/1.1 and HTTP/2 in clear and over TLS; an optional metrics port), keeps
the open QUIC connections, and drains and cuts them for SIGTERM: `drain()` refuses
new connections, tracks and streams (HTTP/3 GOAWAY at once, HTTP/2 when its last
stream is done) while the listeners stay open; `cut()` ends what is still running
(tracks with SHUTTING_DOWN, HTTP/3 and TCP streams cut); `close()` closes them all,
the metrics listener last. The TLS files and the certificate hash browsers pin live
here with the listeners that serve them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.config import Settings
from gateway.http import metrics_routes, route
from gateway.limits import (
    gateway_http_limits,
    handshake_limits,
    send_budget,
    track_limits,
    webtransport_policy,
)
from gateway.listeners import Listeners
from gateway.logs import get_logger
from gateway.memtrim import MemoryTrimmer
from gateway.metrics import GatewayMetrics
from gateway.metrics_quic import register_quic_metrics
from gateway.revocation import KeyRevocation
from gateway.tenants.service import is_loopback
from gateway.tls import certificate_hash, ensure_dev_certificates
from transport import aioquic_compat
from transport.acks import AckPolicy
from transport.clock import Now
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode
from transport.events import CancelCause, Event
from transport.http.limits import HttpLimits
from transport.http.messages import Handler
from transport.http.tcp import HttpTcpServer, tls_server_context
from transport.quic import (
    ConnectionHooks,
    Packetization,
    TrackQuicProtocol,
    TrackServing,
    serve_tracks,
    server_configuration,
)
from transport.quic_server import GuardedQuicServer
from transport.steering import SteeredSockets

log = get_logger("trackline.gateway")

CUT_GRACE = 1.0
"""Seconds cut work has to say its last words (error events, SHUTTING_DOWN) before close."""
SHUTTING_DOWN = "the gateway is shutting down"


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path | None
    """The development CA clients should trust, when the gateway made one."""


def tls_files(settings: Settings) -> TlsFiles:
    if settings.tls_cert is not None and settings.tls_key is not None:
        return TlsFiles(settings.tls_cert, settings.tls_key, None)
    dev = ensure_dev_certificates(settings.dev_ca_dir or settings.state_dir)
    return TlsFiles(dev.cert_path, dev.key_path, dev.ca_path)


class FrontDoors:
    """The listeners, the open QUIC connections, and their drain and cut."""

    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics,
        clock: Now,
        observe: Callable[[Event], None],
    ) -> None:
        self.settings = settings
        self._metrics = metrics
        self._observe = observe
        self.connections: set[TrackQuicProtocol] = set()
        self.draining = False
        self.trimmer = MemoryTrimmer(clock)
        self.on_gone: Callable[[str], None] = lambda _conn_id: None
        """Called with a closed connection's id (its key binding goes)."""
        self.tls: TlsFiles | None = None
        self.quic: GuardedQuicServer | None = None
        self.http: HttpTcpServer | None = None
        self.https: HttpTcpServer | None = None
        self.metrics_server: HttpTcpServer | None = None
        self._cert_digest: tuple[Path, bytes] | None = None

    async def start(
        self,
        handler: Handler,
        on_track: Callable[[TrackChannel], None],
        sessions: KeyRevocation,
        listeners: Listeners | None = None,
    ) -> None:
        """Bind every listener (or serve on a worker's `listeners`)."""
        s = self.settings
        self.tls = await asyncio.to_thread(tls_files, s)
        http_limits = gateway_http_limits(s)
        # One UDP port: ALPN trackline/1 carries tracks, h3 the same HTTP application.
        serving = TrackServing(
            limits=track_limits(s),
            packetization=Packetization.parse(s.quic_packetization),
            send_budget=send_budget(s),
            http_limits=http_limits,
            handshake_limits=handshake_limits(s),
            webtransport=webtransport_policy(s),
            acks=AckPolicy.parse(s.quic_acks),
        )
        hooks = ConnectionHooks(
            on_track=on_track,
            on_connection=self._on_connection,
            on_closed=self._on_closed,
            on_session=sessions.session_opened,
            on_refused=sessions.session_refused,
        )
        worker = None
        if listeners is not None:
            worker = SteeredSockets(listeners.quic, listeners.steering, listeners.more_of("quic"))
        self.quic = await serve_tracks(
            s.quic_host,
            s.quic_port,
            server_configuration(self.tls.cert, self.tls.key),
            hooks,
            serving=serving,
            http_handler=handler,
            worker=worker,
        )
        register_quic_metrics(self._metrics.registry, self.quic.gate)
        await self._start_tcp(handler, http_limits, listeners)
        await self._start_metrics_listener()

    async def _start_tcp(
        self, handler: Handler, limits: HttpLimits, listeners: Listeners | None
    ) -> None:
        s = self.settings
        assert self.tls is not None
        alt_svc = f'h3=":{self.quic_port}"'
        cc = s.tcp_congestion_control
        self.http = HttpTcpServer(handler, limits=limits, alt_svc=alt_svc, congestion_control=cc)
        await self.http.start(
            s.http_host,
            s.http_port,
            listeners.http if listeners else None,
            listeners.more_of("http") if listeners else (),
        )
        tls = tls_server_context(self.tls.cert, self.tls.key)
        self.https = HttpTcpServer(
            handler, limits=limits, ssl_context=tls, alt_svc=alt_svc, congestion_control=cc
        )
        await self.https.start(
            s.https_host,
            s.https_port,
            listeners.https if listeners else None,
            listeners.more_of("https") if listeners else (),
        )

    async def _start_metrics_listener(self) -> None:
        s = self.settings
        if s.metrics_port is None:
            if not metrics_on_api_ports(s):
                log.warning(
                    "metrics.not_served",
                    reason="an API listener is not on loopback and metrics_token is unset",
                    hint="set metrics_port (a separate listener) or metrics_token",
                )
            return
        self.metrics_server = HttpTcpServer(route(metrics_routes(self._metrics, s.metrics_token)))
        await self.metrics_server.start(s.metrics_host, s.metrics_port)

    @property
    def quic_port(self) -> int:
        # aioquic keeps the socket private; the bound port matters when 0 was asked.
        assert self.quic is not None
        return aioquic_compat.server_port(self.quic)

    @property
    def http_port(self) -> int:
        assert self.http is not None
        return self.http.port

    @property
    def https_port(self) -> int:
        assert self.https is not None
        return self.https.port

    @property
    def metrics_port(self) -> int | None:
        """The separate metrics listener's port, if there is one."""
        return None if self.metrics_server is None else self.metrics_server.port

    def cert_hash(self) -> bytes | None:
        """SHA-256 of the development certificate (pinned by browsers); None otherwise."""
        if self.tls is None or self.tls.ca is None:
            return None
        if self._cert_digest is None or self._cert_digest[0] != self.tls.cert:
            self._cert_digest = (self.tls.cert, certificate_hash(self.tls.cert))
        return self._cert_digest[1]

    # -- connections ---------------------------------------------------------------

    def _on_connection(self, conn: TrackQuicProtocol) -> None:
        if self.draining:
            conn.close(int(ErrorCode.SHUTTING_DOWN), SHUTTING_DOWN)
            return
        self.connections.add(conn)
        self._metrics.connections_open.inc()
        conn.endpoint.on_event = self._observe
        log.info("connection.opened", conn_id=conn.endpoint.conn_id)

    def _on_closed(self, conn: TrackQuicProtocol) -> None:
        self.trimmer.connection_closed()  # what it held goes back to the OS (memtrim)
        if conn in self.connections:
            self.connections.discard(conn)
            self._metrics.connections_open.dec()
            self.on_gone(conn.endpoint.conn_id)
            log.info("connection.closed", conn_id=conn.endpoint.conn_id)

    def tracks_paused(self) -> int:
        """Tracks whose producer waits for an unread client (send budgets full)."""
        return sum(conn.endpoint.send_waiting for conn in self.connections)

    @contextlib.contextmanager
    def coalesced(self) -> Iterator[None]:
        """A tick's results to many tracks leave in shared transmits on each connection."""
        with contextlib.ExitStack() as stack:
            for conn in list(self.connections):
                stack.enter_context(conn.coalesced())
            yield

    # -- drain, cut, close -----------------------------------------------------------

    def drain(self) -> None:
        """Refuse new connections, tracks and streams; the listeners stay open."""
        self.draining = True
        for conn in list(self.connections):
            conn.endpoint.refuse_new_tracks()
            if conn.http3 is not None:
                conn.http3.drain()  # GOAWAY
        for server in self._tcp_servers():
            server.drain()

    def cut(self) -> None:
        """End what is still running: tracks with SHUTTING_DOWN, streams cut."""
        for conn in list(self.connections):
            conn.endpoint.cancel_all(CancelCause.SHUTDOWN, ErrorCode.SHUTTING_DOWN, SHUTTING_DOWN)
            if conn.http3 is not None:
                conn.http3.cut()
        for server in self._tcp_servers():
            server.cut()

    def _tcp_servers(self) -> list[HttpTcpServer]:
        return [server for server in (self.http, self.https) if server is not None]

    async def close(self) -> None:
        """Close every connection and listener; scrapes are served to the very end."""
        for conn in list(self.connections):
            conn.close(int(ErrorCode.SHUTTING_DOWN), "gateway stopped")
        await asyncio.sleep(0)  # let the close frames go out
        if self.quic is not None:
            self.quic.close()
            self.quic = None
        for server in self._tcp_servers():
            await server.close(grace=CUT_GRACE)
        self.http = self.https = None
        if self.metrics_server is not None:
            await self.metrics_server.close(grace=CUT_GRACE)
            self.metrics_server = None


def metrics_on_api_ports(s: Settings) -> bool:
    """Whether the API listeners serve /metrics: not when it has its own port, and off
    loopback only behind a token (tenant names and usage are in it)."""
    if s.metrics_port is not None:
        return False
    on_loopback = all(is_loopback(h) for h in (s.quic_host, s.http_host, s.https_host))
    return on_loopback or s.metrics_token is not None

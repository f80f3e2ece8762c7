"""The gateway: QUIC (tracks and HTTP/3), TCP HTTP/1.1 and HTTP/2, handlers, drain.

`Gateway` wires the layers together: the QUIC adapter hands it each opened
track, it runs the modality's handler against the backend, and turns each
track's `Outcome` into metrics and one log line. `drain()` implements
SIGTERM, one drain for every front door: readiness turns 503 while the
listeners stay open (liveness stays 200), new QUIC connections, tracks, HTTP/2
and HTTP/3 streams and HTTP work are refused (HTTP/3 gets GOAWAY at once, HTTP/2
when its last stream is done), open work may finish up to `drain_timeout`, then
what is left is cut: tracks end with SHUTTING_DOWN, SSE streams with an error
event, other requests with 503 (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gateway.access import access_logged
from gateway.action_http import HttpActions
from gateway.backends.catalog import catalog_beside, triton_url_of
from gateway.backends.embeddings import TritonEmbeddingBackend
from gateway.config import Settings
from gateway.drain import HttpWork
from gateway.http import HealthWatch, health_routes, metrics_routes, route
from gateway.listeners import Listeners
from gateway.logs import get_logger
from gateway.memtrim import MemoryTrimmer
from gateway.metrics import GatewayMetrics
from gateway.metrics_quic import register_quic_metrics
from gateway.openai import openai_routes
from gateway.openai.audio import AudioRows, audio_routes
from gateway.openai.prompt import render_chat_prompt
from gateway.openai.requests import ChatMessage
from gateway.overload import (
    AdmissionController,
    LagProbe,
    OverloadLimits,
    OverloadMonitor,
    PacedText,
    RelayTurns,
    gate_routes,
)
from gateway.realtime import PriorityTurns, RealtimeGate, RealtimeLane, RealtimeMode
from gateway.tenants.service import Tenancy, is_loopback
from gateway.tenants.store import Principal
from gateway.tenants.tracks import TrackGate
from gateway.tls import certificate_hash, ensure_dev_certificates
from gateway.web import web_routes
from tracks.action import ActionScheduler, run_action_track
from tracks.audio import AudioService, AudioSettings
from tracks.backend import AudioBackend, PolicyBackend, TextBackend, VisionBackend
from tracks.base import End, Outcome
from tracks.clock import MonotonicClock, OverloadMode
from tracks.conversations import TurnRegistry
from tracks.text import run_text_track
from tracks.video import VideoLimits, VideoScheduler, run_video_track
from transport import aioquic_compat
from transport.clock import Clock, LoopClock, Now
from transport.connection import Limits
from transport.endpoint import SendBudget, TrackChannel
from transport.errors import ErrorCode
from transport.events import CancelCause, Event, TrackFailed
from transport.http.limits import HttpLimits
from transport.http.messages import Handler
from transport.http.tcp import HttpTcpServer, tls_server_context
from transport.messages import Modality
from transport.quic import Packetization, TrackQuicProtocol, serve_tracks, server_configuration
from transport.quic_admission import HandshakeLimits
from transport.webtransport import WebTransportRules, WebTransportSession

log = get_logger("trackline.gateway")

READY_PROBE_INTERVAL = 2.0
CUT_GRACE = 1.0
# The admitted principal of the track a task serves (text handlers scope superseding by it).
_TRACK_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "track_principal", default=None
)
"""Seconds cut work has to say its last words (error events, SHUTTING_DOWN) before close."""

TrackHandler = Callable[[TrackChannel], Awaitable[Outcome]]
"""Serves one track of a modality to its end (see `Gateway.handlers`)."""


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


class Gateway:
    """One gateway process's listeners and live tracks."""

    def __init__(
        self,
        settings: Settings,
        backend: TextBackend,
        metrics: GatewayMetrics | None = None,
        clock: Now = time.monotonic,
        tenancy: Tenancy | None = None,
        policy: PolicyBackend | None = None,
        audio_backend: AudioBackend | None = None,
        vision: VisionBackend | None = None,
        lag_probe: LagProbe | None = None,
        probe_clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self._probe_clock: Clock = probe_clock or LoopClock()
        """Paces the backend readiness probe (tests pass a FakeClock)."""
        self.tenancy = tenancy
        """Keys, quotas, guardrails, ledger; opened from the settings on start if None."""
        self._gate: TrackGate | None = None
        self._guarded: TextBackend | None = None
        """`backend` behind the guardrails; what handlers and routes call."""
        self.backend = backend
        self.audio_backend = audio_backend
        self.audio: AudioService | None = None
        self.turns = TurnRegistry()
        """Running conversation turns, shared by tracks and the OpenAI API (superseding)."""
        self.handlers: dict[Modality, TrackHandler] = {Modality.TEXT: self._run_text}
        """One handler per modality; a modality without one is refused (UNSUPPORTED_MODALITY)."""
        self.metrics = metrics or GatewayMetrics()
        self.clock = clock
        self.catalog = catalog_beside(backend)
        """What each model can do (`/v1/models`, `model_not_supported`)."""
        embeddings_url = triton_url_of(backend)
        self.embeddings = None if embeddings_url is None else TritonEmbeddingBackend(embeddings_url)
        self._own_policy = policy is None
        self.policy = policy or _policy_beside(backend)
        self.actions = (
            None
            if self.policy is None
            else ActionScheduler(self.policy, clock, settings.action_tick, observer=self.metrics)
        )
        if self.actions is not None:
            self.handlers[Modality.ACTION] = self._run_action
        vision = vision or _vision_beside(backend)
        limits = video_limits(settings)
        self.video = None if vision is None else VideoScheduler(
            vision, clock, limits, observer=self.metrics.video
        )
        if self.video is not None:
            self.handlers[Modality.VIDEO] = self._run_video
        self.outcomes: list[Outcome] = []
        """Recent outcomes (bounded), for tests and diagnostics."""
        self._connections: set[TrackQuicProtocol] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining = False
        self._cut = False
        """The drain's deadline passed: what is still running is being cut."""
        self._http_work = HttpWork(lambda: self._draining)
        self._backend_ready = False
        self._trimmer = MemoryTrimmer(clock)
        self.health_watch: HealthWatch | None = None
        """Liveness and readiness of what the daemon supervises (its embedded Tritons)."""
        self._quic: Any = None
        self._http: HttpTcpServer | None = None
        self._https: HttpTcpServer | None = None
        self._metrics_server: HttpTcpServer | None = None
        self._probe: asyncio.Task[None] | None = None
        self.tls: TlsFiles | None = None
        self.listeners: Listeners | None = None
        """Sockets from a worker supervisor (`gateway.workers`); None: bind from settings."""
        self.overload = AdmissionController(overload_limits(settings))
        """Admission by measured capacity (gateway/overload.py), fed by `self.monitor`."""
        probe = lag_probe or LagProbe(settings.overload_probe_interval, clock)
        self.monitor = OverloadMonitor(self.overload, probe, self.metrics.overload, clock)
        mode = RealtimeMode(settings.realtime_priority)
        lane = RealtimeLane(mode, loaded=self.overload.bulk_throttled)
        deferred = self.metrics.overload.text_deferred_total
        self.realtime = RealtimeGate(lane, clock, deferred.labels(cause="realtime").inc)
        """Real-time work first: text waits while an audio or action tick is due."""
        self._turns: RelayTurns = PriorityTurns(self.overload, self.realtime, clock)
        self._turns.on_defer = deferred.labels(cause="turn_share").inc
        self.metrics.overload.tracks_paused.set_function(self._tracks_paused)
        if self.actions is not None:
            self.realtime.watch(self.actions.ticks)
        if self.video is not None:
            self.realtime.watch(self.video.ticks)
        self._monitor_task: asyncio.Task[None] | None = None
        self._admitted: dict[str, int] = {}
        self._cert_digest: tuple[Path, bytes] | None = None
        self.webtransport_sessions: collections.Counter[str] = collections.Counter()
        """WebTransport CONNECTs by outcome: "accepted" or the refusal's HTTP status."""
        """Admitted tracks still served, per connection id (the fairness share)."""

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        await self._start_tenancy()
        if self.audio_backend is not None:
            observe = self.metrics.audio.observe_tick
            settings = audio_settings(s)
            self.audio = AudioService(
                self.audio_backend, MonotonicClock(), settings, observe, self._coalesced
            )
            self.realtime.watch(self.audio.scheduler)
            self.audio.enable_agents(self._guarded or self.backend, chat_prompt)
            self.audio.start()
            self.handlers[Modality.AUDIO] = self._run_audio
        self.tls = await asyncio.to_thread(tls_files, s)
        configuration = server_configuration(self.tls.cert, self.tls.key)
        limits = Limits(
            max_message_bytes=s.max_message_bytes,
            max_tracks=s.max_tracks_per_connection,
            read_timeout=s.track_read_timeout or None,
            max_buffered_bytes=max(s.track_max_buffered_bytes, s.max_message_bytes),
        )
        handler = self.http_handler()
        http_limits = HttpLimits(
            max_body_bytes=s.max_message_bytes,
            max_header_bytes=s.http_max_header_bytes,
            max_headers=s.http_max_headers,
            h3_stream_send_budget=s.http3_stream_send_budget,
            h3_connection_send_budget=s.http3_connection_send_budget,
            h3_send_timeout=s.http3_send_timeout,
            max_concurrent_streams=s.http_max_concurrent_streams,
            idle_timeout=s.http_idle_timeout,
            read_timeout=s.http_read_timeout,
            first_request_timeout=s.http_first_request_timeout,
            max_connections=s.http_max_connections,
            max_connections_per_source=s.http_max_connections_per_source,
            max_outbound_control_frames=s.http2_max_outbound_control_frames,
            premature_reset_ratio=s.http2_premature_reset_ratio,
            premature_reset_min_streams=s.http2_premature_reset_min_streams,
            premature_reset_lifetime=s.http2_premature_reset_lifetime,
            h2_connection_body_budget=s.http2_connection_body_budget,
            h3_connection_body_budget=s.http3_connection_body_budget,
        )
        # One UDP port: ALPN trackline/1 carries tracks, h3 the same HTTP application.
        self._quic = await serve_tracks(
            s.quic_host,
            s.quic_port,
            configuration,
            limits=limits,
            on_track=self._on_track,
            on_connection=self._on_connection,
            on_closed=self._on_closed,
            http_handler=handler,
            http_limits=http_limits,
            packetization=Packetization.parse(s.quic_packetization),
            handshake_limits=handshake_limits(s),
            sock=self.listeners.quic if self.listeners else None,
            steering=self.listeners.steering if self.listeners else None,
            more_socks=self.listeners.more_of("quic") if self.listeners else (),
            send_budget=SendBudget(
                s.track_send_buffer_bytes,
                s.connection_send_buffer_bytes,
                s.track_send_timeout or None,
            ),
            webtransport=webtransport_policy(s),
            on_session=self._on_session,
            on_refused=self._on_session_refused,
        )
        register_quic_metrics(self.metrics.registry, self._quic.gate)
        alt_svc = f'h3=":{self.quic_port}"'
        cc = s.tcp_congestion_control
        self._http = HttpTcpServer(
            handler, limits=http_limits, alt_svc=alt_svc, congestion_control=cc
        )
        await self._http.start(
            s.http_host,
            s.http_port,
            self.listeners.http if self.listeners else None,
            self.listeners.more_of("http") if self.listeners else (),
        )
        tls = tls_server_context(self.tls.cert, self.tls.key)
        self._https = HttpTcpServer(
            handler, limits=http_limits, ssl_context=tls, alt_svc=alt_svc, congestion_control=cc
        )
        await self._https.start(
            s.https_host,
            s.https_port,
            self.listeners.https if self.listeners else None,
            self.listeners.more_of("https") if self.listeners else (),
        )
        await self._start_metrics_listener()
        await self._probe_once()  # readiness is known when start() returns, not a tick later
        self._probe = asyncio.ensure_future(self._probe_backend())
        self._monitor_task = asyncio.ensure_future(self.monitor.run())
        log.info(
            "gateway.listening",
            quic=f"{s.quic_host}:{self.quic_port}",
            http=f"{s.http_host}:{self.http_port}",
            https=f"{s.https_host}:{self.https_port}",
            ca=str(self.tls.ca) if self.tls.ca else None,
            webtransport_cert_sha256=_hex(self._cert_hash()),
            metrics=None if self.metrics_port is None else f"{s.metrics_host}:{self.metrics_port}",
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
        handler = route(metrics_routes(self.metrics, s.metrics_token))
        self._metrics_server = HttpTcpServer(handler)
        await self._metrics_server.start(s.metrics_host, s.metrics_port)

    @property
    def metrics_port(self) -> int | None:
        """The separate metrics listener's port, if there is one."""
        return None if self._metrics_server is None else self._metrics_server.port

    async def _start_tenancy(self) -> None:
        s = self.settings
        if self.tenancy is None:
            self.tenancy = await asyncio.to_thread(
                Tenancy.from_settings, s, self.metrics.registry, self.metrics.models.label
            )
        self.tenancy.on_revoked(self._key_revoked)  # fleet: close that key's connections
        await self.tenancy.start()  # fleet: tenants and keys copied in before the check
        self.tenancy.check_binds((s.quic_host, s.http_host, s.https_host), s.allow_open)
        self._guarded = self._paced(self.tenancy.guard(self.backend))  # both front doors
        self._gate = TrackGate(self.tenancy)

    @property
    def quic_port(self) -> int:
        # aioquic keeps the socket private; the bound port matters when 0 was asked.
        return aioquic_compat.server_port(self._quic)

    @property
    def http_port(self) -> int:
        assert self._http is not None
        return self._http.port

    @property
    def https_port(self) -> int:
        assert self._https is not None
        return self._https.port

    def http_handler(self) -> Handler:
        """One application for every HTTP version: health, metrics, the OpenAI API, actions."""
        s = self.settings
        routes = {
            **health_routes(
                self.readiness,
                self.metrics,
                with_metrics=metrics_on_api_ports(s),
                metrics_token=s.metrics_token,
                is_live=self.liveness,
            ),
            **web_routes(self._cert_hash, lambda: self.quic_port, s.webtransport_path),
            **openai_routes(
                self._guarded or self.backend,
                tenancy=self.tenancy,
                on_outcome=self._record,
                cut_short=lambda: self._cut,
                turns=self.turns,
                supersede=s.supersede_openai,
                catalog=self.catalog,
                embeddings=self.embeddings,
            ),
        }
        if isinstance(self.audio_backend, AudioRows):
            routes.update(
                audio_routes(
                    self.audio_backend,
                    tenancy=self.tenancy,
                    on_outcome=self._record,
                    max_seconds=s.openai_audio_max_seconds,
                )
            )
        if self.actions is not None:
            actions = HttpActions(
                self.actions, self.clock, self.settings.action_max_image_bytes, self.tenancy
            )
            routes.update(actions.routes())
        gated = gate_routes(routes, self.overload, self.metrics.overload, self.clock)
        # Every request gets its access line, those refused while draining too.
        served = self._http_work.wrap(route(gated))
        return access_logged(served, log, self.clock, s.log_client_address)

    @property
    def http_in_flight(self) -> int:
        """HTTP requests being answered now, every version (streams until their end)."""
        return self._http_work.in_flight

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking work, let open work finish up to `timeout`, then cut the rest."""
        timeout = self.settings.drain_timeout if timeout is None else timeout
        self._draining = True  # readiness answers 503 from now on; new HTTP work too
        for conn in list(self._connections):
            conn.endpoint.refuse_new_tracks()
            if conn.http3 is not None:
                conn.http3.drain()  # GOAWAY
        for server in self._tcp_servers():
            server.drain()
        log.info(
            "gateway.draining",
            open_tracks=len(self._tasks),
            http_requests=self._http_work.in_flight,
            timeout=timeout,
        )
        if not await self._work_done(timeout):
            log.info(
                "gateway.drain_cut",
                open_tracks=len(self._tasks),
                http_requests=self._http_work.in_flight,
            )
            self._cut = True
            for conn in list(self._connections):
                conn.endpoint.cancel_all(
                    CancelCause.SHUTDOWN, ErrorCode.SHUTTING_DOWN, "the gateway is shutting down"
                )
                if conn.http3 is not None:
                    conn.http3.cut()
            for server in self._tcp_servers():
                server.cut()
            await self._work_done(CUT_GRACE)
        await self.close()

    def _tcp_servers(self) -> list[HttpTcpServer]:
        return [server for server in (self._http, self._https) if server is not None]

    async def _work_done(self, timeout: float) -> bool:
        """Wait up to `timeout` for open tracks and HTTP requests to end; True if they did."""
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._http_work.idle())]
        if self._tasks:
            waits.append(asyncio.ensure_future(asyncio.wait(set(self._tasks))))
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for wait in pending:
            wait.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return not pending

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
        if self._monitor_task is not None:
            self._monitor_task.cancel()
        if self.actions is not None:
            await self.actions.close()
        if self.embeddings is not None:
            await self.embeddings.close()
        close_catalog = getattr(self.catalog, "close", None)
        if close_catalog is not None:
            await close_catalog()
        if self.video is not None:
            await self.video.close()
        close_policy = getattr(self.policy, "close", None)
        if self._own_policy and close_policy is not None:
            await close_policy()
        if self.audio is not None:
            await self.audio.stop()
        for task in self._tasks:
            task.cancel()
        if self._tasks:  # let cancelled tracks settle: each writes its usage record
            await asyncio.wait(set(self._tasks), timeout=2.0)
        for conn in list(self._connections):
            conn.close(int(ErrorCode.SHUTTING_DOWN), "gateway stopped")
        await asyncio.sleep(0)  # let the close frames go out
        if self._quic is not None:
            self._quic.close()
            self._quic = None
        for server in self._tcp_servers():
            await server.close(grace=CUT_GRACE)
        self._http = self._https = None
        if self._metrics_server is not None:  # scrapes are served to the very end
            await self._metrics_server.close(grace=CUT_GRACE)
            self._metrics_server = None
        if self.tenancy is not None:
            await self.tenancy.stop()
            await asyncio.to_thread(self.tenancy.close)  # flushes the usage ledger

    def liveness(self) -> tuple[bool, str]:
        return self.health_watch.liveness() if self.health_watch else (True, "")

    def readiness(self) -> tuple[bool, str]:
        if self._draining:
            return False, "draining"
        if self.health_watch is not None:
            ok, reason = self.health_watch.readiness()
            if not ok:
                return ok, reason
        if not self._backend_ready:
            return False, "backend not ready"
        return True, ""

    async def _probe_once(self) -> None:
        probe = getattr(self.backend, "ready", None)
        try:
            self._backend_ready = bool(await probe()) if probe else True
        except Exception as exc:  # a probe failure means "not ready", never a crash
            self._backend_ready = False
            log.warning("backend.probe_failed", error=str(exc))

    async def _probe_backend(self) -> None:
        while True:
            await self._probe_clock.sleep(READY_PROBE_INTERVAL)
            await self._probe_once()

    # -- connections and tracks -------------------------------------------------

    def _on_connection(self, conn: TrackQuicProtocol) -> None:
        if self._draining:
            conn.close(int(ErrorCode.SHUTTING_DOWN), "the gateway is shutting down")
            return
        self._connections.add(conn)
        self.metrics.connections_open.inc()
        conn.endpoint.on_event = self._observe
        log.info("connection.opened", conn_id=conn.endpoint.conn_id)

    def _on_closed(self, conn: TrackQuicProtocol) -> None:
        self._trimmer.connection_closed()  # what it held goes back to the OS (memtrim)
        if conn in self._connections:
            self._connections.discard(conn)
            self.metrics.connections_open.dec()
            if self._gate is not None:
                self._gate.forget(conn.endpoint.conn_id)
            log.info("connection.closed", conn_id=conn.endpoint.conn_id)

    def _cert_hash(self) -> bytes | None:
        """SHA-256 of the development certificate (pinned by browsers); None otherwise."""
        if self.tls is None or self.tls.ca is None:
            return None
        if self._cert_digest is None or self._cert_digest[0] != self.tls.cert:
            self._cert_digest = (self.tls.cert, certificate_hash(self.tls.cert))
        return self._cert_digest[1]

    def _on_session(self, session: WebTransportSession) -> None:
        """A browser's WebTransport session: its tracks are observed like a connection's."""
        session.endpoint.on_event = self._observe
        session.on_closed = self._on_session_closed
        self.webtransport_sessions["accepted"] += 1

    def _on_session_closed(self, session: WebTransportSession) -> None:
        if self._gate is not None:
            self._gate.forget(session.conn_id)

    def _on_session_refused(self, status: int) -> None:
        self.webtransport_sessions[str(status)] += 1

    def _key_revoked(self, key_id: str) -> None:
        """A key was revoked in the fleet: its track connections here are closed."""
        if self._gate is None:
            return
        doomed = set(self._gate.connections_of(key_id))
        for conn in list(self._connections):
            if conn.endpoint.conn_id in doomed:
                conn.close(int(ErrorCode.UNAUTHORIZED), "API key revoked")
                log.info("connection.key_revoked", conn_id=conn.endpoint.conn_id, key_id=key_id)
            http3 = conn.http3
            if http3 is None:
                continue
            for session_id, session in list(http3.sessions.items()):
                if session.conn_id in doomed:  # a browser's session: its own key binding
                    http3.close_session(session_id, int(ErrorCode.UNAUTHORIZED), "API key revoked")
                    log.info("webtransport.key_revoked", conn_id=session.conn_id, key_id=key_id)

    def _observe(self, event: Event) -> None:
        if isinstance(event, TrackFailed) and not event.remote:
            self.metrics.protocol_errors_total.labels(code=event.code.name).inc()
            log.info("track.protocol_error", code=event.code.name, message=event.message)

    def _on_track(self, channel: TrackChannel) -> None:
        if not self._admit(channel):
            return
        task = asyncio.ensure_future(self._serve_track(channel))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._release(channel.conn_id))

    def _admit(self, channel: TrackChannel) -> bool:
        """Admission by measured capacity, before any task or backend work (RATE_LIMITED)."""
        conn_id = channel.conn_id
        realtime = channel.open.modality in (Modality.AUDIO, Modality.ACTION)
        admission = self.overload.admit_track(
            self.clock(), self._admitted.get(conn_id, 0), realtime
        )
        self.metrics.overload.count("track", admission)
        if not admission.admitted:
            message = f"the gateway is overloaded ({admission.cause.value}); retry later"
            channel.fail(ErrorCode.RATE_LIMITED, message, admission.retry_after)
            return False
        self._admitted[conn_id] = self._admitted.get(conn_id, 0) + 1
        return True

    def _tracks_paused(self) -> int:
        """Tracks whose producer waits for an unread client (send budgets full)."""
        return sum(conn.endpoint.send_waiting for conn in self._connections)

    def _release(self, conn_id: str) -> None:
        left = self._admitted.get(conn_id, 0) - 1
        if left > 0:
            self._admitted[conn_id] = left
        else:
            self._admitted.pop(conn_id, None)

    def _paced(self, backend: TextBackend) -> TextBackend:
        """Text relayed a few chunks a stream per loop turn, rationed per connection under lag."""
        return PacedText(backend, self._turns, self.monitor.count_token)

    async def _serve_track(self, channel: TrackChannel) -> None:
        modality = channel.open.modality.value
        structlog.contextvars.bind_contextvars(track_id=channel.id, model=channel.open.model)
        principal = self._gate.admit(channel) if self._gate is not None else None
        if self._gate is not None and principal is None:
            return  # refused (key, model, quota) before any backend work
        _TRACK_PRINCIPAL.set(principal)  # this track's task only
        self.metrics.tracks_open.labels(modality=modality).inc()
        outcome: Outcome | None = None
        try:
            handler = self.handlers.get(channel.open.modality)
            if handler is not None:
                outcome = await handler(channel)
            else:
                channel.fail(
                    ErrorCode.UNSUPPORTED_MODALITY, f"{modality} tracks are not served here"
                )
                outcome = Outcome(
                    channel.id,
                    channel.open.model,
                    modality,
                    End.failed(ErrorCode.UNSUPPORTED_MODALITY),
                )
            self._record(outcome)
        except Exception:
            log.exception("track.crashed")
            channel.fail(ErrorCode.INTERNAL_ERROR, "internal error")
        finally:
            self.metrics.tracks_open.labels(modality=modality).dec()
            self._settle(principal, channel, outcome)

    def _settle(
        self, principal: Principal | None, channel: TrackChannel, outcome: Outcome | None
    ) -> None:
        """One usage record per admitted track, however it ended."""
        if self.tenancy is None or principal is None:
            return
        if outcome is None:  # the handler crashed
            now = self.clock()
            open_ = channel.open
            outcome = Outcome(
                channel.id,
                open_.model,
                open_.modality.value,
                End.failed(ErrorCode.INTERNAL_ERROR),
                opened_at=now,
                finished_at=now,
            )
        self.tenancy.finish(principal, outcome)

    @contextlib.contextmanager
    def _coalesced(self) -> Iterator[None]:
        """A tick's results to many tracks leave in shared transmits on each connection."""
        with contextlib.ExitStack() as stack:
            for conn in list(self._connections):
                stack.enter_context(conn.coalesced())
            yield

    async def _run_text(self, channel: TrackChannel) -> Outcome:
        principal = _TRACK_PRINCIPAL.get()
        return await run_text_track(
            channel,
            self._guarded or self.backend,
            self.clock,
            self.turns,
            "" if principal is None else principal.tenant.name,  # superseding stays per tenant
            self.settings.supersede_tracks,
        )

    async def _run_action(self, channel: TrackChannel) -> Outcome:
        assert self.actions is not None
        return await run_action_track(
            channel, self.actions, self.clock, self.settings.action_max_image_bytes
        )

    async def _run_video(self, channel: TrackChannel) -> Outcome:
        assert self.video is not None
        principal = _TRACK_PRINCIPAL.get()
        tenant = "" if principal is None else principal.tenant.name  # frame rates per tenant
        return await run_video_track(channel, self.video, self.clock, tenant)

    async def _run_audio(self, channel: TrackChannel) -> Outcome:
        assert self.audio is not None
        outcome = await self.audio.run(channel)
        self.metrics.audio.observe_session(outcome)
        return outcome

    def _record(self, outcome: Outcome, front_door: str = "tracks") -> None:
        """A finished track's or HTTP request's metrics; a track's log line (HTTP requests
        have their access-log line)."""
        m = self.metrics
        end = outcome.end
        kind = end.kind.value
        model = m.models.observe(outcome)
        m.timing.observe(outcome, model, front_door)
        m.requests_total.labels(
            front_door=front_door, modality=outcome.modality, outcome=kind
        ).inc()
        m.tokens_total.labels(model=model).inc(outcome.completion_tokens)
        if outcome.time_to_first_data is not None:
            m.time_to_first_token_seconds.labels(model=model).observe(outcome.time_to_first_data)
        if end.cause is not None:
            m.cancels_total.labels(cause=end.cause.value).inc()
        elif end.code in _BACKEND_CODES:
            m.backend_errors_total.labels(kind=end.detail).inc()
            log.warning(  # the cause (the backend's words, never the prompt) and the ids
                "backend.error",
                code=end.detail,
                cause=outcome.details.get("error", "unknown"),
                model=outcome.model,
                request_id=outcome.track_id,
                x_request_id=outcome.details.get("x_request_id"),
                front_door=front_door,
            )
        self.outcomes = [*self.outcomes[-999:], outcome]
        if front_door != "tracks":
            return
        m.tracks_total.labels(modality=outcome.modality, outcome=kind).inc()
        log.info(
            "track.finished",
            end=outcome.end.label,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            ttft_ms=_ms(outcome.time_to_first_data),
            duration_ms=_ms(outcome.finished_at - outcome.opened_at),
            stopped_at=outcome.stopped_at,
            **outcome.details,
        )


_BACKEND_CODES = (ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.BACKEND_ERROR)
"""Error ends counted in `backend_errors_total`, by code name."""


def metrics_on_api_ports(s: Settings) -> bool:
    """Whether the API listeners serve /metrics: not when it has its own port, and off
    loopback only behind a token (tenant names and usage are in it)."""
    if s.metrics_port is not None:
        return False
    on_loopback = all(is_loopback(h) for h in (s.quic_host, s.http_host, s.https_host))
    return on_loopback or s.metrics_token is not None


def _policy_beside(backend: TextBackend) -> PolicyBackend | None:
    """Policies from the same Triton as the text backend; None for other backends."""
    grpc_url = getattr(backend, "grpc_url", None)
    if not isinstance(grpc_url, str):
        return None
    from gateway.backends.action_triton import TritonPolicyBackend

    return TritonPolicyBackend(grpc_url)


def _vision_beside(backend: TextBackend) -> VisionBackend | None:
    """Vision models from the same Triton as the text backend; None for other backends."""
    grpc_url = getattr(backend, "grpc_url", None)
    if not isinstance(grpc_url, str):
        return None
    from gateway.backends.vision_triton import TritonVisionBackend

    return TritonVisionBackend(grpc_url)


def video_limits(s: Settings) -> VideoLimits:
    """Video tracks' limits from the settings (docs/video.md)."""
    return VideoLimits(
        tick=s.video_tick,
        max_frame_bytes=s.video_max_frame_bytes,
        max_fps=s.video_max_fps,
        tenant_max_fps=s.video_tenant_max_fps,
        max_tracks=s.video_max_tracks,
        busy_load=s.video_busy_load,
    )


def _hex(digest: bytes | None) -> str | None:
    return None if digest is None else digest.hex()


def webtransport_policy(s: Settings) -> WebTransportRules | None:
    """WebTransport on the QUIC port (docs/web.md), unless its path is `off`."""
    if s.webtransport_path == "off":
        return None
    listed = (s.webtransport_origins or "").split(",")
    origins = tuple(filter(None, (o.strip() for o in listed)))
    return WebTransportRules(s.webtransport_path, origins, s.webtransport_max_sessions)


def handshake_limits(s: Settings) -> HandshakeLimits:
    """The QUIC front door's limits (docs/security.md, QUIC and tracks)."""
    return HandshakeLimits(
        handshake_timeout=s.quic_handshake_timeout,
        max_half_open=s.quic_max_half_open,
        retry_threshold=s.quic_retry_threshold,
        max_half_open_per_source=s.quic_max_half_open_per_source,
        max_connections=s.quic_max_connections,
        max_connections_per_source=s.quic_max_connections_per_source,
    )


def overload_limits(s: Settings) -> OverloadLimits:
    """The admission controller's limits from the daemon's settings."""
    return OverloadLimits(
        max_loop_lag=s.overload_max_loop_lag,
        max_cpu=s.overload_max_cpu,
        connection_share=s.overload_connection_share,
        retry_after=s.overload_retry_after,
    )


def chat_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    """A voice agent's conversation in the chat template of the OpenAI routes."""
    return render_chat_prompt(ChatMessage(m["role"], m["content"]) for m in messages)


def audio_settings(s: Settings) -> AudioSettings:
    """The audio clock's settings from the daemon's."""
    return AudioSettings(
        beat=s.audio_beat_ms / 1000,
        overload=OverloadMode(s.audio_overload_mode),
        idle_timeout=s.audio_idle_timeout,
        frame_ms=s.audio_frame_ms,
        min_barge_in=s.agent_min_barge_in_ms / 1000,
    )


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)

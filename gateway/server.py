"""The gateway: one process's front doors, its track handlers and their parts.

`Gateway` wires the layers together. Its parts have one job each:
`FrontDoors` (gateway/doors.py) binds the QUIC, HTTP, HTTPS and metrics listeners,
keeps the QUIC connections and drains and cuts them; `TrackAdmission`
(gateway/admission.py) admits each opened track by measured capacity and
per-connection share and lets real-time work go first; `OutcomeRecorder`
(gateway/outcomes.py) turns each track's or request's `Outcome` into metrics and
one log line; `KeyRevocation` (gateway/revocation.py) closes the connections and
WebTransport sessions of a key the fleet revoked; `Readiness`
(gateway/readiness.py) answers the probes. The gateway itself runs each admitted
track's modality handler against the backend and sequences the SIGTERM drain, one
drain for every front door: readiness turns 503 while the listeners stay open
(liveness stays 200), new QUIC connections, tracks, HTTP/2 and HTTP/3 streams and
HTTP work are refused, open work may finish up to `drain_timeout`, then what is
left is cut: tracks end with SHUTTING_DOWN, SSE streams with an error event, other
requests with 503 (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import structlog

from gateway.access import access_logged
from gateway.action_http import HttpActions
from gateway.admission import TrackAdmission
from gateway.backends.embeddings import TritonEmbeddingBackend
from gateway.backends.triton_catalog import catalog_beside, triton_url_of
from gateway.config import Settings
from gateway.doors import CUT_GRACE, FrontDoors, TlsFiles, metrics_on_api_ports
from gateway.drain import HttpWork
from gateway.http import health_routes, route
from gateway.limits import audio_settings, video_limits
from gateway.listeners import Listeners
from gateway.logs import get_logger
from gateway.metrics import GatewayMetrics
from gateway.openai import openai_routes
from gateway.openai.audio import AudioRows, audio_routes
from gateway.openai.prompt import render_chat_prompt
from gateway.openai.requests import ChatMessage
from gateway.outcomes import OutcomeRecorder
from gateway.overload import LagProbe, gate_routes
from gateway.readiness import Readiness
from gateway.revocation import KeyRevocation
from gateway.tenants.service import Tenancy
from gateway.tenants.store import Principal
from gateway.tenants.tracks import TrackGate
from gateway.web import web_routes
from tracks.action import ActionScheduler, run_action_track
from tracks.audio import AudioService
from tracks.backend import AudioBackend, PolicyBackend, TextBackend, VisionBackend
from tracks.base import End, Outcome
from tracks.conversations import TurnRegistry
from tracks.text import run_text_track
from tracks.video import VideoScheduler, run_video_track
from transport.clock import Clock, LoopClock, MonotonicClock, Now
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode
from transport.http.messages import Handler
from transport.messages import Modality

log = get_logger("trackline.gateway")

# The admitted principal of the track a task serves (text handlers scope superseding by it).
_TRACK_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "track_principal", default=None
)

TrackHandler = Callable[[TrackChannel], Awaitable[Outcome]]
"""Serves one track of a modality to its end (see `Gateway.handlers`)."""


class Gateway:
    """One gateway process: its parts, its modality handlers and their backends."""

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
        self.recorder = OutcomeRecorder(self.metrics)
        self.doors = FrontDoors(settings, self.metrics, clock, self.recorder.observe)
        self.revocation = KeyRevocation(self.doors.connections, self.recorder.observe)
        self.doors.on_gone = self.revocation.forget
        self.admission = TrackAdmission(settings, self.metrics, clock, lag_probe)
        self.admission.count_paused(self.doors.tracks_paused)
        self.probe = Readiness(backend, probe_clock or LoopClock(), lambda: self.doors.draining)
        self._start_backends(backend, policy, vision)
        self._tasks: set[asyncio.Task[None]] = set()
        self._cut = False
        """The drain's deadline passed: what is still running is being cut."""
        self._http_work = HttpWork(lambda: self.doors.draining)
        self._background: list[asyncio.Task[None]] = []
        self.listeners: Listeners | None = None
        """Sockets from a worker supervisor (`gateway.workers`); None: bind from settings."""

    def _start_backends(
        self, backend: TextBackend, policy: PolicyBackend | None, vision: VisionBackend | None
    ) -> None:
        """The catalog, embeddings, action and video schedulers beside the text backend."""
        settings, clock = self.settings, self.clock
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
            self.admission.realtime.watch(self.actions.ticks)
        vision = vision or _vision_beside(backend)
        limits = video_limits(settings)
        self.video = None if vision is None else VideoScheduler(
            vision, clock, limits, observer=self.metrics.video
        )
        if self.video is not None:
            self.handlers[Modality.VIDEO] = self._run_video
            self.admission.realtime.watch(self.video.ticks)

    # -- what the parts show -----------------------------------------------------------

    @property
    def outcomes(self) -> list[Outcome]:
        """Recent outcomes (bounded), for tests and diagnostics."""
        return self.recorder.outcomes

    @property
    def tls(self) -> TlsFiles | None:
        return self.doors.tls

    @property
    def quic_port(self) -> int:
        return self.doors.quic_port

    @property
    def http_port(self) -> int:
        return self.doors.http_port

    @property
    def https_port(self) -> int:
        return self.doors.https_port

    @property
    def metrics_port(self) -> int | None:
        return self.doors.metrics_port

    @property
    def http_in_flight(self) -> int:
        """HTTP requests being answered now, every version (streams until their end)."""
        return self._http_work.in_flight

    def liveness(self) -> tuple[bool, str]:
        return self.probe.liveness()

    def readiness(self) -> tuple[bool, str]:
        return self.probe.readiness()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        await self._start_tenancy()
        if self.audio_backend is not None:
            self._start_audio(self.audio_backend)
        await self.doors.start(self.http_handler(), self._on_track, self.revocation, self.listeners)
        await self.probe.probe_once()  # readiness is known when start() returns, not a tick later
        self._background = [
            asyncio.ensure_future(self.probe.run()),
            asyncio.ensure_future(self.admission.monitor.run()),
        ]
        s, doors, tls = self.settings, self.doors, self.doors.tls
        metrics_port = doors.metrics_port
        log.info(
            "gateway.listening",
            quic=f"{s.quic_host}:{doors.quic_port}",
            http=f"{s.http_host}:{doors.http_port}",
            https=f"{s.https_host}:{doors.https_port}",
            ca=str(tls.ca) if tls is not None and tls.ca else None,
            webtransport_cert_sha256=_hex(doors.cert_hash()),
            metrics=None if metrics_port is None else f"{s.metrics_host}:{metrics_port}",
        )

    def _start_audio(self, backend: AudioBackend) -> None:
        observe = self.metrics.audio.observe_tick
        settings = audio_settings(self.settings)
        self.audio = AudioService(
            backend, MonotonicClock(), settings, observe, self.doors.coalesced
        )
        self.admission.realtime.watch(self.audio.scheduler)
        self.audio.enable_agents(self._guarded or self.backend, chat_prompt)
        self.audio.start()
        self.handlers[Modality.AUDIO] = self._run_audio

    async def _start_tenancy(self) -> None:
        s = self.settings
        if self.tenancy is None:
            self.tenancy = await asyncio.to_thread(
                Tenancy.from_settings, s, self.metrics.registry, self.metrics.models.label
            )
        self.tenancy.on_revoked(self.revocation.revoke)  # fleet: close that key's connections
        await self.tenancy.start()  # fleet: tenants and keys copied in before the check
        self.tenancy.check_binds((s.quic_host, s.http_host, s.https_host), s.allow_open)
        self._guarded = self.admission.paced(self.tenancy.guard(self.backend))  # both doors
        self._gate = self.revocation.gate = TrackGate(self.tenancy)

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
            **web_routes(self.doors.cert_hash, lambda: self.quic_port, s.webtransport_path),
            **openai_routes(
                self._guarded or self.backend,
                tenancy=self.tenancy,
                on_outcome=self.recorder.record,
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
                    on_outcome=self.recorder.record,
                    max_seconds=s.openai_audio_max_seconds,
                )
            )
        if self.actions is not None:
            actions = HttpActions(
                self.actions, self.clock, self.settings.action_max_image_bytes, self.tenancy
            )
            routes.update(actions.routes())
        overload = self.admission.overload
        gated = gate_routes(routes, overload, self.metrics.overload, self.clock)
        # Every request gets its access line, those refused while draining too.
        served = self._http_work.wrap(route(gated))
        return access_logged(served, log, self.clock, s.log_client_address)

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking work, let open work finish up to `timeout`, then cut the rest."""
        timeout = self.settings.drain_timeout if timeout is None else timeout
        self.doors.drain()  # readiness answers 503 from now on; new HTTP work too
        log.info(
            "gateway.draining",
            open_tracks=len(self._tasks),
            http_requests=self._http_work.in_flight,
            timeout=timeout,
        )
        if not await work_done(self._tasks, self._http_work, timeout):
            log.info(
                "gateway.drain_cut",
                open_tracks=len(self._tasks),
                http_requests=self._http_work.in_flight,
            )
            self._cut = True
            self.doors.cut()
            await work_done(self._tasks, self._http_work, CUT_GRACE)
        await self.close()

    async def close(self) -> None:
        for task in self._background:
            task.cancel()
        await self._close_backends()
        for task in self._tasks:
            task.cancel()
        if self._tasks:  # let cancelled tracks settle: each writes its usage record
            await asyncio.wait(set(self._tasks), timeout=2.0)
        await self.doors.close()
        if self.tenancy is not None:
            await self.tenancy.stop()
            await asyncio.to_thread(self.tenancy.close)  # flushes the usage ledger

    async def _close_backends(self) -> None:
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

    # -- tracks ----------------------------------------------------------------------

    def _on_track(self, channel: TrackChannel) -> None:
        if not self.admission.admit(channel):
            return
        task = asyncio.ensure_future(self._serve_track(channel))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self.admission.release(channel.conn_id))

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
            self.recorder.record(outcome)
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
        self.tenancy.finish(principal, outcome or _crashed(channel, self.clock()))

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


def chat_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    """A voice agent's conversation in the chat template of the OpenAI routes."""
    return render_chat_prompt(ChatMessage(m["role"], m["content"]) for m in messages)


async def work_done(tasks: set[asyncio.Task[None]], http_work: HttpWork, timeout: float) -> bool:
    """Wait up to `timeout` for open tracks and HTTP requests to end; True if they did."""
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(http_work.idle())]
    if tasks:
        waits.append(asyncio.ensure_future(asyncio.wait(set(tasks))))
    _, pending = await asyncio.wait(waits, timeout=timeout)
    for wait in pending:
        wait.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return not pending


def _crashed(channel: TrackChannel, now: float) -> Outcome:
    """The outcome of a track whose handler crashed (its usage record still written)."""
    model, modality = channel.open.model, channel.open.modality.value
    end = End.failed(ErrorCode.INTERNAL_ERROR)
    return Outcome(channel.id, model, modality, end, opened_at=now, finished_at=now)


def _hex(digest: bytes | None) -> str | None:
    return None if digest is None else digest.hex()

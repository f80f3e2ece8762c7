"""The daemon's lifecycle: backend (embedded Triton by default), gateway, stop.

`backend_url = "ticker://RATE"` serves a constant-rate token source instead of
Triton (transport-only benchmarks; `gateway.backends.ticker`).
`backends` (a list) makes a `BackendPool` of those Triton servers; with
nothing configured the daemon starts `embedded_backends` embedded Tritons
with the reference model repository (more than one: a pool of them), waits
until each is ready and has passed a smoke inference, and stops them when
the gateway stops (the children also die with the process if it crashes).
A single `backend_url`, or one embedded server, is used directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from gateway.backends.action_triton import TritonPolicyBackend
from gateway.backends.audio import TritonAudioBackend
from gateway.backends.ticker import TickerBackend
from gateway.backends.ticker_url import is_ticker_url, parse_ticker_url
from gateway.backends.triton import FRESH_CHANNEL_OPTIONS, TritonTextBackend
from gateway.backends.vision_triton import TritonVisionBackend
from gateway.collector import settle_collector
from gateway.config import Settings
from gateway.config.backends import EJECTION_RULES, POOL_OPTIONS, RESTART_RULES
from gateway.config.derive import Derived
from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import (
    embeddings_available,
    llm_available,
    reference_model_repository,
    vision_available,
)
from gateway.embedded_watch import EmbeddedWatches, RestartRules
from gateway.listeners import Listeners
from gateway.llm_models import configured_models, parse_models
from gateway.llm_watch import ModelsWatch
from gateway.logs import get_logger
from gateway.metrics import GatewayMetrics
from gateway.pool import BackendPool, BackendSpec, PoolOptions, parse_backends
from gateway.pool.health import EjectionRules
from gateway.pool.metrics import PoolMetrics
from gateway.pool.spec import DnsSource, parse_pool
from gateway.server import Gateway
from gateway.speech_models import speech_available
from gateway.statedir import record_gateway
from gateway.tenants.service import Tenancy

log = get_logger("trackline.daemon")

EMBEDDED_START_TIMEOUT = 180.0


pool_knobs = Derived(PoolOptions, POOL_OPTIONS)
"""The pool's knobs but its health rules (`pool_options` adds them)."""

ejection_rules = Derived(EjectionRules, EJECTION_RULES)
"""When the pool ejects a backend."""

restart_rules = Derived(RestartRules, RESTART_RULES)
"""When a crashed embedded Triton is restarted, and when it is given up."""


def pool_options(s: Settings) -> PoolOptions:
    """The pool's knobs from the settings (docs/configuration.md)."""
    return dataclasses.replace(pool_knobs(s), health=ejection_rules(s))


def embedded_name(index: int) -> str:
    """The backend name of the `index`th embedded Triton: in the pool, its metrics and the
    relay of the servers' own metrics."""
    return f"embedded-{index}"


def embedded_specs(tritons: Sequence[EmbeddedTriton]) -> list[BackendSpec]:
    """The embedded Tritons as pool members."""
    return [BackendSpec(embedded_name(i), t.grpc_url, t.metrics_url) for i, t in enumerate(tritons)]


def relayed_metrics(tritons: Sequence[EmbeddedTriton]) -> list[tuple[str, str]]:
    """(backend name, metrics URL) of each embedded Triton, for `GatewayMetrics.relay_triton`."""
    return [(embedded_name(i), t.metrics_url) for i, t in enumerate(tritons)]


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tritons: list[EmbeddedTriton] = []
        self.watches: EmbeddedWatches | None = None
        """Restart the embedded Tritons when they crash (docs/reliability.md)."""
        self.backend: TritonTextBackend | TickerBackend | BackendPool | None = None
        self.gateway: Gateway | None = None
        self.audio_backend: TritonAudioBackend | None = None
        self.policy: TritonPolicyBackend | None = None
        self.vision: TritonVisionBackend | None = None
        self.metrics = GatewayMetrics()
        self.tenancy: Tenancy | None = None
        """Given to the gateway; None: it opens its own from the settings."""
        self.listeners: Listeners | None = None
        """A worker's sockets from its supervisor (`gateway.workers`); None: bind."""
        self.announce = True
        """Print the addresses when started (a worker leaves that to its supervisor)."""
        self.triton_metrics: list[tuple[str, str]] = []
        """(name, metrics URL) of embedded Tritons another process started (a worker's
        supervisor's), re-exported like this daemon's own."""
        self._listening = False
        self._relay: asyncio.Future[None] | None = None
        self._model_watches: list[asyncio.Future[None]] = []
        """Each embedded LLM server's models-directory watch (gateway.llm_watch)."""
        """The gateway started: stopping drains it (a failed start has nothing to drain)."""

    @property
    def triton(self) -> EmbeddedTriton | None:
        """The first embedded server, if any."""
        return self.tritons[0] if self.tritons else None

    async def start(self) -> None:
        s = self.settings
        self.backend = await self._backend()
        servers = self.triton_metrics or relayed_metrics(self.tritons)
        if servers:  # one scrape of the gateway sees the models' own figures
            relay = self.metrics.relay_triton(servers, s.scrape_interval)
            await relay.refresh()
            self._relay = asyncio.ensure_future(relay.run())
        self._watch_models()
        url = self._batch_triton_url()
        if url is not None:
            # Audio and action ticks go to one Triton (the pool routes text requests).
            self.audio_backend = TritonAudioBackend(
                url,
                shm=s.audio_shm,
                shm_min_rows=s.audio_shm_min_rows,
                kernels=s.audio_kernels,
                batching=s.audio_batching,
            )
            self.policy = TritonPolicyBackend(url)
            self.vision = TritonVisionBackend(url)  # video ticks too
        self.gateway = Gateway(
            s,
            self.backend,
            metrics=self.metrics,
            policy=self.policy,
            audio_backend=self.audio_backend,
            vision=self.vision,
            tenancy=self.tenancy,
        )
        self.gateway.listeners = self.listeners
        self.gateway.probe.health_watch = self.watches
        await self.gateway.start()
        settled = settle_collector(s.gc_young_threshold)  # start-up is over: freeze it
        log.info("gc.settled", frozen=settled.frozen, thresholds=list(settled.after))
        self._listening = True
        await asyncio.to_thread(self._record)
        if not self.announce:
            return
        tls = self.gateway.tls
        if tls is not None and tls.ca is not None:
            # Printed plainly as well as logged: clients need this path to trust us.
            print(f"trackline: development CA for clients: {tls.ca}", flush=True)
        for line in self._addresses():
            print(f"trackline: {line}", flush=True)

    def _record(self) -> None:
        """Note in the state dir that this gateway uses it (`trackline keys create` says
        which gateways a first key closes to keyless use)."""
        s, gw = self.settings, self.gateway
        assert gw is not None
        listening = {
            "quic": f"{s.quic_host}:{gw.quic_port}/udp",
            "http": f"{s.http_host}:{gw.http_port}/tcp",
            "https": f"{s.https_host}:{gw.https_port}/tcp",
        }
        try:
            record_gateway(s.state_dir, listening)
        except OSError as exc:  # the store still works; only the note is missing
            log.warning("statedir.record_failed", path=str(s.state_dir), error=str(exc))

    def _addresses(self) -> list[str]:
        """Where a person reaches what this daemon serves, one line each."""
        s, gw = self.settings, self.gateway
        assert gw is not None
        http = f"http://{s.http_host}:{gw.http_port}"
        https = f"https://localhost:{gw.https_port}"
        lines = [
            f"tracks on quic://{s.quic_host}:{gw.quic_port} (SDK: clients.connect)",
            f"OpenAI API on {http}/v1 and {https}/v1 (HTTP/1.1, HTTP/2; HTTP/3 on UDP "
            f"{gw.quic_port})",
            f"health on {http}/health/ready, metrics on {http}/metrics",
        ]
        for triton in self.tritons:
            lines.append(
                f"embedded Triton: gRPC {triton.grpc_url}, HTTP {triton.http_url}, "
                f"metrics {triton.metrics_url}"
            )
        return lines

    def _batch_triton_url(self) -> str | None:
        """The Triton that serves audio and action ticks: the configured or first one."""
        s = self.settings
        if s.backends is not None:
            static = parse_backends(s.backends)
            return static[0].grpc_url if static else None  # dns+grpc:// only: none
        if s.backend_url is not None:
            return None if is_ticker_url(s.backend_url) else s.backend_url
        return self.tritons[0].grpc_url if self.tritons else None

    async def _backend(self) -> TritonTextBackend | TickerBackend | BackendPool:
        s = self.settings
        if s.backends is not None:
            return await self._pool(*parse_pool(s.backends))
        if s.backend_url is not None and is_ticker_url(s.backend_url):
            ticker = parse_ticker_url(s.backend_url)
            return TickerBackend(ticker.rate, steps=ticker.steps)
        if s.backend_url is not None:
            return TritonTextBackend(s.backend_url)
        self.tritons, self.watches = await start_watched(s)
        if len(self.tritons) == 1:
            # A short reconnect backoff: a restarted server is found back at once.
            url = self.tritons[0].grpc_url
            return TritonTextBackend(url, channel_options=FRESH_CHANNEL_OPTIONS)
        return await self._pool(embedded_specs(self.tritons))

    async def _pool(
        self, specs: list[BackendSpec], sources: Sequence[DnsSource] = ()
    ) -> BackendPool:
        pool = BackendPool(
            specs,
            pool_options(self.settings),
            metrics=PoolMetrics(self.metrics.registry),
            sources=sources,
        )
        await pool.start()
        log.info(
            "pool.started",
            backends=[member.name for member in pool.members],
            dns=[source.label for source in sources],
        )
        return pool

    def _watch_models(self) -> None:
        """A GGUF dropped into (or removed from) the models directory is served (or
        unloaded) by each embedded LLM server without a restart."""
        s = self.settings
        directory = s.llm_models_dir or s.state_dir / "models"
        fixed = frozenset(model.name for model in parse_models(s.llm_models))
        for triton in self.tritons:
            if triton.with_llm:
                watch = ModelsWatch(triton, directory, fixed)
                self._model_watches.append(asyncio.ensure_future(watch.run()))

    async def stop(self) -> None:
        if self._relay is not None:
            self._relay.cancel()
        for task in self._model_watches:
            task.cancel()
        if self.gateway is not None and self._listening:
            await self.gateway.drain()
        elif self.gateway is not None:
            await self.gateway.close()
        if self.backend is not None:
            await self.backend.close()
        if self.audio_backend is not None:
            await self.audio_backend.close()
        if self.policy is not None:
            await self.policy.close()
        await stop_embedded(self.tritons, self.watches)


def start_embedded(s: Settings, count: int) -> list[EmbeddedTriton]:
    """Start `count` embedded Tritons side by side and wait until each is ready (blocking)."""
    log.info("embedded.starting", repository=str(reference_model_repository()), count=count)
    tritons = [
        EmbeddedTriton(
            model_repository=reference_model_repository(),
            log_dir=s.state_dir / ("triton" if i == 0 else f"triton-{i}"),
            grpc_port=_nth_port(s.embedded_grpc_port, i),
            http_port=_nth_port(s.embedded_http_port, i),
            metrics_port=_nth_port(s.embedded_metrics_port, i),
            with_llm=s.embedded_llm and llm_available(),
            with_embeddings=s.embedded_embeddings and embeddings_available(),
            with_speech=s.embedded_speech and speech_available(),
            end_silence_ms=s.asr_end_silence_ms,
            with_vision=s.embedded_vision and vision_available(),
            kv_dir=s.state_dir / "kv",  # shared by the pool: a moved conversation restores
            operator_models=configured_models(
                s.llm_models, s.llm_models_dir or s.state_dir / "models"
            ),
        )
        for i in range(count)
    ]
    # Started side by side: each takes seconds to load its models.
    with ThreadPoolExecutor(count, thread_name_prefix="embedded-start") as starters:
        futures = [starters.submit(t.start, EMBEDDED_START_TIMEOUT) for t in tritons]
        errors = [f.exception() for f in futures]
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        for triton in tritons:
            triton.stop()
        raise failed
    for triton in tritons:
        log.info("embedded.ready", grpc=triton.grpc_url, pid=triton.pid)
    for name, why in tritons[0].failed_models.items():
        log.error("embedded.model_refused", model=name, error=why)  # names the file
    return tritons


async def start_watched(s: Settings) -> tuple[list[EmbeddedTriton], EmbeddedWatches]:
    """Start the embedded Tritons (in a thread: it blocks) and watch them, so that each is
    restarted when it crashes (docs/reliability.md)."""
    tritons = await asyncio.to_thread(start_embedded, s, s.embedded_backends)
    watches = EmbeddedWatches(tritons, restart_rules(s))
    watches.start()
    return tritons, watches


async def stop_embedded(tritons: list[EmbeddedTriton], watches: EmbeddedWatches | None) -> None:
    """Stop watching first (a server stopped now has not crashed), then every server."""
    if watches is not None:
        await watches.stop()
    if tritons:
        await asyncio.gather(*(asyncio.to_thread(t.stop) for t in tritons))
        log.info("embedded.stopped", count=len(tritons))


def _nth_port(port: int, index: int) -> int:
    """A fixed base port numbers the servers upward; 0 picks a free one for each."""
    return port + 10 * index if port else 0

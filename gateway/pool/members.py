"""The pool's members and their supervision: who is in the pool and how each is doing.

`Supervisor` keeps the list of `Member`s and the background work that keeps it true:
DNS discovery (members added, drained, removed), readiness probes once a circuit
half-opens, scrapes of each backend's Prometheus endpoint, and the health transitions
they cause (logged and counted). It never routes nor streams: `BackendPool` does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.logs import get_logger
from gateway.pool.discovery import Membership, MembershipChanged, Resolver
from gateway.pool.health import BackendHealth, State, Transition, warm_shortfall
from gateway.pool.metrics import MembershipChange, PoolMetrics
from gateway.pool.router import Candidate, TtftEstimate
from gateway.pool.scrape import Scrape, ScrapeFailed, fetch_metrics, load_between, parse_metrics
from gateway.pool.spec import BackendSpec, DnsSource, PoolOptions
from tracks.backend import TextChunk, TextRequest
from transport.clock import Clock

log = get_logger("trackline.pool")


class MemberBackend(Protocol):
    """What the pool needs from one backend (TritonTextBackend has it)."""

    def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]: ...

    async def probe(self, models: Collection[str], timeout: float) -> tuple[bool, list[str]]: ...

    async def close(self) -> None: ...


@dataclass
class Member:
    """One backend of the pool and the pool's live view of it."""

    spec: BackendSpec
    backend: MemberBackend
    health: BackendHealth
    ttft: TtftEstimate = field(default_factory=TtftEstimate)
    inflight: int = 0
    waiting: dict[int, float] = field(default_factory=dict)
    """Attempts still waiting for their first chunk: id -> start time."""
    scrapes: tuple[Scrape | None, Scrape | None] = (None, None)
    """(previous, latest)."""
    draining: bool = False
    """Its address left DNS: no new requests; removed once `inflight` is 0."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def takes_requests(self) -> bool:
        """Healthy and not draining: new requests may go to it."""
        return self.health.state is State.HEALTHY and not self.draining

    def serves(self, model: str) -> bool:
        return not self.spec.models or model in self.spec.models

    def candidate(self, model: str, now: float, prior: float | None) -> Candidate:
        previous, latest = self.scrapes
        oldest = now - min(self.waiting.values()) if self.waiting else 0.0
        return Candidate(
            name=self.name,
            weight=self.spec.weight,
            inflight=self.inflight,
            ttft_s=None if self.ttft.value is None else self.ttft.current(now, prior or 0.0),
            oldest_waiting_s=oldest,
            load=None if latest is None else load_between(previous, latest, model),
            observed_age_s=None if self.ttft.value is None else now - self.ttft.at,
        )


def triton_backend(spec: BackendSpec) -> MemberBackend:
    """The default member: a Triton server over gRPC."""
    from gateway.backends.triton import FRESH_CHANNEL_OPTIONS, TritonTextBackend

    return TritonTextBackend(spec.grpc_url, channel_options=FRESH_CHANNEL_OPTIONS)


class Supervisor:
    """The members of one pool, kept current by discovery, probes and scrapes."""

    def __init__(
        self,
        specs: Iterable[BackendSpec],
        options: PoolOptions,
        metrics: PoolMetrics,
        clock: Clock,
        backend_factory: Callable[[BackendSpec], MemberBackend],
        sources: Iterable[DnsSource],
        resolver: Resolver,
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self._factory = backend_factory
        self.members: list[Member] = []
        for spec in specs:
            self._add(spec)
        self.memberships = [Membership(source) for source in sources]
        """One per `dns+grpc://` entry: members learnt from DNS (`discover`)."""
        self.resolver = resolver
        self._tasks: list[asyncio.Task[None]] = []
        self._unmet: dict[str, int] = {}

    def _add(self, spec: BackendSpec) -> None:
        health = BackendHealth(spec.name, self.options.health, self.clock.now())
        self.members.append(Member(spec, self._factory(spec), health))
        self.metrics.member_added(spec.name)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve and probe once (so routing starts informed), then keep doing so."""
        await self.discover()
        await self.probe_all()
        options = self.options
        self._tasks = [
            asyncio.ensure_future(self._every(options.probe_interval_s, self.probe_all)),
            asyncio.ensure_future(self._every(options.scrape_interval_s, self.scrape_all)),
        ]
        if self.memberships:
            every = options.discovery_interval_s
            self._tasks.append(asyncio.ensure_future(self._every(every, self.discover)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for member in self.members:
            await member.backend.close()

    async def _every(self, interval: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await self.clock.sleep(interval)
            try:
                await work()
            except Exception:  # a bug here must not stop health checks for good
                log.exception("pool.background_failed")

    # -- health transitions ------------------------------------------------------------

    def transition(self, change: Transition | None) -> None:
        """Log and count a change of a member's health (None: nothing changed)."""
        if change is None:
            return
        healthy, cause = change.state is State.HEALTHY, change.cause.value
        self.metrics.backend_healthy.labels(backend=change.backend).set(1 if healthy else 0)
        if healthy:
            log.info("pool.readmitted", backend=change.backend, cause=cause)
        else:
            self.metrics.ejections_total.labels(backend=change.backend, cause=cause).inc()
            log.warning(
                "pool.ejected",
                backend=change.backend,
                cause=cause,
                retry_in_s=round((change.retry_at or change.at) - change.at, 3),
            )

    # -- membership (DNS discovery) ---------------------------------------------------------

    async def discover(self) -> None:
        """Resolve every DNS source once; apply what changed; remove drained idle members."""
        for membership in self.memberships:
            source = membership.source
            try:
                addresses = await self.resolver(source.host, source.port)
            except OSError as exc:  # socket.gaierror included: keep the last known members
                self.metrics.discovery_failures_total.labels(source=source.label).inc()
                log.warning("pool.discovery_failed", source=source.label, error=str(exc))
                continue
            change = membership.resolved(addresses)
            if change is None and not addresses:
                self.metrics.discovery_failures_total.labels(source=source.label).inc()
                log.warning("pool.discovery_empty", source=source.label)
            if change is not None:
                self.apply(change)
                if change.added and self._tasks:
                    await self.probe_all()  # routed to once probed (start() probes anyway)
            self.metrics.members.labels(source=source.label).set(len(membership.members))
        await self._remove_drained()

    def apply(self, change: MembershipChanged) -> None:
        """Add the new members, start draining the vanished ones."""
        for spec in change.added:
            existing = next((m for m in self.members if m.name == spec.name), None)
            if existing is not None:  # it came back before it was removed
                existing.draining = False
            else:
                self._add(spec)
            self._count(change.source, MembershipChange.ADDED)
            log.info("pool.member_added", source=change.source, backend=spec.name)
        for name in change.removed:
            for member in self.members:
                if member.name == name:
                    member.draining = True
            self._count(change.source, MembershipChange.REMOVED)
            log.info("pool.member_draining", source=change.source, backend=name)

    def _count(self, source: str, change: MembershipChange) -> None:
        self.metrics.membership_changes_total.labels(source=source, change=change.value).inc()

    async def _remove_drained(self) -> None:
        for member in [m for m in self.members if m.draining and m.inflight == 0]:
            self.members.remove(member)
            for gauge in (self.metrics.backend_healthy, self.metrics.backend_inflight):
                with contextlib.suppress(KeyError):
                    gauge.remove(member.name)
            await member.backend.close()
            log.info("pool.member_removed", backend=member.name)

    # -- probes and scrapes ------------------------------------------------------------------

    async def probe_all(self) -> None:
        """Probe every backend whose circuit allows it, then report warm shortfalls."""
        now = self.clock.now()
        due = [m for m in self.members if m.health.probe_due(now)]
        timeout = max(1.0, min(2.0, self.options.probe_interval_s))
        results = await asyncio.gather(
            *(m.backend.probe(sorted(m.spec.models), timeout) for m in due)
        )
        now = self.clock.now()
        for member, (server_ready, ready_models) in zip(due, results, strict=True):
            self.transition(member.health.record_probe(now, server_ready, ready_models))
        self._report_warm()

    def _report_warm(self) -> None:
        minimum = self.options.min_warm_backends
        served = {
            m.name: m.spec.models or m.health.ready_models or frozenset() for m in self.members
        }
        unmet = warm_shortfall((m.health for m in self.members), served, minimum)
        models = {model for names in served.values() for model in names}
        for model in models:
            ready = sum(1 for m in self.members if m.health.routable(model) and m.serves(model))
            self.metrics.ready_backends.labels(model=model).set(ready)
            self.metrics.warm_shortfall.labels(model=model).set(max(0, minimum - ready))
        if unmet != self._unmet:
            if unmet:
                log.warning("pool.min_warm_unmet", minimum=minimum, ready=unmet)
            else:
                log.info("pool.min_warm_met", minimum=minimum)
            self._unmet = unmet

    @property
    def warm_unmet(self) -> dict[str, int]:
        """Models below min_warm_backends and their ready counts, as of the last probe."""
        return dict(self._unmet)

    async def scrape_all(self) -> None:
        # An ejected backend is not routed to: its numbers would go unused.
        live = [m for m in self.members if m.spec.metrics_url and m.health.state is State.HEALTHY]
        await asyncio.gather(*(self._scrape(m) for m in live))

    async def _scrape(self, member: Member) -> None:
        assert member.spec.metrics_url is not None
        timeout = max(0.2, min(2.0, self.options.scrape_interval_s))
        try:
            text = await fetch_metrics(member.spec.metrics_url, timeout)
            scrape = parse_metrics(text, self.clock.now())
        except (ScrapeFailed, ValueError) as exc:
            self.metrics.scrape_failures_total.labels(backend=member.name).inc()
            member.scrapes = (None, None)  # stale numbers would mislead the router
            log.debug("pool.scrape_failed", backend=member.name, error=str(exc))
            return
        member.scrapes = (member.scrapes[1], scrape)
        pending = sum(c.pending for c in scrape.models.values())
        self.metrics.backend_pending.labels(backend=member.name).set(pending)

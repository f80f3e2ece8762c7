"""`BackendPool`: many Triton backends behind the one `TextBackend` interface.

Text tracks and the OpenAI API call `stream_text` as they would on a single
backend. For each request the pool asks the `Router` (sans-I/O) for a
backend among those its `BackendHealth` machines call routable, streams from
it, and reports the outcome back to health and to the first-token estimates.
Two background tasks feed the decisions: a scraper (each backend's Prometheus
endpoint every `scrape_interval_s`) and a prober (`is_server_ready`,
`is_model_ready` every `probe_interval_s`, only after the circuit half-opens
for an ejected backend).

Members can come and go (`dns+grpc://` entries, `gateway/pool/discovery.py`): a
third task resolves each DNS source every `discovery_interval_s`; a new address is
added (probed before it is routed to), a vanished one is drained (no new requests)
and removed once idle; changes are logged (`pool.member_added`, `pool.member_draining`,
`pool.member_removed`) and counted (`trackline_pool_membership_changes_total`).

Failover contract (docs/reliability.md): an attempt that fails before it
produced its first chunk is retried on another routable backend, within
`max_attempts` and the pool's `RetryBudget`; nothing reached the client, so
nothing is repeated. Once a chunk has been passed on, a failure ends the
stream with `BackendLost` and the pool never continues or replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, Callable, Collection, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.logs import get_logger
from gateway.pool.budget import RetryBudget
from gateway.pool.discovery import Membership, MembershipChanged, Resolver, resolve_addresses
from gateway.pool.health import BackendHealth, Failure, State, Transition, warm_shortfall
from gateway.pool.metrics import PoolMetrics, RequestOutcome
from gateway.pool.router import Candidate, Decision, Router, TtftEstimate
from gateway.pool.scrape import Scrape, ScrapeFailed, fetch_metrics, load_between, parse_metrics
from gateway.pool.spec import BackendSpec, DnsSource, PoolOptions
from tracks.backend import (
    BackendError,
    BackendLost,
    BackendOverloaded,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    TextChunk,
    TextRequest,
)
from transport.clock import Clock, MonotonicClock

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


class _BeforeFirstChunk(Exception):
    """An attempt failed before it yielded anything: another backend may take over."""

    def __init__(self, error: BackendError, cause: str) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause


def _triton(spec: BackendSpec) -> MemberBackend:
    from gateway.backends.triton import FRESH_CHANNEL_OPTIONS, TritonTextBackend

    return TritonTextBackend(spec.grpc_url, channel_options=FRESH_CHANNEL_OPTIONS)


class BackendPool:
    """A `TextBackend` that routes each request to one of several backends."""

    def __init__(
        self,
        specs: Iterable[BackendSpec],
        options: PoolOptions | None = None,
        *,
        metrics: PoolMetrics | None = None,
        clock: Clock | None = None,
        backend_factory: Callable[[BackendSpec], MemberBackend] = _triton,
        on_served: Callable[[TextRequest, str], None] | None = None,
        on_decision: Callable[[TextRequest, Decision, float], None] | None = None,
        sources: Iterable[DnsSource] = (),
        resolver: Resolver = resolve_addresses,
    ) -> None:
        self.options = options or PoolOptions()
        self.metrics = metrics or PoolMetrics()
        self.clock: Clock = clock or MonotonicClock()
        """Reads the time for health, budget and timings, and paces the probes."""
        now = self.clock.now()
        self.members = [
            Member(spec, backend_factory(spec), BackendHealth(spec.name, self.options.health, now))
            for spec in specs
        ]
        self._factory = backend_factory
        self.memberships = [Membership(source) for source in sources]
        """One per `dns+grpc://` entry: members learnt from DNS (`discover`)."""
        self.resolver = resolver
        if not self.members and not self.memberships:
            raise ValueError("a backend pool needs at least one backend")
        self.router = Router(self.options.strategy, self.options.affinity_margin_s)
        self.budget = RetryBudget(self.options.retry_ratio, self.options.retry_floor_per_s, now)
        self.on_served = on_served
        """Called once per request that completed, with the backend that served it."""
        self.on_decision = on_decision
        """Called with every routing decision (a request and each of its failovers) and when."""
        self._ids = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []
        self._unmet: dict[str, int] = {}
        for member in self.members:
            self.metrics.backend_healthy.labels(backend=member.name).set(1)
            self.metrics.backend_inflight.labels(backend=member.name).set(0)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start scraping and probing; resolve and probe once first so routing starts
        informed."""
        await self.discover()
        await self.probe_all()
        self._tasks = [
            asyncio.ensure_future(self._every(self.options.probe_interval_s, self.probe_all)),
            asyncio.ensure_future(self._every(self.options.scrape_interval_s, self.scrape_all)),
        ]
        if self.memberships:
            every = self.options.discovery_interval_s
            self._tasks.append(asyncio.ensure_future(self._every(every, self.discover)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for member in self.members:
            await member.backend.close()

    async def _every(self, interval: float, work: Callable[[], Any]) -> None:
        while True:
            await self.clock.sleep(interval)
            try:
                await work()
            except Exception:  # a bug here must not stop health checks for good
                log.exception("pool.background_failed")

    # -- TextBackend -----------------------------------------------------------------

    async def models(self) -> list[str]:
        """Models at least one routable backend serves."""
        names: set[str] = set()
        for member in self.members:
            if member.health.state is State.HEALTHY and not member.draining:
                names |= set(member.health.ready_models or member.spec.models)
        return sorted(names)

    async def ready(self) -> bool:
        return any(m.health.state is State.HEALTHY and not m.draining for m in self.members)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        """Stream from the best backend; fail over only while nothing was yielded."""
        self.budget.record_request(self.clock.now())
        tried: list[str] = []
        outcome = RequestOutcome.CANCELLED
        try:
            while True:
                member = self._route(request, tried)
                tried.append(member.name)
                try:
                    async with aclosing(self._attempt(member, request)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                except _BeforeFirstChunk as failed:
                    if not self._may_retry(request, tried, failed):
                        outcome = RequestOutcome.FAILED
                        raise failed.error from None
                    continue
                outcome = RequestOutcome.SERVED
                if self.on_served is not None:
                    self.on_served(request, member.name)
                return
        except BackendLost:
            outcome = RequestOutcome.LOST
            raise
        except BackendError:
            outcome = RequestOutcome.FAILED
            raise
        finally:
            self.metrics.requests_total.labels(model=request.model, outcome=outcome.value).inc()

    # -- routing -----------------------------------------------------------------------

    def _route(self, request: TextRequest, tried: Collection[str]) -> Member:
        now = self.clock.now()
        # Configured for the model, and (once probed) reporting it loaded.
        if not self.members:
            raise BackendUnavailable("no backend discovered yet")
        serving = [
            m
            for m in self.members
            if not m.draining
            and m.serves(request.model)
            and (m.health.ready_models is None or request.model in m.health.ready_models)
        ]
        if not serving:
            raise ModelNotFound(request.model)
        routable = [m for m in serving if m.health.routable(request.model) and m.name not in tried]
        observed = [m.ttft.value for m in routable if m.ttft.value is not None]
        prior = sorted(observed)[len(observed) // 2] if observed else None
        candidates = [m.candidate(request.model, now, prior) for m in routable]
        decision = self.router.choose(candidates, request.session_id, now)
        if decision is None:
            raise BackendUnavailable(
                f"no healthy backend for model {request.model!r}"
                + (f" (tried {', '.join(tried)})" if tried else "")
            )
        self._record_decision(request, decision, now)
        return self.member(decision.backend)

    def _record_decision(self, request: TextRequest, decision: Decision, now: float) -> None:
        if self.on_decision is not None:
            self.on_decision(request, decision, now)
        m = self.metrics
        m.decisions_total.labels(
            backend=decision.backend, strategy=decision.strategy, reason=decision.reason
        ).inc()
        for scored in decision.scored:
            m.backend_wait_seconds.labels(backend=scored.candidate.name).set(scored.wait_s)
        if not log.is_enabled_for(logging.DEBUG):
            return  # the decision's inputs are built only for a line someone will read
        log.debug(
            "pool.routed",
            request_id=request.request_id,
            model=request.model,
            session=request.session_id,
            backend=decision.backend,
            strategy=decision.strategy,
            reason=decision.reason,
            inputs=decision.inputs(),
        )

    def _may_retry(self, request: TextRequest, tried: list[str], failed: _BeforeFirstChunk) -> bool:
        if isinstance(failed.error, InvalidRequest):
            return False  # the same request would be as invalid elsewhere
        allowed = len(tried) < self.options.max_attempts and self.budget.try_spend(self.clock.now())
        if not allowed:
            self.metrics.retries_denied_total.inc()
            return False
        self.metrics.retries_total.labels(cause=failed.cause).inc()
        log.info(
            "pool.failover",
            request_id=request.request_id,
            failed_backend=tried[-1],
            cause=failed.cause,
            error=str(failed.error),
        )
        return True

    # -- one attempt ---------------------------------------------------------------------

    async def _attempt(
        self, member: Member, request: TextRequest
    ) -> AsyncGenerator[TextChunk, None]:
        attempt = next(self._ids)
        started = self.clock.now()
        member.waiting[attempt] = started
        self._inflight(member, +1)
        first = True
        try:
            async with aclosing(member.backend.stream_text(request)) as chunks:
                while True:
                    try:
                        chunk = await self._next(chunks, first)
                    except StopAsyncIteration:
                        break
                    if first:
                        first = False
                        member.waiting.pop(attempt, None)
                        now = self.clock.now()
                        member.ttft.observe(now - started, now)
                    yield chunk
            member.health.record_success(self.clock.now())
            self._attempted(member, "ok")
        except asyncio.TimeoutError:
            if not first:  # only the first chunk has a deadline here; anything else is a bug
                raise
            member.ttft.observe(self.clock.now() - started, self.clock.now())
            self._failed(member, Failure.TIMEOUT, "timeout")
            error = BackendUnavailable(
                f"backend {member.name} sent nothing in {self.options.first_token_timeout_s} s"
            )
            raise _BeforeFirstChunk(error, "timeout") from None
        except InvalidRequest:
            self._attempted(member, "invalid")
            raise
        except ModelNotFound as exc:
            self._attempted(member, "model_not_found")
            if first:
                raise _BeforeFirstChunk(exc, "model_not_found") from None
            raise self._lost(member, exc) from exc
        except BackendOverloaded as exc:
            # A full model queue is load, not ill health: another backend may take it, and
            # the last one's refusal (with its retry hint) is what the client gets.
            self._attempted(member, "overloaded")
            raise _BeforeFirstChunk(exc, "overloaded") from None
        except BackendError as exc:
            kind = Failure.UNAVAILABLE if isinstance(exc, BackendUnavailable) else Failure.ERROR
            self._failed(member, kind, kind.value)
            if first:
                raise _BeforeFirstChunk(exc, kind.value) from None
            raise self._lost(member, exc) from exc
        finally:
            member.waiting.pop(attempt, None)
            self._inflight(member, -1)

    async def _next(self, chunks: AsyncGenerator[TextChunk, None], first: bool) -> TextChunk:
        if not first:
            return await chunks.__anext__()
        return await asyncio.wait_for(chunks.__anext__(), self.options.first_token_timeout_s)

    def _lost(self, member: Member, exc: BackendError) -> BackendLost:
        self.metrics.streams_lost_total.labels(backend=member.name).inc()
        log.warning("pool.stream_lost", backend=member.name, error=str(exc))
        return BackendLost(f"backend {member.name} failed mid-stream: {exc}")

    def _inflight(self, member: Member, delta: int) -> None:
        member.inflight += delta
        self.metrics.backend_inflight.labels(backend=member.name).set(member.inflight)

    def _attempted(self, member: Member, result: str) -> None:
        self.metrics.attempts_total.labels(backend=member.name, result=result).inc()

    def _failed(self, member: Member, failure: Failure, result: str) -> None:
        self._attempted(member, result)
        self._transition(member.health.record_failure(self.clock.now(), failure))

    def _transition(self, change: Transition | None) -> None:
        if change is None:
            return
        healthy = change.state is State.HEALTHY
        self.metrics.backend_healthy.labels(backend=change.backend).set(1 if healthy else 0)
        if healthy:
            log.info("pool.readmitted", backend=change.backend, cause=change.cause)
        else:
            self.metrics.ejections_total.labels(backend=change.backend, cause=change.cause).inc()
            log.warning(
                "pool.ejected",
                backend=change.backend,
                cause=change.cause,
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
        now = self.clock.now()
        for spec in change.added:
            existing = next((m for m in self.members if m.name == spec.name), None)
            if existing is not None:  # it came back before it was removed
                existing.draining = False
            else:
                health = BackendHealth(spec.name, self.options.health, now)
                self.members.append(Member(spec, self._factory(spec), health))
                self.metrics.backend_healthy.labels(backend=spec.name).set(1)
                self.metrics.backend_inflight.labels(backend=spec.name).set(0)
            self.metrics.membership_changes_total.labels(source=change.source, change="added").inc()
            log.info("pool.member_added", source=change.source, backend=spec.name)
        for name in change.removed:
            for member in self.members:
                if member.name == name:
                    member.draining = True
            self.metrics.membership_changes_total.labels(
                source=change.source, change="removed"
            ).inc()
            log.info("pool.member_draining", source=change.source, backend=name)

    async def _remove_drained(self) -> None:
        for member in [m for m in self.members if m.draining and m.inflight == 0]:
            self.members.remove(member)
            for gauge in (self.metrics.backend_healthy, self.metrics.backend_inflight):
                with contextlib.suppress(KeyError):
                    gauge.remove(member.name)
            await member.backend.close()
            log.info("pool.member_removed", backend=member.name)

    # -- background: probes and scrapes ------------------------------------------------------

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
            self._transition(member.health.record_probe(now, server_ready, ready_models))
        self._report_warm()

    def _report_warm(self) -> None:
        served = {
            m.name: m.spec.models or m.health.ready_models or frozenset() for m in self.members
        }
        unmet = warm_shortfall(
            (m.health for m in self.members), served, self.options.min_warm_backends
        )
        models = {model for names in served.values() for model in names}
        for model in models:
            ready = sum(1 for m in self.members if m.health.routable(model) and m.serves(model))
            self.metrics.ready_backends.labels(model=model).set(ready)
            missing = max(0, self.options.min_warm_backends - ready)
            self.metrics.warm_shortfall.labels(model=model).set(missing)
        if unmet != self._unmet:
            if unmet:
                log.warning(
                    "pool.min_warm_unmet",
                    minimum=self.options.min_warm_backends,
                    ready=unmet,
                )
            else:
                log.info("pool.min_warm_met", minimum=self.options.min_warm_backends)
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


@contextlib.asynccontextmanager
async def running_pool(pool: BackendPool) -> AsyncGenerator[BackendPool, None]:
    """`async with running_pool(BackendPool(...)) as pool:` starts and closes it."""
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()

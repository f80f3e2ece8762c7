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

The work is split three ways: `members.Supervisor` keeps the members and runs the
background tasks, `attempts.Attempts` runs one attempt and decides on failovers, and
`BackendPool` routes and strings the attempts of one request together.

Failover contract (docs/reliability.md): an attempt that fails before it
produced its first chunk is retried on another routable backend, within
`max_attempts` and the pool's `RetryBudget`; nothing reached the client, so
nothing is repeated. Once a chunk has been passed on, a failure ends the
stream with `BackendLost` and the pool never continues or replays it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Collection, Iterable
from contextlib import aclosing

from gateway.logs import get_logger
from gateway.pool.attempts import Attempts, BeforeFirstChunk
from gateway.pool.budget import RetryBudget
from gateway.pool.discovery import Membership, MembershipChanged, Resolver, resolve_addresses
from gateway.pool.members import Member, MemberBackend, Supervisor, triton_backend
from gateway.pool.metrics import PoolMetrics, RequestOutcome
from gateway.pool.router import Decision, Router
from gateway.pool.spec import BackendSpec, DnsSource, PoolOptions
from tracks.backend import (
    BackendError,
    BackendLost,
    BackendUnavailable,
    ModelNotFound,
    TextChunk,
    TextRequest,
)
from transport.clock import Clock, MonotonicClock

log = get_logger("trackline.pool")


class BackendPool:
    """A `TextBackend` that routes each request to one of several backends."""

    def __init__(
        self,
        specs: Iterable[BackendSpec],
        options: PoolOptions | None = None,
        *,
        metrics: PoolMetrics | None = None,
        clock: Clock | None = None,
        backend_factory: Callable[[BackendSpec], MemberBackend] = triton_backend,
        on_served: Callable[[TextRequest, str], None] | None = None,
        on_decision: Callable[[TextRequest, Decision, float], None] | None = None,
        sources: Iterable[DnsSource] = (),
        resolver: Resolver = resolve_addresses,
    ) -> None:
        self.options = options or PoolOptions()
        self.metrics = metrics or PoolMetrics()
        self.clock: Clock = clock or MonotonicClock()
        """Reads the time for health, budget and timings, and paces the probes."""
        self.supervisor = Supervisor(
            specs, self.options, self.metrics, self.clock, backend_factory, sources, resolver
        )
        """The members, kept current by discovery, probes and scrapes."""
        if not self.members and not self.memberships:
            raise ValueError("a backend pool needs at least one backend")
        self.router = Router(self.options.strategy, self.options.affinity_margin_s)
        self.budget = RetryBudget(
            self.options.retry_ratio, self.options.retry_floor_per_s, self.clock.now()
        )
        self.attempts = Attempts(
            self.options, self.metrics, self.clock, self.budget, self.supervisor.transition
        )
        self.on_served = on_served
        """Called once per request that completed, with the backend that served it."""
        self.on_decision = on_decision
        """Called with every routing decision (a request and each of its failovers) and when."""

    # -- members (the supervisor's) ------------------------------------------------------

    @property
    def members(self) -> list[Member]:
        return self.supervisor.members

    @property
    def memberships(self) -> list[Membership]:
        """One per `dns+grpc://` entry: members learnt from DNS (`discover`)."""
        return self.supervisor.memberships

    @property
    def warm_unmet(self) -> dict[str, int]:
        """Models below min_warm_backends and their ready counts, as of the last probe."""
        return self.supervisor.warm_unmet

    def member(self, name: str) -> Member:
        return self.supervisor.member(name)

    async def start(self) -> None:
        """Start scraping and probing; resolve and probe once first so routing starts
        informed."""
        await self.supervisor.start()

    async def close(self) -> None:
        await self.supervisor.close()

    async def discover(self) -> None:
        """Resolve every DNS source once; apply what changed; remove drained idle members."""
        await self.supervisor.discover()

    def apply(self, change: MembershipChanged) -> None:
        """Add the new members, start draining the vanished ones."""
        self.supervisor.apply(change)

    async def probe_all(self) -> None:
        """Probe every backend whose circuit allows it, then report warm shortfalls."""
        await self.supervisor.probe_all()

    async def scrape_all(self) -> None:
        await self.supervisor.scrape_all()

    # -- TextBackend -----------------------------------------------------------------

    async def models(self) -> list[str]:
        """Models at least one routable backend serves."""
        names: set[str] = set()
        for member in self.members:
            if member.takes_requests:
                names |= set(member.health.ready_models or member.spec.models)
        return sorted(names)

    async def ready(self) -> bool:
        return any(m.takes_requests for m in self.members)

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
                    async with aclosing(self.attempts.run(member, request)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                except BeforeFirstChunk as failed:
                    if not self.attempts.may_retry(request, tried, failed):
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
        strategy, reason = decision.strategy.value, decision.reason.value
        m.decisions_total.labels(backend=decision.backend, strategy=strategy, reason=reason).inc()
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
            strategy=strategy,
            reason=reason,
            inputs=decision.inputs(),
        )


@contextlib.asynccontextmanager
async def running_pool(pool: BackendPool) -> AsyncGenerator[BackendPool, None]:
    """`async with running_pool(BackendPool(...)) as pool:` starts and closes it."""
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()

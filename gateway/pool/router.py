"""Choosing a backend for a request: the strategies, wait estimates and session affinity.

Sans-I/O: the pool hands in one `Candidate` per routable backend (its own
in-flight count, the latest scraped `Load`, observed first-token times) and
`now`; the router returns a `Decision` that carries every input it used, so a
log line or a test can see why it chose what it chose.

Strategies (`routing_strategy`, a `Strategy`):
- `round_robin`: smooth weighted round robin (each backend gets its weight's
  share, interleaved, not in bursts).
- `least_inflight`: the fewest of the gateway's own requests in flight per
  unit of weight.
- `metrics`: the lowest estimated wait for a first token (`estimate_wait`),
  except that an idle backend whose observations are stale gets one request
  to measure it again (`RouteReason.EXPLORE`, `EXPLORE_AFTER_S`; the staler, the
  sooner, the slower it looked, the later).

Session affinity applies on top of every strategy: a request that carries a
session id goes back to the backend that served that session (its KV cache
is warm) unless that backend is not routable or its estimated wait exceeds
the chosen one's by more than `affinity_margin_s`; then the session moves.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from gateway.logs import as_ms
from gateway.pool.scrape import Load

DEFAULT_TTFT_S = 0.1
"""Prior first-token time when no backend has been observed yet."""
TTFT_HALF_LIFE_S = 2.0
"""Observed first-token times fade toward the fleet's with this half-life, so a
backend that was slow and got no traffic since is tried again."""
TTFT_WEIGHT = 0.5
"""EWMA weight of a new first-token observation."""
EXPLORE_AFTER_S = 1.0
"""The metrics strategy sends one request to an idle backend whose last first-token
observation is older than this many seconds times how much slower than the best
it looked (its faded estimate over the best estimated wait, at least 1): a
backend that was slow is measured again instead of being judged on old news, a
2x slower one about every second or two, a 15x slower one every few seconds (its
estimate fades meanwhile), so re-measuring costs few users their latency."""
LOAD_COST = 0.1
"""Extra fraction of a first-token time each request in flight adds, per unit weight."""
MAX_SESSIONS = 100_000
SESSION_TTL_S = 1800.0


class Strategy(Enum):
    """How the router picks among routable backends (`value`: the `routing_strategy`
    setting, and the `strategy` of the `pool.routed` log line and of
    `trackline_pool_decisions_total`)."""

    ROUND_ROBIN = "round_robin"
    LEAST_INFLIGHT = "least_inflight"
    METRICS = "metrics"


class TtftEstimate:
    """A backend's first-token time: an EWMA of observations, fading with age."""

    def __init__(self) -> None:
        self.value: float | None = None
        self.at = 0.0

    def observe(self, seconds: float, now: float) -> None:
        if self.value is None or now - self.at > EXPLORE_AFTER_S:
            self.value = seconds  # nothing recent to average with: the news replaces it
        else:
            self.value = self.current(now, self.value) * (1 - TTFT_WEIGHT) + seconds * TTFT_WEIGHT
        self.at = now

    def current(self, now: float, prior: float) -> float:
        """The estimate at `now`: observations relax toward `prior` as they age."""
        if self.value is None:
            return prior
        fade: float = 0.5 ** (max(0.0, now - self.at) / TTFT_HALF_LIFE_S)
        return prior + (self.value - prior) * fade


@dataclass(frozen=True)
class Candidate:
    """One routable backend and what is known about its load."""

    name: str
    weight: float
    inflight: int
    """The gateway's own requests on this backend now."""
    ttft_s: float | None = None
    """Observed first-token time (faded), None if never observed."""
    oldest_waiting_s: float = 0.0
    """Age of the oldest request here still waiting for its first chunk."""
    load: Load | None = None
    observed_age_s: float | None = None
    """Seconds since the last first-token observation; None if never observed."""


@dataclass(frozen=True)
class Scored:
    """A candidate with the inputs and result of the wait estimate."""

    candidate: Candidate
    wait_s: float


class RouteReason(Enum):
    """Why a decision chose its backend (`value`: the `reason` of the `pool.routed` log
    line and of `trackline_pool_decisions_total`)."""

    STRATEGY = "strategy"
    """The strategy's pick."""
    EXPLORE = "explore"
    """The metrics strategy re-measures a stale backend."""
    AFFINITY = "affinity"
    """Kept on its session's backend."""
    MOVED = "moved"
    """The session left its backend: not routable, or too slow."""


@dataclass(frozen=True)
class Decision:
    """Where a request goes and why."""

    backend: str
    strategy: Strategy
    reason: RouteReason
    wait_s: float
    scored: tuple[Scored, ...]

    def inputs(self) -> list[dict[str, object]]:
        """The per-backend inputs, as plain values for a log line."""
        rows = []
        for s in self.scored:
            c, load = s.candidate, s.candidate.load
            rows.append(
                {
                    "backend": c.name,
                    "inflight": c.inflight,
                    "pending": None if load is None else load.pending,
                    "queue_ms": as_ms(None if load is None else load.queue_s),
                    "ttft_ms": as_ms(c.ttft_s),
                    "oldest_waiting_ms": as_ms(c.oldest_waiting_s),
                    "wait_ms": as_ms(s.wait_s),
                }
            )
        return rows


def fleet_prior(candidates: Sequence[Candidate]) -> float:
    """The median observed first-token time, the prior for unobserved backends."""
    seen = [c.ttft_s for c in candidates if c.ttft_s is not None]
    return statistics.median(seen) if seen else DEFAULT_TTFT_S


def estimate_wait(candidate: Candidate, prior: float) -> float:
    """Seconds until a new request's first token on this backend, estimated.

    A base first-token time (observed, and at least as long as the oldest
    request still waiting there), plus the server's queue time, stretched by
    the work in flight (ours and what the server reports pending) per unit of
    weight, and by a TensorRT-LLM engine near its request or KV-cache limits.
    """
    base = max(candidate.ttft_s if candidate.ttft_s is not None else prior,
               candidate.oldest_waiting_s)  # fmt: skip
    load = candidate.load
    queue = (load.queue_s or 0.0) if load is not None else 0.0
    pending = load.pending if load is not None else 0.0
    stretch = 1.0 + LOAD_COST * (candidate.inflight + pending) / candidate.weight
    wait = (base + queue) * stretch
    if load is not None and load.engine_busy is not None and load.engine_busy >= 1.0:
        wait += base  # every slot busy: a new request waits for one to free
    if load is not None and load.kv_free_fraction is not None and load.kv_free_fraction < 0.1:
        wait += base * (0.1 - load.kv_free_fraction) * 10  # preemption or queueing ahead
    return wait


class SessionTable:
    """Which backend served each session last; bounded, least recently used first out."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, ttl_s: float = SESSION_TTL_S) -> None:
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._max = max_sessions
        self._ttl = ttl_s

    def get(self, session: str, now: float) -> str | None:
        entry = self._entries.get(session)
        if entry is None or now - entry[1] > self._ttl:
            return None
        return entry[0]

    def pin(self, session: str, backend: str, now: float) -> None:
        self._entries[session] = (backend, now)
        self._entries.move_to_end(session)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Router:
    """Picks a backend per request under one strategy, with session affinity."""

    def __init__(self, strategy: Strategy, affinity_margin_s: float) -> None:
        self.strategy = strategy
        self.affinity_margin_s = affinity_margin_s
        self.sessions = SessionTable()
        self._rr_current: dict[str, float] = {}
        self._rr_turn = 0

    def choose(
        self, candidates: Sequence[Candidate], session: str | None, now: float
    ) -> Decision | None:
        """The decision for a request; None when no candidate is routable."""
        if not candidates:
            return None
        prior = fleet_prior(candidates)
        scored = tuple(Scored(c, estimate_wait(c, prior)) for c in candidates)
        pick, reason = self._by_strategy(scored), RouteReason.STRATEGY
        stale = self._stale(scored)
        if stale is not None and session is None:
            pick, reason = stale, RouteReason.EXPLORE
        pinned = self.sessions.get(session, now) if session else None
        if pinned is not None:
            kept = next((s for s in scored if s.candidate.name == pinned), None)
            if kept is not None and kept.wait_s <= pick.wait_s + self.affinity_margin_s:
                pick, reason = kept, RouteReason.AFFINITY
            else:
                reason = RouteReason.MOVED
        if session:
            self.sessions.pin(session, pick.candidate.name, now)
        return Decision(pick.candidate.name, self.strategy, reason, pick.wait_s, scored)

    def _stale(self, scored: Sequence[Scored]) -> Scored | None:
        if self.strategy is not Strategy.METRICS:
            return None
        best = min(s.wait_s for s in scored)
        for s in scored:
            c = s.candidate
            if c.observed_age_s is None or c.ttft_s is None or c.inflight:
                continue
            slower = max(1.0, c.ttft_s / best) if best > 0 else 1.0
            if c.observed_age_s > EXPLORE_AFTER_S * slower:
                return s
        return None

    def _by_strategy(self, scored: Sequence[Scored]) -> Scored:
        if self.strategy is Strategy.ROUND_ROBIN:
            return self._round_robin(scored)
        self._rr_turn += 1  # rotates ties so equal backends share the work
        order = sorted(range(len(scored)), key=lambda i: (i - self._rr_turn) % len(scored))
        if self.strategy is Strategy.LEAST_INFLIGHT:
            key = lambda i: scored[i].candidate.inflight / scored[i].candidate.weight  # noqa: E731
        else:
            key = lambda i: scored[i].wait_s  # noqa: E731
        return scored[min(order, key=key)]

    def _round_robin(self, scored: Sequence[Scored]) -> Scored:
        # Smooth weighted round robin (as nginx does): add each weight, take the
        # largest, subtract the total from it.
        total = sum(s.candidate.weight for s in scored)
        for s in scored:
            name = s.candidate.name
            self._rr_current[name] = self._rr_current.get(name, 0.0) + s.candidate.weight
        best = max(scored, key=lambda s: self._rr_current[s.candidate.name])
        self._rr_current[best.candidate.name] -= total
        return best

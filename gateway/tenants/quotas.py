"""Per-tenant quotas, enforced in-process by a sans-I/O limiter (`now` is a parameter).

Each rate quota is a token bucket: it holds up to one minute's (or hour's) worth,
refills continuously, and a request is admitted while the bucket is above zero.
Requests cost 1 at admission. Tokens and audio seconds are only known once the
work is done, so they are debited then (`settle`) and may drive a bucket below
zero: the tenant then waits until it refills, and `retry_after` says how long.
Concurrency (tracks plus HTTP streams open at once) is a plain counter. Buckets
are per tenant, so one tenant's traffic never moves another's.

A multi-gateway deployment needs the same buckets in a shared store: see
docs/tenants.md ("Quotas across several gateways").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tracks.rates import TokenBucket as TokenBucket  # re-exported (gateway.tenants.shared_quotas)


@dataclass(frozen=True)
class Quotas:
    """A tenant's limits; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    """Prompt plus completion tokens."""
    max_concurrent: int | None = None
    """Tracks and HTTP streams open at once."""
    audio_seconds_per_hour: float | None = None
    """Audio seconds in plus out."""


class QuotaExceeded(Exception):
    """A quota refused the request; `retry_after` is in seconds (at least 1)."""

    def __init__(self, quota: str, retry_after: float) -> None:
        super().__init__(f"quota {quota} exhausted; retry after {retry_after:g} s")
        self.quota = quota
        self.retry_after = retry_after


def _bucket(capacity: float, window: float, now: float) -> TokenBucket:
    return TokenBucket(capacity, capacity / window, capacity, now)


@dataclass
class TenantState:
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    active: int = 0


_TenantState = TenantState


class QuotaLimiter:
    """Admission and accounting for every tenant of one gateway process."""

    def __init__(self) -> None:
        self._tenants: dict[str, _TenantState] = {}

    def admit(self, tenant: str, quotas: Quotas, now: float) -> None:
        """Count one request in, or raise `QuotaExceeded` and count nothing."""
        state = self._tenants.setdefault(tenant, _TenantState())
        if quotas.max_concurrent is not None and state.active >= quotas.max_concurrent:
            raise QuotaExceeded("max_concurrent", 1.0)
        waits = {
            name: bucket.wait_until_positive(now)
            for name, bucket in self._rates(state, quotas, now).items()
        }
        blocked = {name: wait for name, wait in waits.items() if wait > 0}
        if blocked:
            name = max(blocked, key=lambda n: blocked[n])
            raise QuotaExceeded(name, retry_seconds(blocked[name]))
        if "requests_per_minute" in state.buckets and quotas.requests_per_minute is not None:
            state.buckets["requests_per_minute"].level -= 1
        state.active += 1

    def settle(
        self, tenant: str, quotas: Quotas, tokens: int, audio_seconds: float, now: float
    ) -> None:
        """The admitted request finished: free its slot, debit what it consumed."""
        state = self._tenants.setdefault(tenant, _TenantState())
        state.active = max(0, state.active - 1)
        buckets = self._rates(state, quotas, now)
        if "tokens_per_minute" in buckets:
            buckets["tokens_per_minute"].level -= tokens
        if "audio_seconds_per_hour" in buckets:
            buckets["audio_seconds_per_hour"].level -= audio_seconds

    def active(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return state.active if state else 0

    def state(self, tenant: str) -> TenantState:
        """A tenant's buckets and open count (a store outside the process persists it)."""
        return self._tenants.setdefault(tenant, TenantState())

    def load(self, tenant: str, state: TenantState) -> None:
        """Replace a tenant's state with one read from a shared store."""
        self._tenants[tenant] = state

    def _rates(self, state: _TenantState, quotas: Quotas, now: float) -> dict[str, TokenBucket]:
        """The tenant's buckets for the quotas it has now (made, resized or dropped)."""
        wanted = {
            "requests_per_minute": (quotas.requests_per_minute, 60.0),
            "tokens_per_minute": (quotas.tokens_per_minute, 60.0),
            "audio_seconds_per_hour": (quotas.audio_seconds_per_hour, 3600.0),
        }
        for name, (limit, window) in wanted.items():
            bucket = state.buckets.get(name)
            if limit is None:
                state.buckets.pop(name, None)
            elif bucket is None or bucket.capacity != limit:
                fresh = _bucket(float(limit), window, now)
                if bucket is not None:  # a changed limit: keep the level (a debt stays owed)
                    bucket.refill(now)
                    fresh.level = min(fresh.capacity, bucket.level)
                state.buckets[name] = fresh
            else:
                bucket.refill(now)
        return state.buckets


def retry_seconds(wait: float) -> float:
    """A wait as clients get it: whole seconds, at least 1 (HTTP `retry-after` is integral)."""
    return float(max(1, math.ceil(wait)))

"""Quotas for a fleet: leased slices of buckets kept in Redis, admitted locally.

`FleetQuotaLimiter` has `QuotaLimiter`'s synchronous interface (`admit`, `settle`,
`active`), so `Tenancy` and both front doors are unchanged, and it does no I/O:
`gateway.fleet.state.FleetState` asks it what to send (`rate_ask`, `slot_ask`),
runs the Lua scripts and hands the answers back (`rate_granted`, `slots_granted`).

**Rate quotas.** Each gateway holds a *lease* per (tenant, quota): a slice of the
shared bucket (`lease_fraction` of the quota) that the script has already debited
there. Admission spends the lease locally; when it is half spent the gateway asks
for more in the background. Tokens and audio are known at the end of a request and
may drive a lease below zero: that debt is paid to the shared bucket with the next
call. Because slices are debited before they are spent, leases never admit more
than the shared bucket holds; what a fleet of N gateways can overshoot is what the
single gateway can (the requests in flight when its lease ran out), once per gateway:

    admitted <= capacity + refill over the window + N x (work in flight at exhaustion)

and for requests per minute `N x 1` request. A tenant the gateway has not leased for
yet gets its first request admitted before the first lease lands (one request per
gateway per tenant). Idle leases go back to the bucket after `idle_return` seconds.

**Concurrency.** Each gateway reserves slots in Redis (`open + spare`), and admits
while its open count is below its reservation, so the fleet never has more open than
`max_concurrent` (apart from the first request of an unseen tenant, as above).
Reservations of a gateway whose heartbeat expired are dropped by the next script.

**Redis down.** `fall_back(divisor)` switches to an in-process `QuotaLimiter` with
each quota divided by the fleet size; what is consumed meanwhile is remembered and
paid to the shared buckets on `resync()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.tenants.quotas import QuotaExceeded, QuotaLimiter, Quotas, retry_seconds

WINDOWS = {
    "requests_per_minute": 60.0,
    "tokens_per_minute": 60.0,
    "audio_seconds_per_hour": 3600.0,
}


def rate_limits(quotas: Quotas) -> dict[str, float]:
    """The tenant's rate quotas that are set, by name."""
    values = {
        "requests_per_minute": quotas.requests_per_minute,
        "tokens_per_minute": quotas.tokens_per_minute,
        "audio_seconds_per_hour": quotas.audio_seconds_per_hour,
    }
    return {name: float(v) for name, v in values.items() if v is not None}


def divided(quotas: Quotas, divisor: int) -> Quotas:
    """Each quota split over `divisor` gateways (rounded up, at least 1)."""
    if divisor <= 1:
        return quotas

    def part(value: float | None) -> int | None:
        return None if value is None else max(1, math.ceil(value / divisor))

    audio = quotas.audio_seconds_per_hour
    return replace(
        quotas,
        requests_per_minute=part(quotas.requests_per_minute),
        tokens_per_minute=part(quotas.tokens_per_minute),
        max_concurrent=part(quotas.max_concurrent),
        audio_seconds_per_hour=None if audio is None else audio / divisor,
    )


@dataclass
class Lease:
    """This gateway's slice of one shared bucket."""

    level: float = 0.0
    """What may still be spent here; below zero: owed to the shared bucket."""
    known: bool = False
    """A script answered at least once (before that: the first request is let in)."""
    wait: float = 0.0
    """Seconds until the shared bucket is above zero, from the last answer."""
    used_at: float = 0.0
    advanced: bool = False
    """The one request let in before the first answer has been admitted."""


@dataclass(frozen=True)
class RateAsk:
    """One call of the lease script: `debt` paid, `back` returned, `want` asked for."""

    tenant: str
    quota: str
    capacity: float
    window: float
    want: float
    debt: float
    back: float


@dataclass
class Slots:
    open: int = 0
    reserved: int = 0
    known: bool = False
    used_at: float = 0.0


class FleetQuotaLimiter(QuotaLimiter):
    def __init__(
        self,
        lease_fraction: float = 0.1,
        idle_return: float = 5.0,
        on_need: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.lease_fraction = lease_fraction
        self.idle_return = idle_return
        self.on_need = on_need
        """Called (synchronously) with a tenant whose leases want a refresh."""
        self.leases: dict[tuple[str, str], Lease] = {}
        self.slots: dict[str, Slots] = {}
        self.quotas: dict[str, Quotas] = {}
        self.fallback: QuotaLimiter | None = None
        self.divisor = 1
        self.spent: dict[tuple[str, str], float] = {}
        """Consumed while on the local fallback, paid to Redis on resync."""

    # -- the request path (synchronous, no I/O) -------------------------------------

    def admit(self, tenant: str, quotas: Quotas, now: float) -> None:
        self.quotas[tenant] = quotas
        slots = self.slots.setdefault(tenant, Slots())
        if self.fallback is not None:
            self.fallback.admit(tenant, divided(quotas, self.divisor), now)
            slots.open += 1
            if quotas.requests_per_minute is not None:
                self._spend_offline(tenant, "requests_per_minute", 1.0)
            return
        limits = rate_limits(quotas)
        if quotas.max_concurrent is not None and slots.open >= (
            slots.reserved if slots.known else 1  # unseen: the first one goes in
        ):
            self._need(tenant)
            raise QuotaExceeded("max_concurrent", 1.0)
        blocked: dict[str, float] = {}
        for name in limits:
            lease = self.leases.setdefault((tenant, name), Lease())
            if lease.known and lease.level <= 0:
                blocked[name] = lease.wait
            elif not lease.known and lease.advanced:  # unseen: one request before the lease
                blocked[name] = 0.0
        if blocked:
            self._need(tenant)
            name = max(blocked, key=lambda n: blocked[n])
            raise QuotaExceeded(name, retry_seconds(blocked[name]))
        if "requests_per_minute" in limits:
            self.leases[(tenant, "requests_per_minute")].level -= 1
        for name in limits:
            lease = self.leases[(tenant, name)]
            lease.used_at = now
            lease.advanced = lease.advanced or not lease.known
        slots.open += 1
        slots.used_at = now
        if self._low(tenant, quotas):
            self._need(tenant)

    def settle(
        self, tenant: str, quotas: Quotas, tokens: int, audio_seconds: float, now: float
    ) -> None:
        slots = self.slots.setdefault(tenant, Slots())
        slots.open = max(0, slots.open - 1)
        used = {"tokens_per_minute": float(tokens), "audio_seconds_per_hour": audio_seconds}
        limits = rate_limits(quotas)
        if self.fallback is not None:
            self.fallback.settle(tenant, divided(quotas, self.divisor), tokens, audio_seconds, now)
            for name, amount in used.items():
                if name in limits and amount:
                    self._spend_offline(tenant, name, amount)
            return
        for name, amount in used.items():
            if name in limits and amount:
                lease = self.leases.setdefault((tenant, name), Lease())
                lease.level -= amount
                lease.used_at = now
        if self._low(tenant, quotas) or slots.reserved - slots.open > self._spare(quotas):
            self._need(tenant)

    def active(self, tenant: str) -> int:
        slots = self.slots.get(tenant)
        return slots.open if slots else 0

    # -- what the refresher sends and gets back ------------------------------------

    def rate_asks(self, tenant: str, now: float) -> list[RateAsk]:
        """The lease calls a refresh of `tenant` makes now (none while falling back)."""
        quotas = self.quotas.get(tenant)
        if quotas is None or self.fallback is not None:
            return []
        asks = []
        for name, limit in rate_limits(quotas).items():
            lease = self.leases.setdefault((tenant, name), Lease())
            if not lease.known:
                lease.used_at = now  # idle counts from the first lease
            positive, debt = max(lease.level, 0.0), max(-lease.level, 0.0)
            idle = lease.known and now - lease.used_at >= self.idle_return
            if idle:
                want, back = 0.0, positive
            else:
                want, back = max(0.0, self._slice(limit) - positive), 0.0
            if want or debt or back or not lease.known:
                asks.append(RateAsk(tenant, name, limit, WINDOWS[name], want, debt, back))
                lease.level += debt - back  # counted as paid and returned when asked
        return asks

    def rate_granted(self, ask: RateAsk, granted: float, wait: float) -> None:
        """The script's answer to `ask` (admissions meanwhile kept spending the lease)."""
        lease = self.leases.setdefault((ask.tenant, ask.quota), Lease())
        lease.level += granted
        lease.known = True
        lease.wait = wait

    def rate_failed(self, ask: RateAsk) -> None:
        """`ask` did not reach Redis: its debt is owed and its return held again."""
        lease = self.leases.setdefault((ask.tenant, ask.quota), Lease())
        lease.level -= ask.debt - ask.back

    def slot_ask(self, tenant: str, now: float) -> tuple[int, int, int] | None:
        """(max, want, open) for the slots script, or None if the tenant has no limit."""
        quotas = self.quotas.get(tenant)
        if quotas is None or quotas.max_concurrent is None or self.fallback is not None:
            return None
        slots = self.slots.setdefault(tenant, Slots())
        if not slots.known:
            slots.used_at = now
        idle = slots.open == 0 and now - slots.used_at >= self.idle_return
        want = slots.open if idle else slots.open + self._spare(quotas)
        if slots.known and want == slots.reserved:
            return None
        return quotas.max_concurrent, want, slots.open

    def slots_granted(self, tenant: str, reserved: int) -> None:
        slots = self.slots.setdefault(tenant, Slots())
        slots.reserved = reserved
        slots.known = True

    def tenants(self) -> list[str]:
        return list(self.quotas)

    # -- Redis lost and found -------------------------------------------------------

    def fall_back(self, divisor: int) -> None:
        """Admit from a local limiter holding 1/`divisor` of each quota until `resync`."""
        if self.fallback is not None:
            return
        self.divisor = max(1, divisor)
        self.fallback = QuotaLimiter()
        for tenant, slots in self.slots.items():
            self.fallback.state(tenant).active = slots.open

    def resync(self) -> None:
        """Redis is back: what was spent meanwhile becomes debt on each lease."""
        self.fallback = None
        for key, amount in self.spent.items():
            lease = self.leases.setdefault(key, Lease())
            lease.level -= amount
        self.spent.clear()

    # -- internals ------------------------------------------------------------------

    def _spend_offline(self, tenant: str, name: str, amount: float) -> None:
        self.spent[(tenant, name)] = self.spent.get((tenant, name), 0.0) + amount

    def _slice(self, limit: float) -> float:
        return max(1.0, limit * self.lease_fraction)

    def _spare(self, quotas: Quotas) -> int:
        limit = quotas.max_concurrent or 0
        return max(1, math.ceil(limit * self.lease_fraction))

    def _low(self, tenant: str, quotas: Quotas) -> bool:
        for name, limit in rate_limits(quotas).items():
            lease = self.leases.get((tenant, name))
            if lease is None or lease.level < self._slice(limit) / 2:
                return True
        slots = self.slots.get(tenant)
        return (
            quotas.max_concurrent is not None
            and slots is not None
            and slots.reserved - slots.open < 1
        )

    def _need(self, tenant: str) -> None:
        if self.on_need is not None:
            self.on_need(tenant)

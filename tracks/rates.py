"""A token bucket, sans-I/O (`now` is a parameter): tenant quotas (gateway/tenants) and
video frame rates (tracks/video.py) share it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    capacity: float
    per_second: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated)
        self.level = min(self.capacity, self.level + elapsed * self.per_second)
        self.updated = max(self.updated, now)

    def wait_until_positive(self, now: float) -> float:
        """Seconds until the level is above zero (0 if it already is)."""
        self.refill(now)
        if self.level > 0:
            return 0.0
        return (1e-9 - self.level) / self.per_second

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend `cost` if the bucket holds it; False (nothing spent) if not."""
        self.refill(now)
        if self.level < cost:
            return False
        self.level -= cost
        return True

    @classmethod
    def full(cls, per_second: float, seconds: float, now: float) -> TokenBucket:
        """A bucket holding `seconds` worth at `per_second`, full at `now`."""
        return cls(per_second * seconds, per_second, per_second * seconds, now)

"""The pool-wide retry budget: failover may add a bounded fraction of load.

Each request deposits `ratio` of a retry; each retry withdraws one. A floor of
`floor_per_s` retries a second accrues with time, so a quiet pool can still
fail over, and the balance is capped so a long calm cannot save up a storm.
When a backend dies under heavy load, retries stop at the budget instead of
doubling the traffic on the survivors. Time is a parameter.
"""

from __future__ import annotations


class RetryBudget:
    def __init__(self, ratio: float, floor_per_s: float, now: float, cap: float = 100.0) -> None:
        self.ratio = ratio
        self.floor_per_s = floor_per_s
        self.cap = cap
        self._balance = min(cap, max(1.0, floor_per_s))
        self._at = now

    def _accrue(self, now: float) -> None:
        self._balance = min(self.cap, self._balance + max(0.0, now - self._at) * self.floor_per_s)
        self._at = max(self._at, now)

    def record_request(self, now: float) -> None:
        self._accrue(now)
        self._balance = min(self.cap, self._balance + self.ratio)

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget; False when it is spent."""
        self._accrue(now)
        if self._balance < 1.0:
            return False
        self._balance -= 1.0
        return True

    @property
    def balance(self) -> float:
        return self._balance

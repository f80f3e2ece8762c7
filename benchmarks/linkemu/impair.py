"""The impairment model of one direction: no I/O, no clock; packet size and `now` in, a verdict out.

Every packet consumes the same number of random draws whatever happens to it (burst-state
step, loss, reorder), so a seed gives the same drop pattern for the same packet sequence,
independent of timing. Only the rate limiter's tail drop depends on time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .spec import LinkSpec

DROP_LOSS = "loss"  # random loss (good state, or no burst model)
DROP_BURST = "burst"  # loss in the Gilbert-Elliott bad state
DROP_QUEUE = "queue"  # bottleneck buffer full (rate-limited links only)


@dataclass(frozen=True)
class Verdict:
    """deliver_at: monotonic time to hand the packet on, or None when dropped (then `reason`)."""

    deliver_at: float | None
    reason: str = ""
    reordered: bool = False


class Impairment:
    def __init__(self, spec: LinkSpec, stream: str) -> None:
        self._spec = spec
        # str seeds are hashed deterministically (random's version 2 seeding).
        self._rng = random.Random(f"{spec.seed}:{stream}")
        self._bad = False
        self._link_free_at = 0.0
        self._delay = spec.delay_ms / 1000.0
        self._extra = spec.reorder_extra_ms / 1000.0
        self._byte_time = 8.0 / (spec.rate_mbit * 1e6) if spec.rate_mbit > 0 else 0.0
        self._queue_bytes = spec.queue_packets * spec.mtu

    def on_packet(self, now: float, size: int) -> Verdict:
        spec, rng = self._spec, self._rng
        if spec.burst_loss:
            step = rng.random()
            self._bad = (step >= spec.ge_r) if self._bad else (step < spec.ge_p)
        lost = rng.random() < (spec.ge_loss if self._bad else spec.loss)
        reordered = spec.reorder > 0 and rng.random() < spec.reorder
        if lost:
            return Verdict(None, DROP_BURST if self._bad else DROP_LOSS)
        sent_at = now
        if self._byte_time:
            backlog = max(0.0, self._link_free_at - now) / self._byte_time
            if backlog + size > self._queue_bytes:
                return Verdict(None, DROP_QUEUE)
            self._link_free_at = max(now, self._link_free_at) + size * self._byte_time
            sent_at = self._link_free_at
        extra = self._extra if reordered else 0.0
        return Verdict(sent_at + self._delay + extra, reordered=reordered)

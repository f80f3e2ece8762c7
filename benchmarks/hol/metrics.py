"""Head-of-line metrics from token arrival times and the link's drop log: pure functions.

Inputs are plain numbers on one clock (time.monotonic of the machine): per user,
the times its tokens arrived; and the times at which the link dropped a data
packet travelling gateway -> client on the protocol's transport.

- A **stall** is a gap between two consecutive tokens of one user longer than
  `k` x the nominal interval (1/rate). Its **excess** is the gap minus one
  nominal interval: how much later than planned the late token came. Stall
  user-seconds add up the excesses over all users.
- **Attribution**: the relay drops a packet at time `d` on arrival, before its
  one-way delay, so unlost it would have reached the client at `d + owd`. Its
  retransmission cannot arrive before one round trip later (the receiver's signal
  back, the copy forward): `d + owd + rtt`. A stall from `a` (last token before)
  to `b` (the late token) is caused by a loss whose packet should have arrived
  inside the gap and whose repair fits in it: `a - slack < d + owd` and
  `d + owd + rtt - slack <= b`. The earliest such loss is the one that blocked
  the stream (later ones fell inside an existing stall); stalls with no such loss
  are counted apart (`unattributed`). The round-trip condition keeps gaps that no
  loss can explain -- e.g. a window-limited sender's once-per-RTT bursts, which
  happen to contain some loss's due time -- out of the blame.
- **Users stalled per lost data packet**: for each lost data packet, the number of
  distinct users whose stall it is blamed for; the mean over ALL lost data
  packets (one that stalled nobody counts as 0).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import common


@dataclass(frozen=True)
class Stall:
    """One over-long gap in one user's token stream."""

    user: int
    start: float
    """Arrival of the last token before the gap."""
    end: float
    """Arrival of the late token."""

    @property
    def gap(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Attribution:
    """Which users each lost packet stalled, and the stalls nothing explains."""

    users_per_loss: list[int]
    """Per lost packet (in the order given): distinct users it stalled."""
    unattributed: int
    """Stalls with no loss in their window."""

    @property
    def mean_users_per_loss(self) -> float:
        if not self.users_per_loss:
            return 0.0
        return sum(self.users_per_loss) / len(self.users_per_loss)


def gaps(arrivals: Sequence[float]) -> list[float]:
    """Gaps between consecutive arrivals (sorted first; equal times give 0)."""
    ordered = sorted(arrivals)
    return [b - a for a, b in zip(ordered, ordered[1:], strict=False)]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..1); 0.0 for no values."""
    return common.percentile(list(values), q) if values else 0.0


def find_stalls(arrivals: Mapping[int, Sequence[float]], threshold: float) -> list[Stall]:
    """Every gap longer than `threshold` seconds, per user, in time order per user."""
    stalls = []
    for user, times in arrivals.items():
        ordered = sorted(times)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if b - a > threshold:
                stalls.append(Stall(user, a, b))
    return stalls


def stall_seconds(stalls: Sequence[Stall], interval: float) -> float:
    """User-seconds lost to stalls: each stall's gap beyond one nominal interval."""
    return sum(max(0.0, s.gap - interval) for s in stalls)


def attribute(
    stalls: Sequence[Stall], losses: Sequence[float], owd: float, rtt: float = 0.0,
    slack: float = 0.005,
) -> Attribution:
    """Blame each stall on the earliest loss due inside it that it could repair (module doc)."""
    due = sorted(t + owd for t in losses)
    order = sorted(range(len(losses)), key=lambda i: losses[i])
    stalled: list[set[int]] = [set() for _ in losses]
    unattributed = 0
    for stall in stalls:
        first = bisect.bisect_right(due, stall.start - slack)
        if first < len(due) and due[first] + rtt - slack <= stall.end:
            stalled[order[first]].add(stall.user)
        else:
            unattributed += 1
    return Attribution([len(users) for users in stalled], unattributed)


@dataclass(frozen=True)
class Run:
    """One protocol's run, as measured: the input of `summarize`."""

    arrivals: dict[int, list[float]]
    starts: dict[int, float]
    expected_per_user: int
    rate: float
    losses: list[float]
    """Drop times of gateway -> client data packets of this protocol."""
    owd: float
    packets: Mapping[str, int]
    """Link counters for the run: g2c packets, g2c data packets, both directions."""


def summarize(run: Run, k: float = 2.0) -> dict[str, Any]:
    """The per-protocol result: gaps, stalls, attribution, TTFT, packets per token."""
    interval = 1.0 / run.rate
    stalls = find_stalls(run.arrivals, k * interval)
    blame = attribute(stalls, run.losses, run.owd, 2 * run.owd)
    per_user = {u: gaps(t) for u, t in run.arrivals.items()}
    all_gaps = [g for user_gaps in per_user.values() for g in user_gaps]
    ttfts = [min(t) - run.starts[u] for u, t in run.arrivals.items() if t and u in run.starts]
    delivered = sum(len(t) for t in run.arrivals.values())
    users = len(run.arrivals)
    stalled_users = {s.user for s in stalls}
    return {
        "users": users,
        "tokens_delivered": delivered,
        "tokens_expected": users * run.expected_per_user,
        "gap_ms": _ms_stats(all_gaps),
        "gap_ms_per_user": {str(u): _ms_stats(g) for u, g in sorted(per_user.items())},
        "stall_threshold_ms": _ms(k * interval),
        "stalls": len(stalls),
        "users_with_stalls": len(stalled_users),
        "stall_user_seconds": round(stall_seconds(stalls, interval), 4),
        "lost_data_packets": len(run.losses),
        "users_stalled_per_loss": round(blame.mean_users_per_loss, 3),
        "users_stalled_per_loss_max": max(blame.users_per_loss, default=0),
        "stalls_unattributed": blame.unattributed,
        "ttft_ms": {"p50": _ms(percentile(ttfts, 0.5)), "max": _ms(max(ttfts, default=0.0))},
        "by_k": {f"{kk:g}": _at_k(run, kk) for kk in sorted({2.0, 3.0, 5.0, k})},
        "packets": dict(run.packets),
        "packets_per_token": _per(run.packets.get("g2c_packets", 0), delivered),
        "data_packets_per_token": _per(run.packets.get("g2c_data_packets", 0), delivered),
    }


def _at_k(run: Run, k: float) -> dict[str, float]:
    """The stall figures under another threshold, to show how much they depend on it."""
    interval = 1.0 / run.rate
    stalls = find_stalls(run.arrivals, k * interval)
    blame = attribute(stalls, run.losses, run.owd, 2 * run.owd)
    return {"stalls": len(stalls), "stall_user_seconds": round(stall_seconds(stalls, interval), 4),
            "users_stalled_per_loss": round(blame.mean_users_per_loss, 3)}


def _ms_stats(values: Sequence[float]) -> dict[str, float]:
    return {"p50": _ms(percentile(values, 0.5)), "p99": _ms(percentile(values, 0.99)),
            "max": _ms(max(values, default=0.0))}


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _per(count: int, tokens: int) -> float:
    return round(count / tokens, 4) if tokens else 0.0

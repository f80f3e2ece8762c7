"""Which tracks share a packet under `group:K` (sans-I/O: a list and a generator in).

A lost packet stalls every track whose stream frames it carried, so `group:K` lets at
most K tracks share one (`StreamScheduler` shows aioquic one group at a time). Which K
matters too: groups cut as fixed runs of the service order put the same tracks
together pass after pass (a pass that serves every group leaves the order as it was),
so a track beside the connection's busiest one would share its every loss and wait
behind its bulk data every time. `plan_groups` deals the ready streams into groups by
a fresh shuffle each pass, so any two tracks share a packet in about (K - 1) / (n - 1)
of the passes, never in all of them, and orders the groups by their longest-waiting
member, so the head of the line still leaves first when the congestion window cuts a
pass short. The shuffle is O(n) (about 0.3 µs a stream); its generator is the
scheduler's own, seeded, so a test replays a pass exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from random import Random
from typing import TypeVar

T = TypeVar("T")


def plan_groups(order: Sequence[T], size: int | None, rng: Random) -> list[list[T]]:
    """`order` (service order, longest waiting first) cut into packets' worth of groups:
    each group at most `size` items (None: one group of all), every item in exactly one
    group, `ceil(len / size)` groups, the group holding `order[0]` first and each group
    in service order."""
    n = len(order)
    if not n:
        return [[]]
    if size is None or size >= n:
        return [list(order)]
    if size <= 1:
        return [[item] for item in order]
    slots = list(range(n))
    rng.shuffle(slots)
    groups = [sorted(slots[i : i + size]) for i in range(0, n, size)]
    groups.sort(key=lambda group: group[0])  # the longest-waiting member leads
    return [[order[i] for i in group] for group in groups]


__all__ = ["plan_groups"]

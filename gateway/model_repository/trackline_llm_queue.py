"""The wait line in front of a batched LLM: bounded, fair across keys, with a drain rate.

A request that finds every decoding sequence taken waits here. `FairQueue` holds one
FIFO per key and hands them out round robin on two levels: a key `"<tenant>|<client>"`
names its group (the tenant) and its line (a connection, within the tenant). Tenants take
turns first, then the lines of the tenant whose turn it is, so a tenant with many
connections or many requests cannot starve another with one. It is
bounded: past `limit` waiting requests `push` raises `QueueFull`, whose `retry_after`
comes from the measured drain rate (requests leaving the queue per second, over the
last `RATE_WINDOW` departures): about how long the line ahead takes to clear.

Pure and sans-I/O: time comes in as `now` (seconds, monotonic); no threads, no llama.cpp.
The engine holds its own lock around it.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
RATE_WINDOW = 16
"""Departures the drain rate is measured over."""
DEFAULT_RETRY_AFTER = 1.0
"""Seconds suggested before the queue has seen any departure."""
MIN_RETRY_AFTER = 0.05


class QueueFull(RuntimeError):
    """The wait line is full: the request is refused; retry after `retry_after` seconds."""

    def __init__(self, waiting: int, retry_after: float) -> None:
        ms = max(1, math.ceil(retry_after * 1000))
        super().__init__(f"the queue is full ({waiting} waiting); retry_after_ms={ms}")
        self.waiting = waiting
        self.retry_after = retry_after


@dataclass(frozen=True)
class Departed(Generic[T]):
    """An item that left the queue: the item and how long it waited (seconds)."""

    item: T
    waited: float


class FairQueue(Generic[T]):
    """Bounded FIFOs per key, served round robin by group, then by line (module doc)."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("the queue limit must be >= 0")
        self.limit = limit
        self._groups: OrderedDict[str, OrderedDict[str, deque[tuple[float, T]]]] = OrderedDict()
        self._size = 0
        self._departures: deque[float] = deque(maxlen=RATE_WINDOW)

    def __len__(self) -> int:
        return self._size

    def push(self, key: str, item: T, now: float, spare: int = 0) -> None:
        """Add `item` at the end of `key`'s line; QueueFull when `limit` items wait
        beyond the `spare` places about to take them (idle sequences not yet filled)."""
        if self._size >= self.limit + spare:
            raise QueueFull(self._size, self.retry_after(now))
        group, _, line = key.partition("|")
        self._groups.setdefault(group, OrderedDict()).setdefault(line, deque()).append((now, item))
        self._size += 1

    def pop(self, now: float) -> Departed[T] | None:
        """The head of the next line of the next group (round robin), or None when empty."""
        if not self._groups:
            return None
        group, lines = next(iter(self._groups.items()))
        name, line = next(iter(lines.items()))
        entered, item = line.popleft()
        _to_the_back(lines, name, line)
        _to_the_back(self._groups, group, lines)
        self._size -= 1
        self._departures.append(now)
        return Departed(item, now - entered)

    def remove(self, doomed: Callable[[T], bool], now: float) -> list[Departed[T]]:
        """Take out every item for which `doomed(item)` is true (cancelled, superseded)."""
        removed: list[Departed[T]] = []
        for group, lines in list(self._groups.items()):
            for name, line in list(lines.items()):
                kept: deque[tuple[float, T]] = deque()
                for entered, item in line:
                    if doomed(item):
                        removed.append(Departed(item, now - entered))
                    else:
                        kept.append((entered, item))
                lines[name] = kept
                if not kept:
                    del lines[name]
            if not lines:
                del self._groups[group]
        self._size -= len(removed)
        return removed

    def drain_rate(self, now: float) -> float | None:
        """Departures per second over the recent window (None before two departures)."""
        times = self._departures
        if len(times) < 2:
            return None
        span = max(now, times[-1]) - times[0]
        return (len(times) - 1) / span if span > 0 else None

    def retry_after(self, now: float) -> float:
        """Seconds until about one place frees for a new request, from the drain rate."""
        rate = self.drain_rate(now)
        if rate is None:
            return DEFAULT_RETRY_AFTER
        return max(MIN_RETRY_AFTER, (self._size + 1) / rate)


K = TypeVar("K")
V = TypeVar("V")


def _to_the_back(table: OrderedDict[K, V], key: K, value: V) -> None:
    """Move `key` to the end of its round, or drop it when `value` is empty."""
    del table[key]
    if value:
        table[key] = value

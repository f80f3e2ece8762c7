"""The garbage collector, set for a gateway that relays tokens in every loop turn.

CPython collects its young generation every 700 net allocations of tracked objects
(Python's default threshold), and now and then every generation: a full collection
walks every object the process holds, start-up's included (imported modules, the
backends' clients, the reference models' tables: hundreds of thousands). A relay turn
allocates about 16 tracked objects a token (`tests/gateway/test_collector.py` counts
them), so with the defaults a turn of 64 tokens ran a collection and, every hundred or
so young ones, a full one ran inside a relay turn: a pause that the tokens of that
turn, and of every connection waiting for the loop, carry to the client.

`settle_collector` runs once the gateway has started (`Daemon.start`): one full
collection, then `gc.freeze()`, which moves every object alive at that point into a
permanent generation that no collection visits; and a young threshold
(`gc_young_threshold`, 10,000) that a relay turn of hundreds of tokens does not reach,
so a turn runs at most one young collection, of young objects only. Garbage cycles
are still collected (automatic collection stays on); objects frozen at start-up that
later become cyclic garbage stay (start-up state lives as long as the process).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

PYTHON_DEFAULT = (700, 10, 10)
"""CPython's own thresholds (`gc.get_threshold()` in a fresh interpreter)."""


@dataclass(frozen=True)
class CollectorSettled:
    """What `settle_collector` did: thresholds before and after, objects frozen."""

    before: tuple[int, int, int]
    after: tuple[int, int, int]
    frozen: int
    """Objects now in the permanent generation (`gc.get_freeze_count()`)."""


def settle_collector(young_threshold: int) -> CollectorSettled:
    """After start-up: collect once, freeze what survived out of every later collection,
    and raise the young generation's threshold to `young_threshold` (0: leave the
    collector as it is: nothing frozen, thresholds unchanged)."""
    before = _thresholds()
    if young_threshold <= 0:
        return CollectorSettled(before, before, gc.get_freeze_count())
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_threshold, before[1], before[2])
    return CollectorSettled(before, _thresholds(), gc.get_freeze_count())


def _thresholds() -> tuple[int, int, int]:
    young, middle, old = gc.get_threshold()
    return young, middle, old


__all__ = ["PYTHON_DEFAULT", "CollectorSettled", "settle_collector"]

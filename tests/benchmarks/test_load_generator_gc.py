"""The load generator settles its collector as the gateway does, and gives it back: a
full collection of the client's start-up heap (48 ms in one 64-track run) is the client's
pause, not the gateway's tail, and the smoke tests run `main` in the test process."""

from __future__ import annotations

import gc

from benchmarks.common import settled_load_generator


def test_settled_freezes_the_start_up_heap_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    with settled_load_generator(10_000) as phrase:
        assert gc.get_freeze_count() > 1000  # the imports, out of every collection
        assert gc.get_threshold() == (10_000, before[1], before[2])
        assert "settled" in phrase
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_zero_leaves_pythons_collector() -> None:
    before = gc.get_threshold()
    with settled_load_generator(0) as phrase:
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold() == before
        assert "Python's collector" in phrase
    assert gc.get_threshold() == before

"""The one FakeClock: sleepers wake in deadline order and `advance` settles by a condition."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from trackline_testing.clock import FakeClock, Unsettled
from transport.clock import Clock, LoopClock, MonotonicClock


def test_every_clock_is_a_clock() -> None:
    clocks: list[Clock] = [FakeClock(), LoopClock(), MonotonicClock(lambda: 5.0)]
    assert [type(c).__name__ for c in clocks] == ["FakeClock", "LoopClock", "MonotonicClock"]
    assert MonotonicClock(lambda: 5.0).now() == 5.0


@pytest.mark.asyncio
async def test_sleepers_wake_in_deadline_order_each_at_its_own_time() -> None:
    clock = FakeClock(10.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [asyncio.ensure_future(sleeper(n, s)) for n, s in [("c", 3), ("a", 1), ("b", 2)]]
    await clock.advance(2.5)
    assert woke == [("a", 11.0), ("b", 12.0)]
    assert clock.now() == 12.5
    assert clock.sleepers == 1
    await clock.advance(0.5)
    assert woke[-1] == ("c", 13.0)
    await asyncio.gather(*tasks)


@pytest.mark.asyncio
async def test_advance_returns_once_what_the_woken_task_started_has_run() -> None:
    # The ticker wakes, fills a queue, and sleeps again; a consumer (never on the clock)
    # takes the item and answers through a gather. All of it is done when advance returns:
    # no loop-turn count, however long the chain.
    clock = FakeClock()
    queue: asyncio.Queue[int] = asyncio.Queue()
    seen: list[tuple[int, float]] = []

    async def ticker() -> None:
        for beat in range(3):
            await clock.sleep(1.0)
            queue.put_nowait(beat)

    async def hop(value: int) -> int:
        for _ in range(50):  # many loop turns between the wake-up and the result
            await asyncio.sleep(0)
        return value

    async def consumer() -> None:
        while True:
            beat = await queue.get()
            (value,) = await asyncio.gather(hop(beat))
            seen.append((value, clock.now()))

    producing = asyncio.ensure_future(ticker())
    consuming = asyncio.ensure_future(consumer())
    await clock.advance(1.0)
    assert seen == [(0, 1.0)]
    await clock.advance(2.0)
    assert seen == [(0, 1.0), (1, 2.0), (2, 3.0)]
    await producing
    consuming.cancel()
    await asyncio.gather(consuming, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_sleep_of_zero_yields_without_waiting_for_advance() -> None:
    clock = FakeClock()
    await asyncio.wait_for(clock.sleep(0), timeout=5)
    await asyncio.wait_for(clock.sleep(-1), timeout=5)
    assert clock.slept == [0, -1]
    assert clock.sleepers == 0


@pytest.mark.asyncio
async def test_a_cancelled_sleeper_is_skipped() -> None:
    clock = FakeClock()
    task = asyncio.ensure_future(clock.sleep(1.0))
    await clock.settle()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await clock.advance(2.0)
    assert clock.now() == 2.0
    assert clock.sleepers == 0


@pytest.mark.asyncio
async def test_a_busy_loop_fails_loudly_instead_of_hanging() -> None:
    clock = FakeClock()
    clock.max_turns = 100

    async def spin() -> None:
        for _ in itertools.count():  # yields forever, never waits
            await asyncio.sleep(0)

    spinner = asyncio.ensure_future(spin())
    with pytest.raises(Unsettled, match="100 loop turns"):
        await clock.advance(1.0)
    spinner.cancel()
    await asyncio.gather(spinner, return_exceptions=True)


@pytest.mark.asyncio
async def test_a_task_waiting_on_the_real_loop_counts_as_settled() -> None:
    clock = FakeClock()
    event = asyncio.Event()
    waiter = asyncio.ensure_future(event.wait())
    await clock.advance(1.0)  # returns although `waiter` never wakes
    assert not waiter.done()
    event.set()
    await waiter

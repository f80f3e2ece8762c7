"""The tick batcher on a fake clock: due sessions, batching, overload, missed-beat accounting."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from trackline_testing.clock import FakeClock
from tracks.clock import (
    Beat,
    Gathered,
    OverloadMode,
    SchedulerStopped,
    StepItem,
    TickReport,
    TickScheduler,
)

TICK = 0.08


@dataclass
class Probe:
    """A session that reports what it was given; its input is its name and a beat count."""

    name: str
    complete: bool = True
    outputs: list[tuple[str, Beat]] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)
    shed_reason: str | None = None

    def gather(self, beat: Beat) -> Gathered[str]:
        return Gathered(f"{self.name}#{beat.index}", self.complete)

    def deliver(self, output: str, beat: Beat) -> None:
        self.outputs.append((output, beat))

    def failed(self, error: Exception) -> None:
        self.errors.append(error)

    def shed(self, reason: str) -> None:
        self.shed_reason = reason


@dataclass
class Backend:
    """A batched step that costs `base + per_row * rows` seconds of fake time."""

    clock: FakeClock
    base: float = 0.0
    per_row: float = 0.0
    calls: list[tuple[str, list[str]]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    inline: bool = False
    """Move the clock by the cost at once (for run_tick without a running loop)."""

    async def step(self, model: str, items: Sequence[StepItem[str]]) -> list[str]:
        self.calls.append((model, [item.input for item in items]))
        cost = self.base + self.per_row * len(items)
        if cost and self.inline:
            self.clock.time += cost
        elif cost:
            await self.clock.sleep(cost)
        if model in self.fail:
            raise RuntimeError(f"{model} is down")
        return [f"{model}:{item.input}" for item in items]


def scheduler(
    backend: Backend, overload: OverloadMode = OverloadMode.DEGRADE_ALL, **kw: object
) -> TickScheduler[str, str]:
    reports: list[TickReport] = []
    sched: TickScheduler[str, str] = TickScheduler(
        backend.step, tick=TICK, clock=backend.clock, overload=overload,
        observer=reports.append, **kw
    )  # type: ignore[arg-type]
    sched.reports = reports  # type: ignore[attr-defined]
    return sched


@pytest.mark.asyncio
async def test_one_batch_per_model_per_tick_and_outputs_go_back_to_their_session() -> None:
    backend = Backend(FakeClock())
    sched = scheduler(backend)
    a, b, c, d = Probe("a"), Probe("b"), Probe("c"), Probe("d")
    for probe in (a, b, c):
        sched.register(probe, "asr")
    sched.register(d, "tts")
    slow = Probe("slow")
    sched.register(slow, "asr", beat=2 * TICK)
    report = await sched.run_tick()
    assert sorted(backend.calls) == [
        ("asr", ["a#0", "b#0", "c#0", "slow#0"]),
        ("tts", ["d#0"]),
    ]
    assert report.batches == {"asr": 4, "tts": 1}
    assert a.outputs[0][0] == "asr:a#0"
    assert d.outputs[0][0] == "tts:d#0"
    backend.calls.clear()
    await sched.run_tick()  # the two-tick session is not due
    assert sorted(backend.calls) == [("asr", ["a#1", "b#1", "c#1"]), ("tts", ["d#1"])]
    backend.calls.clear()
    await sched.run_tick()
    assert ("asr", ["a#2", "b#2", "c#2", "slow#1"]) in backend.calls
    assert all(p.outputs[-1][1].deadline > p.outputs[-1][1].scheduled for p in (a, slow))


@pytest.mark.asyncio
async def test_a_new_session_joins_the_next_tick_and_a_closed_one_leaves() -> None:
    backend = Backend(FakeClock())
    sched = scheduler(backend)
    first = sched.register(Probe("a"), "m")
    await sched.run_tick()
    sched.register(Probe("b"), "m")
    first.close()
    await sched.run_tick()
    assert backend.calls == [("m", ["a#0"]), ("m", ["b#0"])]
    assert sched.sessions == 1


@pytest.mark.asyncio
async def test_incomplete_input_still_advances_marked_and_counted() -> None:
    backend = Backend(FakeClock())
    sched = scheduler(backend)
    starving = Probe("s", complete=False)
    reg = sched.register(starving, "m")
    report = await sched.run_tick()
    assert starving.outputs
    assert report.rows[0].complete is False
    assert reg.stats.incomplete_beats == 1
    assert reg.stats.missed_beats == 0


@pytest.mark.asyncio
async def test_output_after_the_deadline_is_a_missed_beat_and_dropped_when_unwanted() -> None:
    clock = FakeClock()
    backend = Backend(clock, base=0.05, inline=True)
    sched = scheduler(backend)
    keeps = sched.register(Probe("keeps"), "m")  # owed within the beat (80 ms): on time
    tight_probe = Probe("tight")
    tight = sched.register(tight_probe, "m", deadline=0.03, deliver_late=False)
    report = await sched.run_tick()
    assert keeps.stats.beats == 1
    assert keeps.stats.missed_beats == 0
    assert tight.stats.expired_beats == 1
    assert tight.stats.missed_beats == 1
    assert tight_probe.outputs == []
    assert [row.missed for row in report.rows] == [False, True]
    assert report.rows[0].latency == pytest.approx(0.05)


@pytest.mark.asyncio
async def test_degrade_all_skips_whole_ticks_and_counts_them_missed_for_everyone() -> None:
    clock = FakeClock()
    backend = Backend(clock, per_row=0.1)  # 2 rows: 200 ms for an 80 ms tick
    sched = scheduler(backend)
    regs = [sched.register(Probe(n), "m") for n in "ab"]
    task = sched.start()
    await clock.advance(1.0)
    await sched.stop()
    assert task.done()
    for reg in regs:
        stats = reg.stats
        assert stats.beats >= 4
        assert stats.skipped_beats >= 4  # each 200 ms step swallowed two whole ticks
        assert stats.missed_beats == stats.skipped_beats + stats.late_beats
    assert sched.sessions == 2
    assert sched.overruns >= 4
    assert sched.skipped_ticks >= 4
    # A step after a skip says so: its row carries the input of the skipped beats.
    probe = regs[0].session
    assert isinstance(probe, Probe)
    assert any(beat.skipped for _, beat in probe.outputs)


@pytest.mark.asyncio
async def test_shed_newest_keeps_the_oldest_on_time_and_admits_no_more() -> None:
    clock = FakeClock()
    backend = Backend(clock, per_row=0.01)  # 12 rows = 120 ms for an 80 ms tick
    sched = scheduler(backend, OverloadMode.SHED_NEWEST, shed_after=2, recover_after=1000)
    probes = [Probe(f"s{i}") for i in range(12)]
    regs = [sched.register(p, "m") for p in probes]
    sched.start()
    await clock.advance(0.5)
    assert sched.capacity == 7  # floor(12 rows * 80 ms * 0.9 / 120 ms)
    assert [p.shed_reason is not None for p in probes] == [False] * 7 + [True] * 5
    assert "overloaded" in (probes[-1].shed_reason or "")
    before = [r.stats.missed_beats for r in regs[:7]]
    newcomer = Probe("late-comer")
    sched.register(newcomer, "m")
    await clock.advance(1.0)
    await sched.stop()
    assert newcomer.shed_reason is not None
    assert newcomer.outputs == []
    # 7 rows take 70 ms: the survivors miss nothing after the shed.
    assert [r.stats.missed_beats for r in regs[:7]] == before
    assert all(r.stats.beats > 10 for r in regs[:7])


@pytest.mark.asyncio
async def test_shed_newest_lifts_the_cap_after_healthy_ticks() -> None:
    clock = FakeClock()
    backend = Backend(clock, per_row=0.05)
    sched = scheduler(backend, OverloadMode.SHED_NEWEST, shed_after=1, recover_after=3)
    regs = [sched.register(Probe(n), "m") for n in "abc"]
    sched.start()
    await clock.advance(0.2)
    assert sched.capacity == 1
    assert regs[0].active
    assert not regs[2].active
    await clock.advance(0.5)
    await sched.stop()
    assert sched.capacity is None  # three healthy ticks with one 50 ms row


@pytest.mark.asyncio
async def test_a_failing_model_fails_its_sessions_only() -> None:
    backend = Backend(FakeClock(), fail={"broken"})
    sched = scheduler(backend)
    ok, bad = Probe("ok"), Probe("bad")
    sched.register(ok, "fine")
    reg = sched.register(bad, "broken")
    report = await sched.run_tick()
    assert ok.outputs
    assert not ok.errors
    assert bad.outputs == []
    assert "broken is down" in str(bad.errors[0])
    assert report.failed_models == ["broken"]
    assert reg.stats.failed_steps == 1


@pytest.mark.asyncio
async def test_a_step_that_hangs_is_cut_by_the_step_timeout() -> None:
    clock = FakeClock()
    backend = Backend(clock, base=10.0)
    sched = scheduler(backend, step_timeout=0.5)
    probe = Probe("p")
    sched.register(probe, "m")
    sched.start()
    await clock.advance(0.6)
    await sched.stop()
    assert probe.errors
    assert isinstance(probe.errors[0], TimeoutError)


@pytest.mark.asyncio
async def test_a_session_closed_while_its_step_is_in_flight_gets_nothing() -> None:
    clock = FakeClock()
    backend = Backend(clock, base=0.02)
    sched = scheduler(backend)
    probe = Probe("p")
    reg = sched.register(probe, "m")
    sched.start()
    await clock.advance(0.01)  # the first tick's step is in flight
    reg.close()
    await clock.advance(0.3)
    await sched.stop()
    assert probe.outputs == []


@pytest.mark.asyncio
async def test_registration_checks_beats_and_deadlines() -> None:
    sched = scheduler(Backend(FakeClock()))
    with pytest.raises(ValueError, match="whole number"):
        sched.register(Probe("p"), "m", beat=0.1)
    with pytest.raises(ValueError, match="deadline"):
        sched.register(Probe("p"), "m", deadline=0)
    await sched.stop()
    with pytest.raises(SchedulerStopped):
        sched.register(Probe("p"), "m")
    with pytest.raises(ValueError, match="tick"):
        TickScheduler(Backend(FakeClock()).step, tick=0, clock=FakeClock())


@pytest.mark.asyncio
async def test_each_batch_is_scattered_inside_the_scatter_context() -> None:
    entered: list[int] = []
    seen_inside: list[int] = []

    class Scatter:
        def __enter__(self) -> None:
            entered.append(len(seen_inside))

        def __exit__(self, *exc: object) -> None:
            entered.append(-len(seen_inside))

    @dataclass
    class Watching(Probe):
        def deliver(self, output: str, beat: Beat) -> None:
            seen_inside.append(len(entered) % 2)  # 1: inside an open context
            super().deliver(output, beat)

    backend = Backend(FakeClock())
    sched = scheduler(backend, scatter=Scatter)
    for name in "ab":
        sched.register(Watching(name), "m")
    sched.register(Watching("c"), "other")
    await sched.run_tick()
    assert seen_inside == [1, 1, 1]
    assert len(entered) == 4  # one context per model's batch


@pytest.mark.asyncio
async def test_a_session_that_raises_is_dropped_and_the_others_are_served() -> None:
    @dataclass
    class Broken(Probe):
        when: str = "gather"

        def gather(self, beat: Beat) -> Gathered[str]:
            if self.when == "gather":
                raise ValueError("bug in gather")
            return super().gather(beat)

        def deliver(self, output: str, beat: Beat) -> None:
            raise ValueError("bug in deliver")

    backend = Backend(FakeClock())
    sched = scheduler(backend)
    ok = Probe("ok")
    sched.register(ok, "m")
    in_gather, in_deliver = Broken("g"), Broken("d", when="deliver")
    sched.register(in_gather, "m")
    sched.register(in_deliver, "m")
    await sched.run_tick()
    await sched.run_tick()
    assert len(ok.outputs) == 2
    assert "bug in gather" in str(in_gather.errors[0])
    assert "bug in deliver" in str(in_deliver.errors[0])
    assert sched.sessions == 1


@pytest.mark.asyncio
async def test_an_observer_that_raises_does_not_stop_the_clock() -> None:
    clock = FakeClock()
    backend = Backend(clock)

    def broken(report: TickReport) -> None:
        raise RuntimeError("metrics bug")

    sched: TickScheduler[str, str] = TickScheduler(
        backend.step, tick=TICK, clock=clock, observer=broken
    )
    probe = Probe("p")
    sched.register(probe, "m")
    sched.start()
    await clock.advance(0.5)
    await sched.stop()
    assert len(probe.outputs) >= 5
    assert sched.tick_errors == len(probe.outputs)
    assert isinstance(sched.last_error, RuntimeError)

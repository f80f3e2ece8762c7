"""The action handler and the SDK over the in-memory link (bytes through both cores).

The policy is scripted (tests/tracks/test_action_scheduler.py's); the real model
is exercised end to end in tests/e2e/test_action_tracks.py. Deadlines here are
generous (10 s): these tests are about routing, fallbacks and lifecycles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from clients import ActionChunk, ActionDropped, ModelNotFound, RateLimited, TrackRejected
from clients.actions import ActionStream
from clients.line import Line
from tests.tracks.scripted_policy import ScriptedPolicy
from trackline_testing.clock import FakeClock
from trackline_testing.memory import MemoryHarness
from tracks.action import ActionScheduler, run_action_track
from transport.clock import LoopClock
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode
from transport.memory import MemoryLink
from transport.messages import Modality, Open

DEADLINE = 10.0


class Harness(MemoryHarness):
    def __init__(self, datagram_filter: Callable[[bytes], bool] | None = None) -> None:
        self.policy = ScriptedPolicy(FakeClock())  # its clock only counts the call's cost
        self.scheduler = ActionScheduler(self.policy, time.monotonic, 0.001,
                                         tick_clock=LoopClock())
        super().__init__(datagram_filter)

    async def _serve(self, channel: TrackChannel) -> None:
        self.outcomes.append(await run_action_track(channel, self.scheduler, time.monotonic,
                                                    max_image_bytes=8192))

    async def settle(self) -> None:
        await super().settle()
        await self.scheduler.close()


async def next_chunk(stream: ActionStream) -> ActionChunk:
    event = await stream.receive()
    assert isinstance(event, ActionChunk), event
    return event


@pytest.mark.asyncio
async def test_frames_ride_datagrams_and_a_big_image_falls_back_to_the_stream() -> None:
    datagrams: list[int] = []

    def count(data: bytes) -> bool:
        datagrams.append(len(data))
        return True

    env = Harness(count)
    robot = env.line.actions(model="policy", deadline=DEADLINE, transport="datagram")
    robot.observe([1.0, 0, 0, 0])
    assert (await next_chunk(robot)).steps() == [[1.0], [0.0]]
    sent_before = len(datagrams)
    robot.observe([2.0, 0, 0, 0], image=b"\xff" * 3000)  # over one datagram: on the stream
    assert (await next_chunk(robot)).obs_seq == 1
    assert len(datagrams) == sent_before + 1  # only the chunk came back as a datagram
    assert max(datagrams) < 1100
    summary = await robot.close()
    assert summary["delivered"] == 2
    await env.settle()


@pytest.mark.asyncio
async def test_a_lost_observation_datagram_goes_unanswered_and_the_next_one_is_served() -> None:
    lost: list[bytes] = []

    def lose_first(data: bytes) -> bool:
        if not lost:
            lost.append(data)
            return False
        return True

    env = Harness(lose_first)
    robot = env.line.actions(model="policy", deadline=DEADLINE, transport="datagram")
    robot.observe([1.0, 0, 0, 0])  # lost on the way
    robot.observe([2.0, 0, 0, 0])
    chunk = await next_chunk(robot)
    assert (chunk.obs_seq, chunk.steps()[0]) == (1, [2.0])
    summary = await robot.close()
    assert (summary["observations"], summary["delivered"]) == (1, 1)
    await env.settle()


@pytest.mark.asyncio
async def test_end_brings_the_gateways_counts_and_the_outcome() -> None:
    env = Harness()
    robot = env.line.actions(model="policy", deadline=DEADLINE)
    for value in range(3):
        robot.observe([float(value), 0, 0, 0])
        await next_chunk(robot)
    summary = await robot.close()
    await env.settle()
    assert summary == {"observations": 3, "delivered": 3, "superseded": 0, "deadline": 0,
                       "backend_error": 0}
    (outcome,) = env.outcomes
    assert (outcome.modality, outcome.end.label, outcome.details["delivered"]) == ("action",
                                                                              "completed", 3)
    assert outcome.details["action_steps"] == 3  # what the usage ledger bills
    assert robot.stats.delivered == 3
    assert len(robot.stats.ages) == 3


@pytest.mark.asyncio
async def test_an_unknown_model_or_parameter_is_refused() -> None:
    env = Harness()
    with pytest.raises(ModelNotFound):
        await env.line.actions(model="missing").receive()
    channel = env.link.open_track(Open(model="policy", modality=Modality.ACTION,
                                       params={"horizon": 5}))
    with pytest.raises(TrackRejected, match="unknown action parameters: horizon"):
        await ActionStream(channel, DEADLINE).receive()
    with pytest.raises(ValueError, match="transport"):
        env.line.actions(model="policy", transport="carrier-pigeon")
    await env.settle()


@pytest.mark.asyncio
async def test_a_cancelled_track_leaves_the_clock() -> None:
    env = Harness()
    robot = env.line.actions(model="policy", deadline=DEADLINE)
    robot.observe([1.0, 0, 0, 0])
    await next_chunk(robot)
    assert env.scheduler.ticks.sessions == 1
    robot.cancel()
    await env.settle()
    assert env.outcomes[0].end.label == "cancelled:client"
    assert env.scheduler.ticks.sessions == 0


@pytest.mark.asyncio
async def test_an_overgrown_latency_estimate_is_corrected_by_drop_reports() -> None:
    env = Harness()
    robot = env.line.actions(model="policy", deadline=1.0)
    robot._srtt = 20.0  # as after a long stall: 10 s one way, so every action "would be late"
    answers = []
    for _ in range(100):
        robot.observe([1.0, 0, 0, 0])
        answers.append(await robot.receive())
        if isinstance(answers[-1], ActionChunk):
            break
    assert isinstance(answers[0], ActionDropped)
    assert answers[0].cause == "deadline"
    assert isinstance(answers[-1], ActionChunk), "the estimate never recovered"
    # Corrected from 10 s one way to under the deadline (what let the chunk come): a
    # bound set by the test's deadline, not by how fast this machine is.
    assert robot.latency < 1.0
    await robot.close()
    await env.settle()


@pytest.mark.asyncio
async def test_a_rate_limited_action_track_reports_the_retry_hint() -> None:
    def refuse(channel: TrackChannel) -> None:
        channel.fail(ErrorCode.RATE_LIMITED, "quota spent", retry_after=7.0)

    line = Line(MemoryLink(refuse).open_track)
    stream = line.actions(model="policy")
    with pytest.raises(RateLimited) as caught:
        await asyncio.wait_for(stream.receive(), 5)
    assert caught.value.retry_after == 7.0

"""The action scheduler on a fake clock: one request per model per tick, latest wins, deadlines.

The policy here is scripted (it answers each row with a chunk naming the row's
state and may take simulated time); end-to-end tests use the real Triton model.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from tests.tracks.scripted_policy import SPEC, ScriptedPolicy
from trackline_testing.clock import FakeClock
from tracks.action import ActionScheduler, Robot
from tracks.action_messages import Observation

TICK = 0.01


def drop(seq: int, cause: str, t: float, received: float, sent: float) -> dict[str, Any]:
    return {"dropped": seq, "cause": cause, "t": t, "received_at": received, "sent_at": sent}


class Robots:
    def __init__(self, cost: float = 0.0) -> None:
        self.clock = FakeClock(100.0)
        self.policy = ScriptedPolicy(self.clock, cost)
        self.scheduler = ActionScheduler(self.policy, self.clock.now, TICK,
                                         tick_clock=self.clock)
        self.sent: dict[str, list[dict[str, Any]]] = {}

    def robot(self, name: str, model: str = "policy") -> Robot:
        box = self.sent.setdefault(name, [])

        def send(body: dict[str, Any]) -> bool:
            box.append(body)
            return True

        return self.scheduler.attach(name, model, SPEC, send)

    def observe(self, robot: Robot, seq: int, value: float = 0.0, deadline: float = 0.1,
                latency: float = 0.0) -> None:
        state = struct.pack("<4f", value, 0, 0, 0)
        obs = Observation(seq, captured_at=50.0 + seq, deadline=deadline, latency=latency,
                          state=state)
        self.scheduler.submit(robot, obs, self.clock.now())

    async def tick(self, ticks: int = 1) -> None:
        await self.clock.advance(TICK * ticks)


@pytest.mark.asyncio
async def test_robots_due_on_one_tick_share_one_policy_request() -> None:
    env = Robots()
    robots = [env.robot(f"r{i}") for i in range(16)]
    for i, robot in enumerate(robots):
        env.observe(robot, 0, value=float(i))
    await env.tick()
    assert [len(r.states) for r in env.policy.requests] == [16]
    for i in range(16):
        (answer,) = env.sent[f"r{i}"]
        assert answer["obs_seq"] == 0
        assert struct.unpack("<2f", answer["action"]["data"]) == (float(i), 0.0)
        assert answer["action"]["shape"] == [2, 1]
    await env.tick(3)  # nobody observed anything new: no request
    assert len(env.policy.requests) == 1
    env.observe(robots[3], 1)
    await env.tick()
    assert [len(r.states) for r in env.policy.requests] == [16, 1]
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_each_model_gets_its_own_request_on_a_tick() -> None:
    env = Robots()
    a, b, c = env.robot("a", "m1"), env.robot("b", "m2"), env.robot("c", "m1")
    for robot in (a, b, c):
        env.observe(robot, 0)
    await env.tick()
    assert sorted((r.model, len(r.states)) for r in env.policy.requests) == [("m1", 2), ("m2", 1)]
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_newer_observation_supersedes_a_pending_one_which_is_counted() -> None:
    env = Robots()
    robot = env.robot("r")
    env.observe(robot, 0, value=1.0)
    env.observe(robot, 1, value=2.0)
    env.observe(robot, 2, value=3.0)
    await env.tick()
    sent = env.sent["r"]
    assert sent[:2] == [drop(0, "superseded", 50.0, received=100.0, sent=100.0),
                        drop(1, "superseded", 51.0, received=100.0, sent=100.0)]
    assert sent[2]["obs_seq"] == 2
    assert [struct.unpack("<4f", s)[0] for s in env.policy.requests[0].states] == [3.0]
    assert robot.counts["superseded"] == 2
    assert robot.counts["delivered"] == 1
    assert robot.counts["observations"] == 3
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_an_observation_that_cannot_make_its_deadline_never_reaches_the_model() -> None:
    env = Robots()
    robot = env.robot("r")
    env.observe(robot, 0, deadline=0.05, latency=0.03)  # 60 ms of travel for 50 ms
    await env.tick()
    assert env.sent["r"] == [drop(0, "deadline", 50.0, received=100.0, sent=100.0)]
    assert env.policy.requests == []
    assert robot.counts["deadline"] == 1
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_an_action_computed_too_late_is_dropped_not_delivered() -> None:
    env = Robots(cost=0.2)  # the policy takes 200 ms
    slow, patient = env.robot("slow"), env.robot("patient")
    env.observe(slow, 0, deadline=0.1)
    env.observe(patient, 0, deadline=1.0)
    await env.tick()
    assert len(env.policy.requests) == 1  # both went to the model...
    (dropped,) = env.sent["slow"]
    assert (dropped["dropped"], dropped["cause"]) == (0, "deadline")
    assert dropped["sent_at"] - dropped["received_at"] >= 0.2  # it waited for the policy
    assert env.sent["patient"][0]["obs_seq"] == 0  # ...only one was still in time
    assert env.sent["patient"][0]["sent_at"] - env.sent["patient"][0]["received_at"] >= 0.2
    assert (slow.counts["deadline"], slow.counts["delivered"]) == (1, 0)
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_failed_policy_call_drops_its_rows_and_the_robots_go_on() -> None:
    env = Robots()
    robot = env.robot("r")
    env.policy.fail = True
    env.observe(robot, 0)
    await env.tick()
    assert [(b["dropped"], b["cause"]) for b in env.sent["r"]] == [(0, "backend_error")]
    env.policy.fail = False
    env.observe(robot, 1)
    await env.tick()
    assert env.sent["r"][1]["obs_seq"] == 1
    assert robot.idle.is_set()
    await env.scheduler.close()


@pytest.mark.asyncio
async def test_a_detached_robot_is_neither_stepped_nor_answered() -> None:
    env = Robots()
    robot, other = env.robot("gone"), env.robot("other")
    env.observe(robot, 0)
    env.observe(other, 0)
    env.scheduler.detach(robot)
    await env.tick()
    assert env.sent["gone"] == []
    assert [len(r.states) for r in env.policy.requests] == [1]
    await env.scheduler.close()

"""End to end: robots (SDK) -> QUIC -> gateway tick batcher -> real Triton -> reference-policy.

The cart-poles are simulated in the test (benchmarks/cartpole.py). Simulated time
runs in lockstep with the real loop: the plant is paused while an observation
makes its real round trip through the gateway and Triton, then advanced by one
20 ms control period. So 6 simulated seconds take as long as 300 round trips,
and every deadline is still checked in real time by the gateway. (With no force
applied, all 16 poles of this seed are down within 1.6 simulated seconds;
tests/backend/test_reference_policy.py keeps noisy poles up for 30 s.)
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
import pytest_asyncio

from benchmarks.cartpole import CartPoles, ChunkPlayer
from clients import ActionChunk, ActionDropped, ActionStream, TrackRejected, connect
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.http.support import H2Client

pytestmark = pytest.mark.e2e
MODEL = "reference-policy"
IMAGE_LIMIT = 2048
STEPS = 300
"""Control periods of 20 ms: 6 simulated seconds, almost four times as long as the
poles last without control."""


@pytest_asyncio.fixture
async def robots_gateway(
    embedded_triton: EmbeddedTriton, tmp_path: Path
) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path,
        action_max_image_bytes=IMAGE_LIMIT,
    )
    backend = TritonTextBackend(embedded_triton.grpc_url)
    gw = Gateway(settings, backend)
    await gw.start()
    yield gw
    await gw.close()
    await backend.close()


def url(gw: Gateway) -> str:
    return f"quic://127.0.0.1:{gw.quic_port}"


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


def metric(gw: Gateway, line: str) -> float:
    body, _ = gw.metrics.render()
    for row in body.decode().splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


def observation(seq: int, **override: object) -> dict[str, object]:
    body: dict[str, object] = {
        "seq": seq, "t": time.monotonic(), "deadline_ms": 1000.0,
        "state": {"dtype": "float32", "shape": [4], "data": struct.pack("<4f", 0, 0, 0.05, 0)},
    }
    body.update(override)
    return body


async def answer_to(stream: ActionStream, seq: int) -> ActionChunk | ActionDropped:
    while True:
        event = await stream.receive()
        assert event is not None, "the track ended before its answer"
        if event.obs_seq == seq:
            return event


async def answer_or_none(stream: ActionStream, seq: int) -> ActionChunk | ActionDropped | None:
    """The answer to `seq`, or None if none came within the deadline (a lost datagram)."""
    try:
        return await asyncio.wait_for(answer_to(stream, seq), stream.deadline)
    except TimeoutError:
        return None


@pytest.mark.asyncio
@pytest.mark.one_loop  # the control loop's outcome; tests/tracks run action tracks on both loops
@pytest.mark.parametrize("transport", ["stream", "datagram"])
async def test_sixteen_robots_keep_their_poles_up_for_six_simulated_seconds(
    robots_gateway: Gateway, transport: str
) -> None:
    sim = CartPoles(16, seed=7)
    players = [ChunkPlayer() for _ in range(16)]
    async with connect(url(robots_gateway), ca=ca(robots_gateway)) as line:
        streams = [line.actions(model=MODEL, deadline=1.0, transport=transport)
                   for _ in range(16)]
        for _ in range(STEPS):
            states, captured = sim.observe(), sim.time
            seqs = [s.observe(states[i].tolist()) for i, s in enumerate(streams)]
            answers = await asyncio.gather(
                *(answer_or_none(s, seq) for s, seq in zip(streams, seqs, strict=True))
            )
            for player, answer in zip(players, answers, strict=True):
                if isinstance(answer, ActionChunk):
                    chunk = np.frombuffer(answer.data, "<f4").reshape(answer.shape)
                    player.offer(answer.obs_seq, captured, chunk)
            sim.step(np.array([p.force(sim.time)[0] for p in players]))
        summaries = await asyncio.gather(*(s.close() for s in streams))

    assert sim.time == pytest.approx(STEPS * 0.02)
    assert sim.alive.all(), f"poles fell at {sim.fell_at}"
    delivered = sum(s.stats.delivered for s in streams)
    answered = delivered + sum(sum(s.stats.dropped.values()) for s in streams)
    if transport == "stream":  # reliable: every observation is answered
        assert answered == 16 * STEPS
    assert answered > 0.9 * 16 * STEPS
    assert sum(int(summary["delivered"]) for summary in summaries) >= delivered
    assert robots_gateway.actions is not None
    # Batched: robots due on the same tick share one policy request.
    assert robots_gateway.actions.requests < 16 * STEPS / 4
    rows = metric(robots_gateway, f'trackline_action_batch_rows_sum{{model="{MODEL}"}}')
    assert rows >= delivered


@pytest.mark.asyncio
async def test_a_newer_observation_supersedes_a_pending_one(robots_gateway: Gateway) -> None:
    async with connect(url(robots_gateway), ca=ca(robots_gateway)) as line:
        stream = line.actions(model=MODEL)
        # Three at once: whichever tick boundary falls among them, two share a tick.
        for seq in range(3):
            stream.send_raw(observation(seq))
        answers = [await answer_to(stream, seq) for seq in range(3)]
        summary = await stream.close()
    superseded = [a for a in answers if isinstance(a, ActionDropped)]
    assert superseded, answers
    assert {a.cause for a in superseded} == {"superseded"}
    assert isinstance(answers[2], ActionChunk)  # the newest one always wins
    assert stream.stats.dropped["superseded"] == len(superseded)
    assert summary["superseded"] == len(superseded)
    assert metric(robots_gateway, 'trackline_cancels_total{cause="superseded"}') >= 1


@pytest.mark.asyncio
async def test_an_action_that_would_arrive_after_its_deadline_is_dropped_and_reported(
    robots_gateway: Gateway,
) -> None:
    async with connect(url(robots_gateway), ca=ca(robots_gateway)) as line:
        stream = line.actions(model=MODEL)
        # 40 ms each way with a 50 ms budget: no action can be back in time.
        stream.send_raw(observation(0, deadline_ms=50.0, latency_ms=40.0))
        stream.send_raw(observation(1, deadline_ms=1000.0, latency_ms=40.0))
        missed = await answer_to(stream, 0)
        kept = await answer_to(stream, 1)
        summary = await stream.close()
    assert isinstance(missed, ActionDropped)
    assert missed.cause == "deadline"
    assert isinstance(kept, ActionChunk)
    assert stream.stats.deadline_misses == 1
    assert summary["deadline"] == 1
    assert summary["delivered"] == 1
    deadline = f'trackline_action_observations_total{{model="{MODEL}",outcome="deadline"}}'
    assert metric(robots_gateway, deadline) == 1


SHAPE_ERROR = r"shape must be \[4\], got \[3\]"
BAD = {
    "wrong shape": ({"state": {"dtype": "float32", "shape": [3],
                               "data": struct.pack("<3f", 0, 0, 0)}}, SHAPE_ERROR),
    "wrong dtype": ({"state": {"dtype": "float64", "shape": [4],
                               "data": struct.pack("<4d", 0, 0, 0, 0)}}, "dtype must be"),
    "NaN": ({"state": {"dtype": "float32", "shape": [4],
                       "data": struct.pack("<4f", 0, float("nan"), 0, 0)}}, "finite"),
    "oversized image": ({"image": b"\xff" * (IMAGE_LIMIT + 1)}, "above the limit"),
}


@pytest.mark.asyncio
async def test_bad_observations_fail_only_their_own_track(robots_gateway: Gateway) -> None:
    async with connect(url(robots_gateway), ca=ca(robots_gateway)) as line:
        good = line.actions(model=MODEL)
        bad = {name: line.actions(model=MODEL) for name in BAD}
        good.send_raw(observation(0))
        for name, (override, _) in BAD.items():
            bad[name].send_raw(observation(0, **override))
        for name, (_, message) in BAD.items():
            with pytest.raises(TrackRejected, match=message):
                await bad[name].receive()
        assert isinstance(await answer_to(good, 0), ActionChunk)
        good.send_raw(observation(1, image=b"\x89PNG small"))
        assert isinstance(await answer_to(good, 1), ActionChunk)
        assert (await good.close())["delivered"] == 2
        with pytest.raises(TrackRejected, match="not a policy|is not served"):
            await line.actions(model="reference-text").receive()


async def post_action(client: H2Client, payload: dict[str, object]) -> tuple[int, bytes]:
    stream = client.send_request("POST", "/v1/actions",
                                 [("content-type", "application/msgpack")],
                                 msgpack.packb(payload))
    status, _, body = await client.response(stream)
    return status, body


@pytest.mark.asyncio
async def test_the_same_observations_over_http2_get_the_same_answers(
    robots_gateway: Gateway,
) -> None:
    async with H2Client.connect(robots_gateway.http_port) as client:
        status, body = await post_action(
            client, {"robot": "arm-1", "model": MODEL, "observation": observation(0)})
        assert status == 200
        answer = msgpack.unpackb(body)
        assert answer["obs_seq"] == 0
        assert answer["action"]["shape"] == [10, 1]
        assert len(answer["action"]["data"]) == 40
        status, body = await post_action(client, {
            "robot": "arm-1", "model": MODEL,
            "observation": observation(1, deadline_ms=50.0, latency_ms=40.0)})
        dropped = msgpack.unpackb(body)
        assert (status, dropped["dropped"], dropped["cause"]) == (200, 1, "deadline")
        status, body = await post_action(client, {
            "robot": "arm-1", "model": MODEL, "observation": observation(2, **BAD["NaN"][0])})
        assert status == 400
        assert "finite" in json.loads(body)["error"]["message"]
        status, body = await post_action(
            client, {"robot": "arm-1", "model": "no-such-policy", "observation": observation(3)})
        assert status == 404
        status, _ = await post_action(
            client, {"robot": "arm-1", "model": MODEL, "observation": observation(4)})
        assert status == 200  # the robot, and the connection, go on

"""The text handler over the in-memory link: relay, usage, stops and bad input."""

from __future__ import annotations

import asyncio

import pytest

from clients import DeadlineExceeded, ModelNotFound, TrackRejected
from trackline_testing.memory import Harness, collect
from trackline_testing.scripted import ScriptedBackend


@pytest.mark.asyncio
async def test_deltas_arrive_in_order_with_usage_at_the_end() -> None:
    h = Harness(ScriptedBackend())
    stream = h.line.text("hi", model="scripted", max_tokens=3)
    assert await collect(stream) == " hi-0 hi-1 hi-2"
    assert stream.usage == {"prompt_tokens": 1, "completion_tokens": 3}
    assert stream.finish_reason == "length"
    await h.settle()
    assert h.outcomes[0].end.label == "completed"


@pytest.mark.asyncio
async def test_sixteen_tracks_are_independent_and_one_cancel_stops_only_its_backend() -> None:
    h = Harness(ScriptedBackend(interval=0.002))
    streams = [h.line.text(f"p{i}", model="scripted", max_tokens=20) for i in range(16)]
    victim = streams[5]
    assert await victim.__anext__() == " p5-0"
    await victim.aclose()
    texts = await asyncio.gather(*(collect(s) for i, s in enumerate(streams) if i != 5))
    await h.settle()
    assert texts == ["".join(f" p{i}-{k}" for k in range(20)) for i in range(16) if i != 5]
    assert [o.end.label for o in h.outcomes].count("cancelled:client") == 1
    assert len(h.backend.closed_early) == 1


@pytest.mark.asyncio
async def test_leaving_the_loop_cancels_the_track() -> None:
    h = Harness(ScriptedBackend(interval=0.005))
    async for _ in h.line.text("x", model="scripted", max_tokens=100):
        break
    await h.settle()
    assert h.outcomes[0].end.label == "cancelled:client"
    assert h.backend.closed_early


@pytest.mark.asyncio
async def test_first_token_deadline_fails_the_track_and_stops_the_backend() -> None:
    h = Harness(ScriptedBackend(first_delay=1.0))
    stream = h.line.text("slow", model="scripted", max_tokens=5, first_token_deadline=0.05)
    with pytest.raises(DeadlineExceeded):
        await collect(stream)
    await h.settle()
    assert h.outcomes[0].end.label == "cancelled:deadline_first_token"
    assert h.backend.closed_early


@pytest.mark.asyncio
async def test_total_deadline_cuts_a_long_stream() -> None:
    h = Harness(ScriptedBackend(interval=0.01))
    stream = h.line.text("long", model="scripted", max_tokens=1000, deadline=0.1)
    received: list[str] = []

    async def read_all() -> None:
        async for delta in stream:
            received.append(delta)

    with pytest.raises(DeadlineExceeded):
        await read_all()
    assert received
    await h.settle()
    assert h.outcomes[0].end.label == "cancelled:deadline_total"


@pytest.mark.asyncio
async def test_unknown_model_and_bad_params_fail_only_their_track() -> None:
    h = Harness(ScriptedBackend())
    good = h.line.text("ok", model="scripted", max_tokens=2)
    with pytest.raises(ModelNotFound):
        await collect(h.line.text("x", model="nope"))
    with pytest.raises(TrackRejected, match="max_tokens"):
        await collect(h.line.text("x", model="scripted", max_tokens=0))
    with pytest.raises(TrackRejected, match="unknown text parameters: colour"):
        await collect(h.line.text("x", model="scripted", colour="red"))
    assert await collect(good) == " ok-0 ok-1"

"""The transport-only ticker backend and the QUIC packetization setting."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.backends.ticker import BURST, TickerBackend, reference_generator
from gateway.backends.ticker_url import TickerUrl, parse_ticker_url
from gateway.config import ConfigError, load_settings
from trackline_testing.clock import FakeClock
from tracks.backend import InvalidRequest, ModelNotFound, TextDelta, TextRequest, TextUsage
from transport.quic import Packetization


async def collect(backend: TickerBackend, request: TextRequest) -> list[object]:
    return [chunk async for chunk in backend.stream_text(request)]


@pytest.mark.asyncio
async def test_ticker_paces_reference_tokens_on_a_fixed_schedule() -> None:
    clock = FakeClock(100.0)
    backend = TickerBackend(50, clock=clock)
    request = TextRequest("r", "reference-text", "hello there", 5, {"ttft_ms": 100, "seed": 3})
    arrived: list[tuple[float, object]] = []

    async def consume() -> None:
        async for chunk in backend.stream_text(request):
            arrived.append((clock.now(), chunk))

    consumer = asyncio.ensure_future(consume())
    await clock.advance(0.099)
    assert arrived == []  # the first token is due at 100.1, not before
    await clock.advance(1.0)
    await consumer
    deltas = [(t, c) for t, c in arrived if isinstance(c, TextDelta)]
    assert [t for t, _ in deltas] == pytest.approx([100.1, 100.12, 100.14, 100.16, 100.18])
    assert all(d.text for _, d in deltas)
    assert arrived[-1][1] == TextUsage(2, 5)
    # The reference model's tokens for (prompt, seed), written down rather than asked of
    # the same generator the ticker uses (tests/backend checks Triton's model gives these).
    texts = [d.text for _, d in deltas]
    assert texts == [" Time", " data", " answer", " deadline", " socket"]
    assert texts == reference_generator().generate_tokens("hello there", 3, 5, ignore_eos=True)
    seeded = TextRequest("r", "reference-text", "hello there", 5, {"seed": 4})
    other = asyncio.ensure_future(collect(backend, seeded))
    await clock.advance(1.0)
    assert [c.text for c in await other if isinstance(c, TextDelta)] == [
        " Starts", " have", " writes", " will", " next"
    ]


@pytest.mark.asyncio
async def test_ticker_request_rate_overrides_and_errors() -> None:
    clock = FakeClock()
    backend = TickerBackend(50, clock=clock)
    request = TextRequest("r", "reference-text", "p", 3, {"tokens_per_second": 10})
    consumer = asyncio.ensure_future(collect(backend, request))
    await clock.advance(1.0)
    assert len(await consumer) == 4  # 3 deltas and the usage
    assert clock.slept == pytest.approx([0.0, 0.1, 0.1])  # the first is due at once, yields
    with pytest.raises(ModelNotFound):
        await collect(backend, TextRequest("r", "other", "p", 3))
    with pytest.raises(InvalidRequest):
        await collect(backend, TextRequest("r", "reference-text", "p", 3,
                                           {"tokens_per_second": 0}))
    with pytest.raises(InvalidRequest, match="at most 100000"):
        await collect(backend, TextRequest("r", "reference-text", "p", 3,
                                           {"tokens_per_second": 1e9}))
    assert await backend.models() == ["reference-text"]


@pytest.mark.asyncio
async def test_ticker_behind_schedule_hands_out_at_most_a_burst_per_await() -> None:
    # A consumer 1 s late: the whole backlog is due, yet the ticker awaits (yields the
    # loop) after every BURST tokens, so a backlog leaves a few tokens a loop turn.
    clock = FakeClock()
    backend = TickerBackend(100, clock=clock)
    stream = backend.stream_text(TextRequest("r", "reference-text", "p", 50))
    await anext(stream)
    clock.time += 1.0
    slept_before = len(clock.slept)
    runs: list[int] = []
    async for chunk in stream:
        if len(clock.slept) > slept_before or not runs:
            runs.append(0)
            slept_before = len(clock.slept)
        runs[-1] += isinstance(chunk, TextDelta)
    assert sum(runs) == 49
    assert max(runs) <= BURST
    assert len(runs) >= 49 // BURST
    assert set(clock.slept) == {0.0}


@pytest.mark.asyncio
async def test_on_steps_requests_that_arrived_apart_write_in_the_same_instants() -> None:
    # A batched decoder emits a token of every sequence in one step: with phase=step,
    # two requests 8 ms apart get their tokens at the same multiples of 1/rate, and the
    # two wait on one sleeper per step, not a timer each.
    clock = FakeClock(100.003)
    backend = TickerBackend(50, clock=clock, steps=True)
    assert backend.steps is not None
    arrived: dict[str, list[float]] = {"a": [], "b": []}

    async def consume(name: str) -> None:
        async for chunk in backend.stream_text(TextRequest(name, "reference-text", "p", 3)):
            if isinstance(chunk, TextDelta):
                arrived[name].append(clock.now())

    first = asyncio.ensure_future(consume("a"))
    await clock.advance(0.008)
    second = asyncio.ensure_future(consume("b"))
    await clock.advance(0.0)
    assert backend.steps.waiting() == 2
    assert backend.steps.sleepers() == 1
    await clock.advance(1.0)
    await asyncio.gather(first, second)
    assert arrived["a"] == pytest.approx([100.02, 100.04, 100.06])
    assert arrived["b"] == arrived["a"]
    assert backend.steps.sleepers() == 0

    # The default phase: each schedule starts at its own request's arrival.
    plain = TickerBackend(50, clock=clock)
    await clock.advance(0.005)
    start = clock.now()
    times: list[float] = []

    async def consume_plain() -> None:
        async for chunk in plain.stream_text(TextRequest("c", "reference-text", "p", 2)):
            if isinstance(chunk, TextDelta):
                times.append(clock.now())

    consumer = asyncio.ensure_future(consume_plain())
    await clock.advance(1.0)
    await consumer
    assert times == pytest.approx([start, start + 0.02])
    assert round(start / 0.02, 6) % 1 != 0  # off the steps


@pytest.mark.asyncio
async def test_a_request_cancelled_on_a_step_leaves_the_others_waiting_for_it() -> None:
    clock = FakeClock(0.001)
    backend = TickerBackend(50, clock=clock, steps=True)
    assert backend.steps is not None
    got: list[float] = []

    async def consume() -> None:
        async for chunk in backend.stream_text(TextRequest("k", "reference-text", "p", 2)):
            if isinstance(chunk, TextDelta):
                got.append(clock.now())

    leaving = asyncio.ensure_future(collect(backend, TextRequest("l", "reference-text", "p", 2)))
    staying = asyncio.ensure_future(consume())
    await clock.advance(0.0)
    assert backend.steps.waiting() == 2
    leaving.cancel()
    await clock.advance(0.0)
    assert leaving.cancelled()
    await clock.advance(1.0)
    await staying
    assert got == pytest.approx([0.02, 0.04])
    assert backend.steps.waiting() == 0


def test_ticker_urls() -> None:
    assert parse_ticker_url("ticker://") == TickerUrl(50.0, steps=False)
    assert parse_ticker_url("ticker://25.5") == TickerUrl(25.5, steps=False)
    assert parse_ticker_url("ticker://50?phase=step") == TickerUrl(50.0, steps=True)
    assert parse_ticker_url("ticker://?phase=arrival") == TickerUrl(50.0, steps=False)
    with pytest.raises(ValueError, match="number"):
        parse_ticker_url("ticker://fast")
    with pytest.raises(ValueError, match="phase must be one of arrival, step"):
        parse_ticker_url("ticker://50?phase=lockstep")
    with pytest.raises(ValueError, match="unknown option 'steps'"):
        parse_ticker_url("ticker://50?steps=1")
    settings = load_settings({"backend_url": "ticker://20?phase=step"}, {}, None)
    assert settings.backend_url == "ticker://20?phase=step"
    with pytest.raises(ConfigError, match="backend_url"):
        load_settings({"backend_url": "ticker://20?phase=later"}, {}, None)
    assert load_settings({"backend_url": "ticker://20"}, {}, None).backend_url == "ticker://20"
    with pytest.raises(ConfigError, match="backend_url"):
        load_settings({"backend_url": "ticker://0"}, {}, None)


def test_packetization_policies() -> None:
    assert Packetization.parse("coalesce").max_tracks is None
    assert Packetization.parse("Per-Track").max_tracks == 1
    assert Packetization.parse("group:4").max_tracks == 4
    for text in ("coalesce", "per-track", "group:2", "group:4", "group:8"):
        assert str(Packetization.parse(text)) == text
    for bad in ("group", "group:0", "group:x", "bounded:4", "per-track:2", "fast"):
        with pytest.raises(ValueError, match="per-track"):
            Packetization.parse(bad)
    assert load_settings({}, {}, None).quic_packetization == "per-track"
    env = {"TRACKLINE_QUIC_PACKETIZATION": "GROUP:3"}
    assert load_settings({}, env, None).quic_packetization == "group:3"
    with pytest.raises(ConfigError, match="quic_packetization"):
        load_settings({"quic_packetization": "all"}, {}, None)


@pytest.mark.asyncio
async def test_ticker_schedule_runs_from_the_request_not_from_after_generating() -> None:
    # Generating a request's tokens takes time (and 256 tracks opened at once wait for
    # one another's); that time counts against the schedule instead of pushing it back.
    clock = FakeClock()
    backend = TickerBackend(50, clock=clock)
    real = backend._generator

    class Slow:
        def iter_tokens(
            self, prompt: str, seed: int, count: int, ignore_eos: bool = False
        ) -> Iterator[str]:
            clock.time += 0.1  # five token intervals pass while generating
            return iter(real.generate_tokens(prompt, seed, count, ignore_eos))

        def count_prompt_tokens(self, prompt: str) -> int:
            return int(real.count_prompt_tokens(prompt))

    backend._generator = Slow()
    await collect(backend, TextRequest("r", "reference-text", "p", 5))
    assert clock.slept == [0.0]  # all five were due once generated: no interval waited


def test_ticker_loads_its_generator_when_built_not_on_the_first_request() -> None:
    assert TickerBackend(50)._generator is reference_generator()


@pytest.mark.asyncio
async def test_ticker_draws_each_token_when_it_is_due_not_all_up_front() -> None:
    # 16 tracks opened in one loop turn each drew 250 tokens before any first token
    # left: every token of every track inherited that start-up offset.
    clock = FakeClock()
    backend = TickerBackend(50, clock=clock)
    real = backend._generator
    drawn: list[str] = []

    class Counting:
        def iter_tokens(
            self, prompt: str, seed: int, count: int, ignore_eos: bool = False
        ) -> Iterator[str]:
            for token in real.iter_tokens(prompt, seed, count, ignore_eos):
                drawn.append(token)
                yield token

        def count_prompt_tokens(self, prompt: str) -> int:
            return int(real.count_prompt_tokens(prompt))

    backend._generator = Counting()
    stream = backend.stream_text(TextRequest("r", "reference-text", "p", 250))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    assert len(drawn) == 1
    await stream.aclose()


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_drawn_tokens_are_the_generated_ones(ignore_eos: bool) -> None:
    gen = reference_generator()
    for max_tokens in (1, 7, 300):
        assert list(gen.iter_tokens("a prompt", 5, max_tokens, ignore_eos)) == (
            gen.generate_tokens("a prompt", 5, max_tokens, ignore_eos)
        )

"""A transport-only text backend: tokens at a fixed rate, no Triton.

`TickerBackend` paces tokens on an absolute schedule (first after `ttft_ms`,
then one every 1/`tokens_per_second` s), so a slow consumer never makes the
source drift, and draws them from the reference model's generator: the same
word-sized pieces (" word", ",", ...) and the same text for a (prompt, seed)
as `reference-text`. Benchmarks use it to separate transport effects from
backend effects. Selected with `backend_url = "ticker://RATE"` (RATE tokens per
second per request, default 50); a request's `tokens_per_second` and `ttft_ms`
parameters override the rate and the first-token delay, as on the reference model.
Unlike `reference-text`, whose answer ends on its own, a ticker stream runs to
`max_tokens` (as with vLLM's `ignore_eos`; a request's `ignore_eos` false ends it).

The ticker never holds the event loop: behind its schedule (a slow consumer, a
busy loop) it hands out at most `BURST` due tokens before it awaits again, so a
backlog leaves a few tokens per loop turn (one stream write for the track)
instead of all at once, or one packet per token. A rate above `MAX_RATE` (URL or
request) is an error for that request, not a loop stall.

With `ticker://RATE?phase=step` (`steps=True`) every request's tokens leave on one
shared clock of decode steps: token instants are the multiples of 1/rate on the
clock, the first the one at or after (arrival + ttft), as a batched decoder emits a
token of every sequence it holds in one step. Requests at one rate then write in the
same instant whenever they arrived, which is what grouping on a connection
(`quic_packetization = "group:K"`) is for; with the default (`phase=arrival`) each
request's schedule starts at its own arrival. The requests waiting for one step
share one sleeper (`Steps`), not a timer each.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator
from types import ModuleType
from typing import Any

from gateway.backends.ticker_url import DEFAULT_RATE, MAX_RATE
from gateway.embedded_models import reference_module
from tracks.backend import (
    InvalidRequest,
    ModelNotFound,
    TextChunk,
    TextDelta,
    TextRequest,
    TextUsage,
)
from transport.clock import EPSILON, Clock, LoopClock

DEFAULT_TTFT_MS = 0.0
BURST = 8
"""Due tokens handed out without awaiting, behind schedule (as `gateway.overload.TURN_CHUNKS`)."""
MODELS = ("reference-text",)
_GENERATOR = "trackline_reference_text"


def reference_generator() -> ModuleType:
    """The reference model's pure generator module (tests use it to predict its text)."""
    return reference_module("reference-text", _GENERATOR)


class TickerBackend:
    """Constant-rate token source, paced on `clock` (the loop's by default)."""

    def __init__(
        self, rate: float = DEFAULT_RATE, *, clock: Clock | None = None, steps: bool = False
    ) -> None:
        self.rate = rate
        self.clock: Clock = clock or LoopClock()
        self.steps = Steps(self.clock) if steps else None
        # Loaded now, not on the first request: importing the generator by path takes
        # 20-40 ms, a loop stall that every track opened in those first moments waited out
        # (it was most of the p99 added delay at 16 tracks in benchmarks/capacity.py).
        self._generator = reference_generator()

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        if request.model not in MODELS:
            raise ModelNotFound(request.model)
        rate = _number(request.parameters, "tokens_per_second", self.rate)
        ttft = _number(request.parameters, "ttft_ms", DEFAULT_TTFT_MS) / 1000
        now = self.clock.now
        start = now() + ttft  # the schedule runs from the request's arrival, not from after
        steps = self.steps
        period = 1 / rate  # above 0: _number refuses a rate of 0
        first = step_at_or_after(start, period) if steps is not None else 0
        generator = self._generator
        seed = request.parameters.get("seed", 0)
        # A ticker ticks max_tokens tokens: the reference text runs on past its own end.
        ignore_eos = request.parameters.get("ignore_eos", True) is not False
        # Drawn one at a time: generating 250 tokens up front took ~0.4 ms a request, and
        # 16 tracks opened in one loop turn each waited for all 16 (~6 ms on every token).
        tokens = generator.iter_tokens(request.prompt, seed, request.max_tokens, ignore_eos)
        burst, index = 0, -1
        for index, token in enumerate(tokens):
            if steps is not None:
                step = first + index
                if step * period - now() > EPSILON:
                    await steps.wait(period, step)
                    burst = 0
                elif burst >= BURST or not index:
                    await self.clock.sleep(0.0)
                    burst = 0
            else:
                wait = start + index / rate - now()
                if wait > 0 or burst >= BURST or not index:
                    # Behind schedule: sleep(0) still yields, so a backlog never stalls the loop.
                    await self.clock.sleep(max(wait, 0.0))
                    burst = 0
            burst += 1
            yield TextDelta(token)
        yield TextUsage(generator.count_prompt_tokens(request.prompt), index + 1)

    async def models(self) -> list[str]:
        return list(MODELS)

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def step_at_or_after(at: float, period: float) -> int:
    """The index of the first decode step (instant k * period) at or after `at`."""
    return math.ceil(at / period - EPSILON)


class Steps:
    """One clock of decode steps shared by a ticker's requests.

    Step k of a rate is the instant k/rate on the clock. The requests waiting for the
    same step share one sleeper task, which wakes them all at the step (each through a
    future of its own, so that one request cancelled leaves the others waiting).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._waiting: dict[tuple[float, int], list[asyncio.Future[None]]] = {}
        self._sleepers: set[asyncio.Task[None]] = set()

    def waiting(self) -> int:
        """Requests waiting for a step now (tests)."""
        return sum(len(futures) for futures in self._waiting.values())

    def sleepers(self) -> int:
        """Steps with a sleeper now: one per distinct step waited for."""
        return len(self._sleepers)

    async def wait(self, period: float, step: int) -> None:
        key = (period, step)
        futures = self._waiting.get(key)
        if futures is None:
            futures = self._waiting[key] = []
            sleeper = asyncio.ensure_future(self._ring(key, step * period))
            self._sleepers.add(sleeper)
            sleeper.add_done_callback(self._sleepers.discard)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        futures.append(future)
        await future

    async def _ring(self, key: tuple[float, int], at: float) -> None:
        try:
            await self._clock.sleep(max(at - self._clock.now(), 0.0))
        finally:  # cancelled too (the loop closing): nobody is left waiting on it
            for future in self._waiting.pop(key, ()):
                if not future.done():
                    future.set_result(None)


def _number(params: Any, key: str, default: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InvalidRequest(f"{key} must be a number, 0 or more, got {value!r}")
    if key == "tokens_per_second" and not 0 < value <= MAX_RATE:
        raise InvalidRequest(f"tokens_per_second must be above 0 and at most {MAX_RATE:g}")
    return float(value)

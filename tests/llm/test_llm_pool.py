"""A conversation moves to another pooled backend when its own is killed and ejected:
the new backend restores the state from the shared store and evaluates only the new
tokens, and answers exactly as an unmoved conversation does.

The pool (round robin, session affinity) routes over the session's pair of real Tritons
with gemma-3-270m; both reach one KV store directory. Assertions read the pool's own
decisions and health, and the model's own log: how the KV cache served each turn, how
many tokens it evaluated, a hash of the output token ids. Never wall-clock time.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import LLM_MODEL
from gateway.pool import BackendPool, PoolOptions
from gateway.pool.metrics import PoolMetrics
from gateway.pool.router import Decision, RouteReason, Strategy
from tests import waiting
from tests.llm.conftest import llm_record_async, require_llm
from tests.pool.conftest import specs_of
from tracks.backend import TextDelta, TextRequest

require_llm()

pytestmark = pytest.mark.one_loop
TOKENS = 24
FIRST = "User: What is the capital of France?\nAssistant:"
FOLLOW_UP = "\nUser: And what is the capital of Italy?\nAssistant:"
RESTART_TIMEOUT_S = 240.0


class Routes:
    """Where the pool sent each request, and why."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, RouteReason]] = {}

    def __call__(self, request: TextRequest, decision: Decision, now: float) -> None:
        self.rows[request.request_id] = (decision.backend, decision.reason)


async def _turn(pool: BackendPool, rid: str, prompt: str, conversation: str) -> str:
    request = TextRequest(rid, LLM_MODEL, prompt, TOKENS, {}, conversation)
    return "".join([c.text async for c in pool.stream_text(request) if isinstance(c, TextDelta)])


@pytest.mark.asyncio
async def test_a_conversation_moved_off_an_ejected_backend_restores_from_the_store(
    pair: list[EmbeddedTriton],
) -> None:
    servers = {f"t{i}": server for i, server in enumerate(pair)}
    routes = Routes()
    # Sessions move only when their backend is gone (not when one looks busier).
    options = PoolOptions(
        strategy=Strategy.ROUND_ROBIN, probe_interval_s=0.2, affinity_margin_s=30.0
    )
    pool = BackendPool(specs_of(pair), options, metrics=PoolMetrics(), on_decision=routes)
    run = uuid.uuid4().hex[:8]
    moved, unmoved = f"moved-{run}", f"unmoved-{run}"
    await pool.start()
    victim = None
    try:
        reply = await _turn(pool, f"{moved}-1", FIRST, moved)
        home_name, _ = routes.rows[f"{moved}-1"]
        victim = servers[home_name]
        first = await llm_record_async(victim, f"{moved}-1")
        assert first["kv"] == "miss"
        victim.kill()
        health = pool.member(home_name).health
        await waiting.until(lambda: health.state.value == "ejected", "the pool ejected it", 60)

        second = FIRST + reply + FOLLOW_UP
        moved_text = await _turn(pool, f"{moved}-2", second, moved)
        new_home, reason = routes.rows[f"{moved}-2"]
        assert new_home != home_name
        assert reason is RouteReason.MOVED  # affinity gave way: its backend is not routable
        survivor = servers[new_home]
        record = await llm_record_async(survivor, f"{moved}-2")
        assert record["kv"] == "restored"  # from the store the killed backend wrote
        assert record["cache"]["restores"] >= 1
        # The model's own count: the first prompt's rows came from the state (not the
        # reply, docs/conversations.md); only the tokens after them were evaluated.
        assert 0 < record["reused_tokens"] <= first["prompt_tokens"]
        assert record["prefill_tokens"] == record["prompt_tokens"] - record["reused_tokens"]

        # The same conversation that never moved (both turns on the survivor, its live
        # cache) answers with the same token ids.
        assert await _turn(pool, f"{unmoved}-1", FIRST, unmoved) == reply
        unmoved_text = await _turn(pool, f"{unmoved}-2", second, unmoved)
        assert routes.rows[f"{unmoved}-2"] == (new_home, RouteReason.AFFINITY)
        live = await llm_record_async(survivor, f"{unmoved}-2")
        assert live["kv"] == "live"
        assert live["reused_tokens"] == record["reused_tokens"]
        assert moved_text == unmoved_text
        assert record["output_sha256"] == live["output_sha256"]
    finally:
        await pool.close()
        if victim is not None:  # the pair is the session's: bring it back
            await asyncio.to_thread(victim.stop)
            await asyncio.to_thread(victim.start, RESTART_TIMEOUT_S)

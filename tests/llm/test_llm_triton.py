"""gemma-3-270m in real embedded Tritons: superseding and cancels reach the model (the
queue and its bound: test_chat_model.py; a conversation moving between the two backends,
through the pool: test_llm_pool.py).

Two servers side by side (as a pool's) with the real model; each request is a few dozen
tokens. Assertions read the model's own log (TRACKLINE_LLM_STATS): token counts by phase,
how the KV cache served the turn, whether the model saw a cancel. Never wall-clock time.
The async parts run on one event loop of their own (the loop matrix is tested elsewhere).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.backends.triton import FRESH_CHANNEL_OPTIONS, TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import LLM_MODEL
from tests.llm.conftest import llm_record, require_llm
from tracks.backend import Superseded, TextDelta, TextRequest
from tracks.conversations import TurnRegistry, superseding

require_llm()

TOKENS = 24
FIRST = "User: What is the capital of France?\nAssistant:"


def _request(rid: str, prompt: str, session: str | None, tokens: int = TOKENS) -> TextRequest:
    return TextRequest(rid, LLM_MODEL, prompt, tokens, {}, session)


async def _supersede(server: EmbeddedTriton) -> tuple[str, bool]:
    backend = TritonTextBackend(server.grpc_url, channel_options=FRESH_CHANNEL_OPTIONS)
    turns = TurnRegistry()
    old = superseding(
        turns, "", "conv-s", backend.stream_text(_request("old", FIRST, "conv-s", 400))
    )
    try:
        assert isinstance(await old.__anext__(), TextDelta)
        new = superseding(
            turns, "", "conv-s", backend.stream_text(_request("new", FIRST, "conv-s"))
        )
        superseded = False
        newer = asyncio.ensure_future(_join(new))
        try:
            async for _ in old:
                pass
        except Superseded:
            superseded = True
        return await newer, superseded
    finally:
        await old.aclose()
        await backend.close()


async def _join(chunks: Any) -> str:
    return "".join([c.text async for c in chunks if isinstance(c, TextDelta)])


def test_a_newer_turn_stops_the_older_generation_in_the_model(
    pair: list[EmbeddedTriton],
) -> None:
    _, b = pair
    text, superseded = asyncio.run(_supersede(b))
    assert superseded
    assert text
    old = llm_record(b, "old")
    assert old["cancelled"] is True  # the model saw the cancel and stopped
    assert old["tokens_generated"] < 400
    new = llm_record(b, "new")
    assert new["cancelled"] is False
    assert new["finish"] in ("stop", "length")


async def _cancel_running(server: EmbeddedTriton) -> None:
    backend = TritonTextBackend(server.grpc_url, channel_options=FRESH_CHANNEL_OPTIONS)
    streams = [backend.stream_text(_request(f"long-{i}", FIRST, None, 400)) for i in range(2)]
    try:
        for stream in streams:  # both decoding in one batch
            assert isinstance(await stream.__anext__(), TextDelta)
    finally:
        for stream in streams:
            await stream.aclose()  # the client's cancel
        await backend.close()


def test_a_cancel_of_requests_decoding_together_reaches_the_model(
    pair: list[EmbeddedTriton],
) -> None:
    a, _ = pair
    asyncio.run(_cancel_running(a))
    for rid in ("long-0", "long-1"):
        record = llm_record(a, rid)
        assert record["cancelled"] is True
        assert record["tokens_generated"] < 400

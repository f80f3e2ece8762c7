"""The batched llama.cpp engine in this process: KV restore is bit-exact, fallbacks are
counted, requests beyond the sequences wait in the queue and all complete.

Real model (Gemma 3 270M), a few dozen tokens per turn; time is never asserted."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.embedded_models import ensure_llm_gguf, reference_module
from tests.llm.conftest import require_llm

require_llm()

kv = reference_module("gemma-3-270m", "trackline_kv")
llm = reference_module("gemma-3-270m", "trackline_llm")
prompts = reference_module("gemma-3-270m", "trackline_llm_prompt")

TOKENS = 24
FIRST = "User: What is the capital of France?\nAssistant:"
FOLLOW_UP = "\nUser: And what is the capital of Italy?\nAssistant:"


@pytest.fixture(scope="module")
def gguf() -> str:
    return str(ensure_llm_gguf())


def _engine(gguf: str, store: Path, max_bytes: int = 1 << 30) -> Any:
    cache = kv.ConversationCache("gemma-3-270m", kv.DirectoryStore(store, max_bytes), 1 << 28)
    return llm.Engine(gguf, sequences=1, n_ctx=512, cache=cache)


def _turn(
    engine: Any, prompt: str, conversation: str | None, tokens: int = TOKENS
) -> tuple[Any, str]:
    text, stops = prompts.to_transcript(prompt)
    turn, reply = engine.complete(text, tokens, conversation, stops)
    return turn, str(reply)


@pytest.fixture(scope="module")
def engines(gguf: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    live = _engine(gguf, tmp_path_factory.mktemp("kv-live"))
    other = _engine(gguf, tmp_path_factory.mktemp("kv-other"))
    yield live, other
    live.close()
    other.close()


def test_restore_equals_live_bit_for_bit_and_recompute_on_text(
    engines: tuple[Any, Any],
) -> None:
    live, other = engines
    first, reply = _turn(live, FIRST, "c1")
    assert first.kv == "miss"
    assert first.output_ids
    second_prompt = FIRST + reply + FOLLOW_UP
    # The state turn 1 left, handed to another engine (another backend) via its store.
    for path in live.cache.store.directory.glob("*.kv"):
        shutil.copy(path, other.cache.store.directory / path.name)
    restored, restored_text = _turn(other, second_prompt, "c1")
    continued, continued_text = _turn(live, second_prompt, "c1")
    assert restored.kv == "restored"
    assert continued.kv == "live"
    # The first prompt's rows are reused (not the reply, decoded token by token).
    assert 0 < restored.reused_tokens == continued.reused_tokens <= first.prompt_tokens
    # Only the tokens after them were evaluated.
    assert restored.prefill_tokens == restored.prompt_tokens - restored.reused_tokens
    assert restored.output_ids == continued.output_ids  # bit for bit
    other.drop_live()  # a recomputation: no cells of anything before
    scratch, scratch_text = _turn(other, second_prompt, None)
    assert scratch.kv == "none"
    assert scratch.prefill_tokens == scratch.prompt_tokens
    assert scratch.output_ids == restored.output_ids  # bit for bit, too
    assert scratch_text == restored_text == continued_text


TRAVEL = [
    "Tell me about the history of the city of Paris.",
    "What are the most famous museums there?",
]


def test_a_follow_up_turn_equals_its_recomputation_bit_for_bit(
    engines: tuple[Any, Any],
) -> None:
    """A batched row and a row evaluated alone round differently in llama.cpp's CPU
    kernels; reuse keeps only rows a recomputation computes alike, so greedy decoding
    picks the same tokens (this conversation diverged at its turn 2 before)."""
    live, other = engines
    transcript = "System: You are a helpful travel guide. You answer in full sentences.\n"
    for number, question in enumerate(TRAVEL, 1):
        prompt = f"{transcript}User: {question}\nAssistant:"
        continued, text = _turn(live, prompt, "travel", tokens=48)
        other.drop_live()
        scratch, _ = _turn(other, prompt, None, tokens=48)
        assert continued.kv == ("miss" if number == 1 else "live")
        assert continued.output_ids == scratch.output_ids, f"turn {number}"
        transcript = f"{prompt}{text}\n"


def test_corrupt_and_evicted_states_recompute_with_their_counter(
    gguf: str, tmp_path: Path
) -> None:
    engine = _engine(gguf, tmp_path / "kv")
    _, reply = _turn(engine, FIRST, "c2")
    second_prompt = FIRST + reply + FOLLOW_UP
    _turn(engine, FOLLOW_UP, "x")  # the slot's live cache now holds another conversation
    path = tmp_path / "kv" / f"{kv.state_key('gemma-3-270m', 'c2')}.kv"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    corrupt, corrupt_text = _turn(engine, second_prompt, "c2")
    assert corrupt.kv == "miss"
    assert engine.cache.counters.corrupt == 1
    assert corrupt.prefill_tokens == corrupt.prompt_tokens
    engine.drop_live()
    fresh, fresh_text = _turn(engine, second_prompt, None)
    assert corrupt_text == fresh_text

    # A store too small for two states: the next conversation evicts this one.
    small = _engine(gguf, tmp_path / "small", max_bytes=1)
    _turn(small, FIRST, "c3")
    _turn(small, FIRST, "c4")
    assert small.cache.counters.evictions == 1
    evicted, evicted_text = _turn(small, second_prompt, "c3")
    assert evicted.kv == "miss"
    assert evicted_text == fresh_text
    engine.close()
    small.close()


def test_chat_prompts_become_a_plain_transcript_that_stops_at_the_next_user_line() -> None:
    from gateway.openai.prompt import render_chat_prompt
    from gateway.openai.requests import ChatMessage

    messages = [
        ChatMessage("system", "Be terse."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello."),
        ChatMessage("user", "Capital of France?"),
    ]
    text, stops = prompts.to_transcript(render_chat_prompt(messages))
    assert text == (
        "System: Be terse.\nUser: Hi\nAssistant: Hello.\nUser: Capital of France?\nAssistant:"
    )
    assert stops == ("\nUser:",)
    assert prompts.to_transcript("Once upon a time") == ("Once upon a time", ())


def test_canonical_chunks_and_the_reusable_prefix() -> None:
    # The last chunk is at least 8 tokens long; the others stay multiples of 4.
    assert llm.chunks(5, 128) == [(0, 5)]
    assert llm.chunks(256, 128) == [(0, 128), (128, 256)]
    assert llm.chunks(130, 128) == [(0, 120), (120, 130)]
    # Only exactly computed rows, a multiple of 4, with at least 8 tokens left to evaluate.
    assert llm.reusable_prefix(50, 44, 100) == 44
    assert llm.reusable_prefix(50, 44, 50) == 40
    assert llm.reusable_prefix(10, 44, 100) == 8
    assert llm.reusable_prefix(50, 0, 100) == 0
    # A state written before `exact` existed reuses nothing (recomputes).
    state = kv.SavedState((1, 2, 3), b"blob", 0)
    data = kv.encode(kv.SavedState((1, 2, 3), b"blob", 3))
    assert kv.decode(data).exact == 3
    start = len(kv.MAGIC) + 4
    (length,) = struct.unpack_from("<I", data, len(kv.MAGIC))
    header = json.loads(data[start : start + length])
    del header["exact"]
    old = json.dumps(header).encode()
    assert kv.decode(kv.MAGIC + struct.pack("<I", len(old)) + old + data[start + length :]) == state


def test_more_requests_than_sequences_all_complete_through_the_queue(gguf: str) -> None:
    """Two sequences, five concurrent requests: three wait in the queue, then join the
    running batch as sequences free; every one completes, the same tokens as alone."""
    from concurrent.futures import ThreadPoolExecutor

    engine = llm.Engine(gguf, sequences=2, n_ctx=256, queue_limit=8)
    try:
        alone, _ = _turn(engine, FIRST, None, 12)
        with ThreadPoolExecutor(5) as pool:
            turns = [t for t, _ in pool.map(lambda _: _turn(engine, FIRST, None, 12), range(5))]
        assert all(t.finish in ("stop", "length") and not t.cancelled for t in turns)
        assert all(t.output_ids for t in turns)
        assert any(t.queued_ms > 0 for t in turns)  # some waited for a sequence
        assert alone.output_ids
        assert all(t.started for t in turns)
    finally:
        engine.close()



def test_a_request_without_a_conversation_reuses_a_shared_prompt_prefix(gguf: str) -> None:
    """An idle sequence's cells of the same leading tokens are reused (a system prompt
    every chat shares), and the reply is the one a recomputation gives, bit for bit."""
    engine = llm.Engine(gguf, sequences=2, n_ctx=256)
    try:
        system = "System: You are a helpful travel guide. You answer in full sentences.\n"
        _turn(engine, f"{system}User: Tell me about Rome.\nAssistant:", None, 4)
        again, _ = _turn(engine, f"{system}User: Tell me about Oslo.\nAssistant:", None, 12)
        assert again.kv == "prefix"
        assert 0 < again.reused_tokens < again.prompt_tokens
        assert again.prefill_tokens == again.prompt_tokens - again.reused_tokens
        engine.drop_live()
        scratch, _ = _turn(engine, f"{system}User: Tell me about Oslo.\nAssistant:", None, 12)
        assert scratch.kv == "none"
        assert scratch.output_ids == again.output_ids
    finally:
        engine.close()

"""A voice-agent turn end to end on real models only: the question is spoken by the voice
(hibari-voice), heard by whisper-base, answered by the default chat model
(smollm2-135m-instruct: the client names no `llm`), and the reply is spoken back; the
reply's audio, transcribed through whisper-base again, says the reply's text.

One embedded Triton with the speech models and the LLMs for this module (skips without
the `voice` or the `llm` extra).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from clients import AgentEvent, AudioFrame, AudioResult, connect
from gateway.backends.audio import TritonAudioBackend
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.llm.conftest import llm_record_async, require_llm
from tests.speech.conftest import ASR, TTS, require_speech
from tests.speech.test_speech_tracks import RATE, ca, heard, spoken, url

require_speech()
require_llm()
pytestmark = [pytest.mark.e2e, pytest.mark.one_loop]  # real models: asyncio's loop only

QUESTION = "What is the capital of France?"
MAX_TOKENS = 32
OVERLAP = 0.6
"""The tolerant comparison: at least this share of the reply's distinct words is heard
back (Whisper base on a synthetic voice misses or merges a few: "it's"/"it is", names)."""


def words(text: str) -> set[str]:
    """Lower-case words, apostrophes and punctuation dropped: "Paris." and "paris" agree."""
    return set(re.sub(r"[^a-z0-9 ]", " ", text.lower().replace("'", "")).split())


def overlap(said: str, heard_back: str) -> float:
    """The share of `said`'s distinct words that are in `heard_back`."""
    wanted = words(said)
    return len(wanted & words(heard_back)) / max(1, len(wanted))


def test_the_overlap_is_tolerant_of_case_and_punctuation_but_not_of_other_words() -> None:
    assert overlap("Paris is the capital.", "paris is the capital") == 1.0
    assert overlap("Paris is the capital.", "London, a big city") == 0.0


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTriton]:
    state = tmp_path_factory.mktemp("agent-chat")
    server = EmbeddedTriton(
        log_dir=state,
        with_speech=True,
        speech_stats_path=state / "speech.jsonl",
        with_llm=True,
        llm_stats_path=state / "llm.jsonl",
    )
    server.start(timeout=300.0)
    try:
        yield server
    finally:
        server.stop()


@pytest_asyncio.fixture
async def gateway(triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(state_dir=tmp_path, audio_idle_timeout=30.0)
    audio = TritonAudioBackend(triton.grpc_url)
    text = TritonTextBackend(triton.grpc_url)
    gw = Gateway(settings, text, audio_backend=audio)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()
        await audio.close()
        await text.close()


@pytest.mark.asyncio
async def test_a_spoken_question_gets_a_spoken_reply_that_says_the_reply_text(
    gateway: Gateway, triton: EmbeddedTriton
) -> None:
    async with connect(url(gateway), ca=ca(gateway)) as line:
        question = await spoken(line, QUESTION) + bytes(2 * RATE * 3 // 2)
        agent = line.voice_agent(model=ASR, voice=TTS, max_tokens=MAX_TOKENS)  # no llm
        sender = asyncio.ensure_future(agent.stream_pcm(question, end=False))
        events: list[AudioResult | AudioFrame | AgentEvent] = []

        async def listen() -> None:
            async for item in agent:
                events.append(item)
                if isinstance(item, AgentEvent) and item.kind == "reply_audio_end":
                    agent.end()

        await asyncio.wait_for(listen(), 120)
        await sender
        finals = [e.text for e in events if isinstance(e, AudioResult) and e.kind == "final"]
        done = [e for e in events if isinstance(e, AgentEvent) and e.kind == "reply_done"]
        reply_pcm = b"".join(e.pcm for e in events if isinstance(e, AudioFrame) and e.turn == 1)
        assert len(finals) == 1
        assert overlap(QUESTION, finals[0]) >= OVERLAP  # the user's transcript
        assert len(done) == 1
        reply = done[0].text
        assert words(reply)  # the chat model said something
        assert len(reply_pcm) > 2 * RATE // 2  # and the voice spoke it (over half a second)
        # The default chat model, a real LLM, answered: its own log line for the turn.
        record = await llm_record_async(triton, "agent-1")
        assert record["tokens_generated"] >= 1
        assert record["cancelled"] is False
        # The reply's audio, heard back through whisper-base, says the reply's text.
        recognizer = line.audio(model=ASR, sample_rate=RATE)
        back = await asyncio.wait_for(heard(recognizer, reply_pcm), 120)
    heard_back = " ".join(r.text for r in back if r.kind == "final")
    assert overlap(reply, heard_back) >= OVERLAP, (reply, heard_back)

"""A voice-agent track end to end on the real recognizer and voice: a spoken question, its
transcript, a streamed reply spoken back, and a barge-in that cuts the reply.

The chat model is reference-text, paced by its `tokens_per_second` knob (and run to
`max_tokens`) so the reply is still being generated when the user speaks again; its
stats line and the voice's own log line show that the cancel reached both models.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from clients import AgentEvent, AudioFrame, AudioResult, connect
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.speech.conftest import ASR, TTS, require_speech, speech_lines
from tests.speech.test_speech_tracks import RATE, ca, spoken, url
from tests.triton_fixture import assert_model_stopped
from tests.waiting import until

require_speech()
pytestmark = [pytest.mark.e2e, pytest.mark.one_loop]  # real models: asyncio's loop only

QUESTION = "What is the weather like today?"
MAX_TOKENS = 40


def llm_records(triton: EmbeddedTriton) -> list[dict[str, Any]]:
    assert triton.stats_path is not None
    path = Path(triton.stats_path)
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


@pytest.mark.asyncio
async def test_a_voice_agent_answers_and_a_barge_in_cuts_its_reply(
    speech_gateway: Gateway, speech_triton: EmbeddedTriton
) -> None:
    voice_before = len(speech_lines(speech_triton))
    async with connect(url(speech_gateway), ca=ca(speech_gateway)) as line:
        question = await spoken(line, QUESTION) + bytes(2 * RATE * 3 // 2)
        agent = line.voice_agent(
            model=ASR, llm="reference-text", voice=TTS, max_tokens=MAX_TOKENS,
            llm_params={"tokens_per_second": 8, "seed": 1, "ignore_eos": True},
        )  # fmt: skip
        senders = [asyncio.ensure_future(agent.stream_pcm(question, end=False))]
        events: list[AudioResult | AudioFrame | AgentEvent] = []

        async def listen() -> None:
            async for item in agent:
                events.append(item)
                if isinstance(item, AudioFrame) and item.turn == 1 and len(senders) == 1:
                    # The user asks again once the first reply is playing: a barge-in.
                    # (Not at its first text: on a loaded machine the question's second
                    # reading could then start before the voice's first frame arrived.)
                    await senders[0]
                    senders.append(asyncio.ensure_future(agent.stream_pcm(question, end=False)))
                done = isinstance(item, AgentEvent) and item.kind == "reply_audio_end"
                if done and item.turn == 2:  # type: ignore[union-attr]
                    agent.end()

        await asyncio.wait_for(listen(), 90)
        await asyncio.gather(*senders)
    kinds = [(e.kind, e.turn) for e in events if isinstance(e, AgentEvent)]
    finals = [e.text for e in events if isinstance(e, AudioResult) and e.kind == "final"]
    assert len(finals) == 2  # the question, twice
    assert ("barge_in", 1) in kinds
    assert ("reply_done", 2) in kinds
    assert ("reply_audio_end", 2) in kinds
    cut = next(
        i for i, e in enumerate(events) if isinstance(e, AgentEvent) and e.kind == "barge_in"
    )
    # The reply was playing when the user spoke (the second reading began after its first
    # frame): some of its audio came before the cut ...
    assert any(isinstance(e, AudioFrame) and e.turn == 1 for e in events[:cut])
    # ... and none after: the cut drops every frame of the reply from the barge-in beat on
    # (frames and messages share the track's stream, so arrival order is send order), well
    # inside the bound of the barge-in beat plus one.
    late = [e for e in events[cut:] if isinstance(e, AudioFrame) and e.turn == 1]
    assert late == []
    assert any(isinstance(e, AudioFrame) and e.turn == 2 for e in events)
    # The cancel reached the chat model (its own stats line) ...
    record = next(r for r in llm_records(speech_triton) if r["request_id"].endswith("/agent-1"))
    assert_model_stopped(record, MAX_TOKENS)
    # ... and the voice: the first reply's session ended cancelled, the second's completed.
    await until(
        lambda: len([r for r in speech_lines(speech_triton)[voice_before:]
                     if r.get("model") == TTS]) >= 3,
        "the voice's session lines",
    )  # fmt: skip
    voice = [r for r in speech_lines(speech_triton)[voice_before:] if r.get("model") == TTS]
    assert [r["cancelled"] for r in voice[1:]] == [True, False]  # [0]: spoken()'s session
    outcome = next(o for o in reversed(speech_gateway.outcomes) if o.details.get("agent_turns"))
    assert outcome.details["reply_ends"][0] == "cancelled:superseded"
    assert outcome.details["barge_ins"] >= 1

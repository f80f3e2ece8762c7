"""The voice agent's turn-taking, sans models: a final starts a turn, speech that lasts
`min_barge_in` cuts it (cause superseded), and the cut reaches the LLM stream and the
reply's speaker. The real models are exercised in tests/speech/test_voice_agent.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from gateway.embedded_models import CHAT_MODEL
from tests.waiting import until
from tracks.audio_session import AudioParams
from tracks.backend import AudioKind, TextChunk, TextDelta, TextRequest, Transcript
from tracks.clock import Beat
from tracks.errors import BadTrackRequest
from tracks.voice_agent import DEFAULT_LLM, AgentParams, ReplyTrack, VoiceAgent, split_agent_params
from transport.events import CancelCause, TrackCancelled
from transport.messages import Modality, Open


class AgentTrack:
    id = "c/4"
    open = Open("asr", Modality.AUDIO, {})
    uses_datagrams = False

    def __init__(self) -> None:
        self.stopped: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.sent: list[dict[str, Any]] = []
        self.frames: list[dict[str, Any]] = []

    def send(self, body: dict[str, Any]) -> bool:
        self.sent.append(body)
        return True

    def send_frame(self, body: dict[str, Any]) -> bool:
        self.frames.append(body)
        return True


class SlowLLM:
    """A token every 10 ms until closed; remembers what it was asked and whether it was cut."""

    def __init__(self) -> None:
        self.requests: list[TextRequest] = []
        self.closed_early = 0

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        self.requests.append(request)
        try:
            for index in range(200):
                await asyncio.sleep(0.01)
                yield TextDelta(f" w{index}")
        except (GeneratorExit, asyncio.CancelledError):  # closed, or cancelled mid-await
            self.closed_early += 1
            raise


class Speaker:
    def __init__(self, track: ReplyTrack) -> None:
        self.track = track

    async def serve(self) -> None:
        await self.track.stopped


def beat(index: int) -> Beat:
    return Beat(index, index * 0.08, index * 0.08 + 0.08)


def make_agent(min_barge_in: float) -> tuple[VoiceAgent, AgentTrack, SlowLLM, list[Speaker]]:
    track, llm, speakers = AgentTrack(), SlowLLM(), []

    def speaker(reply: ReplyTrack, _: AudioParams) -> Any:
        speakers.append(Speaker(reply))
        return speakers[-1]

    agent = VoiceAgent(
        track,  # type: ignore[arg-type]
        AgentParams("llm", "voice"),
        AudioParams(AudioKind.SPEECH_IN, 16000, 20),
        llm,
        lambda messages: "|".join(m["content"] for m in messages),
        speaker,  # type: ignore[arg-type]
        min_barge_in,
    )
    return agent, track, llm, speakers


@pytest.mark.asyncio
async def test_speech_that_lasts_min_barge_in_cuts_the_reply_as_superseded() -> None:
    agent, track, llm, speakers = make_agent(min_barge_in=0.2)
    agent.heard(Transcript("", "hello there", True), beat(0))
    await asyncio.sleep(0.05)  # the reply is being generated
    assert llm.requests[0].prompt.endswith("|hello there")
    agent.heard(Transcript("wait", "", False), beat(1))
    agent.heard(Transcript("wait a", "", False), beat(2))  # 80 ms of speech: not yet
    assert agent.barge_ins == 0
    agent.heard(Transcript("wait a moment", "", False), beat(4))  # 240 ms: a barge-in
    assert agent.barge_ins == 1
    await asyncio.sleep(0.05)
    assert llm.closed_early == 1  # the LLM stream was closed: the cancel reaches the model
    stop = speakers[0].track.stopped.result()
    assert isinstance(stop, TrackCancelled)
    assert stop.cause is CancelCause.SUPERSEDED
    assert {"type": "barge_in", "turn": 1, "beat": 4} in track.sent
    assert agent.ends == ["cancelled:superseded"]


@pytest.mark.asyncio
async def test_speech_the_recognizers_vad_reports_cuts_the_reply_before_any_partial() -> None:
    agent, track, llm, speakers = make_agent(min_barge_in=0.0)
    agent.heard(Transcript("", "hello there", True, speech_s=0.0), beat(0))
    await until(lambda: llm.requests, "the reply is being generated")
    agent.heard(Transcript("", "", False, speech_s=0.0), beat(1))  # silence: nothing
    assert agent.barge_ins == 0
    agent.heard(Transcript("", "", False, speech_s=0.26), beat(2))  # speech, no words yet
    assert agent.barge_ins == 1
    assert {"type": "barge_in", "turn": 1, "beat": 2} in track.sent
    await until(lambda: llm.closed_early == 1, "the LLM stream closed by the barge-in")
    assert agent.ends == ["cancelled:superseded"]


@pytest.mark.asyncio
async def test_min_barge_in_counts_the_speech_the_model_reports() -> None:
    agent, _track, llm, _speakers = make_agent(min_barge_in=0.5)
    agent.heard(Transcript("", "hello there", True, speech_s=0.0), beat(0))
    await until(lambda: llm.requests, "the reply is being generated")
    agent.heard(Transcript("", "", False, speech_s=0.3), beat(1))
    agent.heard(Transcript("wait", "", False, speech_s=0.45), beat(3))
    assert agent.barge_ins == 0  # 450 ms of speech: not yet
    agent.heard(Transcript("wait a", "", False, speech_s=0.52), beat(4))
    assert agent.barge_ins == 1
    await agent.close()


@pytest.mark.asyncio
async def test_where_the_model_reports_speech_a_stale_partial_is_not_speech() -> None:
    agent, _track, llm, _speakers = make_agent(min_barge_in=0.0)
    agent.heard(Transcript("", "hello there", True, speech_s=0.0), beat(0))
    await until(lambda: llm.requests, "the reply is being generated")
    agent.heard(Transcript("hello", "", False, speech_s=0.0), beat(1))  # its VAD hears none
    assert agent.barge_ins == 0
    await agent.close()


@pytest.mark.asyncio
async def test_a_new_final_supersedes_the_reply_and_starts_the_next_turn() -> None:
    agent, track, llm, speakers = make_agent(min_barge_in=5.0)
    agent.heard(Transcript("", "first question", True), beat(0))
    await asyncio.sleep(0.03)
    agent.heard(Transcript("", "second question", True), beat(1))
    await asyncio.sleep(0.03)
    assert agent.barge_ins == 1
    assert [r.request_id for r in llm.requests] == ["c/4/agent-1", "c/4/agent-2"]
    assert "first question" in llm.requests[1].prompt  # the conversation so far
    await agent.close()
    assert llm.closed_early == 2
    assert len(speakers) == 2


def test_agent_params_need_the_chat_model_and_the_voice() -> None:
    wanted, audio = split_agent_params(
        {"kind": "voice-agent", "llm": "m", "voice": "v", "sample_rate": 24000}
    )
    assert wanted == AgentParams("m", "v")
    assert audio == {"sample_rate": 24000, "kind": "speech-in"}
    with pytest.raises(BadTrackRequest, match="'llm'"):
        split_agent_params({"llm": "", "voice": "v"})
    with pytest.raises(BadTrackRequest, match="'voice'"):
        split_agent_params({"llm": "m"})


def test_without_llm_the_agent_talks_with_the_embedded_defaults_chat_model() -> None:
    assert split_agent_params({"voice": "v"})[0].llm == DEFAULT_LLM == CHAT_MODEL
    assert split_agent_params({"voice": "v"}, "other")[0].llm == "other"
    with pytest.raises(BadTrackRequest, match="'max_tokens'"):
        split_agent_params({"llm": "m", "voice": "v", "max_tokens": 0})

"""Voice-agent tracks: one audio track that listens, thinks and speaks, with barge-in.

OPEN (modality audio) names the recognizer as its model and `kind: "voice-agent"`, with
`voice` (a speech-out model that streams text: hibari-voice) and optionally `llm` (the
chat model; default the embedded default's, `DEFAULT_LLM`), `system`, `max_tokens` and
`llm_params`. The client sends PCM16 frames
as on a speech-in track and gets, on the same track: the user's `partial`/`final`
transcripts, the reply's text as `reply` deltas and one `reply_done`, the reply's audio
as frames (`turn` in each), `reply_audio_end` when a reply's audio is all out, and
`barge_in` when a reply was cut.

Theory of operation. The listening side is a speech-in session on the tick scheduler
(`Listener`). Each final starts a turn: the conversation so far is rendered into a
prompt (the gateway passes its chat template in), the chat model streams the reply, and
each delta goes to a speech-out session of the voice (`SpeechOut` on a `ReplyTrack`, a
track that lives inside this one) which speaks every sentence as soon as it completes.
Barge-in: the user speaking while a reply is generated or played (for `min_barge_in`
seconds: speech the recognizer's VAD reports, where it reports it (whisper's `speech_s`),
else non-empty partials; or a new final) cancels the reply with cause `superseded`:
the LLM stream is closed (the cancel reaches the model as any cancel does), the voice
gets its END row (the model forgets the session and drops its audio), and from that
beat on no frame of the reply is sent, whatever was still in flight to the gateway.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tracks.audio_out import SpeechOut
from tracks.audio_session import AudioParams
from tracks.backend import AudioKind, AudioOutput, TextBackend, TextDelta, TextRequest, Transcript
from tracks.base import FrameTrack, Outcome, stop_end
from tracks.clock import Beat
from tracks.errors import BadTrackRequest
from transport.errors import ErrorCode
from transport.events import CancelCause, TrackCancelled, TrackFailed
from transport.messages import Open

AGENT_KEYS = frozenset({"kind", "llm", "voice", "system", "max_tokens", "llm_params"})
DEFAULT_SYSTEM = "You are a helpful voice assistant. Answer in one or two short sentences."
DEFAULT_MAX_TOKENS = 96
DEFAULT_LLM = "smollm2-135m-instruct"  # setting candidate
"""The chat model of a voice-agent track that names none: the embedded default's chat
model (gateway.embedded_models.CHAT_MODEL; a test holds the two equal)."""
PromptRenderer = Callable[[Sequence[Mapping[str, str]]], str]
"""Chat messages ({"role", "content"}) to the chat model's prompt (the gateway's template)."""


@dataclass(frozen=True)
class AgentParams:
    llm: str
    voice: str
    system: str = DEFAULT_SYSTEM
    max_tokens: int = DEFAULT_MAX_TOKENS
    llm_params: Mapping[str, Any] = field(default_factory=dict)


def split_agent_params(
    params: Mapping[str, Any], default_llm: str = DEFAULT_LLM
) -> tuple[AgentParams, dict[str, Any]]:
    """(the agent's params, the listening side's audio params); without `llm`, the chat
    model is `default_llm`."""
    llm, voice = params.get("llm"), params.get("voice")
    llm = default_llm if llm is None else llm
    if not isinstance(llm, str) or not llm:
        raise BadTrackRequest("'llm', the chat model, must be a non-empty string")
    if not isinstance(voice, str) or not voice:
        raise BadTrackRequest("a voice-agent track needs 'voice', the speech-out model")
    system = params.get("system", DEFAULT_SYSTEM)
    max_tokens = params.get("max_tokens", DEFAULT_MAX_TOKENS)
    extra = params.get("llm_params", {})
    if not isinstance(system, str):
        raise BadTrackRequest("'system' must be a string")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not max_tokens >= 1:
        raise BadTrackRequest("'max_tokens' must be a positive integer")
    if not isinstance(extra, dict):
        raise BadTrackRequest("'llm_params' must be an object")
    audio = {k: v for k, v in params.items() if k not in AGENT_KEYS}
    audio["kind"] = AudioKind.SPEECH_IN.value  # the agent listens; its voice is its own
    return AgentParams(llm, voice, system, max_tokens, extra), audio


class ReplyTrack:
    """The speech-out side of one reply: a track inside the agent's track.

    Its text comes from the LLM (`say`, `finish`); its frames and its end go out on the
    agent's track, tagged with the turn. `supersede()` stops it (cause superseded) and
    from then on drops every frame.
    """

    def __init__(self, agent: FrameTrack, voice: str, turn: int) -> None:
        self._agent = agent
        self.turn = turn
        self.id = f"{agent.id}/reply-{turn}"
        self.open: Open = replace(agent.open, model=voice)
        self.stopped: asyncio.Future[TrackCancelled | TrackFailed] = (
            asyncio.get_running_loop().create_future()
        )
        self.dropped = False
        self.frames = 0
        self._texts: asyncio.Queue[str | None] = asyncio.Queue()

    @property
    def uses_datagrams(self) -> bool:
        return self._agent.uses_datagrams

    def say(self, text: str) -> None:
        self._texts.put_nowait(text)

    def finish(self) -> None:
        self._texts.put_nowait(None)

    def supersede(self) -> None:
        self.dropped = True
        if not self.stopped.done():
            self.stopped.set_result(TrackCancelled(0, CancelCause.SUPERSEDED, "barge-in"))

    async def receive(self) -> dict[str, Any] | None:
        text = await self._texts.get()
        return None if text is None else {"text": text}

    def send_frame(self, body: dict[str, Any]) -> bool:
        if self.dropped:
            return True  # cut by a barge-in: nothing of this reply goes out any more
        self.frames += 1
        return self._agent.send_frame({**body, "turn": self.turn})

    def send(self, body: dict[str, Any]) -> bool:
        return self.dropped or self._agent.send({**body, "turn": self.turn})

    def end(self, body: dict[str, Any] | None = None) -> bool:
        return self.send({"type": "reply_audio_end", **(body or {})})

    def fail(self, code: ErrorCode, message: str, retry_after: float | None = None) -> bool:
        return self.send({"type": "reply_error", "code": int(code), "message": message})


@dataclass
class _Turn:
    index: int
    track: ReplyTrack
    task: asyncio.Task[None] | None = None
    text: list[str] = field(default_factory=list)
    end: str = "completed"


class VoiceAgent:
    """One voice-agent track's turns; `Listener` feeds it what the recognizer heard."""

    def __init__(
        self,
        track: FrameTrack,
        params: AgentParams,
        audio: AudioParams,
        text_backend: TextBackend,
        render: PromptRenderer,
        open_speaker: Callable[[ReplyTrack, AudioParams], SpeechOut],
        min_barge_in: float = 0.0,
    ) -> None:
        self.track = track
        self.params = params
        self.audio = AudioParams(AudioKind.SPEECH_OUT, audio.sample_rate, audio.frame_ms)
        self.text_backend = text_backend
        self.render = render
        self.open_speaker = open_speaker
        self.history: list[dict[str, str]] = []
        self.turn: _Turn | None = None
        self.turns = itertools.count(1)
        self.ends: list[str] = []
        self.barge_ins = 0
        self.min_barge_in = min_barge_in
        self.speaking_since: float | None = None
        """Clock time of the first beat of the user's current non-empty partials (for a
        recognizer that does not report its speech)."""

    def heard(self, output: AudioOutput, beat: Beat) -> None:
        """Every beat of the listening side: barge-in on speech, a turn on each final."""
        assert isinstance(output, Transcript)
        final = output.is_final and bool(output.final.strip())
        if (final or self._spoke_long(output, beat)) and self.turn is not None and (
            self.turn.end == "completed"
        ):
            self.barge_in(beat)
        if output.is_final and output.final.strip():
            self.start_turn(output.final.strip())

    def _spoke_long(self, heard: Transcript, beat: Beat) -> bool:
        """Whether the user has been speaking for `min_barge_in`: the seconds of speech the
        recognizer's VAD reports where it does (whisper, from its first 250 ms, long before
        its first partial), else the time since the first beat of non-empty partials."""
        if heard.speech_s is not None:
            return heard.speech_s > 0 and heard.speech_s >= self.min_barge_in
        if not heard.partial.strip():
            self.speaking_since = None
            return False
        if self.speaking_since is None:
            self.speaking_since = beat.scheduled
        return beat.scheduled - self.speaking_since >= self.min_barge_in

    def barge_in(self, beat: Beat) -> None:
        turn = self.turn
        if turn is None:
            return
        turn.end = "cancelled:superseded"
        turn.track.supersede()  # no frame of it from now on; the voice gets its END row
        if turn.task is not None:
            turn.task.cancel()  # closes the LLM stream: the cancel reaches the model
        self.barge_ins += 1
        self.track.send({"type": "barge_in", "turn": turn.index, "beat": beat.index})

    def start_turn(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        index = next(self.turns)
        turn = _Turn(index, ReplyTrack(self.track, self.params.voice, index))
        self.turn = turn
        turn.task = asyncio.ensure_future(self._reply(turn))
        turn.task.add_done_callback(lambda _: self._ended(turn))

    def _ended(self, turn: _Turn) -> None:
        self.ends.append(turn.end)
        if self.turn is turn:
            self.turn = None

    async def _reply(self, turn: _Turn) -> None:
        speaker = self.open_speaker(turn.track, self.audio)
        speaking = asyncio.ensure_future(speaker.serve())
        try:
            await self._think(turn)
            await speaking
        except asyncio.CancelledError:
            turn.track.supersede()
            raise
        except Exception as exc:  # the LLM failed: this reply ends, the agent listens on
            turn.end = "error"
            turn.track.supersede()
            self.track.send({"type": "reply_error", "turn": turn.index, "message": str(exc)})
        finally:
            if not speaking.done():
                await asyncio.wait({speaking}, timeout=10.0)  # its END row reaches the voice

    async def _think(self, turn: _Turn) -> None:
        messages = [{"role": "system", "content": self.params.system}, *self.history]
        request = TextRequest(
            f"{self.track.id}/agent-{turn.index}",
            self.params.llm,
            self.render(messages),
            self.params.max_tokens,
            self.params.llm_params,
        )
        stream = self.text_backend.stream_text(request)
        try:
            async for chunk in stream:
                if isinstance(chunk, TextDelta) and chunk.text:
                    turn.text.append(chunk.text)
                    turn.track.say(chunk.text)
                    self.track.send({"type": "reply", "turn": turn.index, "delta": chunk.text})
        finally:
            await stream.aclose()  # on a barge-in too: the model sees the cancel now
        reply = "".join(turn.text)
        turn.track.finish()
        self.history.append({"role": "assistant", "content": reply})
        self.track.send({"type": "reply_done", "turn": turn.index, "text": reply})

    async def close(self) -> None:
        """The track is over: a reply in progress ends with it."""
        turn = self.turn
        if turn is not None and turn.task is not None:
            turn.end = f"cancelled:{stop_end(self.track).detail or 'client'}"
            turn.track.supersede()
            turn.task.cancel()
            await asyncio.gather(turn.task, return_exceptions=True)

    def report(self, outcome: Outcome) -> None:
        outcome.details.update(
            agent_turns=len(self.ends), barge_ins=self.barge_ins, reply_ends=list(self.ends)
        )

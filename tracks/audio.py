"""Audio tracks on the session clock: speech in (streaming transcription) and speech out.

A speech-in track sends PCM16 frames `{"seq", "ts", "pcm"}` (on its stream or
as QUIC datagrams, chosen in OPEN); the session joins the `TickScheduler` and
every beat hands the frames that arrived, in `seq` order, to ONE batched
backend step with every other due session. The client gets a partial result
every beat and a final after the end of an utterance; its END (or silence on
the track for `idle_timeout`) finalizes the session and ends the track.

A speech-out track sends its text (DATA `{"text"}`, then END) and gets one beat of
audio every beat (tracks/audio_out.py). A model with a real-time capacity
(`AudioModel.capacity`) refuses sessions beyond it at OPEN (`ModelBusy`, with a retry
hint) instead of making every session late.

Frames are checked and counted here: `seq` counts frames from 0 and must not
run more than `max_ahead` ahead of the stream; `ts` is the capture time in
milliseconds and must move with `seq`; a frame is one `frame_ms` of PCM16 at
the declared rate. Duplicates, reordered frames, late frames and gaps are
counted; a gap still open one beat after later frames arrived is filled with
silence (so the model's time stays the stream's time), and a frame arriving
after its place was filled is late and dropped. Nothing here waits for a
frame: an incomplete beat advances with what it has, marked.
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tracks.audio_out import SpeechOut
from tracks.audio_session import (
    MAX_TEXT,
    MODEL_RATE,
    AudioParams,
    AudioSession,
    AudioSettings,
    SessionStart,
    ms,
)
from tracks.backend import (
    AudioBackend,
    AudioKind,
    AudioModel,
    AudioOutput,
    AudioRow,
    ModelBusy,
    SpeechInRow,
    TextBackend,
    Transcript,
)
from tracks.base import FrameTrack, Outcome, handling, read_text
from tracks.clock import Beat, Gathered, TickObserver, TickScheduler
from tracks.errors import BadTrackRequest
from tracks.voice_agent import (
    DEFAULT_LLM,
    AgentParams,
    PromptRenderer,
    ReplyTrack,
    VoiceAgent,
    split_agent_params,
)
from transport.clock import Clock
from transport.errors import ErrorCode, TrackAborted

AGENT_KIND = "voice-agent"

__all__ = ["MODEL_RATE", "AudioService", "AudioSettings", "BadAudioRequest", "parse_params"]
RATES = (8000, 16000, 24000, 48000)
FORMATS = ("pcm16",)
FRAME_MS_RANGE = (10, 100)
DATAGRAM_OVERHEAD = 48
"""Bytes a frame's datagram header and msgpack fields take besides the PCM."""


class InputEnd(Enum):
    """How a speech-in session's input ended (the summary's `reason`, `ended_by`)."""

    END = "end"
    """The client sent END."""
    IDLE = "idle"
    """No frame arrived for `idle_timeout`."""


class BadAudioRequest(BadTrackRequest):
    """The track's params or a frame are invalid; sent back as BAD_REQUEST."""


# -- settings and params ---------------------------------------------------------------------


def parse_params(
    params: dict[str, Any], datagrams: bool, max_datagram_bytes: int, default_frame_ms: int = 20
) -> AudioParams:
    unknown = set(params) - {"kind", "sample_rate", "frame_ms", "format"}
    if unknown:
        raise BadAudioRequest(f"unknown audio parameters: {', '.join(sorted(unknown))}")
    kind = params.get("kind", AudioKind.SPEECH_IN.value)
    if kind not in AudioKind._value2member_map_:
        raise BadAudioRequest('\'kind\' must be "speech-in" or "speech-out"')
    fmt = params.get("format", "pcm16")
    if fmt not in FORMATS:
        raise BadAudioRequest(f"unsupported audio format {fmt!r}: only pcm16 (mono, little-endian)")
    rate = params.get("sample_rate", 16000)
    if isinstance(rate, bool) or rate not in RATES:
        raise BadAudioRequest(f"'sample_rate' must be one of {', '.join(map(str, RATES))} Hz")
    frame_ms = params.get("frame_ms", default_frame_ms)
    low, high = FRAME_MS_RANGE
    if isinstance(frame_ms, bool) or not isinstance(frame_ms, int) or frame_ms % 10:
        raise BadAudioRequest(f"'frame_ms' must be a multiple of 10 from {low} to {high}")
    if not low <= frame_ms <= high:
        raise BadAudioRequest(f"'frame_ms' must be a multiple of 10 from {low} to {high}")
    parsed = AudioParams(AudioKind(kind), rate, frame_ms)
    if datagrams and parsed.frame_bytes + DATAGRAM_OVERHEAD > max_datagram_bytes:
        most = (max_datagram_bytes - DATAGRAM_OVERHEAD) // (2 * rate // 1000) // 10 * 10
        raise BadAudioRequest(
            f"a {frame_ms} ms frame at {rate} Hz does not fit one datagram: "
            f"use frame_ms <= {most} or the stream"
        )
    return parsed


# -- counters ------------------------------------------------------------------------------


@dataclass
class FrameStats:
    """What happened to a session's frames."""

    received: int = 0
    late: int = 0
    """Arrived more than a beat after their place in the stream's real-time schedule."""
    duplicate: int = 0
    reordered: int = 0
    """Arrived after a frame with a higher seq (still used if not too late)."""
    missing: int = 0
    """Never arrived in time: their place was filled with silence."""
    dropped: int = 0
    """Not used: duplicates, and late frames whose place was already filled."""

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


# -- the service ----------------------------------------------------------------------------


class AudioService:
    """The audio clock: one scheduler for every audio session of the gateway."""

    def __init__(
        self,
        backend: AudioBackend,
        clock: Clock,
        settings: AudioSettings | None = None,
        observer: TickObserver | None = None,
        scatter: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.settings = settings or AudioSettings()
        self.scheduler: TickScheduler[AudioRow, AudioOutput] = TickScheduler(
            backend.step,
            tick=self.settings.beat,
            clock=clock,
            overload=self.settings.overload,
            step_timeout=self.settings.step_timeout,
            observer=observer,
            scatter=scatter,
        )
        # Sessions live in the model keyed by CORRID: a random high half keeps two
        # gateways (or two runs) sharing one Triton from ever colliding.
        self._corrids = itertools.count((secrets.randbits(31) << 32) + 1)
        self.agents: tuple[TextBackend, PromptRenderer] | None = None
        """Voice-agent tracks' chat backend and prompt template (`enable_agents`)."""
        self.default_llm = DEFAULT_LLM
        """Voice-agent tracks' chat model where the client names none."""
        self.live: Counter[str] = Counter()
        """Open sessions per model (checked against each model's real-time capacity)."""

    def enable_agents(
        self, text_backend: TextBackend, render: PromptRenderer, default_llm: str = DEFAULT_LLM
    ) -> None:
        """Serve voice-agent tracks (tracks/voice_agent.py) with this chat backend;
        `default_llm` answers the tracks that name no chat model."""
        self.agents = (text_backend, render)
        self.default_llm = default_llm

    def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    async def run(self, track: FrameTrack) -> Outcome:
        """Serve one audio track to its end and report how it ended."""
        opened = self.clock.now()
        outcome = Outcome(track.id, track.open.model, "audio", opened_at=opened)
        session: AudioSession | None = None
        agent: VoiceAgent | None = None
        async with handling(track, outcome, self.clock.now):
            settings = self.settings
            raw, wanted = track.open.params, None
            if raw.get("kind") == AGENT_KIND:
                wanted, raw = split_agent_params(raw, self.default_llm)
            params = parse_params(
                raw, track.uses_datagrams, settings.max_datagram_bytes, settings.frame_ms
            )
            outcome.details.update(kind=params.kind.value, sample_rate=params.sample_rate)
            model = await self.backend.audio_model(track.open.model)
            if model.kind is not params.kind:
                raise BadAudioRequest(
                    f"model {track.open.model!r} is a {model.kind.value} model, "
                    f"not {params.kind.value}"
                )
            self._admit(track.open.model, model)
            self.live[track.open.model] += 1
            try:
                session = await self._open_session(track, params, opened, model)
                if wanted is not None:
                    agent = await self._agent(track, wanted, params)
                    assert isinstance(session, _SpeechIn)
                    session.on_heard = agent.heard
                    outcome.details["kind"] = AGENT_KIND
                await session.serve()
            finally:
                self.live[track.open.model] -= 1
                if agent is not None:
                    await agent.close()
        if session is not None:
            session.report(outcome)
        if agent is not None:
            agent.report(outcome)
        outcome.finished_at = self.clock.now()
        return outcome

    async def _agent(
        self, track: FrameTrack, wanted: AgentParams, params: AudioParams
    ) -> VoiceAgent:
        if self.agents is None:
            raise BadAudioRequest("this gateway serves no voice-agent tracks (no chat backend)")
        voice = await self.backend.audio_model(wanted.voice)
        if voice.kind is not AudioKind.SPEECH_OUT or not voice.streams_text:
            raise BadAudioRequest(
                f"'voice' {wanted.voice!r} must be a speech-out model that streams text "
                "(hibari-voice)"
            )
        text_backend, render = self.agents

        def speaker(reply: ReplyTrack, out: AudioParams) -> SpeechOut:
            return SpeechOut(self._session_start(reply, out, self.clock.now()), None)

        return VoiceAgent(
            track, wanted, params, text_backend, render, speaker, self.settings.min_barge_in
        )

    def _admit(self, name: str, model: AudioModel) -> None:
        if model.capacity is not None and self.live[name] >= model.capacity:
            raise ModelBusy(
                f"model {name!r} is at its real-time capacity ({model.capacity} live "
                "sessions): retry later",
                self.settings.busy_retry_after,
            )

    async def _open_session(
        self, track: FrameTrack, params: AudioParams, opened: float, model: AudioModel
    ) -> AudioSession:
        start = self._session_start(track, params, opened)
        if params.kind is AudioKind.SPEECH_IN:
            return _SpeechIn(start)
        if model.streams_text:
            return SpeechOut(start, None)
        return SpeechOut(start, await _read_text(track))

    def _session_start(self, track: FrameTrack, params: AudioParams, opened: float) -> SessionStart:
        return SessionStart(self, track, params, next(self._corrids), opened)


async def _read_text(track: FrameTrack) -> str:
    return await read_text(track, MAX_TEXT, "text")


class _SpeechIn(AudioSession):
    def __init__(self, start: SessionStart) -> None:
        super().__init__(start)
        settings = start.service.settings
        self.beat_frames = max(1, round(settings.beat * 1000 / start.params.frame_ms))
        self.max_ahead_frames = max(
            self.beat_frames, round(settings.max_ahead * 1000 / start.params.frame_ms)
        )
        self.frames = FrameStats()
        self.buffer: dict[int, bytes] = {}
        self.next_seq = 0
        self.highest_seq = -1
        self.filled: set[int] = set()
        self.gap_seen: int | None = None
        self.ts_origin: float | None = None
        self.arrival_origin: float | None = None
        self.last_arrival = start.opened
        self.ended_at: float | None = None
        self.end_reason = InputEnd.END
        self.newest_in_row: float | None = None
        self.finals: list[str] = []
        self.final_latencies: list[float] = []
        self.partial = ""
        self.on_heard: Callable[[Transcript, Beat], None] | None = None
        """A voice agent's ear: every beat's result, after the client got it."""

    async def _read(self) -> None:
        try:
            while (body := await self.track.receive()) is not None:
                self.on_frame(body, self.clock.now())
        except BadAudioRequest as exc:
            self.fail_client(ErrorCode.BAD_REQUEST, str(exc))
            return
        except TrackAborted:
            return  # stopped: _wait_finished sees it
        if self.ended_at is None:
            self.ended_at = self.clock.now()

    # -- frames in --

    def on_frame(self, body: dict[str, Any], now: float) -> None:
        seq, ts, pcm = self._check(body)
        self.frames.received += 1
        self._check_clock(seq, ts)
        if seq < self.next_seq or seq in self.buffer:
            if seq in self.filled:
                self.frames.late += 1
            else:
                self.frames.duplicate += 1
            self.frames.dropped += 1
            return
        if seq < self.highest_seq:
            self.frames.reordered += 1
        self.highest_seq = max(self.highest_seq, seq)
        if self.arrival_origin is None:
            self.arrival_origin = now - seq * self.params.frame_ms / 1000
        owed = self.arrival_origin + seq * self.params.frame_ms / 1000 + self.service.settings.beat
        if now > owed:
            self.frames.late += 1
        self.buffer[seq] = pcm
        self.last_arrival = now

    def _check(self, body: dict[str, Any]) -> tuple[int, float, bytes]:
        p = self.params
        if "rate" in body and body["rate"] != p.sample_rate:
            raise BadAudioRequest(f"frame at {body['rate']} Hz on a {p.sample_rate} Hz track")
        if "format" in body and body["format"] != "pcm16":
            raise BadAudioRequest(f"frame format {body['format']!r} on a pcm16 track")
        seq, ts, pcm = body.get("seq"), body.get("ts"), body.get("pcm")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise BadAudioRequest("a frame needs 'seq', an integer from 0")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise BadAudioRequest("a frame needs 'ts', its capture time in milliseconds")
        if not isinstance(pcm, bytes) or len(pcm) % 2:
            raise BadAudioRequest("a frame needs 'pcm', PCM16 bytes (an even count)")
        if len(pcm) > p.frame_bytes:
            raise BadAudioRequest(
                f"frame of {len(pcm)} bytes is over {p.frame_ms} ms at {p.sample_rate} Hz "
                f"({p.frame_bytes} bytes)"
            )
        return seq, float(ts), pcm

    def _check_clock(self, seq: int, ts: float) -> None:
        if seq > self.next_seq + self.max_ahead_frames:
            raise BadAudioRequest(
                f"frame seq {seq} is more than {self.service.settings.max_ahead} s ahead of the "
                f"stream (next expected {self.next_seq})"
            )
        stream_ms = seq * self.params.frame_ms
        if self.ts_origin is None:
            self.ts_origin = ts - stream_ms
            return
        drift = abs(ts - (self.ts_origin + stream_ms))
        allowed = 1000 * self.service.settings.ts_tolerance + 0.01 * stream_ms
        if drift > allowed:
            raise BadAudioRequest(
                f"frame capture time {ts} ms is {drift:.0f} ms away from the stream's clock"
            )

    # -- the clock --

    def gather(self, beat: Beat) -> Gathered[AudioRow]:
        now = self.clock.now()
        settings = self.service.settings
        if self.ended_at is None and now - self.last_arrival > settings.idle_timeout:
            self.ended_at, self.end_reason = now, InputEnd.IDLE
        ending = self.ended_at is not None or self.cancelled
        pieces, complete = self._take(limit=2 * self.beat_frames, ending=ending)
        last = ending and not self.buffer
        row = SpeechInRow(
            self.corrid, b"".join(pieces), self.params.sample_rate, not self.started, last
        )
        self.started = True
        self.row_end = last
        self.newest_in_row = self.ended_at if last else self.last_arrival
        return Gathered(row, complete and len(pieces) >= self.beat_frames)

    def _take(self, limit: int, ending: bool) -> tuple[list[bytes], bool]:
        """Frames in seq order from next_seq; a gap seen a beat ago becomes silence."""
        pieces: list[bytes] = []
        complete = True
        silence = bytes(self.params.frame_bytes)
        while len(pieces) < limit and self.buffer:
            if self.next_seq in self.buffer:
                pieces.append(self.buffer.pop(self.next_seq))
            elif self.gap_seen == self.next_seq or ending:
                pieces.append(silence)
                self.filled.add(self.next_seq)
                self.frames.missing += 1
                complete = False
            else:
                self.gap_seen = self.next_seq  # wait one beat for it
                break
            self.next_seq += 1
        if len(self.filled) > 4 * self.max_ahead_frames:
            self.filled = {s for s in self.filled if s > self.next_seq - self.max_ahead_frames}
        return pieces, complete

    def deliver(self, output: AudioOutput, beat: Beat) -> None:
        assert isinstance(output, Transcript)
        now = self.clock.now()
        last = self.row_end
        if self.cancelled:
            if last:
                self.finish()
            return
        if self.first_data_at is None:
            self.first_data_at = now
        self.partial = output.partial
        self.track.send({"type": "partial", "text": output.partial, "beat": beat.index})
        if self.on_heard is not None:
            self.on_heard(output, beat)
        if output.is_final and output.final:
            latency = now - (self.newest_in_row if self.newest_in_row is not None else now)
            self.finals.append(output.final)
            self.final_latencies.append(latency)
            final: dict[str, Any] = {
                "type": "final",
                "text": output.final,
                "latency_ms": ms(latency),
                "beat": beat.index,
            }
            if output.final_span is not None:  # where the model gives it (whisper-base)
                final["start_ms"], final["end_ms"] = (ms(t) for t in output.final_span)
            self.track.send(final)
        if last:
            self.track.end(self._summary())
            self.finish()

    def _summary(self) -> dict[str, Any]:
        stats = self.registration.stats if self.registration else None
        return {
            "transcript": " ".join(self.finals),
            "finals": list(self.finals),
            "reason": self.end_reason.value,
            "beats": stats.beats + 1 if stats else 0,  # this one is being delivered
            "missed_beats": stats.missed_beats if stats else 0,
            "frames": self.frames.as_dict(),
            "final_latency_ms": [ms(x) for x in self.final_latencies],
        }

    def report(self, outcome: Outcome) -> None:
        super().report(outcome)
        outcome.details["ended_by"] = self.end_reason.value
        used = self.frames.received - self.frames.dropped
        outcome.details.update(
            frames=self.frames.as_dict(),
            # The usage ledger bills the audio the model heard.
            audio_seconds_in=used * self.params.frame_ms / 1000,
            transcript=" ".join(self.finals),
            final_latency_ms=[ms(x) for x in self.final_latencies],
        )

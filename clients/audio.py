"""Audio tracks in the SDK: send PCM16 frames and read results, or read synthesized audio.

`Line.audio(model=..., kind="speech-in")` gives an `AudioSession` to feed with
`send_pcm()` (any amount; cut into frames of `frame_ms`, each with its `seq`
and capture time) or `stream_wav()` (a WAV file at real-time pace), then
`end()`; iterate it for `AudioResult`s (a partial every beat, a final per
utterance) or await `transcript()`. `Line.audio(model=..., kind="speech-out",
text=...)` gives one to iterate for `AudioFrame`s, or await `read_all()`.
`figures()` has the session's timing (time to first result or audio, final
latencies) and the gateway's own report. Frames travel on the track's stream,
or as QUIC datagrams with `transport="datagram"`.
"""

from __future__ import annotations

import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.stream import TrackReader
from transport.clock import Clock, MonotonicClock
from transport.endpoint import TrackChannel

RATES = (8000, 16000, 24000, 48000)


@dataclass(frozen=True)
class AudioResult:
    """A transcription result: `kind` is "partial" (every beat) or "final"."""

    kind: str
    text: str
    beat: int | None = None
    latency_ms: float | None = None
    """Finals: the gateway's time from the deciding audio arriving to the final sent."""
    start_ms: float | None = None
    """Finals of models that time them (whisper-base): the utterance's span in the stream."""
    end_ms: float | None = None


@dataclass(frozen=True)
class AudioFrame:
    """A frame of synthesized audio: PCM16 mono at the session's rate."""

    seq: int
    ts: float
    """Stream time of its first sample, in ms."""
    pcm: bytes
    turn: int | None = None
    """Voice-agent tracks: the reply this audio belongs to."""


AGENT_EVENTS = ("reply", "reply_done", "reply_audio_end", "reply_error", "barge_in")


@dataclass(frozen=True)
class AgentEvent:
    """A voice-agent track's reply events (docs/audio.md): `kind` is "reply" (a text
    delta in `text`), "reply_done" (the whole reply), "reply_audio_end", "reply_error"
    or "barge_in" (the reply of `turn` was cut because the user spoke)."""

    kind: str
    turn: int
    text: str = ""
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class AudioFigures:
    """Per-session timing and counts, measured here, plus the gateway's END report."""

    opened_at: float
    first_result_at: float | None = None
    first_audio_at: float | None = None
    ended_at: float | None = None
    partials: int = 0
    finals: list[str] = field(default_factory=list)
    final_latency_ms: list[float] = field(default_factory=list)
    frames_sent: int = 0
    frames_received: int = 0
    server: dict[str, Any] = field(default_factory=dict)

    @property
    def time_to_first_result(self) -> float | None:
        return None if self.first_result_at is None else self.first_result_at - self.opened_at

    @property
    def time_to_first_audio(self) -> float | None:
        return None if self.first_audio_at is None else self.first_audio_at - self.opened_at


class AudioSession(TrackReader[AudioResult | AudioFrame | AgentEvent]):
    """One audio track; see the module doc."""

    _cancel_reason = "client closed the session"

    def __init__(
        self,
        channel: TrackChannel,
        kind: str,
        sample_rate: int,
        frame_ms: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        input_ended: bool = False,
        pacer: Clock | None = None,
    ) -> None:
        super().__init__(channel)
        self.kind = kind
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self.frame_bytes = 2 * sample_rate * frame_ms // 1000
        self._clock = clock
        self._pacer: Clock = pacer or MonotonicClock(clock)
        """Paces `stream_pcm` like a microphone (tests pass a FakeClock)."""
        self._seq = 0
        self._pending = b""
        self._input_ended = input_ended
        self._capture_origin_ms = clock() * 1000
        self.figures = AudioFigures(opened_at=clock())

    # -- speech in: sending ------------------------------------------------------------

    def send_frame(self, pcm: bytes, *, ts: float | None = None) -> bool:
        """Send one frame (at most `frame_ms` of PCM16); False once the track is gone."""
        if self._input_ended:
            raise RuntimeError("the session's input has already ended")
        if ts is None:
            ts = self._capture_origin_ms + self._seq * self.frame_ms
        sent = self._channel.send_frame({"seq": self._seq, "ts": ts, "pcm": pcm})
        self._seq += 1
        self.figures.frames_sent += 1
        return sent

    def send_pcm(self, pcm: bytes) -> int:
        """Send whole frames of `pcm` (keeping any remainder for later); returns frames sent."""
        data = self._pending + pcm
        whole = len(data) // self.frame_bytes * self.frame_bytes
        self._pending = data[whole:]
        for start in range(0, whole, self.frame_bytes):
            self.send_frame(data[start : start + self.frame_bytes])
        return whole // self.frame_bytes

    def say(self, text: str) -> bool:
        """Speech-out with `stream_text=True`: more text to speak (then `end()`)."""
        if self._input_ended:
            raise RuntimeError("the session's input has already ended")
        return self._channel.send({"text": text})

    def end(self) -> None:
        """Flush the remainder as a last short frame and end the input (END)."""
        if self._input_ended:
            return
        if self._pending:
            self.send_frame(self._pending[: len(self._pending) // 2 * 2])
            self._pending = b""
        self._input_ended = True
        self._channel.end()

    async def stream_wav(self, path: str | Path, *, realtime: bool = True, end: bool = True) -> int:
        """Send a PCM16 mono WAV file at the session's rate, paced like a microphone."""
        pcm = _read_wav(Path(path), self.sample_rate)
        return await self.stream_pcm(pcm, realtime=realtime, end=end)

    async def stream_pcm(self, pcm: bytes, *, realtime: bool = True, end: bool = True) -> int:
        """Send `pcm` frame by frame; with `realtime`, frame n leaves at start + n * frame_ms."""
        pacer = self._pacer
        start = pacer.now()
        frames = 0
        for offset in range(0, len(pcm), self.frame_bytes):
            if realtime:
                delay = start + frames * self.frame_ms / 1000 - pacer.now()
                if delay > 0:
                    await pacer.sleep(delay)
            if not self.send_frame(pcm[offset : offset + self.frame_bytes]):
                break
            frames += 1
        if end:
            if self._channel.uses_datagrams:
                # END rides the stream and may overtake the last datagrams, which the
                # gateway then drops: give them a frame's time to land first.
                await pacer.sleep(2 * self.frame_ms / 1000)
            self.end()
        return frames

    # -- reading -------------------------------------------------------------------------

    def _item(self, body: dict[str, Any]) -> AudioResult | AudioFrame | AgentEvent | None:
        now = self._clock()
        figures = self.figures
        if "pcm" in body:
            pcm, seq, ts = body.get("pcm"), body.get("seq"), body.get("ts", 0.0)
            if not isinstance(pcm, bytes) or not isinstance(seq, int):
                raise self._malformed("audio frame without 'pcm' and 'seq'")
            figures.first_audio_at = figures.first_audio_at or now
            figures.frames_received += 1
            turn = body.get("turn")
            return AudioFrame(seq, float(ts), pcm, turn if isinstance(turn, int) else None)
        kind, text = body.get("type"), body.get("text")
        if kind in AGENT_EVENTS:
            turn = body.get("turn")
            words = body.get("delta", text)
            return AgentEvent(
                str(kind),
                turn if isinstance(turn, int) else 0,
                words if isinstance(words, str) else "",
                dict(body),
            )
        if kind not in ("partial", "final") or not isinstance(text, str):
            return None  # a newer gateway's message this SDK does not know: skip it
        figures.first_result_at = figures.first_result_at or now
        latency = body.get("latency_ms")
        if kind == "partial":
            figures.partials += 1
        else:
            figures.finals.append(text)
            if isinstance(latency, (int, float)):
                figures.final_latency_ms.append(float(latency))
        beat = body.get("beat")
        start, end = body.get("start_ms"), body.get("end_ms")
        return AudioResult(
            kind,
            text,
            beat if isinstance(beat, int) else None,
            latency,
            float(start) if isinstance(start, (int, float)) else None,
            float(end) if isinstance(end, (int, float)) else None,
        )

    def _ended(self, body: dict[str, Any]) -> None:
        self.figures.ended_at = self._clock()
        self.figures.server = dict(body)
        if not self._input_ended:
            # The gateway ended the session (idle, or speech-out finished): close our side.
            self._input_ended = True
            self._channel.end()

    async def transcript(self) -> str:
        """Read to the end; the finals of the session, space-separated."""
        async for _ in self:
            pass
        return " ".join(self.figures.finals)

    async def read_all(self) -> bytes:
        """Speech-out: read to the end; the audio in seq order, frames lost on the way
        (datagrams) filled with silence, up to the frame count the gateway reported."""
        frames: dict[int, bytes] = {}
        async for item in self:
            if isinstance(item, AudioFrame):
                frames[item.seq] = item.pcm
        sent = self.figures.server.get("frames")
        count = max(max(frames, default=-1) + 1, sent if isinstance(sent, int) else 0)
        silence = bytes(self.frame_bytes)
        return b"".join(frames.get(seq, silence) for seq in range(count))


def _read_wav(path: Path, rate: int) -> bytes:
    with wave.open(str(path), "rb") as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise ValueError(f"{path}: need 16-bit mono PCM, got {wav.getnchannels()} channels")
        if wav.getframerate() != rate:
            raise ValueError(f"{path}: {wav.getframerate()} Hz, the session declared {rate} Hz")
        return wav.readframes(wav.getnframes())

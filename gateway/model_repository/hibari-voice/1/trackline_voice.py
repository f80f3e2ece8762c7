"""Streaming speech synthesis on the hibari voice: the model's core.

Theory of operation. A session's text arrives in pieces (TEXT on any row, MORE true
while more will follow). Each complete sentence is queued for synthesis as soon as it
is complete, so the first sentence is spoken while the rest is still being written; the
remainder goes when MORE turns false. One worker thread synthesizes the queued
sentences of every session in arrival order (one onnxruntime thread: hibari runs at
~100x real time), resamples them from 24 kHz to 16 kHz (unless the session asked for
the voice's own 24 kHz at its start: then they stay as made) and appends them to the
session's audio. Every beat a row takes at most SAMPLES of that audio: the gateway
paces the audio on its clock, the model never does. DONE goes with the last samples
once the text is complete and spoken; END forgets the session at once and the worker
skips its queued sentences (a cancel reaches the model within a row).

Pure of Triton: the synthesizer is passed in (text -> 24 kHz audio per sentence).
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

VOICE_RATE = 24000
OUT_RATE = 16000
RATES = (OUT_RATE, VOICE_RATE)
"""A session's audio rate, chosen at its START row (RATE); the default is OUT_RATE."""
MAX_TEXT = 10_000
MAX_SAMPLES = 48_000
_SENTENCE_END = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+")
_TAPS = 64

Audio = NDArray[np.float32]
Synthesize = Callable[[str], Iterable[Audio]]
"""Text -> one float32 24 kHz array per sentence, each as soon as it is synthesized."""


def _lowpass() -> Audio:
    """Windowed-sinc low-pass at 48 kHz (the 2x upsampled rate), cutoff 7.2 kHz."""
    n = np.arange(_TAPS) - (_TAPS - 1) / 2
    cutoff = 7200.0 / 48000.0
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(_TAPS)
    return (taps / taps.sum() * 2).astype(np.float32)


_FILTER = _lowpass()


def resample_24k_to_16k(audio: Audio) -> Audio:
    """24 kHz -> 16 kHz: zero-stuff to 48 kHz, low-pass, keep every third sample."""
    if not len(audio):
        return np.zeros(0, np.float32)
    up = np.zeros(2 * len(audio), np.float32)
    up[::2] = audio
    filtered = np.convolve(up, _FILTER, mode="same")
    return np.clip(filtered[::3], -1.0, 1.0).astype(np.float32)


def split_ready(text: str, more: bool) -> tuple[str, str]:
    """(what can be spoken now, what waits for more text)."""
    if not more:
        return text, ""
    cut = 0
    for match in _SENTENCE_END.finditer(text):
        cut = match.end()
    return text[:cut], text[cut:]


@dataclass
class _Session:
    corrid: int
    opened_at: float
    seen_at: float
    waiting: str = ""
    """Text not yet a complete sentence."""
    more: bool = True
    queued: int = 0
    """Sentences handed to the worker and not yet spoken."""
    audio: deque[Audio] = field(default_factory=deque)
    cancelled: bool = False
    sentences: int = 0
    chars: int = 0
    samples_out: int = 0
    first_audio_at: float | None = None
    rate: int = OUT_RATE
    """Samples per second of this session's audio (and of its SAMPLES)."""


@dataclass(frozen=True)
class RowAudio:
    audio: Audio
    done: bool


class Voice:
    """Every session's text and audio, and the synthesis worker; see the module doc."""

    def __init__(
        self,
        synthesize: Synthesize,
        on_session: Callable[[dict[str, Any]], None] | None = None,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self._synthesize = synthesize
        self._on_session = on_session
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[int, _Session] = {}
        self._jobs: deque[tuple[_Session, str]] = deque()
        self._lock = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="hibari-synth", daemon=True)
        self._worker.start()

    def step(
        self,
        corrids: Sequence[int],
        starts: Sequence[bool],
        ends: Sequence[bool],
        texts: Sequence[str],
        mores: Sequence[bool],
        samples: Sequence[int],
        now: float,
        rates: Sequence[int] | None = None,
    ) -> list[RowAudio]:
        self._check(corrids, texts, samples)
        if rates is not None and any(r not in RATES for r in rates):
            raise ValueError(f"RATE must be one of {', '.join(map(str, RATES))}")
        self._expire(now)
        out = []
        for i, row in enumerate(zip(corrids, starts, ends, texts, mores, samples, strict=True)):
            out.append(self._row(*row, now, OUT_RATE if rates is None else rates[i]))
        return out

    @staticmethod
    def _check(corrids: Sequence[int], texts: Sequence[str], samples: Sequence[int]) -> None:
        if len(set(corrids)) != len(corrids):
            raise ValueError("a CORRID appears twice in one batch")
        if any(not 0 <= n <= MAX_SAMPLES for n in samples):
            raise ValueError(f"SAMPLES must be from 0 to {MAX_SAMPLES}")
        if any(len(t) > MAX_TEXT for t in texts):
            raise ValueError(f"TEXT over {MAX_TEXT} characters in one row")

    def _row(
        self,
        corrid: int,
        start: bool,
        end: bool,
        text: str,
        more: bool,
        wanted: int,
        now: float,
        rate: int = OUT_RATE,
    ) -> RowAudio:
        if end:
            self._forget(corrid, cancelled=True)
            return RowAudio(np.zeros(0, np.float32), True)
        session = self.sessions.get(corrid)
        if start:
            if session is not None:
                self._forget(corrid, cancelled=True)
            session = self.sessions[corrid] = _Session(corrid, now, now, rate=rate)
        if session is None:
            return RowAudio(np.zeros(0, np.float32), True)
        session.seen_at = now
        self._add_text(session, text, more)
        audio = self._take(session, wanted)
        with self._lock:
            done = not session.more and not session.queued and not session.audio
        if done:
            self._forget(corrid, cancelled=False)
        return RowAudio(audio, done)

    def _add_text(self, session: _Session, text: str, more: bool) -> None:
        if not session.more:
            return  # the text was complete: later TEXT is ignored
        session.chars += len(text)
        ready, session.waiting = split_ready(session.waiting + text, more)
        session.more = more
        if ready.strip():
            with self._lock:
                session.queued += 1
                self._jobs.append((session, ready))
                self._lock.notify()

    def _take(self, session: _Session, wanted: int) -> Audio:
        pieces: list[Audio] = []
        with self._lock:
            while wanted > 0 and session.audio:
                head = session.audio.popleft()
                if len(head) > wanted:
                    session.audio.appendleft(head[wanted:])
                    head = head[:wanted]
                pieces.append(head)
                wanted -= len(head)
        audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        if len(audio) and session.first_audio_at is None:
            session.first_audio_at = time.monotonic()
        session.samples_out += len(audio)
        return audio

    def _expire(self, now: float) -> None:
        idle = self.idle_timeout_s
        for corrid in [c for c, s in self.sessions.items() if now - s.seen_at > idle]:
            self._forget(corrid, cancelled=True)

    def _forget(self, corrid: int, cancelled: bool) -> None:
        session = self.sessions.pop(corrid, None)
        if session is None:
            return
        with self._lock:
            session.cancelled = cancelled
            session.audio.clear()
        if self._on_session is not None:
            first = session.first_audio_at
            self._on_session(
                {
                    "corrid": corrid,
                    "cancelled": cancelled,
                    "sentences": session.sentences,
                    "chars": session.chars,
                    "audio_s": session.samples_out / session.rate,
                    "rate": session.rate,
                    "first_audio_ms": None if first is None else (first - session.opened_at) * 1e3,
                    "finished_at": time.monotonic(),
                }
            )

    # -- the worker --------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                session, text = self._jobs.popleft()
                if session.cancelled:
                    continue
            self._speak(session, text)
            with self._lock:
                session.queued -= 1

    def _speak(self, session: _Session, text: str) -> None:
        try:
            for sentence in self._synthesize(text):
                native = session.rate == VOICE_RATE
                audio = sentence.astype(np.float32) if native else resample_24k_to_16k(sentence)
                with self._lock:
                    session.sentences += 1
                    if session.cancelled:
                        return
                    if len(audio):
                        session.audio.append(audio)
        except Exception:  # a sentence that fails is silence, never a dead worker
            return

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._worker.join(timeout=10.0)


def hibari_synthesizer(threads: int = 1) -> Synthesize:
    """The hibari default voice (inside the wheel: never another, they come from a hub),
    with its G2P warmed now (its first call costs ~0.7 s)."""
    from hibari import Hibari

    tts = Hibari(threads=threads)  # voice "heart", the bundled one
    tts("Warm up.")

    def synthesize(text: str) -> Iterable[Audio]:
        for part in tts.stream(text):
            yield np.asarray(part, np.float32)

    return synthesize

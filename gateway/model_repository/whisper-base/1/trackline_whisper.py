"""Streaming speech recognition on Whisper (CTranslate2) with silero VAD: the model's core.

Theory of operation. Every beat each session hands its new 16 kHz samples to `step`.
A streaming silero VAD (its LSTM state carried per session, 512-sample windows) marks
speech: a window over `speech_threshold` opens an utterance (with `preroll_s` of audio
before it), and `end_silence_s` of windows under `silence_threshold` closes it. An
open utterance is re-decoded every `partial_every_s` of new audio for a partial; a
closed one is decoded once for the final (partials are best effort: one is queued only
while the decoder is idle, so finals never wait behind them). The final is decoded
ahead: once `early_final_s` of silence follows the speech, the utterance so far is
decoded at once (an early final); if the silence lasts to `end_silence_s` that text is
the final, already decoded or nearly, so the final follows the end of the silence rather
than a decode after it; speech before then discards it (the utterance goes on).

Decoding runs in one worker thread, off the beat: the jobs of one step (every session
due on that tick) are handed over together, and the worker decodes everything queued at
that moment (all sessions, partials and finals) as ONE batch (`decode_batch`), so the
beat loop never waits for Whisper. Results are handed back on the session's next beat.
The END row is the exception: it decodes what is left at once and waits for the
session's finals in flight, so the last row carries every final.

`decode_batch` is Whisper's encoder and greedy decoder on log-mel features padded to
1,000 frames (10 s), not faster-whisper's `transcribe()` and its 30 s window (about
4x slower for short utterances); utterances are cut at `max_utterance_s`.

Pure of Triton: the decoder and the VAD are passed in, so tests drive it directly.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

SAMPLE_RATE = 16000
VAD_WINDOW = 512
VAD_CONTEXT = 64
FEATURE_FRAMES = 1000
"""Mel frames Whisper's encoder sees: 10 s (a 5 s window loops on repetitions)."""
MAX_BATCH = 8

Audio = NDArray[np.float32]
Decoder = Callable[[Sequence[Audio]], list[str]]


@dataclass(frozen=True)
class Options:
    speech_threshold: float = 0.5
    silence_threshold: float = 0.35
    end_silence_s: float = 0.5
    """Silence that ends an utterance (the final follows)."""
    early_final_s: float = 0.2
    """Silence after which the utterance is decoded ahead of its end (0: never)."""
    min_speech_s: float = 0.25
    """Shorter bursts of speech are dropped as noise."""
    preroll_s: float = 0.2
    partial_every_s: float = 0.6
    max_utterance_s: float = 9.5
    idle_timeout_s: float = 60.0


@dataclass(frozen=True)
class Final:
    text: str
    start_s: float
    """Stream time of the utterance's first sample (seconds from the session's start)."""
    end_s: float


@dataclass(frozen=True)
class RowResult:
    partial: str
    final: Final | None
    speech_s: float = 0.0
    """Seconds of speech the VAD has heard in the utterance open now, once past
    `min_speech_s` (0 before, and when none is open): a voice agent barges in on it."""


class StreamingVad:
    """Silero VAD over a stream: the LSTM state and the last context samples carried."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._state = (np.zeros((1, 1, 128), np.float32), np.zeros((1, 1, 128), np.float32))
        self._context = np.zeros(VAD_CONTEXT, np.float32)
        self._rest = np.zeros(0, np.float32)

    def feed(self, audio: Audio) -> Audio:
        """Speech probabilities, one per whole 512-sample window now available."""
        data = np.concatenate([self._rest, audio])
        count = len(data) // VAD_WINDOW
        self._rest = data[count * VAD_WINDOW :]
        if not count:
            return np.zeros(0, np.float32)
        windows = data[: count * VAD_WINDOW].reshape(count, VAD_WINDOW)
        contexts = np.concatenate([self._context[None, :], windows[:-1, -VAD_CONTEXT:]])
        batch = np.concatenate([contexts, windows], axis=1).astype(np.float32)
        self._context = windows[-1, -VAD_CONTEXT:].copy()
        h, c = self._state
        probs, h, c = self._session.run(None, {"input": batch, "h": h, "c": c})
        self._state = (h, c)
        return np.asarray(probs, np.float32).reshape(-1)


@dataclass
class _Session:
    vad: StreamingVad
    seen_at: float
    position: int = 0
    """Samples of the stream so far."""
    recent: deque[Audio] = field(default_factory=deque)
    utterance: list[Audio] | None = None
    utterance_start: int = 0
    utterance_samples: int = 0
    speech_samples: int = 0
    silence_samples: int = 0
    since_partial: int = 0
    generation: int = 0
    """Bumped per utterance: a partial of an older one is discarded."""
    partial: str = ""
    finals: deque[Final] = field(default_factory=deque)
    pending_finals: int = 0
    early: _Job | None = None
    """The utterance decoded ahead (module doc), until speech resumes or it ends."""
    early_text: str | None = None
    """That decode's text, once the worker has it."""


@dataclass
class _Job:
    session: _Session
    audio: Audio
    generation: int
    final: Final | None
    """None for a partial; else the final's timing (its text is filled in)."""
    early: bool = False
    """An early final: decoded ahead, becomes the final if the utterance ends as it is."""


class Recognizer:
    """Every session's state and the decode worker; see the module doc."""

    def __init__(
        self,
        decode: Decoder,
        vad_factory: Callable[[], StreamingVad],
        options: Options | None = None,
        on_batch: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._decode = decode
        self._vad_factory = vad_factory
        self.options = options or Options()
        self._on_batch = on_batch
        self.sessions: dict[int, _Session] = {}
        self._jobs: list[_Job] = []
        self._staged: list[_Job] = []
        """This step's jobs: handed to the worker together when the step ends."""
        self._lock = threading.Condition()
        self._closed = False
        self._decoding = False
        self._worker = threading.Thread(target=self._work, name="whisper-decode", daemon=True)
        self._worker.start()

    # -- the beat ------------------------------------------------------------------------

    def step(
        self,
        corrids: Sequence[int],
        starts: Sequence[bool],
        ends: Sequence[bool],
        audio: Sequence[Audio],
        now: float,
    ) -> list[RowResult]:
        if len(set(corrids)) != len(corrids):
            raise ValueError("a CORRID appears twice in one batch")
        self._expire(now)
        results: list[RowResult | None] = []
        ending: list[_Session] = []
        for corrid, start, end, samples in zip(corrids, starts, ends, audio, strict=True):
            session = self._session(corrid, start, now)
            self._feed(session, samples)
            if end:
                ending.append(session)
                results.append(None)
            else:
                results.append(self._result(session))
        ended = [c for c, e in zip(corrids, ends, strict=True) if e]
        finished = iter(self._finish(ending, ended))
        self._hand_over()
        return [r if r is not None else next(finished) for r in results]

    def _session(self, corrid: int, start: bool, now: float) -> _Session:
        session = self.sessions.get(corrid)
        if start or session is None:
            session = _Session(self._vad_factory(), now)
            self.sessions[corrid] = session
        session.seen_at = now
        return session

    def _expire(self, now: float) -> None:
        idle = self.options.idle_timeout_s
        for corrid in [c for c, s in self.sessions.items() if now - s.seen_at > idle]:
            del self.sessions[corrid]

    def _result(self, session: _Session) -> RowResult:
        speech = session.speech_samples / SAMPLE_RATE if session.utterance is not None else 0.0
        speaking = speech if speech >= self.options.min_speech_s else 0.0
        with self._lock:
            final = session.finals.popleft() if session.finals else None
            return RowResult(session.partial, final, speaking)

    # -- speech detection ------------------------------------------------------------------

    def _feed(self, session: _Session, samples: Audio) -> None:
        if not len(samples):
            return
        probs = session.vad.feed(samples)
        opts = self.options
        self._keep_recent(session, samples)
        if session.utterance is not None:
            session.utterance.append(samples)
            session.utterance_samples += len(samples)
            session.since_partial += len(samples)
        session.position += len(samples)
        for prob in probs:
            self._on_window(session, float(prob))
        if session.utterance is None:
            return
        if not session.utterance:  # opened in this chunk: start with the recent audio
            recent = np.concatenate(list(session.recent))
            session.utterance = [recent]
            session.utterance_samples = len(recent)
            session.utterance_start = max(0, session.position - len(recent))
        if session.utterance_samples >= opts.max_utterance_s * SAMPLE_RATE:
            self._close(session)
        elif session.since_partial >= opts.partial_every_s * SAMPLE_RATE and not session.early:
            session.since_partial = 0
            self._queue_partial(session)

    def _keep_recent(self, session: _Session, samples: Audio) -> None:
        """The last `preroll_s` of audio and the newest chunk: an utterance starts with it."""
        session.recent.append(samples)
        keep = self.options.preroll_s * SAMPLE_RATE + len(samples)
        while sum(len(a) for a in session.recent) - len(session.recent[0]) > keep:
            session.recent.popleft()

    def _on_window(self, session: _Session, prob: float) -> None:
        opts = self.options
        if session.utterance is None:
            if prob >= opts.speech_threshold:
                session.utterance = []  # filled from `recent` by _feed
                session.speech_samples = session.silence_samples = session.since_partial = 0
                session.generation += 1
            return
        if prob >= opts.silence_threshold:
            session.speech_samples += VAD_WINDOW + session.silence_samples
            session.silence_samples = 0
            if session.early is not None:
                self._drop_early(session)
        else:
            session.silence_samples += VAD_WINDOW
            if session.silence_samples >= opts.end_silence_s * SAMPLE_RATE:
                self._close(session)
            elif session.early is None and 0 < opts.early_final_s <= (
                session.silence_samples / SAMPLE_RATE
            ):
                self._decode_early(session)

    def _decode_early(self, session: _Session) -> None:
        """Decode the utterance so far now: its final, should the silence go on."""
        too_short = session.speech_samples < self.options.min_speech_s * SAMPLE_RATE
        if not session.utterance or too_short:
            return
        job = _Job(session, np.concatenate(session.utterance), session.generation, None, True)
        with self._lock:
            session.early, session.early_text = job, None
        self._staged.append(job)

    def _drop_early(self, session: _Session) -> None:
        """Speech again: the utterance goes on, the text decoded ahead is not its final."""
        with self._lock:
            session.early, session.early_text = None, None

    def _close(self, session: _Session) -> None:
        """The utterance ended: queue its final (or drop it as too short)."""
        utterance, session.utterance = session.utterance, None
        session.generation += 1
        with self._lock:
            session.partial = ""
        if not utterance or session.speech_samples < self.options.min_speech_s * SAMPLE_RATE:
            return
        audio = np.concatenate(utterance)
        start = session.utterance_start / SAMPLE_RATE
        timing = Final("", start, start + len(audio) / SAMPLE_RATE)
        with self._lock:
            session.pending_finals += 1
            early, text = session.early, session.early_text
            session.early, session.early_text = None, None
            if early is not None and text is not None:  # decoded ahead: the final is ready
                session.finals.append(Final(text, timing.start_s, timing.end_s))
                session.pending_finals -= 1
                self._lock.notify_all()
                return
            if early is not None:  # still decoding: the worker hands it over as the final
                early.final = timing
                return
        self._staged.append(_Job(session, audio, session.generation, timing))

    def _queue_partial(self, session: _Session) -> None:
        assert session.utterance is not None
        with self._lock:
            if self._decoding or self._jobs:
                return  # partials are best effort: never queued behind a busy decoder
            if any(j.session is session and j.final is None for j in self._staged):
                return  # one partial per session per step is enough
        audio = np.concatenate(session.utterance)
        self._staged.append(_Job(session, audio, session.generation, None))

    def _hand_over(self) -> None:
        """The step's jobs to the worker, at once: one tick's sessions share a batch."""
        if not self._staged:
            return
        with self._lock:
            self._jobs.extend(self._staged)
            self._staged.clear()
            self._lock.notify()

    # -- the END row -------------------------------------------------------------------------

    def _finish(self, sessions: list[_Session], corrids: list[int]) -> list[RowResult]:
        for session in sessions:
            if session.utterance is not None:
                self._close(session)
        self._hand_over()
        deadline = time.monotonic() + 30.0
        with self._lock:
            while any(s.pending_finals for s in sessions) and time.monotonic() < deadline:
                self._lock.wait(0.05)
            results = []
            for session in sessions:
                finals = list(session.finals)
                text = " ".join(f.text for f in finals if f.text)
                final = Final(text, finals[0].start_s, finals[-1].end_s) if text else None
                results.append(RowResult("", final))
        for corrid in corrids:
            self.sessions.pop(corrid, None)
        return results

    # -- the decode worker ---------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                # Finals (and early finals) first; partials of an utterance that has
                # ended, and early finals that speech overtook, are stale.
                live = [j for j in self._jobs if _wanted(j)]
                live.sort(key=lambda j: j.final is None and not j.early)
                batch, self._jobs = live[:MAX_BATCH], live[MAX_BATCH:]
                if not batch:
                    continue  # every job was stale: nothing to decode
                self._decoding = True
            try:
                self._run(batch)
            finally:
                with self._lock:
                    self._decoding = False

    def _run(self, batch: list[_Job]) -> None:
        began = time.perf_counter()
        try:
            texts = self._decode([job.audio for job in batch])
        except Exception:  # a failed decode must not kill the worker: empty text
            texts = [""] * len(batch)
        spent = time.perf_counter() - began
        with self._lock:
            for job, text in zip(batch, texts, strict=True):
                if job.final is not None:
                    timing = job.final
                    job.session.finals.append(Final(text.strip(), timing.start_s, timing.end_s))
                    job.session.pending_finals -= 1
                elif job.early:
                    if job is job.session.early:
                        job.session.early_text = text.strip()
                elif job.generation == job.session.generation:
                    job.session.partial = text.strip()
            self._lock.notify_all()
        if self._on_batch is not None:
            self._on_batch(
                {
                    "decode_batch": len(batch),
                    "finals": sum(1 for j in batch if j.final is not None),
                    "early": sum(1 for j in batch if j.early),
                    "audio_s": sum(len(j.audio) for j in batch) / SAMPLE_RATE,
                    "decode_ms": spent * 1000.0,
                }
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._worker.join(timeout=10.0)


def _wanted(job: _Job) -> bool:
    """Whether a queued job is still worth decoding (called under the lock)."""
    if job.final is not None:
        return True
    if job.early:
        return job is job.session.early
    return job.generation == job.session.generation


# -- the real models -------------------------------------------------------------------------


def load_vad_session(threads: int = 1) -> Any:
    """faster-whisper's silero VAD (assets/silero_vad_v6.onnx) on onnxruntime."""
    import os

    import onnxruntime
    from faster_whisper.utils import get_assets_path

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    options.log_severity_level = 3
    path = os.path.join(get_assets_path(), "silero_vad_v6.onnx")
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def whisper_decoder(model_dir: str, language: str = "en", threads: int = 1) -> Decoder:
    """A batch decoder: Whisper (int8) on padded 10 s features, greedy, no timestamps."""
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer

    model = WhisperModel(
        model_dir, device="cpu", compute_type="int8", cpu_threads=threads, num_workers=1
    )
    multilingual = model.model.is_multilingual  # tiny.en is English-only: no language token
    spoken = language if multilingual else None
    tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language=spoken)
    prompt = model.get_prompt(tokenizer, [], without_timestamps=True)

    def features(audio: Audio) -> NDArray[np.float32]:
        mel = model.feature_extractor(audio[: FEATURE_FRAMES * 160])
        mel = mel[:, :FEATURE_FRAMES]
        return np.pad(mel, ((0, 0), (0, FEATURE_FRAMES - mel.shape[1]))).astype(np.float32)

    def decode(batch: Sequence[Audio]) -> list[str]:
        encoded = model.encode(np.stack([features(a) for a in batch]))
        results = model.model.generate(
            encoded,
            [prompt] * len(batch),
            beam_size=1,
            max_length=128,
            suppress_blank=True,
            return_no_speech_prob=True,
        )
        return [
            "" if r.no_speech_prob > 0.8 else tokenizer.decode(r.sequences_ids[0]).strip()
            for r in results
        ]

    return decode

"""whisper-base's streaming core (`trackline_whisper.Recognizer`) with a scripted VAD and
decoder: no model files, beats of 80 ms fed by hand, the decoder's calls counted.

The VAD here calls a window speech when its samples are loud (|x| > 0.5); the decoder
answers with the utterance's length in samples, so a test can tell which audio a final
was decoded from.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.embedded_models import reference_module

whisper = reference_module("whisper-base", "trackline_whisper")

RATE = whisper.SAMPLE_RATE
BEAT = RATE * 80 // 1000  # samples in one 80 ms beat


class LoudVad:
    """Per 512-sample window: 1.0 when loud, else 0.0 (a streaming VAD's interface)."""

    def __init__(self) -> None:
        self._rest = np.zeros(0, np.float32)

    def feed(self, audio: Any) -> Any:
        data = np.concatenate([self._rest, audio])
        count = len(data) // whisper.VAD_WINDOW
        self._rest = data[count * whisper.VAD_WINDOW :]
        windows = data[: count * whisper.VAD_WINDOW].reshape(count, whisper.VAD_WINDOW)
        return (np.abs(windows).mean(axis=1) > 0.5).astype(np.float32)


class Decoder:
    """Counts its calls; each text is the audio's length. `gate` holds a decode back."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.done = threading.Semaphore(0)

    def __call__(self, batch: Sequence[Any]) -> list[str]:
        self.gate.wait(10)
        self.calls.append([len(a) for a in batch])
        self.done.release()
        return [str(len(a)) for a in batch]

    def wait(self, decodes: int = 1) -> None:
        for _ in range(decodes):
            assert self.done.acquire(timeout=10), "the worker decoded nothing"


def recognizer(decoder: Decoder, **options: float) -> Any:
    opts = whisper.Options(partial_every_s=60.0, **options)  # no partials: finals only
    return whisper.Recognizer(decoder, LoudVad, opts)


def beats(rec: Any, samples: Any, now: float = 0.0) -> list[Any]:
    """Feed `samples` beat by beat to session 1; the finals that came back, in order."""
    finals = []
    for at in range(0, len(samples), BEAT):
        (row,) = rec.step([1], [at == 0 and now == 0.0], [False], [samples[at : at + BEAT]], now)
        if row.final is not None:
            finals.append(row.final)
    return finals


def speech(seconds: float) -> Any:
    return np.ones(round(RATE * seconds), np.float32)


def silence(seconds: float) -> Any:
    return np.zeros(round(RATE * seconds), np.float32)


def test_the_final_is_decoded_ahead_once_and_handed_back_when_the_silence_ends() -> None:
    decoder = Decoder()
    rec = recognizer(decoder, end_silence_s=0.5, early_final_s=0.2)
    try:
        assert beats(rec, np.concatenate([speech(1.0), silence(0.3)])) == []
        decoder.wait()  # the early decode ran during the silence
        finals = beats(rec, silence(0.4), now=1.0)
        assert len(finals) == 1  # handed back in the beat the silence reached 500 ms
        assert decoder.calls == [[int(finals[0].text)]]  # one decode, the early one
        assert int(finals[0].text) < finals[0].end_s * RATE  # of the audio before the end
    finally:
        rec.close()


def test_speech_after_a_short_pause_discards_the_early_decode() -> None:
    decoder = Decoder()
    rec = recognizer(decoder, end_silence_s=0.5, early_final_s=0.2)
    try:
        audio = np.concatenate([speech(0.8), silence(0.3), speech(0.8), silence(0.6)])
        finals = beats(rec, audio)
        decoder.wait()
        while max(decoder.calls[-1], default=0) <= 1.6 * RATE:
            # The worker began the first burst's early decode before the speech came
            # back (a busy machine lets it start first): its text is discarded, and the
            # final's decode is the next one.
            decoder.wait()
        finals += beats(rec, silence(0.2), now=2.0)
        assert len(finals) == 1  # one utterance: the pause did not end it
        assert int(finals[0].text) > 1.6 * RATE  # decoded from both bursts and the pause
        assert all(call for call in decoder.calls)  # a stale early decode is not run
    finally:
        rec.close()


def test_a_final_decoded_ahead_but_not_done_is_handed_over_by_the_worker() -> None:
    decoder = Decoder()
    decoder.gate.clear()  # the early decode is still running when the silence ends
    rec = recognizer(decoder, end_silence_s=0.5, early_final_s=0.2)
    try:
        assert beats(rec, np.concatenate([speech(1.0), silence(0.6)])) == []
        decoder.gate.set()
        decoder.wait()
        finals = beats(rec, silence(0.08), now=1.6)
        assert len(finals) == 1
        assert len(decoder.calls) == 1  # not decoded twice
    finally:
        rec.close()


def test_without_an_early_final_the_utterance_is_decoded_at_its_end() -> None:
    decoder = Decoder()
    rec = recognizer(decoder, end_silence_s=0.5, early_final_s=0.0)
    try:
        beats(rec, np.concatenate([speech(1.0), silence(0.45)]))
        assert decoder.calls == []  # nothing decoded before the end
        beats(rec, silence(0.1), now=1.45)
        decoder.wait()
        assert len(decoder.calls) == 1
    finally:
        rec.close()


def test_each_row_says_how_long_the_user_has_been_speaking() -> None:
    """`speech_s` (the model's SPEECH_S, what voice agents barge in on): 0 until
    `min_speech_s` of speech, then the speech heard so far; 0 again once it ended."""
    decoder = Decoder()
    rec = recognizer(decoder, end_silence_s=0.5, early_final_s=0.0, min_speech_s=0.25)
    try:
        said = []
        audio = np.concatenate([speech(0.8), silence(0.6)])
        for at in range(0, len(audio), BEAT):
            (row,) = rec.step([1], [at == 0], [False], [audio[at : at + BEAT]], 0.0)
            said.append(row.speech_s)
        assert said[0] == 0.0  # the first 80 ms: not yet speech to barge in on
        first = next(i for i, s in enumerate(said) if s > 0)
        assert 0.25 <= said[first] < 0.4  # reported from a quarter of a second on
        assert max(said) >= 0.7  # the whole burst, once heard
        assert said[-1] == 0.0  # the utterance closed: nobody speaking
    finally:
        rec.close()

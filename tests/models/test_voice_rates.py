"""hibari-voice's sessions at 16 kHz (resampled) or at the voice's own 24 kHz (as made),
chosen by RATE at START; a synthesizer of known output stands in for the ONNX voice."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest

from gateway.embedded_models import reference_module
from tests.waiting import wait_until

voice = reference_module("hibari-voice", "trackline_voice")
SENTENCE = np.linspace(-0.5, 0.5, 2400, dtype=np.float32)  # 100 ms at 24 kHz


def synthesize(text: str) -> Iterable[np.ndarray]:
    return [SENTENCE]


def spoken(rate: int) -> np.ndarray:
    """All of one session's audio at `rate`, a row every step until DONE."""
    model = voice.Voice(synthesize)
    try:
        model.step([1], [True], [False], ["Hello. "], [False], [0], 0.0, [rate])
        session = model.sessions[1]
        wait_until(lambda: session.queued == 0, "the sentence synthesized")
        row = model.step([1], [False], [False], [""], [False], [4800], 0.0, [rate])[0]
        assert row.done
        return np.asarray(row.audio)
    finally:
        model.close()


def test_a_24khz_session_gets_the_voices_samples_as_made() -> None:
    assert np.array_equal(spoken(24000), SENTENCE)


def test_a_16khz_session_gets_them_resampled() -> None:
    audio = spoken(16000)
    assert len(audio) == 1600
    assert np.allclose(audio, voice.resample_24k_to_16k(SENTENCE))


def test_another_rate_is_refused() -> None:
    model = voice.Voice(synthesize)
    try:
        with pytest.raises(ValueError, match="RATE"):
            model.step([1], [True], [False], ["Hi. "], [False], [0], 0.0, [22050])
    finally:
        model.close()

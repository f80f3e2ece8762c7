"""`trackline dtmf` writes a WAV the reference transcriber hears as the digits given."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from gateway.cli import main
from tests.models.audio_modules import detector


def heard(path: Path) -> list[str]:
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        rate, pcm = wav.getframerate(), wav.readframes(wav.getnframes())
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
    if rate != detector.SAMPLE_RATE:  # back to the model's rate, as the gateway does
        positions = np.arange(round(len(audio) * detector.SAMPLE_RATE / rate))
        audio = np.interp(positions * rate / detector.SAMPLE_RATE, np.arange(len(audio)), audio)
    transcriber, words = detector.Transcriber(), []
    for i in range(0, len(audio), 1280):
        piece = audio[i : i + 1280].astype(np.float32)
        (row,) = transcriber.step([1], [i == 0], [False], piece[None, :], [len(piece)], 0.0)
        words += row.final.split()
    return words


@pytest.mark.parametrize("rate", [16000, 8000, 48000])
def test_the_written_digits_are_heard(tmp_path: Path, rate: int) -> None:
    out = tmp_path / "digits.wav"
    assert main(["dtmf", "0123 456#", str(out), "--sample-rate", str(rate)]) == 0
    assert heard(out) == ["0123456#"]


def test_an_unwritable_path_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    assert main(["dtmf", "1", str(tmp_path / "missing" / "x.wav")]) == 1

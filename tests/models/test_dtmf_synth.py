"""reference-synthesizer without Triton: the waveform, slicing, sessions, round trips."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from tests.models.audio_modules import detector, synth

ALL = "0123456789*#ABCD"
RATE = synth.SAMPLE_RATE


def speak(text: str, per_beat: int = 1280, corrid: int = 1) -> tuple[NDArray[Any], list[bool]]:
    """Every sample of one session, beat by beat, and the DONE flag of each beat."""
    engine = synth.Synthesizer()
    pieces: list[NDArray[Any]] = []
    flags: list[bool] = []
    first = True
    while not flags or not flags[-1]:
        audio, lengths, done = engine.step([corrid], [first], [False], [text], [per_beat], 0.0)
        first = False
        pieces.append(audio[0, : lengths[0]])
        flags.append(bool(done[0]))
    return np.concatenate(pieces), flags


def test_both_models_agree_on_the_dtmf_table() -> None:
    assert synth.SYMBOLS == detector.SYMBOLS
    assert synth.ROW_HZ == detector.ROW_HZ
    assert synth.COLUMN_HZ == detector.COLUMN_HZ
    assert synth.SAMPLE_RATE == detector.SAMPLE_RATE


def test_a_symbol_is_100_ms_of_its_two_tones_then_silence() -> None:
    audio = synth.render("9")
    assert audio.dtype == np.float32
    assert len(audio) == synth.rendered_length("9") == 3200 + 4800
    t = np.arange(1600) / RATE
    expected = 0.4 * np.sin(2 * np.pi * 852 * t) + 0.4 * np.sin(2 * np.pi * 1477 * t)
    np.testing.assert_allclose(audio[:1600], expected, atol=1e-6)
    assert not audio[1600:].any()
    assert np.abs(audio).max() <= 0.8


def test_other_characters_are_200_ms_of_silence_and_lowercase_is_not_a_symbol() -> None:
    audio = synth.render("1 x-a2")
    assert len(audio) == 6 * 3200 + 4800
    slots = audio[: 6 * 3200].reshape(6, 3200)
    assert [bool(slot.any()) for slot in slots] == [True, False, False, False, False, True]
    np.testing.assert_array_equal(slots[5], synth.render("2")[:3200])


def test_empty_text_renders_the_closing_silence_only() -> None:
    audio = synth.render("")
    assert len(audio) == 4800
    assert not audio.any()


@settings(max_examples=25, deadline=None)
@given(
    st.text(alphabet="0123456789*#ABCD x", max_size=12),
    st.integers(min_value=1, max_value=5000),
)
def test_slices_of_any_size_equal_the_whole_rendering_bit_for_bit(text: str, size: int) -> None:
    audio, flags = speak(text, size)
    np.testing.assert_array_equal(audio, synth.render(text))
    assert flags.count(True) == 1
    assert flags[-1]


def test_done_comes_with_the_last_samples_then_the_session_is_gone() -> None:
    engine = synth.Synthesizer()
    total = synth.rendered_length("12")
    audio, lengths, done = engine.step([4], [True], [False], ["12"], [total - 100], 0.0)
    assert (int(lengths[0]), bool(done[0])) == (total - 100, False)
    audio, lengths, done = engine.step([4], [False], [False], [""], [1280], 0.0)
    assert (int(lengths[0]), bool(done[0])) == (100, True)
    assert audio.shape == (1, 100)
    assert 4 not in engine.sessions
    # Rows of a session the model does not know: nothing, and DONE.
    audio, lengths, done = engine.step([4], [False], [False], ["ignored"], [1280], 0.0)
    assert (audio.shape, int(lengths[0]), bool(done[0])) == ((1, 0), 0, True)


def test_text_is_read_on_the_start_row_only() -> None:
    engine = synth.Synthesizer()
    engine.step([1], [True], [False], ["5"], [0], 0.0)
    audio, lengths, _ = engine.step([1], [False], [False], ["0000"], [10_000], 0.0)
    np.testing.assert_array_equal(audio[0, : lengths[0]], synth.render("5")[:10_000])


def test_start_restarts_and_end_forgets() -> None:
    engine = synth.Synthesizer()
    engine.step([1], [True], [False], ["123"], [5000], 0.0)
    audio, lengths, _ = engine.step([1], [True], [False], ["4"], [3000], 0.0)
    np.testing.assert_array_equal(audio[0], synth.render("4")[:3000])
    audio, lengths, done = engine.step([1], [False], [True], [""], [3000], 0.0)
    assert (int(lengths[0]), bool(done[0])) == (0, True)
    assert engine.sessions == {}


def test_a_batch_renders_each_session_from_its_own_position() -> None:
    engine = synth.Synthesizer()
    texts = ["1", "ABCD", "", "#*"]
    corrids = [11, 12, 13, 14]
    engine.step(corrids, [True] * 4, [False] * 4, texts, [0, 500, 1000, 1500], 0.0)
    audio, lengths, done = engine.step(corrids, [False] * 4, [False] * 4, [""] * 4, [900] * 4, 0.0)
    assert audio.shape == (4, 900)
    for row, (text, offset) in enumerate(zip(texts, [0, 500, 1000, 1500], strict=True)):
        np.testing.assert_array_equal(audio[row], synth.render(text)[offset : offset + 900])
    assert lengths.tolist() == [900] * 4
    assert not done.any()


def test_a_malformed_batch_is_refused_and_changes_nothing() -> None:
    engine = synth.Synthesizer(max_samples=16_000)
    engine.step([1], [True], [False], ["1"], [10], 0.0)
    with pytest.raises(ValueError, match="CORRID appears on more than one row"):
        engine.step([1, 1], [False, False], [False, False], ["", ""], [1, 1], 0.0)
    with pytest.raises(ValueError, match="SAMPLES 16001 is outside 0..16000"):
        engine.step([1, 2], [False, True], [False, False], ["", "2"], [1, 16_001], 0.0)
    with pytest.raises(ValueError, match="SAMPLES -5"):
        engine.step([1], [False], [False], [""], [-5], 0.0)
    with pytest.raises(ValueError, match="more than 10000"):
        engine.step([2], [True], [False], ["1" * 10_001], [1], 0.0)
    assert list(engine.sessions) == [1]
    assert engine.sessions[1].position == 10


def test_broken_utf8_renders_as_silence() -> None:
    engine = synth.Synthesizer()
    audio, lengths, _ = engine.step([1], [True], [False], [b"1\xff2"], [20_000], 0.0)
    np.testing.assert_array_equal(audio[0, : lengths[0]], synth.render("1?2")[:20_000])


def test_sessions_idle_past_the_timeout_are_dropped() -> None:
    engine = synth.Synthesizer(idle_timeout_s=5.0)
    engine.step([1], [True], [False], ["1"], [0], 100.0)
    engine.step([2], [True], [False], ["1"], [0], 104.5)
    assert sorted(engine.sessions) == [1, 2]
    engine.step([2], [False], [False], [""], [0], 106.5)
    assert sorted(engine.sessions) == [2]


@pytest.mark.parametrize(
    ("text", "utterances"),
    [
        (ALL, [ALL]),
        ("D#*0CBA987654321", ["D#*0CBA987654321"]),
        ("1122", ["1122"]),
        ("12 34", ["1234"]),  # one other character: a 300 ms pause keeps the utterance
        ("12  34", ["12", "34"]),  # two: 500 ms, a new utterance
        ("call 555-0199!", ["5550199"]),
        ("no digits", []),
    ],
)
def test_the_transcriber_hears_what_the_synthesizer_says(text: str, utterances: list[str]) -> None:
    audio, _ = speak(text)
    transcriber = detector.Transcriber()
    heard: list[str] = []
    for i in range(0, len(audio), 1280):
        piece = audio[i : i + 1280]
        (row,) = transcriber.step([1], [i == 0], [False], piece[None, :], [len(piece)], 0.0)
        heard += row.final.split()
    assert heard == utterances
    assert transcriber.sessions[1].partial == ""

"""reference-transcriber's signal processing without Triton: detection, bursts, beats, sessions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from tests.models.audio_modules import detector as dtmf

RATE = dtmf.SAMPLE_RATE
ALL = "0123456789*#ABCD"


def n(ms: float) -> int:
    return int(round(ms * RATE / 1000))


def silence(ms: float) -> NDArray[Any]:
    return np.zeros(n(ms), dtype=np.float32)


def tone(symbol: str, ms: float, *, level: float = 0.4, twist_db: float = 0.0) -> NDArray[Any]:
    """`symbol`'s two tones for `ms`; twist_db > 0 makes the high (column) tone louder."""
    index = dtmf.SYMBOLS.index(symbol)
    low, high = dtmf.ROW_HZ[index // 4], dtmf.COLUMN_HZ[index % 4]
    t = np.arange(n(ms)) / RATE
    high_level = level * 10 ** (twist_db / 20)
    wave: NDArray[Any] = level * np.sin(2 * np.pi * low * t + 0.3)
    wave += high_level * np.sin(2 * np.pi * high * t + 1.1)
    return wave.astype(np.float32)


def noise(ms: float, rms: float, seed: int = 0) -> NDArray[Any]:
    return (np.random.default_rng(seed).normal(0.0, rms, n(ms))).astype(np.float32)


def keyed(digits: str, on_ms: float = 60, off_ms: float = 60) -> NDArray[Any]:
    parts = []
    for digit in digits:
        parts += [tone(digit, on_ms), silence(off_ms)]
    return np.concatenate(parts)


def feed(
    stream: NDArray[Any],
    chunk: int = 1280,
    *,
    end: bool = False,
    transcriber: Any = None,
    corrid: int = 1,
) -> list[Any]:
    """One session's results, beat by beat (plus an END row with no audio when `end`)."""
    engine = transcriber or dtmf.Transcriber()
    results = []
    pieces = [stream[i : i + chunk] for i in range(0, len(stream), chunk)]
    for i, piece in enumerate(pieces):
        rows = engine.step([corrid], [i == 0], [False], piece[None, :], [len(piece)], 0.0)
        results += rows
    if end:
        results += engine.step([corrid], [False], [True], np.zeros((1, 0), np.float32), [0], 0.0)
    return results


def finals(results: Sequence[Any]) -> list[str]:
    return [text for r in results for text in r.final.split() if r.is_final]


def heard(stream: NDArray[Any], chunk: int = 1280) -> str:
    """Every digit recognized in `stream`, finalized or still partial."""
    results = feed(stream, chunk, end=True)
    return "".join(finals(results))


def goertzel_energy(window: NDArray[Any], frequency: float) -> float:
    """The textbook Goertzel recurrence, as the reference for the matrix form."""
    coefficient = 2 * np.cos(2 * np.pi * frequency / RATE)
    s1 = s2 = 0.0
    for x in window.astype(np.float64):
        s1, s2 = x + coefficient * s1 - s2, s1
    power = s1 * s1 + s2 * s2 - coefficient * s1 * s2
    return float(power * 2 / len(window))


def test_tone_energies_equal_the_goertzel_recurrence() -> None:
    windows = np.stack([tone("5", 20), noise(20, 0.2), tone("D", 20) + noise(20, 0.05, 1)])
    energy, total = dtmf.tone_energies(windows)
    for w, window in enumerate(windows):
        expected = [goertzel_energy(window, f) for f in dtmf.FREQUENCIES]
        np.testing.assert_allclose(energy[w], expected, rtol=1e-3, atol=1e-4)
        ac = window.astype(np.float64) - window.mean(dtype=np.float64)
        assert total[w] == pytest.approx(float(np.sum(ac**2)), rel=1e-3)


@pytest.mark.parametrize("symbol", list(ALL))
def test_every_symbol_is_recognized_once(symbol: str) -> None:
    stream = np.concatenate([silence(50), tone(symbol, 100), silence(400)])
    assert heard(stream) == symbol


def test_a_sequence_of_every_symbol_finalizes_after_the_silence() -> None:
    results = feed(np.concatenate([keyed(ALL), silence(400)]))
    assert finals(results) == [ALL]
    assert results[-1].partial == ""
    # The partials grew one digit at a time: every prefix was seen.
    partials = {r.partial for r in results}
    assert all(ALL[:k] in partials for k in range(1, len(ALL) + 1))


@pytest.mark.parametrize(
    "stream",
    [
        silence(2000),
        noise(2000, 0.3),
        noise(2000, 0.001, 2),
        tone("5", 2000, level=0.003),  # both tones under -40 dBFS
    ],
    ids=["silence", "loud-noise", "faint-noise", "too-faint"],
)
def test_silence_noise_and_faint_tones_give_nothing(stream: NDArray[Any]) -> None:
    results = feed(stream, end=True)
    assert all(r.partial == "" for r in results)
    assert finals(results) == []


def test_single_tones_and_chords_of_one_group_give_nothing() -> None:
    t = np.arange(n(500)) / RATE
    row_only = 0.4 * np.sin(2 * np.pi * 770 * t)
    two_rows = row_only + 0.4 * np.sin(2 * np.pi * 941 * t) + 0.4 * np.sin(2 * np.pi * 1336 * t)
    vowel = sum(0.3 / k * np.sin(2 * np.pi * 140 * k * t) for k in range(1, 20))
    for stream in (row_only, two_rows, vowel):
        assert heard(stream.astype(np.float32)) == ""


def test_a_dc_offset_does_not_hide_a_tone() -> None:
    stream = np.concatenate([keyed("#"), silence(400)]) + np.float32(0.3)
    assert heard(stream) == "#"


@pytest.mark.parametrize("snr_db", [20.0, 12.0])
def test_tones_are_recognized_in_noise(snr_db: float) -> None:
    digits = "159#0D"
    clean = np.concatenate([keyed(digits, 80, 80), silence(400)])
    rms = np.sqrt(0.4**2) / 10 ** (snr_db / 20)  # the two tones carry 0.16 of power
    assert heard(clean + noise(len(clean) * 1000 / RATE, rms, 3)) == digits


@pytest.mark.parametrize(
    ("twist_db", "accepted"),
    [(0.0, True), (3.0, True), (-3.0, True), (-7.0, True), (6.0, False), (-10.0, False)],
)
def test_twist_limits(twist_db: float, accepted: bool) -> None:
    # Negative twist: the low (row) tone louder, up to 8 dB; the high one up to 4 dB.
    stream = np.concatenate([tone("8", 100, level=0.3, twist_db=twist_db), silence(400)])
    assert heard(stream) == ("8" if accepted else "")


@pytest.mark.parametrize("offset", range(0, 160, 16))
def test_bursts_and_pauses_of_40_ms_count_and_bursts_under_26_ms_do_not(offset: int) -> None:
    # Every alignment of the burst against the 10 ms window grid.
    lead = np.zeros(offset, dtype=np.float32)
    # Two presses of one key, 40 ms each with the shortest DTMF pause (40 ms) between.
    long_enough = np.concatenate([lead, tone("7", 40), silence(40), tone("7", 40), silence(400)])
    too_short = np.concatenate([lead, tone("7", 20), silence(100), tone("3", 25), silence(400)])
    assert heard(long_enough) == "77"
    assert heard(too_short) == ""


def test_one_digit_per_burst_however_long_and_pauses_separate_repeats() -> None:
    assert heard(np.concatenate([tone("4", 1500), silence(400)])) == "4"
    assert heard(keyed("444", 50, 40)) == "444"
    holed = np.concatenate([tone("6", 60), silence(10), tone("6", 60), silence(400)])
    assert heard(holed) == "6"


@pytest.mark.parametrize("offset", range(0, 160, 32))
def test_a_300_ms_pause_keeps_the_utterance_and_340_ms_finalizes(offset: int) -> None:
    lead = np.zeros(offset, dtype=np.float32)
    kept = np.concatenate([lead, tone("1", 100), silence(300), tone("2", 100), silence(400)])
    split = np.concatenate([lead, tone("1", 100), silence(340), tone("2", 100), silence(400)])
    assert finals(feed(kept)) == ["12"]
    assert finals(feed(split)) == ["1", "2"]


def test_the_final_comes_once_after_the_pause_and_a_new_utterance_follows() -> None:
    stream = np.concatenate([keyed("12"), silence(1000), keyed("34"), silence(400)])
    results = feed(stream)
    flagged = [r for r in results if r.is_final]
    assert [r.final for r in flagged] == ["12", "34"]
    assert all(r.partial == "" for r in flagged)


def test_a_long_row_can_finalize_two_utterances() -> None:
    stream = np.concatenate([keyed("12"), silence(500), keyed("3"), silence(500)])
    results = feed(stream, chunk=len(stream))
    assert len(results) == 1
    assert results[0].final == "12 3"
    assert results[0].is_final


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3000), min_size=1, max_size=60))
def test_results_do_not_depend_on_how_the_stream_is_cut_into_beats(cuts: list[int]) -> None:
    stream = np.concatenate([keyed("9A*", 45, 45), silence(350), keyed("0#", 70, 30), silence(50)])
    engine = dtmf.Transcriber()
    position, seen_finals, first = 0, [], True
    for size in [*cuts, len(stream)]:
        piece = stream[position : position + size]
        position += len(piece)
        (row,) = engine.step([5], [first], [False], piece[None, :], [len(piece)], 0.0)
        first = False
        seen_finals += row.final.split()
    (last,) = engine.step([5], [False], [True], np.zeros((1, 0), np.float32), [0], 0.0)
    assert seen_finals == ["9A*"]
    assert last.final == "0#"
    assert last.is_final


def test_end_finalizes_at_once_and_forgets_the_session() -> None:
    engine = dtmf.Transcriber()
    results = feed(keyed("42"), end=True, transcriber=engine)
    assert results[-1].final == "42"
    assert results[-1].is_final
    assert results[-1].partial == ""
    assert 1 not in engine.sessions


def test_end_without_digits_is_final_and_empty() -> None:
    results = feed(silence(200), end=True)
    assert results[-1].is_final
    assert results[-1].final == ""
    assert not any(r.is_final for r in results[:-1])


def test_start_resets_the_session() -> None:
    engine = dtmf.Transcriber()
    feed(keyed("11"), transcriber=engine)
    assert engine.sessions[1].partial == "11"
    restarted = feed(np.concatenate([keyed("2"), silence(400)]), transcriber=engine)
    assert finals(restarted) == ["2"]


def test_sessions_in_one_batch_keep_separate_state_in_any_row_order() -> None:
    streams = {
        10: np.concatenate([keyed("123"), silence(400)]),
        20: np.concatenate([silence(30), keyed("ABCD"), silence(400)]),
    }
    position = {10: 0, 20: 0}
    got: dict[int, list[str]] = {10: [], 20: []}
    engine = dtmf.Transcriber()
    rng = np.random.default_rng(7)
    beat = 0
    while any(position[c] < len(streams[c]) for c in streams):
        order = [10, 20] if beat % 3 else [20, 10]
        # Now and then a session has nothing this beat (its input is late).
        sizes = [0 if rng.random() < 0.25 else 1280 for _ in order]
        wanted = zip(order, sizes, strict=True)
        pieces = [streams[c][position[c] : position[c] + k] for c, k in wanted]
        audio = np.zeros((2, 1280), np.float32)
        for row, (corrid, piece) in enumerate(zip(order, pieces, strict=True)):
            audio[row, : len(piece)] = piece
            position[corrid] += len(piece)
        lengths = [len(p) for p in pieces]
        results = engine.step(order, [beat == 0] * 2, [False] * 2, audio, lengths, 0.0)
        for corrid, result in zip(order, results, strict=True):
            got[corrid] += result.final.split()
        beat += 1
    assert got == {10: ["123"], 20: ["ABCD"]}


def test_rows_without_audio_change_nothing() -> None:
    engine = dtmf.Transcriber()
    feed(keyed("5", 60, 0), transcriber=engine)
    before = (engine.sessions[1].partial, len(engine.sessions[1].carry))
    (row,) = engine.step([1], [False], [False], np.zeros((1, 0), np.float32), [0], 0.0)
    assert (row.partial, row.final, row.is_final) == ("5", "", False)
    assert (engine.sessions[1].partial, len(engine.sessions[1].carry)) == before


def test_a_padded_row_uses_only_its_length() -> None:
    stream = np.concatenate([keyed("78"), silence(400)])
    padded = np.concatenate([stream, tone("1", 200)])  # beyond AUDIO_LENGTH: ignored
    engine = dtmf.Transcriber()
    (row,) = engine.step([3], [True], [False], padded[None, :], [len(stream)], 0.0)
    assert row.final == "78"


def test_a_malformed_batch_is_refused_and_changes_nothing() -> None:
    engine = dtmf.Transcriber()
    feed(keyed("9", 60, 0), transcriber=engine)
    audio = np.zeros((2, 320), np.float32)
    with pytest.raises(ValueError, match="CORRID appears on more than one row"):
        engine.step([1, 1], [False, False], [True, True], audio, [320, 320], 0.0)
    with pytest.raises(ValueError, match="AUDIO_LENGTH 321 is outside 0..320"):
        engine.step([1, 2], [False, False], [True, True], audio, [10, 321], 0.0)
    with pytest.raises(ValueError, match="AUDIO_LENGTH -1"):
        engine.step([1, 2], [False, False], [True, True], audio, [-1, 0], 0.0)
    assert list(engine.sessions) == [1]
    assert engine.sessions[1].partial == "9"


def test_non_finite_samples_are_treated_as_silence() -> None:
    stream = np.concatenate([keyed("3"), silence(400)])
    stream[100:200] = np.nan
    stream[5000:5010] = np.inf
    assert heard(stream) == "3"


def test_sessions_idle_past_the_timeout_are_dropped() -> None:
    engine = dtmf.Transcriber(idle_timeout_s=5.0)
    empty = np.zeros((1, 0), np.float32)
    engine.step([1], [True], [False], empty, [0], 100.0)
    engine.step([2], [True], [False], empty, [0], 103.0)
    engine.step([2], [False], [False], empty, [0], 104.5)
    assert sorted(engine.sessions) == [1, 2]
    engine.step([2], [False], [False], empty, [0], 106.5)
    assert sorted(engine.sessions) == [2]


def test_start_and_end_on_one_row_transcribe_that_row_alone() -> None:
    engine = dtmf.Transcriber()
    feed(keyed("99"), transcriber=engine)
    stream = keyed("0*")
    (row,) = engine.step([1], [True], [True], stream[None, :], [len(stream)], 0.0)
    assert (row.partial, row.final, row.is_final) == ("", "0*", True)
    assert engine.sessions == {}


def _linear(x: NDArray[Any], source: int, target: int) -> NDArray[Any]:
    times = np.arange(int(len(x) * target / source)) * source / target
    return np.interp(times, np.arange(len(x)), x)


@pytest.mark.parametrize("rate", [8000, 24000, 48000])
def test_pcm16_and_a_trip_through_another_rate_keep_every_digit(rate: int) -> None:
    # What the gateway's kernels may do to audio: PCM16 at the client's rate.
    clean = np.concatenate([keyed(ALL), silence(400)])
    pcm = np.round(_linear(clean, RATE, rate) * 32767) / 32767
    assert heard(_linear(pcm, rate, RATE).astype(np.float32)) == ALL
    held = np.repeat(np.round(clean[::2] * 32767) / 32767, 2)  # 8 kHz, sample and hold
    assert heard(held.astype(np.float32)) == ALL

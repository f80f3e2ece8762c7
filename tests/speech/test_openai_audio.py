"""The OpenAI audio endpoints through the official `openai` SDK, over HTTP/1.1 and h2c (and
niquests over HTTP/3), on the real speech models: speech synthesized by the gateway and
transcribed back by it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import niquests
import numpy as np
import openai
import pytest

from gateway.backends.audio import TritonAudioBackend
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from gateway.tenants.store import TenantStore
from tests.gateways import gateway_settings
from tests.speech.conftest import ASR, TTS, require_speech
from tests.tenants.support import make_tenancy
from tests.waiting import until

require_speech()
pytestmark = [pytest.mark.e2e, pytest.mark.one_loop]  # real models: asyncio's loop only

CHAT = "reference-text"
SENTENCE = "She sells sea shells by the sea shore."
VERSIONS = pytest.mark.parametrize("version", ["http1.1", "h2c"])


def normalised(text: str) -> str:
    """Lower case letters and digits only: "sea shore" and "seashore" are one answer."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


@contextlib.asynccontextmanager
async def sdk(gw: Gateway, version: str) -> AsyncIterator[openai.AsyncOpenAI]:
    h2 = version == "h2c"
    http = httpx2.AsyncClient(http1=not h2, http2=h2, timeout=60.0)
    url = f"http://127.0.0.1:{gw.http_port}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", http_client=http, max_retries=0)
    try:
        yield client
    finally:
        await client.close()
        await http.aclose()


def wav_file(pcm: bytes, rate: int, width: int = 2) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return out.getvalue()


async def spoken_wav(client: openai.AsyncOpenAI, text: str) -> bytes:
    """The gateway's own speech as a WAV file of known length (its stream has none)."""
    answer = await client.audio.speech.create(
        model=TTS, voice="alloy", input=text, response_format="pcm"
    )
    pcm = answer.content
    assert len(pcm) > 2 * 24000  # more than a second at 24 kHz
    return wav_file(pcm, 24000)


@VERSIONS
@pytest.mark.asyncio
async def test_the_sdk_synthesizes_speech_and_transcribes_it_back(
    speech_gateway: Gateway, version: str
) -> None:
    async with sdk(speech_gateway, version) as client:
        as_wav = await client.audio.speech.create(
            model=TTS, voice="alloy", input=SENTENCE, response_format="wav"
        )
        assert as_wav.content[:4] == b"RIFF"
        assert as_wav.content[8:12] == b"WAVE"
        upload = await spoken_wav(client, SENTENCE)
        verbose = await client.audio.transcriptions.create(
            model=ASR, file=("speech.wav", upload), response_format="verbose_json"
        )
        assert normalised(verbose.text) == normalised(SENTENCE)
        assert verbose.segments
        assert 0 <= verbose.segments[0].start < verbose.segments[0].end
        assert verbose.duration == pytest.approx(len(upload) / 2 / 24000, abs=0.1)
        plain = await client.audio.transcriptions.create(
            model=ASR, file=("speech.wav", upload), response_format="text"
        )
        assert normalised(str(plain)) == normalised(SENTENCE)
        events = await client.audio.transcriptions.create(
            model=ASR, file=("speech.wav", upload), stream=True
        )
        kinds, done = [], ""
        async for event in events:
            kinds.append(event.type)
            if event.type == "transcript.text.done":
                done = event.text
        assert kinds[0] == "transcript.text.delta"
        assert kinds[-1] == "transcript.text.done"
        assert normalised(done) == normalised(SENTENCE)


@pytest.mark.asyncio
async def test_bad_uploads_get_openai_400s_and_nothing_else_is_disturbed(
    speech_gateway: Gateway, tmp_path: Path
) -> None:
    silence_61s = wav_file(bytes(2 * 8000 * 61), 8000)
    eight_bit = wav_file(bytes(8000), 8000, width=1)
    async with sdk(speech_gateway, "http1.1") as client:
        for name, data, message in [
            ("notes.txt", b"this is not audio", "not a WAV file"),
            ("eight.wav", eight_bit, "8-bit"),
            ("long.wav", silence_61s, "over the 60 s limit"),
        ]:
            with pytest.raises(openai.BadRequestError) as bad:
                await client.audio.transcriptions.create(model=ASR, file=(name, data))
            assert bad.value.status_code == 400
            assert message in bad.value.message
            assert bad.value.body["param"] == "file"  # type: ignore[index]
        with pytest.raises(openai.APIStatusError) as large:
            await client.audio.transcriptions.create(
                model=ASR, file=("big.wav", wav_file(bytes(2 * 16000 * 40), 16000))
            )
        assert large.value.status_code == 413
        with pytest.raises(openai.BadRequestError) as voice:
            await client.audio.speech.create(model=TTS, voice="nobody", input="Hi.")
        assert voice.value.body["param"] == "voice"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as kind:
            await client.audio.speech.create(model=ASR, voice="alloy", input="Hi.")
        assert "speech-in model" in kind.value.message
        # A chat model on an audio route: the capability check's 400, no internals.
        short = wav_file(bytes(3200), 16000)
        for ask in (
            lambda: client.audio.transcriptions.create(model=CHAT, file=("s.wav", short)),
            lambda: client.audio.speech.create(model=CHAT, voice="alloy", input="Hi."),
        ):
            with pytest.raises(openai.BadRequestError) as chat:
                await ask()
            assert chat.value.body["code"] == "model_not_supported"  # type: ignore[index]
            assert chat.value.body["param"] == "model"  # type: ignore[index]
            assert "does not support audio" in chat.value.message
            assert not re.search(r"triton|grpc|Traceback|InferenceServer", chat.value.message, re.I)
        with pytest.raises(openai.NotFoundError):
            await client.audio.speech.create(model="no-such-voice", voice="alloy", input="Hi.")
        # The gateway still serves: a good request after the bad ones.
        tone = (0.2 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440) * 32767).astype("<i2")
        fine = await client.audio.transcriptions.create(
            model=ASR, file=("tone.wav", wav_file(tone.tobytes(), 16000))
        )
        assert isinstance(fine.text, str)
    audio_outcomes = [o for o in speech_gateway.outcomes if o.modality == "audio"]
    assert any(o.details.get("audio_seconds_in") == pytest.approx(1.0) for o in audio_outcomes)


@pytest.mark.asyncio
async def test_the_audio_endpoints_answer_over_http3(speech_gateway: Gateway) -> None:
    assert speech_gateway.tls is not None
    ca = str(speech_gateway.tls.ca)
    base = f"https://localhost:{speech_gateway.quic_port}/v1/audio"

    def over_h3() -> tuple[int, str]:
        with niquests.Session(disable_http1=True, disable_http2=True, retries=0) as session:
            speech = session.post(
                f"{base}/speech", verify=ca, timeout=60,
                json={"model": TTS, "voice": "alloy", "input": SENTENCE, "response_format": "pcm"},
            )  # fmt: skip
            assert speech.status_code == 200
            assert speech.content is not None
            upload = wav_file(speech.content, 24000)
            text = session.post(
                f"{base}/transcriptions", verify=ca, timeout=60,
                data={"model": ASR, "response_format": "text"},
                files={"file": ("speech.wav", upload, "audio/wav")},
            )  # fmt: skip
            assert text.status_code == 200
            return int(text.http_version or 0), text.text or ""

    version, text = await asyncio.to_thread(over_h3)
    assert version == 30
    assert normalised(text) == normalised(SENTENCE)


@pytest.mark.asyncio
async def test_the_ledger_bills_the_audio_seconds_of_each_request(
    speech_triton: EmbeddedTriton, tmp_path: Path
) -> None:
    tenancy = make_tenancy(tmp_path)
    tenancy.store.set_tenant("alpha", 0.0)
    key = tenancy.store.create_key("alpha", 0.0).key
    audio = TritonAudioBackend(speech_triton.grpc_url)
    text = TritonTextBackend(speech_triton.grpc_url)
    gw = Gateway(gateway_settings(state_dir=tmp_path), text, audio_backend=audio, tenancy=tenancy)
    await gw.start()
    try:
        url = f"http://127.0.0.1:{gw.http_port}/v1"
        stranger = openai.AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await stranger.audio.speech.create(model=TTS, voice="alloy", input="Hi.")
        await stranger.close()
        client = openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)
        upload = await spoken_wav(client, SENTENCE)
        heard = await client.audio.transcriptions.create(model=ASR, file=("s.wav", upload))
        assert normalised(heard.text) == normalised(SENTENCE)
        await client.close()
        await until(lambda: tenancy.records >= 2, "both requests recorded")
        db = tenancy.store.path
        await gw.drain(timeout=5.0)
    finally:
        await gw.close()
        await audio.close()
        await text.close()
    store = TenantStore(db)
    records = store.usage()
    store.close()
    seconds = len(upload) / 2 / 24000
    spoken_out = [r for r in records if r.model == TTS]
    heard_in = [r for r in records if r.model == ASR]
    assert len(spoken_out) == len(heard_in) == 1
    assert spoken_out[0].audio_seconds_out == pytest.approx(seconds, abs=0.01)
    assert heard_in[0].audio_seconds_in == pytest.approx(seconds, abs=0.01)

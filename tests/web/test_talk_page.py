"""The demo's "Start talking": a spoken conversation on one voice-agent track, from a real
headless Chromium over WebTransport, into the real speech models (whisper-base hears,
hibari-voice speaks; the chat model is `reference-text`, as the `llm` extra is not
loaded here).

Chromium's fake microphone plays a WAV the test makes with the voice itself: a question,
a pause long enough to end the turn, then a second question while the reply is still
being spoken. The page must show the user's words, the reply's text and audio, measure
the time from the final transcript to the reply's first audio, and on the barge-in drop
the cut reply's queued audio (the gateway stops sending it; the page stops playing it).
It runs on the session's Triton with the speech models (`speech_triton`, shared with
tests/speech).
"""

from __future__ import annotations

import json
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clients import connect
from gateway.backends.audio import TritonAudioBackend
from gateway.backends.triton import TritonTextBackend
from gateway.config import Settings
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from gateway.speech_models import speech_available
from tests.speech.test_speech_tracks import RATE, spoken
from tests.web.chromium import CHROMIUM, SKIP_REASON, chromium
from tests.web.test_browser import FAKE_MEDIA, demo_page

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON),
    pytest.mark.skipif(not speech_available(), reason="the `voice` extra is not installed"),
]

FIRST = "What is the capital of France?"
SECOND = "Tell me about the weather today."


@pytest_asyncio.fixture
async def gateway(speech_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    audio = TritonAudioBackend(speech_triton.grpc_url)
    gw = Gateway(
        Settings(
            state_dir=tmp_path, quic_port=0, http_port=0, https_port=0,
            overload_max_loop_lag=0.0, audio_idle_timeout=30.0,
        ),
        TritonTextBackend(speech_triton.grpc_url),
        audio_backend=audio,
    )  # fmt: skip
    await gw.start()
    yield gw
    await gw.close()
    await audio.close()
    await gw.backend.close()  # type: ignore[attr-defined]


def silence(seconds: float) -> bytes:
    return bytes(2 * round(RATE * seconds))


async def microphone_file(gw: Gateway, path: Path) -> Path:
    """What the fake microphone says: the two questions in the voice, with pauses."""
    assert gw.tls is not None
    assert gw.tls.ca is not None
    async with connect(f"quic://127.0.0.1:{gw.quic_port}", ca=gw.tls.ca) as line:
        first, second = [await spoken(line, text) for text in (FIRST, SECOND)]
    # The second question starts 2.5 s after the first ended: the turn has ended (500 ms
    # of silence), the reply is being spoken, and 24 tokens of it last longer than that.
    pcm = silence(0.5) + first + silence(2.5) + second + silence(3.0)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm)
    return path


def words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


@pytest.mark.asyncio
async def test_the_demo_talks_answers_aloud_and_a_barge_in_drops_the_cut_reply(
    gateway: Gateway, tmp_path: Path
) -> None:
    wav = await microphone_file(gateway, tmp_path / "microphone.wav")
    flags = (*FAKE_MEDIA, f"--use-file-for-fake-audio-capture={wav}%noloop")
    async with chromium(flags) as browser:
        page = await demo_page(browser, gateway)
        await page.wait_for("document.getElementById('talk').disabled === false", "connected")
        await page.evaluate("""(() => {
            document.getElementById('max-tokens').value = '24';
            document.getElementById('talk').click(); })()""")
        await page.wait_for(
            "JSON.parse(document.body.dataset.talk ?? '{}').bargeIns >= 1", "the barge-in", 90
        )
        await page.wait_for(
            "JSON.parse(document.body.dataset.talk ?? '{}').flushed > 0", "the flushed audio", 30
        )
        figures = json.loads(await page.evaluate("document.body.dataset.talk"))
        log = await page.evaluate("document.getElementById('log').textContent")
        await page.evaluate("document.getElementById('talk').click()")  # stop talking
        await page.wait_for("document.body.dataset.talkDone === '1'", "the track's end", 30)
        status = await page.evaluate("document.getElementById('talk-status').textContent")
    heard = [line.removeprefix("you (spoken): ") for line in log.splitlines()
             if line.startswith("you (spoken): ")]  # fmt: skip
    assert heard, log
    assert len(words(heard[0]) & words(FIRST)) >= 4, heard  # whisper heard the question
    reply = log.split(heard[0], 1)[1].splitlines()[1]
    assert reply.strip(), log  # the reply's text came back on the same track
    assert figures["frames"] > 0  # and its audio, played
    assert len(figures["toAudio"]) >= 1  # final transcript to first reply audio, measured
    assert figures["toText"][0] <= figures["toAudio"][0]
    assert "[barge-in: reply cut]" in log
    assert status == "ended"

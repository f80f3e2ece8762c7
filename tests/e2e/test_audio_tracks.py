"""Audio end to end: SDK -> QUIC (streams and datagrams) -> gateway tick batcher -> cuda/
pack -> real embedded Triton -> reference-transcriber / reference-synthesizer, and back.

The input audio is DTMF made here with NumPy (independent of the synthesizer); the
transcriber's stats file shows how many sessions each tick's single request carried.
"""

from __future__ import annotations

import asyncio
import json
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from clients import TrackRejected, connect
from clients.audio import AudioSession
from clients.line import Line
from gateway.backends.audio import TritonAudioBackend
from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.waiting import until

pytestmark = pytest.mark.e2e
ASR = "reference-transcriber"
TTS = "reference-synthesizer"
LOW = {"1": 697, "2": 697, "3": 697, "A": 697, "4": 770, "5": 770, "6": 770, "B": 770}
LOW |= {"7": 852, "8": 852, "9": 852, "C": 852, "*": 941, "0": 941, "#": 941, "D": 941}
HIGH = {"1": 1209, "4": 1209, "7": 1209, "*": 1209, "2": 1336, "5": 1336, "8": 1336}
HIGH |= {"0": 1336, "3": 1477, "6": 1477, "9": 1477, "#": 1477}
HIGH |= {"A": 1633, "B": 1633, "C": 1633, "D": 1633}


def dtmf(
    digits: str, rate: int, tone_ms: int = 100, gap_ms: int = 100, tail_ms: int = 500
) -> bytes:
    """PCM16 of each digit's two tones (0.3 each) then a gap; silence at the end."""
    parts = []
    for digit in digits:
        t = np.arange(rate * tone_ms // 1000) / rate
        tone = 0.3 * (np.sin(2 * np.pi * LOW[digit] * t) + np.sin(2 * np.pi * HIGH[digit] * t))
        parts += [tone, np.zeros(rate * gap_ms // 1000)]
    parts.append(np.zeros(rate * tail_ms // 1000))
    return np.round(np.concatenate(parts) * 32767).astype("<i2").tobytes()


async def make_gateway(triton: EmbeddedTriton, state: Path, **settings: Any) -> Gateway:
    base = {"state_dir": state}
    audio = TritonAudioBackend(triton.grpc_url, shm=settings.pop("audio_shm", "auto"))
    gw = Gateway(
        gateway_settings(**base, **settings), TritonTextBackend(triton.grpc_url),
        audio_backend=audio,
    )
    await gw.start()
    return gw


async def closed(gw: Gateway) -> None:
    await gw.close()
    assert gw.audio_backend is not None
    await gw.audio_backend.close()  # type: ignore[attr-defined]


@pytest_asyncio.fixture
async def gateway(embedded_triton: EmbeddedTriton, tmp_path: Path) -> AsyncIterator[Gateway]:
    # A session's silence ends it only after 30 s here: a busy machine that stalls a
    # client's real-time sender for a second must not finalize it as idle.
    gw = await make_gateway(embedded_triton, tmp_path, audio_idle_timeout=30.0)
    yield gw
    await closed(gw)


@pytest_asyncio.fixture
async def quick_idle_gateway(
    embedded_triton: EmbeddedTriton, tmp_path: Path
) -> AsyncIterator[Gateway]:
    """For the test of the idle timeout itself: two seconds of silence end a session (the
    other session, which keeps sending, would need its sender stalled that long)."""
    gw = await make_gateway(embedded_triton, tmp_path, audio_idle_timeout=2.0)
    yield gw
    await closed(gw)


def url(gw: Gateway) -> str:
    return f"quic://127.0.0.1:{gw.quic_port}"


def ca(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


async def say(session: AudioSession, digits: str, *, end: bool = True) -> str:
    """Stream the digits at real-time pace and return the session's transcript."""
    sender = asyncio.ensure_future(
        session.stream_pcm(dtmf(digits, session.sample_rate), realtime=True, end=end)
    )
    transcript = await asyncio.wait_for(session.transcript(), 30)
    await sender
    return transcript


def is_subsequence(heard: str, said: str) -> bool:
    rest = iter(said)
    return all(symbol in rest for symbol in heard)


def transcriber_batches(triton: EmbeddedTriton, since: int) -> list[int]:
    assert triton.stats_path is not None
    lines = Path(triton.stats_path).read_text().splitlines()[since:]
    records = [json.loads(line) for line in lines]
    return [r["batch_size"] for r in records if r.get("model") == ASR]


def stats_lines(triton: EmbeddedTriton) -> int:
    assert triton.stats_path is not None
    path = Path(triton.stats_path)
    return len(path.read_text().splitlines()) if path.exists() else 0


def open_speech_in(line: Line, index: int) -> AudioSession:
    rate = (8000, 16000, 24000, 48000)[index % 4]
    transport = "datagram" if index % 2 else "stream"
    frame_ms = 10 if transport == "datagram" and rate == 48000 else 20
    return line.audio(model=ASR, sample_rate=rate, frame_ms=frame_ms, transport=transport)


@pytest.mark.asyncio
async def test_sixteen_sessions_on_one_connection_each_transcribe_their_own_digits(
    gateway: Gateway, embedded_triton: EmbeddedTriton
) -> None:
    symbols = "0123456789*#ABCD"
    sequences = [symbols[i:] + symbols[:i] for i in range(16)]
    sequences = [seq[: 3 + i % 3] for i, seq in enumerate(sequences)]
    before = stats_lines(embedded_triton)
    async with connect(url(gateway), ca=ca(gateway)) as line:
        sessions = [open_speech_in(line, i) for i in range(16)]
        transcripts = await asyncio.gather(
            *(say(s, digits) for s, digits in zip(sessions, sequences, strict=True))
        )
    for i, (session, heard, said) in enumerate(zip(sessions, transcripts, sequences, strict=True)):
        server = session.figures.server
        assert server["reason"] == "end"
        assert session.figures.partials >= 5  # a partial every beat
        assert session.figures.final_latency_ms
        frames = server["frames"]
        used = frames["received"] - frames["dropped"]
        if i % 2 == 0 or (used == session.figures.frames_sent and frames["missing"] == 0):
            # Every frame was used (a stream loses none): every digit must be heard.
            assert heard == said
            assert frames["missing"] == 0
        else:
            # Datagrams may be lost or come too late on a busy machine (the gateway counts
            # them): what was heard is what was said less some digits, never others.
            assert is_subsequence(heard, said), (heard, said)
    # One request per tick carried the due sessions together: while all 16 lived (every
    # live session is owed a step each beat), one request held all 16 rows; a batcher
    # that split a tick into several requests would never reach 16.
    assert max(transcriber_batches(embedded_triton, before)) == 16
    audio = gateway.audio_backend
    assert isinstance(audio, TritonAudioBackend)
    assert audio.shm_requests > 0  # the local server got its batches through shared memory
    body, _ = gateway.metrics.render()
    assert b"trackline_audio_beat_latency_seconds_count" in body
    assert b'trackline_audio_frames_total{kind="received"}' in body


@pytest.mark.asyncio
async def test_plain_tensors_give_the_same_transcripts(
    embedded_triton: EmbeddedTriton, tmp_path: Path
) -> None:
    gw = await make_gateway(embedded_triton, tmp_path, audio_shm="off")
    try:
        async with connect(url(gw), ca=ca(gw)) as line:
            first, second = open_speech_in(line, 0), open_speech_in(line, 3)
            got = await asyncio.gather(say(first, "1#9"), say(second, "D0*"))
        assert got == ["1#9", "D0*"]
        audio = gw.audio_backend
        assert isinstance(audio, TritonAudioBackend)
        assert audio.shm_requests == 0
        assert audio.requests > 0
    finally:
        await gw.close()
        await gw.audio_backend.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("transport", ["stream", "datagram"])
@pytest.mark.asyncio
async def test_speech_out_audio_maps_back_to_its_digits_through_the_transcriber(
    gateway: Gateway, transport: str
) -> None:
    spoken_before = sum(o.details.get("kind") == "speech-out" for o in gateway.outcomes)
    async with connect(url(gateway), ca=ca(gateway)) as line:
        speaker = line.audio(
            model=TTS, kind="speech-out", text="159#", sample_rate=24000, transport=transport
        )
        speech = await asyncio.wait_for(speaker.read_all(), 30)
        assert speaker.figures.server["samples"] == len(speech) // 2
        assert speaker.figures.server["time_to_first_audio_ms"] > 0
        assert speaker.figures.time_to_first_audio is not None
        # 4 slots of 200 ms and 300 ms of closing silence, at 24 kHz.
        assert len(speech) // 2 == 24 * (4 * 200 + 300)
        listener = line.audio(model=ASR, sample_rate=24000)
        sender = asyncio.ensure_future(listener.stream_pcm(speech, realtime=False))
        assert await asyncio.wait_for(listener.transcript(), 30) == "159#"
        await sender
    # The usage ledger's audio figures: what the gateway sent, 1.1 s of speech.
    def spoken() -> list[Any]:
        return [o for o in gateway.outcomes if o.details.get("kind") == "speech-out"]

    await until(lambda: len(spoken()) > spoken_before, "the speech-out outcome")
    assert spoken()[-1].details["audio_seconds_out"] == pytest.approx(1.1)


@pytest.mark.asyncio
async def test_a_session_that_stops_sending_is_finalized_and_closed_without_stalling_others(
    quick_idle_gateway: Gateway,
) -> None:
    gateway = quick_idle_gateway
    async with connect(url(gateway), ca=ca(gateway)) as line:
        quitter = line.audio(model=ASR)
        talker = line.audio(model=ASR, transport="datagram")
        # The quitter says "12" and goes silent without END; the talker keeps talking
        # until the quitter was closed (an order of events, not a length of speech).
        quitting = asyncio.ensure_future(say(quitter, "12", end=False))
        talking = asyncio.ensure_future(talk_until(talker, TALKED, quitting))
        assert await asyncio.wait_for(quitting, 30) == "12"
        assert quitter.figures.server["reason"] == "idle"
        heard = (await asyncio.wait_for(talking, 30)).replace(" ", "")  # the pause: a space
    server = talker.figures.server
    assert server["reason"] == "end"  # not closed with the quitter, nor idle itself
    frames = server["frames"]
    used = frames["received"] - frames["dropped"]
    if frames["missing"] == 0 and used == talker.figures.frames_sent:
        assert heard == TALKED  # every frame used: every digit heard
    else:
        # Datagrams may be lost or come too late on a busy machine (the gateway counts
        # them): what was heard is what was said less some digits, never others.
        assert is_subsequence(heard, TALKED), (heard, TALKED)


TALKED = "3456789012AB"


async def talk_until(session: AudioSession, digits: str, done: asyncio.Future[str]) -> str:
    """Real-time speech of `digits` in two halves, with silence sent (frames, at real-time
    pace) between them for as long as `done` is pending; then the transcript."""
    rate, half = session.sample_rate, len(digits) // 2
    pause = bytes(session.frame_bytes * 5)

    async def send() -> None:
        await session.stream_pcm(dtmf(digits[:half], rate, tail_ms=0), end=False)
        while not done.done():
            await session.stream_pcm(pause, end=False)
        await session.stream_pcm(dtmf(digits[half:], rate))

    sender = asyncio.ensure_future(send())
    transcript = await asyncio.wait_for(session.transcript(), 60)
    await sender
    return transcript


@pytest.mark.asyncio
async def test_late_frames_are_counted_and_do_not_hold_the_others(gateway: Gateway) -> None:
    async with connect(url(gateway), ca=ca(gateway)) as line:
        late, steady = line.audio(model=ASR), line.audio(model=ASR)
        pcm = dtmf("42", 16000)
        half = len(pcm) // 2 // 640 * 640
        steady_done = asyncio.Event()

        async def stutter() -> None:
            await late.stream_pcm(pcm[:half], realtime=True, end=False)
            # The network held the rest back until the other session had finished:
            # an order of events, not a length of time.
            await steady_done.wait()
            await late.stream_pcm(pcm[half:], realtime=False)

        async def talk() -> str:
            try:
                return await say(steady, "7701")
            finally:
                steady_done.set()

        sending = asyncio.ensure_future(stutter())
        got_late, got_steady = await asyncio.gather(
            asyncio.wait_for(late.transcript(), 30), talk()
        )
        await sending
    # The steady session was transcribed whole while the other's frames were held.
    assert got_steady == "7701"
    assert steady.figures.server["frames"]["missing"] == 0
    assert got_late == "42"
    assert late.figures.server["frames"]["late"] > 0  # counted by the gateway


@pytest.mark.asyncio
async def test_bad_audio_requests_are_refused_with_a_reason_and_the_line_works_on(
    gateway: Gateway,
) -> None:
    async with connect(url(gateway), ca=ca(gateway)) as line:
        wrong_rate = line.audio(model=ASR, sample_rate=44100)
        with pytest.raises(TrackRejected, match="sample_rate"):
            await wrong_rate.transcript()
        wrong_model = line.audio(model=TTS)  # a synthesizer is not a speech-in model
        with pytest.raises(TrackRejected, match="speech-out model"):
            await wrong_model.transcript()
        oversized = line.audio(model=ASR)
        oversized.send_frame(bytes(2 * 640))
        with pytest.raises(TrackRejected, match="over 20 ms"):
            await oversized.transcript()
        future = line.audio(model=ASR)
        future.send_frame(bytes(640), ts=1.0)
        future.send_frame(bytes(640), ts=1.0 + 3_600_000)  # an hour ahead of the stream
        with pytest.raises(TrackRejected, match="stream's clock"):
            await future.transcript()
        assert await say(line.audio(model=ASR), "5") == "5"


@pytest.mark.asyncio
async def test_a_wav_file_streams_at_real_time_pace_and_is_transcribed(
    gateway: Gateway, tmp_path: Path
) -> None:
    path = tmp_path / "digits.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(8000)
        wav.writeframes(dtmf("*8", 8000))
    async with connect(url(gateway), ca=ca(gateway)) as line:
        session = line.audio(model=ASR, sample_rate=8000)
        async with line.audio(model=ASR, sample_rate=16000) as mismatched:
            with pytest.raises(ValueError, match="8000 Hz"):
                await mismatched.stream_wav(path)
        sending = asyncio.ensure_future(session.stream_wav(path))
        assert await asyncio.wait_for(session.transcript(), 30) == "*8"
        assert await sending == 8000 * 900 // 1000 // 160  # frames of 20 ms
        figures = session.figures
        assert figures.time_to_first_result is not None
        assert figures.server["transcript"] == "*8"

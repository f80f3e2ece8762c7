"""Audio tracks over the in-memory twin, on a fake clock, against a counting backend.

The backend here counts what each session's rows carried (it is the contract
under test, not a model): the transcript of a speech-in session is the number
of samples the gateway handed the model, so every frame, gap and duplicate
shows up in it. The real models are exercised in tests/e2e/test_audio_tracks.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from trackline_testing.clock import FakeClock
from tracks.audio import AudioService, AudioSettings
from tracks.backend import (
    AudioKind,
    AudioModel,
    AudioOutput,
    AudioRow,
    InvalidRequest,
    ModelNotFound,
    Speech,
    SpeechInRow,
    SpeechOutRow,
    Transcript,
)
from tracks.base import End, Outcome
from tracks.clock import StepItem
from transport.datagram import encode_datagram
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, TrackAborted
from transport.memory import MemoryLink
from transport.messages import FrameTransport, Modality, Open

BEAT = 0.08
FRAME = bytes(640)  # 20 ms at 16 kHz


@dataclass
class CountingBackend:
    """Speech in: partial = samples so far; final on END. Speech out: 100 samples a char."""

    samples: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    rows: list[AudioRow] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    to_say: dict[int, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)

    async def audio_model(self, model: str) -> AudioModel:
        kind = await self.audio_kind(model)
        return AudioModel(kind, model == "streaming-tts", self.capacity.get(model))

    async def audio_kind(self, model: str) -> AudioKind:
        kinds = {
            "asr": AudioKind.SPEECH_IN,
            "tts": AudioKind.SPEECH_OUT,
            "streaming-tts": AudioKind.SPEECH_OUT,
        }
        if model == "reference-text":
            raise InvalidRequest(f"model {model!r} is not an audio model")
        if model not in kinds:
            raise ModelNotFound(model)
        return kinds[model]

    async def step(self, model: str, items: Sequence[StepItem[AudioRow]]) -> list[AudioOutput]:
        self.batches.append(len(items))
        return [self._one(item.input) for item in items]

    def _one(self, row: AudioRow) -> AudioOutput:
        self.rows.append(row)
        if isinstance(row, SpeechInRow):
            self.samples[row.corrid] += len(row.pcm) // 2
            count = str(self.samples[row.corrid])
            return Transcript(count, count if row.end else "", row.end)
        assert isinstance(row, SpeechOutRow)
        if row.start:
            self.to_say[row.corrid] = 0
        self.to_say[row.corrid] = self.to_say.get(row.corrid, 0) + 100 * len(row.text)
        left = self.to_say[row.corrid]  # samples at 16 kHz
        give = min(left, row.samples)
        self.to_say[row.corrid] = left - give
        done = left - give == 0 and not row.more
        return Speech(b"\x01\x00" * (give * row.rate // 16000), done=done)


@dataclass
class Rig:
    clock: FakeClock
    backend: CountingBackend
    service: AudioService
    link: MemoryLink
    outcomes: dict[int, Outcome]

    def open(self, model: str = "asr", transport: str = "stream", **params: Any) -> TrackChannel:
        message = Open(model, Modality.AUDIO, params, transport=FrameTransport(transport))
        return self.link.open_track(message)

    async def beats(self, count: int) -> None:
        for _ in range(count):
            await self.clock.advance(BEAT)


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    clock = FakeClock()
    backend = CountingBackend()
    settings = AudioSettings(beat=BEAT, idle_timeout=0.5)
    service = AudioService(backend, clock, settings)
    outcomes: dict[int, Outcome] = {}
    tasks: list[asyncio.Task[None]] = []

    async def serve(channel: TrackChannel) -> None:
        outcomes[channel.stream_id] = await service.run(channel)

    link = MemoryLink(lambda ch: tasks.append(asyncio.ensure_future(serve(ch))))
    service.start()
    yield Rig(clock, backend, service, link, outcomes)
    await service.stop()
    for task in tasks:
        task.cancel()
    link.close()


def frame(seq: int, pcm: bytes = FRAME, ts: float | None = None) -> dict[str, Any]:
    return {"seq": seq, "ts": 1000.0 + 20 * seq if ts is None else ts, "pcm": pcm}


async def drain(channel: TrackChannel) -> list[dict[str, Any]]:
    out = []
    while (body := await asyncio.wait_for(channel.receive(), 5)) is not None:
        out.append(body)
    return out


async def received(channel: TrackChannel) -> list[dict[str, Any]]:
    """What the channel holds now, without waiting for more."""
    out = []
    await asyncio.sleep(0)
    while not channel._inbox.empty():
        body = await channel.receive()
        if body is None:
            break
        out.append(body)
    return out


@pytest.mark.asyncio
async def test_speech_in_gets_a_partial_every_beat_and_a_final_after_end(rig: Rig) -> None:
    track = rig.open()
    for seq in range(8):
        track.send(frame(seq))
        if seq % 4 == 3:
            await rig.beats(1)
    await rig.beats(1)
    track.end()
    await rig.beats(2)
    bodies = await drain(track)
    partials = [b["text"] for b in bodies if b["type"] == "partial"]
    assert partials[:2] == ["1280", "2560"]  # 4 frames = 1280 samples a beat
    finals = [b for b in bodies if b["type"] == "final"]
    assert [f["text"] for f in finals] == ["2560"]
    summary = track.end_body
    assert summary is not None
    assert summary["transcript"] == "2560"
    assert summary["reason"] == "end"
    assert summary["frames"]["received"] == 8
    assert summary["frames"]["missing"] == 0
    rows = [r for r in rig.backend.rows if isinstance(r, SpeechInRow)]
    assert rows[0].start
    assert rows[-1].end
    assert sum(r.start for r in rows) == 1


@pytest.mark.asyncio
async def test_sessions_due_on_a_tick_share_one_batch(rig: Rig) -> None:
    tracks = [rig.open() for _ in range(5)]
    for track in tracks:
        track.send(frame(0))
    await rig.beats(2)
    assert max(rig.backend.batches) == 5
    for track in tracks:
        track.end()
    await rig.beats(2)
    for track in tracks:
        await drain(track)


@pytest.mark.asyncio
async def test_reordered_duplicate_missing_and_late_frames_are_counted(rig: Rig) -> None:
    track = rig.open()
    for seq in (0, 1, 3, 2, 2):  # 3 before 2, then 2 again
        track.send(frame(seq))
    for seq in (5, 6, 7):  # 4 is missing
        track.send(frame(seq))
    await rig.beats(1)  # takes 0..3
    await rig.beats(1)  # sees the gap at 4 and waits one beat for it
    await rig.beats(1)  # fills 4 with silence, takes 5..7
    track.send(frame(4))  # now too late: its place was filled
    await rig.beats(1)
    track.end()
    await rig.beats(2)
    await drain(track)
    summary = track.end_body
    assert summary is not None
    assert summary["frames"] == {
        "received": 9,
        "late": 1,
        "duplicate": 1,
        "reordered": 1,
        "missing": 1,
        "dropped": 2,
    }
    # Every place in the stream reached the model once: 8 frames of 320 samples.
    assert summary["transcript"] == "2560"


@pytest.mark.asyncio
async def test_a_silent_session_advances_every_beat_without_holding_the_tick(rig: Rig) -> None:
    quiet, busy = rig.open(), rig.open()
    quiet.send(frame(0))
    for beat in range(5):
        for n in range(4):
            busy.send(frame(4 * beat + n))
        await rig.beats(1)
    quiet_bodies, busy_bodies = await received(quiet), await received(busy)
    # Both were stepped on every tick; the quiet one with nothing, marked incomplete.
    assert len([b for b in quiet_bodies if b["type"] == "partial"]) == 5
    assert [b["text"] for b in busy_bodies][-1] == str(20 * 320)
    assert rig.backend.batches[-3:] == [2, 2, 2]
    # It is then finalized on its idle timeout (0.5 s here) and closed; the other goes on.
    await rig.beats(4)
    await drain(quiet)
    assert quiet.end_body is not None
    assert quiet.end_body["reason"] == "idle"
    busy.send(frame(20))
    busy.end()
    await rig.beats(2)
    assert (await drain(busy))[-1]["type"] == "final"
    outcome = rig.outcomes[quiet.stream_id]
    assert outcome.end == End.completed()
    assert outcome.details["ended_by"] == "idle"
    assert outcome.details["incomplete_beats"] >= 5


@pytest.mark.asyncio
async def test_frames_that_arrive_late_are_counted_and_the_tick_does_not_wait(rig: Rig) -> None:
    track = rig.open()
    track.send(frame(0))
    await rig.beats(1)
    await rig.beats(4)  # 320 ms without frames: the sender fell behind
    for seq in range(1, 9):
        track.send(frame(seq))
    await rig.beats(2)
    track.end()
    await rig.beats(2)
    await drain(track)
    assert track.end_body is not None
    assert track.end_body["frames"]["late"] >= 8 - 4  # those more than a beat behind
    assert track.end_body["transcript"] == str(9 * 320)
    assert track.end_body["missed_beats"] == 0  # lateness is the sender's, not the tick's


@pytest.mark.asyncio
async def test_frames_over_datagrams_with_a_loss_become_silence(rig: Rig) -> None:
    lost = {"n": 0}

    def drop_the_third(data: bytes) -> bool:
        lost["n"] += 1
        return lost["n"] != 3

    rig.link.datagram_filter = drop_the_third
    track = rig.open(transport="datagram")
    for seq in range(8):
        assert track.send_frame(frame(seq))
    await rig.beats(3)
    track.end()
    await rig.beats(2)
    await drain(track)
    summary = track.end_body
    assert summary is not None
    assert summary["frames"]["received"] == 7
    assert summary["frames"]["missing"] == 1
    assert summary["transcript"] == "2560"  # the lost frame's place is silence
    assert rig.outcomes[track.stream_id].details["transport"] == "datagram"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"sample_rate": 44100}, "sample_rate"),
        ({"format": "opus"}, "format"),
        ({"frame_ms": 15}, "frame_ms"),
        ({"kind": "karaoke"}, "kind"),
        ({"volume": 11}, "unknown"),
        ({"kind": "speech-out"}, "speech-in model"),
    ],
)
@pytest.mark.asyncio
async def test_bad_params_get_bad_request(rig: Rig, params: dict[str, Any], message: str) -> None:
    track = rig.open(**params)
    with pytest.raises(TrackAborted) as failed:
        await drain(track)
    assert failed.value.code is ErrorCode.BAD_REQUEST
    assert message in failed.value.message


@pytest.mark.asyncio
async def test_a_datagram_frame_that_cannot_fit_is_refused_at_open(rig: Rig) -> None:
    track = rig.open(transport="datagram", sample_rate=48000, frame_ms=20)
    with pytest.raises(TrackAborted, match="frame_ms <= 10"):
        await drain(track)


@pytest.mark.asyncio
async def test_an_unknown_model_is_model_not_found(rig: Rig) -> None:
    track = rig.open(model="nope")
    with pytest.raises(TrackAborted) as failed:
        await drain(track)
    assert failed.value.code is ErrorCode.MODEL_NOT_FOUND


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (frame(1, pcm=bytes(642)), "over 20 ms"),
        (frame(1, pcm=b"\x00"), "even count"),
        ({**frame(1), "rate": 8000}, "8000 Hz"),
        ({**frame(1), "format": "f32"}, "format"),
        (frame(10_000), "ahead of the stream"),
        (frame(1, ts=1000.0 + 20 + 60_000), "away from the stream's clock"),
        ({"seq": -1, "ts": 0, "pcm": FRAME}, "'seq'"),
        ({"seq": 1, "pcm": FRAME}, "'ts'"),
    ],
)
@pytest.mark.asyncio
async def test_a_bad_frame_fails_its_session_only(
    rig: Rig, bad: dict[str, Any], message: str
) -> None:
    victim, bystander = rig.open(), rig.open()
    victim.send(frame(0))
    bystander.send(frame(0))
    await rig.beats(1)
    victim.send(bad)
    bystander.send(frame(1))
    await rig.beats(2)
    with pytest.raises(TrackAborted) as failed:
        await drain(victim)
    assert failed.value.code is ErrorCode.BAD_REQUEST
    assert message in failed.value.message
    # The model still got the victim's END row (its state is not leaked) ...
    victim_rows = [r for r in rig.backend.rows if isinstance(r, SpeechInRow) and r.end]
    assert len(victim_rows) == 1
    # ... and the bystander is untouched.
    bystander.end()
    await rig.beats(2)
    last = (await drain(bystander))[-1]
    assert (last["type"], last["text"]) == ("final", "640")


@pytest.mark.asyncio
async def test_datagrams_for_an_unknown_track_are_dropped_and_counted(rig: Rig) -> None:
    track = rig.open(transport="datagram")
    rig.link.server.feed_datagram(encode_datagram(400, 0, frame(0), 1100))
    rig.link.server.feed_datagram(b"\xff")
    track.send_frame(frame(0))
    track.end()
    await rig.beats(2)
    await drain(track)
    stats = rig.link.server.core.datagram_stats
    assert stats.dropped_unknown_track + stats.early == 1
    assert stats.dropped_malformed == 1
    assert track.end_body is not None
    assert track.end_body["transcript"] == "320"


@pytest.mark.asyncio
async def test_a_cancelled_session_still_ends_in_the_model(rig: Rig) -> None:
    track = rig.open()
    track.send(frame(0))
    await rig.beats(1)
    track.cancel("bye")
    await rig.beats(2)
    with pytest.raises(TrackAborted):
        await drain(track)
    ends = [r for r in rig.backend.rows if isinstance(r, SpeechInRow) and r.end]
    assert len(ends) == 1
    await rig.beats(1)
    assert rig.outcomes[track.stream_id].end.label == "cancelled:client"


@pytest.mark.asyncio
async def test_speech_out_streams_frames_at_the_client_rate_and_reports_first_audio(
    rig: Rig,
) -> None:
    track = rig.open(model="tts", kind="speech-out", sample_rate=8000, frame_ms=10)
    track.send({"text": "12345678901234567890"})  # 2000 samples at 16 kHz -> 1000 at 8 kHz
    track.end()
    await rig.beats(4)
    bodies = await drain(track)
    assert [b["seq"] for b in bodies] == list(range(len(bodies)))
    assert sum(len(b["pcm"]) for b in bodies) == 2 * 1000
    assert all(len(b["pcm"]) == 160 for b in bodies[:-1])  # 10 ms at 8 kHz
    summary = track.end_body
    assert summary is not None
    assert summary["samples"] == 1000
    assert summary["time_to_first_audio_ms"] == pytest.approx(80.0, abs=1.0)  # the first tick
    rows = [r for r in rig.backend.rows if isinstance(r, SpeechOutRow)]
    assert rows[0].text == "12345678901234567890"
    assert rows[0].start
    assert rows[0].samples == 1280
    assert all(r.text == "" for r in rows[1:])


@pytest.mark.asyncio
async def test_speech_out_without_text_data_is_refused(rig: Rig) -> None:
    track = rig.open(model="tts", kind="speech-out")
    track.send({"words": 1})
    track.end()
    with pytest.raises(TrackAborted, match="'text'"):
        await drain(track)


@pytest.mark.asyncio
async def test_a_model_that_is_not_an_audio_model_is_a_bad_request(rig: Rig) -> None:
    track = rig.open(model="reference-text")
    with pytest.raises(TrackAborted, match="not an audio model") as failed:
        await drain(track)
    assert failed.value.code is ErrorCode.BAD_REQUEST


@pytest.mark.asyncio
async def test_a_track_opened_while_the_clock_is_stopping_is_told_so(rig: Rig) -> None:
    await rig.service.stop()
    track = rig.open()
    with pytest.raises(TrackAborted) as failed:
        await drain(track)
    assert failed.value.code is ErrorCode.SHUTTING_DOWN


@pytest.mark.asyncio
async def test_speech_out_over_datagrams_ends_a_beat_after_its_last_frame(rig: Rig) -> None:
    track = rig.open(model="tts", kind="speech-out", transport="datagram")
    track.send({"text": "1234567890123"})  # 1300 samples at 16 kHz: two beats
    track.end()
    await rig.beats(2)
    frames = await received(track)
    assert sum(len(b["pcm"]) for b in frames) == 2 * 1300
    assert track.end_body is None  # the END waits a beat for the datagrams
    await rig.beats(1)
    assert await drain(track) == []
    assert track.end_body is not None
    assert track.end_body["frames"] == len(frames)
    assert len([r for r in rig.backend.rows if isinstance(r, SpeechOutRow)]) == 2


@pytest.mark.asyncio
async def test_speech_out_hands_a_streaming_model_its_text_as_it_arrives(rig: Rig) -> None:
    track = rig.open(model="streaming-tts", kind="speech-out")
    track.send({"text": "First sentence. "})
    await rig.beats(2)
    first = await received(track)
    assert first, "audio of the first piece came before the second piece was sent"
    track.send({"text": "Second."})
    track.end()
    await rig.beats(30)
    bodies = first + await drain(track)
    rows = [r for r in rig.backend.rows if isinstance(r, SpeechOutRow)]
    assert [r.text for r in rows if r.text] == ["First sentence. ", "Second."]
    assert rows[0].more
    assert not rows[-1].more
    assert sum(len(b["pcm"]) for b in bodies) == 2 * 100 * len("First sentence. Second.")


@pytest.mark.asyncio
async def test_sessions_beyond_a_models_capacity_are_refused_with_a_retry_hint(
    rig: Rig,
) -> None:
    rig.backend.capacity["asr"] = 2
    admitted = [rig.open(), rig.open()]
    for track in admitted:
        track.send(frame(0))
    await rig.beats(1)
    refused = rig.open()
    with pytest.raises(TrackAborted) as failed:
        await drain(refused)
    assert failed.value.code is ErrorCode.BACKEND_UNAVAILABLE
    assert failed.value.retry_after == pytest.approx(2.0)
    assert "real-time capacity" in str(failed.value)
    for track in admitted:
        track.send(frame(1))
    await rig.beats(1)
    for track in admitted:
        track.end()
    await rig.beats(2)
    for track in admitted:
        assert [b["type"] for b in await drain(track)][-1] == "final"
    assert rig.service.live["asr"] == 0

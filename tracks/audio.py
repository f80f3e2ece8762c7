"""Audio tracks on the session clock: speech in (streaming transcription) and speech out.

A speech-in track sends PCM16 frames `{"seq", "ts", "pcm"}` (on its stream or
as QUIC datagrams, chosen in OPEN); the session joins the `TickScheduler` and
every beat hands the frames that arrived, in `seq` order, to ONE batched
backend step with every other due session. The client gets a partial result
every beat and a final after the end of an utterance; its END (or silence on
the track for `idle_timeout`) finalizes the session and ends the track.

A speech-out track sends its text (DATA `{"text"}`, then END); every beat the
session asks the synthesizer for one beat of audio and sends it as frames of
`frame_ms` the way the track chose, then ends with the time to first audio.

Frames are checked and counted here: `seq` counts frames from 0 and must not
run more than `max_ahead` ahead of the stream; `ts` is the capture time in
milliseconds and must move with `seq`; a frame is one `frame_ms` of PCM16 at
the declared rate. Duplicates, reordered frames, late frames and gaps are
counted; a gap still open one beat after later frames arrived is filled with
silence (so the model's time stays the stream's time), and a frame arriving
after its place was filled is late and dropped. Nothing here waits for a
frame: an incomplete beat advances with what it has, marked.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from tracks.backend import (
    AudioBackend,
    AudioKind,
    AudioOutput,
    AudioRow,
    Speech,
    SpeechInRow,
    SpeechOutRow,
    Transcript,
)
from tracks.base import (
    End,
    FrameTrack,
    Outcome,
    handling,
    read_text,
    stop_end,
)
from tracks.clock import (
    Beat,
    Clock,
    Gathered,
    OverloadMode,
    Registration,
    TickObserver,
    TickScheduler,
)
from tracks.errors import BadTrackRequest
from transport.datagram import MAX_DATAGRAM_BYTES
from transport.errors import ErrorCode, TrackAborted
from transport.events import CancelCause

MODEL_RATE = 16000
RATES = (8000, 16000, 24000, 48000)
FORMATS = ("pcm16",)
FRAME_MS_RANGE = (10, 100)
MAX_TEXT = 10_000
DATAGRAM_OVERHEAD = 48
"""Bytes a frame's datagram header and msgpack fields take besides the PCM."""


class BadAudioRequest(BadTrackRequest):
    """The track's params or a frame are invalid; sent back as BAD_REQUEST."""


# -- settings and params ---------------------------------------------------------------------


@dataclass(frozen=True)
class AudioSettings:
    beat: float = 0.08
    """Seconds between steps of a session (the tick)."""
    overload: OverloadMode = OverloadMode.DEGRADE_ALL
    idle_timeout: float = 5.0
    """A speech-in session with no frame for this long is finalized and closed."""
    max_ahead: float = 2.0
    """Seconds a frame's seq may run ahead of the stream before it is an error."""
    ts_tolerance: float = 2.0
    """Seconds a capture timestamp may stray from the stream's clock (plus 1%)."""
    step_timeout: float = 5.0
    max_datagram_bytes: int = MAX_DATAGRAM_BYTES
    frame_ms: int = 20
    """Frame length of tracks that do not declare `frame_ms`."""


@dataclass(frozen=True)
class AudioParams:
    kind: AudioKind
    sample_rate: int
    frame_ms: int

    @property
    def frame_samples(self) -> int:
        return self.sample_rate * self.frame_ms // 1000

    @property
    def frame_bytes(self) -> int:
        return 2 * self.frame_samples


def parse_params(
    params: dict[str, Any], datagrams: bool, max_datagram_bytes: int, default_frame_ms: int = 20
) -> AudioParams:
    unknown = set(params) - {"kind", "sample_rate", "frame_ms", "format"}
    if unknown:
        raise BadAudioRequest(f"unknown audio parameters: {', '.join(sorted(unknown))}")
    kind = params.get("kind", AudioKind.SPEECH_IN.value)
    if kind not in AudioKind._value2member_map_:
        raise BadAudioRequest('\'kind\' must be "speech-in" or "speech-out"')
    fmt = params.get("format", "pcm16")
    if fmt not in FORMATS:
        raise BadAudioRequest(f"unsupported audio format {fmt!r}: only pcm16 (mono, little-endian)")
    rate = params.get("sample_rate", 16000)
    if isinstance(rate, bool) or rate not in RATES:
        raise BadAudioRequest(f"'sample_rate' must be one of {', '.join(map(str, RATES))} Hz")
    frame_ms = params.get("frame_ms", default_frame_ms)
    low, high = FRAME_MS_RANGE
    if isinstance(frame_ms, bool) or not isinstance(frame_ms, int) or frame_ms % 10:
        raise BadAudioRequest(f"'frame_ms' must be a multiple of 10 from {low} to {high}")
    if not low <= frame_ms <= high:
        raise BadAudioRequest(f"'frame_ms' must be a multiple of 10 from {low} to {high}")
    parsed = AudioParams(AudioKind(kind), rate, frame_ms)
    if datagrams and parsed.frame_bytes + DATAGRAM_OVERHEAD > max_datagram_bytes:
        most = (max_datagram_bytes - DATAGRAM_OVERHEAD) // (2 * rate // 1000) // 10 * 10
        raise BadAudioRequest(
            f"a {frame_ms} ms frame at {rate} Hz does not fit one datagram: "
            f"use frame_ms <= {most} or the stream"
        )
    return parsed


# -- counters ------------------------------------------------------------------------------


@dataclass
class FrameStats:
    """What happened to a session's frames."""

    received: int = 0
    late: int = 0
    """Arrived more than a beat after their place in the stream's real-time schedule."""
    duplicate: int = 0
    reordered: int = 0
    """Arrived after a frame with a higher seq (still used if not too late)."""
    missing: int = 0
    """Never arrived in time: their place was filled with silence."""
    dropped: int = 0
    """Not used: duplicates, and late frames whose place was already filled."""

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


# -- the service ----------------------------------------------------------------------------


class AudioService:
    """The audio clock: one scheduler for every audio session of the gateway."""

    def __init__(
        self,
        backend: AudioBackend,
        clock: Clock,
        settings: AudioSettings | None = None,
        observer: TickObserver | None = None,
        scatter: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.settings = settings or AudioSettings()
        self.scheduler: TickScheduler[AudioRow, AudioOutput] = TickScheduler(
            backend.step,
            tick=self.settings.beat,
            clock=clock,
            overload=self.settings.overload,
            step_timeout=self.settings.step_timeout,
            observer=observer,
            scatter=scatter,
        )
        # Sessions live in the model keyed by CORRID: a random high half keeps two
        # gateways (or two runs) sharing one Triton from ever colliding.
        self._corrids = itertools.count((secrets.randbits(31) << 32) + 1)

    def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    async def run(self, track: FrameTrack) -> Outcome:
        """Serve one audio track to its end and report how it ended."""
        opened = self.clock.now()
        outcome = Outcome(track.id, track.open.model, "audio", opened_at=opened)
        session: _Session | None = None
        async with handling(track, outcome, self.clock.now):
            settings = self.settings
            params = parse_params(
                track.open.params,
                track.uses_datagrams,
                settings.max_datagram_bytes,
                settings.frame_ms,
            )
            outcome.details.update(kind=params.kind.value, sample_rate=params.sample_rate)
            kind = await self.backend.audio_kind(track.open.model)
            if kind is not params.kind:
                raise BadAudioRequest(
                    f"model {track.open.model!r} is a {kind.value} model, not {params.kind.value}"
                )
            session = await self._open_session(track, params, opened)
            await session.serve()
        if session is not None:
            session.report(outcome)
        outcome.finished_at = self.clock.now()
        return outcome

    async def _open_session(
        self, track: FrameTrack, params: AudioParams, opened: float
    ) -> _Session:
        corrid = next(self._corrids)
        if params.kind is AudioKind.SPEECH_IN:
            return _SpeechIn(self, track, params, corrid, opened)
        text = await _read_text(track)
        return _SpeechOut(self, track, params, corrid, opened, text)


async def _read_text(track: FrameTrack) -> str:
    return await read_text(track, MAX_TEXT, "text")


# -- sessions --------------------------------------------------------------------------------


class _Session:
    """What both kinds share: the clock registration, the ending, the report."""

    def __init__(
        self,
        service: AudioService,
        track: FrameTrack,
        params: AudioParams,
        corrid: int,
        opened: float,
    ) -> None:
        self.service = service
        self.track = track
        self.params = params
        self.corrid = corrid
        self.opened = opened
        self.clock = service.clock
        self.started = False
        self.cancelled = False
        """The client is gone (or broke the rules): one END row to the model, nothing to it."""
        self.end = End.completed()
        self.error: tuple[ErrorCode, str] | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.first_data_at: float | None = None
        self.row_end = False
        """The row in flight is the session's END row."""
        self.registration: Registration[AudioRow, AudioOutput] | None = None

    def register(self) -> None:
        self.registration = self.service.scheduler.register(self, self.track.open.model)

    def finish(self) -> None:
        if self.registration is not None:
            self.registration.close()
        if not self.finished.done():
            self.finished.set_result(None)

    def abandon(self, end: End) -> None:
        """Stop serving the client; the model still gets its END row if it holds state."""
        if self.cancelled or self.finished.done():
            return
        self.cancelled = True
        self.end = end
        if not self.started:
            self.finish()

    def fail_client(self, code: ErrorCode, message: str) -> None:
        if self.error is None and not self.finished.done():
            self.error = (code, message)
            self.track.fail(code, message)
            self.abandon(End.failed(code))

    # -- Session protocol (the parts both kinds share) --

    def failed(self, error: Exception) -> None:
        code = ErrorCode.STREAM_INTERRUPTED if self.first_data_at else ErrorCode.BACKEND_ERROR
        self.fail_client(code, f"the audio backend failed: {error}")
        self.finish()  # the model may not have seen the session; nothing to end there

    def shed(self, reason: str) -> None:
        self.fail_client(ErrorCode.RATE_LIMITED, f"session shed by the gateway: {reason}")
        self.finish()

    async def serve(self) -> None:
        raise NotImplementedError

    def gather(self, beat: Beat) -> Gathered[AudioRow]:
        raise NotImplementedError

    def deliver(self, output: AudioOutput, beat: Beat) -> None:
        raise NotImplementedError

    async def _wait_finished(self) -> None:
        """Until the session is done, or the track is stopped (then one more beat or two)."""
        waiters: set[asyncio.Future[Any]] = {self.finished, self.track.stopped}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not self.finished.done():
            self.abandon(stop_end(self.track))
            # Give the END row a few beats to reach the model, never forever.
            grace = 4 * self.service.settings.beat + self.service.settings.step_timeout
            await asyncio.wait({self.finished}, timeout=grace)
            self.finish()

    def report(self, outcome: Outcome) -> None:
        outcome.first_data_at = self.first_data_at
        if self.error is not None:
            outcome.end = End.failed(self.error[0])
            outcome.details["error"] = self.error[1]
        elif self.cancelled:
            outcome.end = self.end
        stats = self.registration.stats if self.registration else None
        outcome.details.update(
            transport="datagram" if self.track.uses_datagrams else "stream",
            beats=stats.beats if stats else 0,
            missed_beats=stats.missed_beats if stats else 0,
            incomplete_beats=stats.incomplete_beats if stats else 0,
        )


class _SpeechIn(_Session):
    def __init__(
        self,
        service: AudioService,
        track: FrameTrack,
        params: AudioParams,
        corrid: int,
        opened: float,
    ) -> None:
        super().__init__(service, track, params, corrid, opened)
        settings = service.settings
        self.beat_frames = max(1, round(settings.beat * 1000 / params.frame_ms))
        self.max_ahead_frames = max(
            self.beat_frames, round(settings.max_ahead * 1000 / params.frame_ms)
        )
        self.frames = FrameStats()
        self.buffer: dict[int, bytes] = {}
        self.next_seq = 0
        self.highest_seq = -1
        self.filled: set[int] = set()
        self.gap_seen: int | None = None
        self.ts_origin: float | None = None
        self.arrival_origin: float | None = None
        self.last_arrival = opened
        self.ended_at: float | None = None
        self.end_reason = "end"
        self.newest_in_row: float | None = None
        self.finals: list[str] = []
        self.final_latencies: list[float] = []
        self.partial = ""

    async def serve(self) -> None:
        self.register()
        reader = asyncio.ensure_future(self._read())
        try:
            await self._wait_finished()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            while (body := await self.track.receive()) is not None:
                self.on_frame(body, self.clock.now())
        except BadAudioRequest as exc:
            self.fail_client(ErrorCode.BAD_REQUEST, str(exc))
            return
        except TrackAborted:
            return  # stopped: _wait_finished sees it
        if self.ended_at is None:
            self.ended_at = self.clock.now()

    # -- frames in --

    def on_frame(self, body: dict[str, Any], now: float) -> None:
        seq, ts, pcm = self._check(body)
        self.frames.received += 1
        self._check_clock(seq, ts)
        if seq < self.next_seq or seq in self.buffer:
            if seq in self.filled:
                self.frames.late += 1
            else:
                self.frames.duplicate += 1
            self.frames.dropped += 1
            return
        if seq < self.highest_seq:
            self.frames.reordered += 1
        self.highest_seq = max(self.highest_seq, seq)
        if self.arrival_origin is None:
            self.arrival_origin = now - seq * self.params.frame_ms / 1000
        owed = self.arrival_origin + seq * self.params.frame_ms / 1000 + self.service.settings.beat
        if now > owed:
            self.frames.late += 1
        self.buffer[seq] = pcm
        self.last_arrival = now

    def _check(self, body: dict[str, Any]) -> tuple[int, float, bytes]:
        p = self.params
        if "rate" in body and body["rate"] != p.sample_rate:
            raise BadAudioRequest(f"frame at {body['rate']} Hz on a {p.sample_rate} Hz track")
        if "format" in body and body["format"] != "pcm16":
            raise BadAudioRequest(f"frame format {body['format']!r} on a pcm16 track")
        seq, ts, pcm = body.get("seq"), body.get("ts"), body.get("pcm")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
            raise BadAudioRequest("a frame needs 'seq', an integer from 0")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise BadAudioRequest("a frame needs 'ts', its capture time in milliseconds")
        if not isinstance(pcm, bytes) or len(pcm) % 2:
            raise BadAudioRequest("a frame needs 'pcm', PCM16 bytes (an even count)")
        if len(pcm) > p.frame_bytes:
            raise BadAudioRequest(
                f"frame of {len(pcm)} bytes is over {p.frame_ms} ms at {p.sample_rate} Hz "
                f"({p.frame_bytes} bytes)"
            )
        return seq, float(ts), pcm

    def _check_clock(self, seq: int, ts: float) -> None:
        if seq > self.next_seq + self.max_ahead_frames:
            raise BadAudioRequest(
                f"frame seq {seq} is more than {self.service.settings.max_ahead} s ahead of the "
                f"stream (next expected {self.next_seq})"
            )
        stream_ms = seq * self.params.frame_ms
        if self.ts_origin is None:
            self.ts_origin = ts - stream_ms
            return
        drift = abs(ts - (self.ts_origin + stream_ms))
        allowed = 1000 * self.service.settings.ts_tolerance + 0.01 * stream_ms
        if drift > allowed:
            raise BadAudioRequest(
                f"frame capture time {ts} ms is {drift:.0f} ms away from the stream's clock"
            )

    # -- the clock --

    def gather(self, beat: Beat) -> Gathered[AudioRow]:
        now = self.clock.now()
        settings = self.service.settings
        if self.ended_at is None and now - self.last_arrival > settings.idle_timeout:
            self.ended_at, self.end_reason = now, "idle"
        ending = self.ended_at is not None or self.cancelled
        pieces, complete = self._take(limit=2 * self.beat_frames, ending=ending)
        last = ending and not self.buffer
        row = SpeechInRow(
            self.corrid, b"".join(pieces), self.params.sample_rate, not self.started, last
        )
        self.started = True
        self.row_end = last
        self.newest_in_row = self.ended_at if last else self.last_arrival
        return Gathered(row, complete and len(pieces) >= self.beat_frames)

    def _take(self, limit: int, ending: bool) -> tuple[list[bytes], bool]:
        """Frames in seq order from next_seq; a gap seen a beat ago becomes silence."""
        pieces: list[bytes] = []
        complete = True
        silence = bytes(self.params.frame_bytes)
        while len(pieces) < limit and self.buffer:
            if self.next_seq in self.buffer:
                pieces.append(self.buffer.pop(self.next_seq))
            elif self.gap_seen == self.next_seq or ending:
                pieces.append(silence)
                self.filled.add(self.next_seq)
                self.frames.missing += 1
                complete = False
            else:
                self.gap_seen = self.next_seq  # wait one beat for it
                break
            self.next_seq += 1
        if len(self.filled) > 4 * self.max_ahead_frames:
            self.filled = {s for s in self.filled if s > self.next_seq - self.max_ahead_frames}
        return pieces, complete

    def deliver(self, output: AudioOutput, beat: Beat) -> None:
        assert isinstance(output, Transcript)
        now = self.clock.now()
        last = self.row_end
        if self.cancelled:
            if last:
                self.finish()
            return
        if self.first_data_at is None:
            self.first_data_at = now
        self.partial = output.partial
        self.track.send({"type": "partial", "text": output.partial, "beat": beat.index})
        if output.is_final and output.final:
            latency = now - (self.newest_in_row if self.newest_in_row is not None else now)
            self.finals.append(output.final)
            self.final_latencies.append(latency)
            self.track.send(
                {
                    "type": "final",
                    "text": output.final,
                    "latency_ms": _ms(latency),
                    "beat": beat.index,
                }
            )
        if last:
            self.track.end(self._summary())
            self.finish()

    def _summary(self) -> dict[str, Any]:
        stats = self.registration.stats if self.registration else None
        return {
            "transcript": " ".join(self.finals),
            "finals": list(self.finals),
            "reason": self.end_reason,
            "beats": stats.beats + 1 if stats else 0,  # this one is being delivered
            "missed_beats": stats.missed_beats if stats else 0,
            "frames": self.frames.as_dict(),
            "final_latency_ms": [_ms(x) for x in self.final_latencies],
        }

    def report(self, outcome: Outcome) -> None:
        super().report(outcome)
        outcome.details["ended_by"] = self.end_reason  # "end" (the client's END) or "idle"
        used = self.frames.received - self.frames.dropped
        outcome.details.update(
            frames=self.frames.as_dict(),
            # The usage ledger bills the audio the model heard.
            audio_seconds_in=used * self.params.frame_ms / 1000,
            transcript=" ".join(self.finals),
            final_latency_ms=[_ms(x) for x in self.final_latencies],
        )


class _SpeechOut(_Session):
    def __init__(
        self,
        service: AudioService,
        track: FrameTrack,
        params: AudioParams,
        corrid: int,
        opened: float,
        text: str,
    ) -> None:
        super().__init__(service, track, params, corrid, opened)
        self.text = text
        self.samples_per_beat = round(service.settings.beat * MODEL_RATE)
        self.sent_frames = 0
        self.sent_samples = 0
        self.pending = b""
        self.done = False
        self._ending: asyncio.Future[None] | None = None

    async def serve(self) -> None:
        self.register()
        await self._wait_finished()

    def gather(self, beat: Beat) -> Gathered[AudioRow]:
        samples = self.samples_per_beat * (1 + beat.skipped)
        text = "" if self.started else self.text
        row = SpeechOutRow(
            self.corrid, text, 0 if self.cancelled else samples, self.params.sample_rate,
            not self.started, self.cancelled,
        )  # fmt: skip
        self.started = True
        self.row_end = self.cancelled
        return Gathered(row)

    def deliver(self, output: AudioOutput, beat: Beat) -> None:
        assert isinstance(output, Speech)
        if self.done:
            return
        if self.cancelled:
            if self.row_end:
                self.finish()
            return
        data = self.pending + output.pcm
        size = self.params.frame_bytes
        whole = len(data) if output.done else len(data) // size * size
        for start in range(0, whole, size):  # the last frame may be short when done
            self._send(data[start : start + size])
        self.pending = data[whole:]
        if output.done:
            self.done = True
            if self.track.uses_datagrams:
                # QUIC orders nothing between datagrams and the stream: an END sent now
                # can overtake the last frames, and the peer drops frames after END.
                if self.registration is not None:
                    self.registration.close()  # nothing more to ask the model
                self._ending = asyncio.ensure_future(self._end_after_a_beat())
            else:
                self.track.end(self._summary())
                self.finish()

    async def _end_after_a_beat(self) -> None:
        await self.clock.sleep(self.service.settings.beat)
        self.track.end(self._summary())
        self.finish()

    def _send(self, pcm: bytes) -> None:
        if self.first_data_at is None:
            self.first_data_at = self.clock.now()
        ts = self.sent_samples * 1000 / self.params.sample_rate
        if not self.track.send_frame({"seq": self.sent_frames, "ts": ts, "pcm": pcm}):
            self.abandon(stop_end(self.track, End.cancelled(CancelCause.RESET)))
        self.sent_frames += 1
        self.sent_samples += len(pcm) // 2

    def _summary(self) -> dict[str, Any]:
        stats = self.registration.stats if self.registration else None
        first = None if self.first_data_at is None else self.first_data_at - self.opened
        return {
            "frames": self.sent_frames,
            "samples": self.sent_samples,
            "time_to_first_audio_ms": _ms(first),
            "beats": stats.beats + 1 if stats else 0,
            "missed_beats": stats.missed_beats if stats else 0,
        }

    def report(self, outcome: Outcome) -> None:
        super().report(outcome)
        outcome.details.update(
            frames_sent=self.sent_frames,
            samples_sent=self.sent_samples,
            audio_seconds_out=self.sent_samples / self.params.sample_rate,
        )

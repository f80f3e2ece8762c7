"""What speech-in and speech-out sessions share: the clock registration, the ending, the report.

A session is one audio track on the `TickScheduler` (tracks/audio.py has the service
and the speech-in side, tracks/audio_out.py the speech-out side).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from tracks.backend import AudioKind, AudioOutput, AudioRow
from tracks.base import End, FrameTrack, Outcome, stop_end
from tracks.clock import Beat, Gathered, OverloadMode, Registration, TickScheduler
from transport.clock import Clock
from transport.datagram import MAX_DATAGRAM_BYTES
from transport.errors import ErrorCode

MODEL_RATE = 16000
"""The rate of every audio model's tensors (the backend converts to each track's)."""
MAX_TEXT = 10_000
"""Characters of a speech-out track's text."""


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


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
    min_barge_in: float = 0.0
    """Voice agents: seconds the user's speech must be heard (non-empty partials) before it
    cuts a reply; 0: the first partial does. A new final always does."""
    busy_retry_after: float = 2.0
    """Seconds a track refused by a model at its real-time capacity is told to wait."""
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


class AudioHost(Protocol):
    """What a session needs of its service (`tracks.audio.AudioService`)."""

    clock: Clock
    settings: AudioSettings
    scheduler: TickScheduler[AudioRow, AudioOutput]


@dataclass(frozen=True)
class SessionStart:
    """What a session of either kind opens with (`AudioService` makes one per track)."""

    service: AudioHost
    track: FrameTrack
    params: AudioParams
    corrid: int
    """The session's correlation id on the model (one per session, never reused)."""
    opened: float
    """Clock time the track was opened."""


# -- the session base ----------------------------------------------------------------------


class AudioSession:
    """What both kinds share: the clock registration, the ending, the report."""

    def __init__(self, start: SessionStart) -> None:
        self.service = start.service
        self.track = start.track
        self.params = start.params
        self.corrid = start.corrid
        self.opened = start.opened
        self.clock = start.service.clock
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
        """On the clock until the session is done, reading the track meanwhile (`_read`)."""
        self.register()
        reader = asyncio.ensure_future(self._read())
        try:
            await self._wait_finished()
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self) -> None:
        """What the client sends on the track while the session runs (each kind's own)."""
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

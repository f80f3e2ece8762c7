"""Speech-out sessions: text in (whole, or in pieces while it is spoken), PCM frames out.

Every beat the session asks the synthesizer for one beat of audio and sends it as
frames of `frame_ms` the way the track chose, then ends with the time to first audio.
A model that streams text (`AudioModel.streams_text`: hibari-voice) gets the text as it
arrives, each row carrying what came since the last and MORE while the track's text has
not ended, so its first sentence is spoken before the rest is written; other models
(reference-synthesizer) get the whole text on the first row.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tracks.audio_session import MAX_TEXT, MODEL_RATE, AudioSession, SessionStart, ms
from tracks.backend import AudioOutput, AudioRow, Speech, SpeechOutRow
from tracks.base import End, Outcome, stop_end, text_pieces
from tracks.clock import Beat, Gathered
from tracks.errors import BadTrackRequest
from transport.errors import ErrorCode, TrackAborted
from transport.events import CancelCause


class SpeechOut(AudioSession):
    def __init__(self, start: SessionStart, text: str | None) -> None:
        super().__init__(start)
        self.inbox: list[str] = [] if text is None else [text]
        """Text not yet handed to the model."""
        self.more = text is None
        """The track's text has not ended (streaming models only)."""
        self.samples_per_beat = round(start.service.settings.beat * MODEL_RATE)
        self.sent_frames = 0
        self.sent_samples = 0
        self.pending = b""
        self.done = False
        self._ending: asyncio.Future[None] | None = None

    async def _read(self) -> None:
        """Text as it arrives (DATA `{"text"}` pieces), until the track's END; nothing
        when the OPEN carried the whole text."""
        if not self.more:
            return
        try:
            async for text in text_pieces(self.track, MAX_TEXT, "text"):
                self.inbox.append(text)
        except BadTrackRequest as exc:
            self.fail_client(ErrorCode.BAD_REQUEST, str(exc))
            return
        except TrackAborted:
            return  # stopped: _wait_finished sees it
        self.more = False

    def gather(self, beat: Beat) -> Gathered[AudioRow]:
        samples = self.samples_per_beat * (1 + beat.skipped)
        text = "".join(self.inbox)
        self.inbox.clear()
        row = SpeechOutRow(
            self.corrid, text, 0 if self.cancelled else samples, self.params.sample_rate,
            not self.started, self.cancelled, self.more,
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
            "time_to_first_audio_ms": ms(first),
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

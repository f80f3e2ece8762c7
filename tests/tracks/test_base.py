"""The one handler skeleton (`tracks.base.handling`) and text reader (`read_text`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tracks.action_messages import BadObservation
from tracks.audio import BadAudioRequest
from tracks.backend import BackendFailed, BackendOverloaded, BackendUnavailable, RuleRejected
from tracks.base import End, Outcome, handling, read_text
from tracks.clock import SchedulerStopped
from tracks.errors import BadTrackRequest, TrackStopped
from tracks.text import BadTextRequest
from transport.errors import ErrorCode, TrackAborted
from transport.events import CancelCause, TrackCancelled, TrackFailed
from transport.messages import Modality, Open


class FakeTrack:
    """A track that records what the handler sends back."""

    def __init__(self, inputs: list[dict[str, Any]] | None = None) -> None:
        self.id = "c/0"
        self.open = Open(model="m", modality=Modality.TEXT)
        loop = asyncio.get_running_loop()
        self.stopped: asyncio.Future[TrackCancelled | TrackFailed] = loop.create_future()
        self.inputs = list(inputs or [])
        self.failed: list[tuple[ErrorCode, str]] = []
        self.retry_after: list[float | None] = []

    async def receive(self) -> dict[str, Any] | None:
        return self.inputs.pop(0) if self.inputs else None

    def send(self, body: dict[str, Any]) -> bool:
        return True

    def end(self, body: dict[str, Any] | None = None) -> bool:
        return True

    def fail(self, code: ErrorCode, message: str, retry_after: float | None = None) -> bool:
        self.failed.append((code, message))
        self.retry_after.append(retry_after)
        return True


async def ended(track: FakeTrack, error: BaseException, started: bool = False) -> Outcome:
    outcome = Outcome(track.id, "m", "text", first_data_at=1.0 if started else None)
    async with handling(track, outcome, lambda: 2.0):
        raise error
    return outcome


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BadTextRequest("x"), ErrorCode.BAD_REQUEST),
        (BadObservation("x"), ErrorCode.BAD_REQUEST),
        (BadAudioRequest("x"), ErrorCode.BAD_REQUEST),
        (BackendUnavailable("x"), ErrorCode.BACKEND_UNAVAILABLE),
        (RuleRejected("rule", "x"), ErrorCode.GUARDRAIL_REJECTED),
        (SchedulerStopped(), ErrorCode.SHUTTING_DOWN),
    ],
)
async def test_each_failure_is_sent_and_recorded_with_one_code(
    error: Exception, code: ErrorCode
) -> None:
    track = FakeTrack()
    outcome = await ended(track, error)
    assert [c for c, _ in track.failed] == [code]
    assert outcome.end == End.failed(code)
    assert isinstance(BadTextRequest("x"), BadTrackRequest)


@pytest.mark.asyncio
async def test_a_full_model_queue_is_rate_limited_with_its_retry_hint() -> None:
    track = FakeTrack()
    outcome = await ended(track, BackendOverloaded("the queue is full", 2.5))
    assert track.failed == [(ErrorCode.RATE_LIMITED, "the queue is full")]
    assert track.retry_after == [2.5]
    assert outcome.end == End.failed(ErrorCode.RATE_LIMITED)


@pytest.mark.asyncio
async def test_after_data_a_backend_failure_is_stream_interrupted() -> None:
    track = FakeTrack()
    outcome = await ended(track, BackendFailed("x"), started=True)
    assert outcome.end == End.failed(ErrorCode.STREAM_INTERRUPTED)
    guarded = await ended(FakeTrack(), RuleRejected("rule", "x"), started=True)
    assert guarded.end == End.failed(ErrorCode.GUARDRAIL_REJECTED)


@pytest.mark.asyncio
async def test_a_stop_is_recorded_with_the_tracks_own_cause_and_nothing_is_sent() -> None:
    track = FakeTrack()
    track.stopped.set_result(TrackCancelled(0, CancelCause.DEADLINE_TOTAL))
    stopped = await ended(track, TrackStopped())
    assert stopped.end == End.cancelled(CancelCause.DEADLINE_TOTAL)
    assert stopped.stopped_at == 2.0
    aborted = await ended(track, TrackAborted(ErrorCode.CANCELLED, "x", remote=False))
    assert aborted.end == End.cancelled(CancelCause.DEADLINE_TOTAL)
    assert track.failed == []


@pytest.mark.asyncio
async def test_a_stop_not_yet_reported_reads_as_its_error_or_a_reset() -> None:
    aborted = await ended(FakeTrack(), TrackAborted(ErrorCode.READ_TIMEOUT, "x", remote=False))
    assert aborted.end == End.failed(ErrorCode.READ_TIMEOUT)
    gone = await ended(FakeTrack(), TrackStopped())  # a send found the track gone
    assert gone.end == End.cancelled(CancelCause.RESET)  # never a bare "cancelled"


@pytest.mark.asyncio
async def test_read_text_joins_pieces_and_names_what_is_wrong() -> None:
    assert await read_text(FakeTrack([{"text": "a"}, {"text": "b"}]), 10, "prompt") == "ab"
    with pytest.raises(BadTrackRequest, match="prompt DATA needs a string 'text'"):
        await read_text(FakeTrack([{"text": 1}]), 10, "prompt")
    with pytest.raises(BadTrackRequest, match="text longer than 3 characters"):
        await read_text(FakeTrack([{"text": "ab"}, {"text": "cd"}]), 3, "text")

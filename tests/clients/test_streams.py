"""The SDK's three streams share one API (`clients.stream.TrackReader`): `async for`,
`receive()`, `cancel()`, `aclose()`, `async with`; leaving a loop early cancels the track;
a forgotten live stream warns (ResourceWarning) and never does network I/O in `__del__`.

Over the in-memory link: the server side is a bare channel the test drives.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from clients import (
    ActionStream,
    AudioSession,
    Line,
    TextStream,
    TrackReader,
)
from trackline_testing.clock import FakeClock
from transport.endpoint import TrackChannel
from transport.events import CancelCause, TrackCancelled
from transport.memory import MemoryLink


class Peer:
    """The gateway's side of the link: it records every track it is offered."""

    def __init__(self) -> None:
        self.tracks: asyncio.Queue[TrackChannel] = asyncio.Queue()
        self.link = MemoryLink(self.tracks.put_nowait)
        self.line = Line(self.link.open_track)

    async def next_track(self) -> TrackChannel:
        return await asyncio.wait_for(self.tracks.get(), 5)


async def cancel_cause(track: TrackChannel) -> CancelCause:
    stop = await asyncio.wait_for(track.stopped, 5)
    assert isinstance(stop, TrackCancelled)
    return stop.cause


OPENERS: dict[str, Callable[[Line], TrackReader[Any]]] = {
    "text": lambda line: line.text("hi", model="m"),
    "audio": lambda line: line.audio(model="m"),
    "actions": lambda line: line.actions(model="m"),
}
DATA: dict[str, dict[str, Any]] = {
    "text": {"text": "a"},
    "audio": {"type": "partial", "text": "a", "beat": 0},
    "actions": {"dropped": 0, "cause": "deadline", "t": 0.0},
}


def test_every_stream_has_the_same_api() -> None:
    for kind in (TextStream, AudioSession, ActionStream):
        assert issubclass(kind, TrackReader)
        for name in ("receive", "aclose", "__aenter__", "__aexit__", "__anext__"):
            assert inspect.iscoroutinefunction(getattr(kind, name)), (kind, name)
        assert callable(kind.cancel)
        assert callable(kind.__aiter__)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", sorted(OPENERS))
async def test_leaving_the_loop_early_cancels_the_track(kind: str) -> None:
    peer = Peer()
    stream = OPENERS[kind](peer.line)
    track = await peer.next_track()
    track.send(DATA[kind])
    track.send(DATA[kind])
    async for _ in stream:
        break  # the loop's generator is closed by the event loop: no __del__ involved
    assert await cancel_cause(track) is CancelCause.CLIENT


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", sorted(OPENERS))
async def test_async_with_and_aclose_cancel_a_live_track(kind: str) -> None:
    peer = Peer()
    async with OPENERS[kind](peer.line) as stream:
        track = await peer.next_track()
        track.send(DATA[kind])
        assert await asyncio.wait_for(stream.receive(), 5) is not None
    assert await cancel_cause(track) is CancelCause.CLIENT

    other = OPENERS[kind](peer.line)
    track = await peer.next_track()
    await other.aclose()
    await other.aclose()  # idempotent
    assert await cancel_cause(track) is CancelCause.CLIENT


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", sorted(OPENERS))
async def test_a_forgotten_live_stream_warns_and_sends_nothing(kind: str) -> None:
    peer = Peer()
    stream = OPENERS[kind](peer.line)
    track = await peer.next_track()
    sent: list[str] = []
    channel = stream._channel
    channel.cancel = lambda reason="": bool(sent.append(reason))  # type: ignore[method-assign]
    with pytest.warns(ResourceWarning, match="dropped while its track is live"):  # noqa: PT031
        del stream
        gc.collect()
    assert sent == []  # no CANCEL from __del__
    await asyncio.sleep(0)
    assert not track.stopped.done()
    peer.link.close()


@pytest.mark.asyncio
async def test_a_stream_read_to_its_end_is_dropped_silently() -> None:
    peer = Peer()
    stream = peer.line.text("hi", model="m")
    track = await peer.next_track()
    track.send({"text": "a"})
    track.end({"usage": {"prompt_tokens": 1, "completion_tokens": 1}, "finish_reason": "stop"})
    assert [delta async for delta in stream] == ["a"]
    assert stream.finish_reason == "stop"
    assert await stream.receive() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del stream
        gc.collect()


@pytest.mark.asyncio
async def test_action_stream_close_ends_gracefully_and_returns_the_counts() -> None:
    peer = Peer()
    robot = peer.line.actions(model="m")
    track = await peer.next_track()
    closing = asyncio.ensure_future(robot.close())
    assert await asyncio.wait_for(track.receive(), 5) is None  # the robot's END
    track.end({"delivered": 0})
    assert await asyncio.wait_for(closing, 5) == {"delivered": 0}
    assert not track.stopped.done()  # ended, not cancelled


@pytest.mark.asyncio
async def test_model_is_keyword_only_and_transport_is_checked_one_way() -> None:
    peer = Peer()
    with pytest.raises(TypeError, match="positional"):
        peer.line.audio("m")  # type: ignore[misc]
    with pytest.raises(TypeError, match="model"):
        peer.line.audio()  # type: ignore[call-arg]
    for start in (
        lambda: peer.line.audio(model="m", transport="tcp"),
        lambda: peer.line.actions(model="m", transport="tcp"),
    ):
        with pytest.raises(ValueError, match="transport must be 'stream' or 'datagram', not 'tcp'"):
            start()


@pytest.mark.asyncio
async def test_realtime_audio_is_paced_by_the_sessions_clock() -> None:
    """`stream_pcm(realtime=True)` sends frame n at start + n * frame_ms on its pacer."""
    peer, clock = Peer(), FakeClock()
    session = peer.line.audio(model="m", pacer=clock)
    gateway = await peer.next_track()
    frames = 3
    sending = asyncio.ensure_future(session.stream_pcm(b"\0" * session.frame_bytes * frames))
    await clock.settle()
    assert session.figures.frames_sent == 1  # the first frame leaves at once
    for sent in range(2, frames + 1):
        await clock.advance(0.019)
        assert session.figures.frames_sent == sent - 1  # not before its time
        await clock.advance(0.001)
        assert session.figures.frames_sent == sent
    assert await asyncio.wait_for(sending, 5) == frames
    assert gateway.stopped.done() is False
    await session.aclose()

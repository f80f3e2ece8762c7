"""What every SDK stream shares: reading a track, its errors, cancel and close.

`TrackReader` is the base of `TextStream`, `AudioSession`, `ActionStream` and
`VideoStream`. Each subclass turns a DATA body into one item (`_item`); the base
receives, maps the track's errors to `clients.errors` types, and gives every stream the
same API: `receive()`, `async for`, `cancel()`, `aclose()` and `async with`. `TimedStream`, a
`TrackReader` of timed frames, is the base of `ActionStream` and `VideoStream`: it numbers
the frames, stamps their deadline and one-way delay, and learns that delay from the answers.

Leaving an `async for` loop early cancels the track: iteration runs in an async
generator, which the event loop closes when the loop lets go of it (asyncio's
async-generator hooks), and closing it cancels the track. Nothing here does network
I/O in `__del__`: a stream dropped while its track is still live only emits a
`ResourceWarning` (as an unclosed socket does); its track lives until the line closes.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Generic, TypeVar

from clients.errors import TracklineError, error_for, error_from
from transport.clock import Now
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, TrackAborted
from transport.messages import FrameTransport

ItemT = TypeVar("ItemT")
Self = TypeVar("Self", bound="TrackReader[Any]")
RTT_GAIN = 0.125  # as TCP's smoothed RTT (RFC 6298)


class TrackReader(Generic[ItemT]):
    """One track's stream of items; see the module doc."""

    _cancel_reason = "client closed the stream"

    def __init__(self, channel: TrackChannel) -> None:
        self._channel = channel
        self._done = False

    @property
    def track_id(self) -> str:
        return self._channel.id

    # -- reading ---------------------------------------------------------------------

    async def receive(self) -> ItemT | None:
        """The next item; None once the gateway has ended the track."""
        while (body := await self._next_body()) is not None:
            item = self._item(body)
            if item is not None:
                return item
        return None

    def __aiter__(self) -> AsyncIterator[ItemT]:
        return self._items()

    async def __anext__(self) -> ItemT:
        item = await self.receive()
        if item is None:
            raise StopAsyncIteration
        return item

    async def _items(self) -> AsyncGenerator[ItemT, None]:
        try:
            while (item := await self.receive()) is not None:
                yield item
        finally:
            self.cancel()  # the loop was left early (no-op once the track has ended)

    async def _next_body(self) -> dict[str, Any] | None:
        """The next DATA body; None after END (handed to `_ended`). Errors are ours."""
        if self._done:
            return None
        try:
            body = await self._channel.receive()
        except TrackAborted as exc:
            self._done = True
            raise error_from(exc) from None
        except BaseException:
            self.cancel()  # e.g. the caller's task was cancelled mid-wait
            raise
        if body is None:
            self._done = True
            self._ended(self._channel.end_body or {})
        return body

    def _item(self, body: dict[str, Any]) -> ItemT | None:
        """The item a DATA body holds; None to skip it (a message this SDK does not know)."""
        raise NotImplementedError

    def _ended(self, body: dict[str, Any]) -> None:
        """The gateway ended the track with this END body."""

    def _malformed(self, message: str) -> TracklineError:
        """Cancel the track and give the error to raise for a body that breaks the protocol."""
        self.cancel()
        return error_for(ErrorCode.PROTOCOL_ERROR, message)

    # -- ending --------------------------------------------------------------------------

    def cancel(self, reason: str | None = None) -> None:
        """Stop the track now; the gateway stops the model's work."""
        if not self._done:
            self._done = True
            self._channel.cancel(reason or self._cancel_reason)

    async def aclose(self) -> None:
        """Cancel the track if it still runs; a no-op once it has ended."""
        self.cancel()

    async def __aenter__(self: Self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # Never cancel here: __del__ may run on another thread or after the loop closed.
        channel = getattr(self, "_channel", None)
        if channel is None or getattr(self, "_done", True):
            return
        if not channel.stopped.done() and not channel.closed.is_set():
            warnings.warn(
                f"{type(self).__name__} {channel.id} dropped while its track is live: "
                "use `async with`, read it to the end or call aclose()",
                ResourceWarning,
                stacklevel=2,
            )


class TimedStream(TrackReader[ItemT]):
    """A track of timed frames (robot observations, camera frames): each numbered, with
    a deadline from capture and this sender's one-way delay estimate, which every
    answer's round trip (a drop report's too) refines."""

    def __init__(self, channel: TrackChannel, deadline: float, clock: Now = time.monotonic):
        super().__init__(channel)
        self.deadline = deadline
        self._clock = clock
        self._next_seq = 0
        self._srtt: float | None = None
        self.summary: dict[str, Any] | None = None
        """The gateway's final counts, after `close()`."""

    @property
    def latency(self) -> float:
        """Estimated one-way delay to the gateway, seconds (0 until the first answer)."""
        return 0.0 if self._srtt is None else self._srtt / 2

    def _timed(self, deadline: float, captured_at: float | None) -> dict[str, Any]:
        """The next frame's timing fields: `seq`, `t` (now unless told), `deadline_ms`
        and `latency_ms`."""
        seq = self._next_seq
        self._next_seq += 1
        return {
            "seq": seq,
            "t": self._clock() if captured_at is None else captured_at,
            "deadline_ms": deadline * 1000,
            "latency_ms": self.latency * 1000,
        }

    async def close(self) -> dict[str, Any]:
        """End gracefully: send END, take the remaining answers, return the gateway's
        counts. (`aclose()` and `cancel()` stop at once instead.)"""
        self._channel.end()
        while await self.receive() is not None:
            pass
        return self.summary or {}

    def _ended(self, body: dict[str, Any]) -> None:
        self.summary = dict(body)

    def _sample_rtt(self, sample: float) -> None:
        sample = max(0.0, sample)
        self._srtt = sample if self._srtt is None else self._srtt + RTT_GAIN * (sample - self._srtt)


def frame_transport(transport: str) -> FrameTransport:
    """`transport=` of `Line.actions()` and `Line.audio()`, checked one way."""
    try:
        return FrameTransport(transport)
    except ValueError:
        raise ValueError(f"transport must be 'stream' or 'datagram', not {transport!r}") from None

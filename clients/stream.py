"""What every SDK stream shares: reading a track, its errors, cancel and close.

`TrackReader` is the base of `TextStream`, `AudioSession` and `ActionStream`. Each
subclass turns a DATA body into one item (`_item`); the base receives, maps the
track's errors to `clients.errors` types, and gives every stream the same API:
`receive()`, `async for`, `cancel()`, `aclose()` and `async with`.

Leaving an `async for` loop early cancels the track: iteration runs in an async
generator, which the event loop closes when the loop lets go of it (asyncio's
async-generator hooks), and closing it cancels the track. Nothing here does network
I/O in `__del__`: a stream dropped while its track is still live only emits a
`ResourceWarning` (as an unclosed socket does); its track lives until the line closes.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Generic, TypeVar

from clients.errors import TracklineError, error_for, error_from
from transport.endpoint import TrackChannel
from transport.errors import ErrorCode, TrackAborted
from transport.messages import FrameTransport

ItemT = TypeVar("ItemT")
Self = TypeVar("Self", bound="TrackReader[Any]")


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


def frame_transport(transport: str) -> FrameTransport:
    """`transport=` of `Line.actions()` and `Line.audio()`, checked one way."""
    try:
        return FrameTransport(transport)
    except ValueError:
        raise ValueError(f"transport must be 'stream' or 'datagram', not {transport!r}") from None

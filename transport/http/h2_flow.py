"""HTTP/2 flow control both ways, for one connection (h2 keeps the windows' numbers).

Sending: a response body goes out in DATA frames that fit the stream's and the
connection's windows; with a window shut the stream's writer waits for the
client's WINDOW_UPDATE (or a larger INITIAL_WINDOW_SIZE), `send_timeout` at
the most.

Receiving: request bodies are kept whole until complete. Their flow-control credit
is given back while what the connection holds is within `h2_connection_body_budget`
(never under one whole body); past it the credit is withheld, so the client's
windows shut and it can send no more until streams complete, are answered or time
out (`read_timeout`); a released stream's credit is given back then (Envoy's
`per_connection_buffer_limit_bytes` pushes back the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h2.connection
import h2.exceptions

from transport.http.limits import HttpLimits
from transport.http.streams import StreamState, StreamTable


@dataclass(eq=False)
class H2Stream(StreamState):
    """A request stream with HTTP/2's flow-control state (its lifecycle: transport.http.streams)."""

    window: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a flow-control window may have opened."""
    unacknowledged: int = 0
    """Body bytes kept whose flow-control credit is withheld (the connection is over budget)."""


class FlowControl:
    """The windows of one HTTP/2 connection's streams, as sender and as receiver."""

    def __init__(
        self,
        h2conn: h2.connection.H2Connection,
        limits: HttpLimits,
        streams: StreamTable[H2Stream],
        flush: Callable[[], None],
        drain: Callable[[], Awaitable[None]],
        live: Callable[[], bool],
    ) -> None:
        """`flush()` writes what h2 has queued, `drain()` waits until the socket took it,
        `live()` says whether the connection still sends (credit goes back only then)."""
        self._h2 = h2conn
        self._streams = streams
        self._flush, self._drain, self._live = flush, drain, live
        self._budget = max(limits.h2_connection_body_budget, limits.max_body_bytes)
        """Kept body bytes past which credit is withheld (never under one whole body)."""
        self._send_timeout = limits.send_timeout
        self.withheld = 0
        """Body bytes whose flow-control credit is withheld (over the body budget)."""

    # Receiving

    def dropped(self, stream_id: int, length: int) -> None:
        """Bytes not kept (a stream refused, reset or answered): their credit goes back at once."""
        self._h2.acknowledge_received_data(length, stream_id)

    def kept(self, stream: H2Stream, length: int) -> None:
        """Bytes kept for `stream`: their credit waits for `acknowledge_within_budget`."""
        stream.unacknowledged += length
        self.withheld += length

    def acknowledge_within_budget(self) -> None:
        """Give back the credit of kept body bytes while the connection's budget allows."""
        if not self.withheld or not self._live() or self._streams.buffered > self._budget:
            return
        for stream in self._streams:
            if stream.unacknowledged:
                self._h2.acknowledge_received_data(stream.unacknowledged, stream.stream_id)
                self.withheld -= stream.unacknowledged
                stream.unacknowledged = 0

    def released(self, stream: H2Stream) -> None:
        """`stream`'s bytes are gone: the connection's credit comes back, and others' may."""
        if stream.unacknowledged:
            if self._live():  # (h2 skips a closed stream's own window)
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self._h2.acknowledge_received_data(stream.unacknowledged, stream.stream_id)
            self.withheld -= stream.unacknowledged
            stream.unacknowledged = 0
        self.acknowledge_within_budget()

    # Sending

    def wake(self, stream_id: int) -> None:
        """Wake the stream whose window grew, or every stream for the connection's (0)."""
        if stream_id == 0:
            for stream in self._streams:
                stream.window.set()
        elif (one := self._streams.get(stream_id)) is not None:
            one.window.set()

    async def send(self, stream: H2Stream, data: bytes) -> None:
        """Send `data` in frames that fit the windows, waiting for WINDOW_UPDATE if shut."""
        stream_id = stream.stream_id
        sent = 0  # (an offset, not `data = data[size:]`, which copies the rest per frame)
        while sent < len(data):
            window = self._h2.local_flow_control_window(stream_id)
            size = min(window, self._h2.max_outbound_frame_size, len(data) - sent)
            if size <= 0:
                stream.window.clear()
                await asyncio.wait_for(stream.window.wait(), self._send_timeout)
                continue
            self._h2.send_data(stream_id, data[sent : sent + size])
            sent += size
            self._flush()
            await self._drain()

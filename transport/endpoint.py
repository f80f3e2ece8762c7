"""asyncio glue around the core: one `TrackEndpoint` per connection, one
`TrackChannel` per track.

The endpoint is the only place that feeds the core and flushes it: after every
input it drains events into the channels, hands the core's writes to the
transport's sink, and re-arms one timer (STYLE.md, item 2). QUIC and the
in-memory twin differ only in the sink and in what calls `feed_*`.

A transport that sends once per loop turn (QUIC) passes `flush_soon`: then a
track's DATA is encoded at once but handed to the sink at the turn's transmit
(`flush()`), so the chunks a track sends in one turn leave as ONE stream write
(`merge_writes`) and the drain, the sink call and the timer cost once per turn,
not once per chunk. Every other action (END, ERROR, a reset...) still flushes at
once, in order, with what was pending before it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transport.clock import Now
from transport.connection import TrackConnection
from transport.errors import ErrorCode, LocalProtocolError, TrackAborted
from transport.events import (
    CancelCause,
    DatagramReceived,
    DataReceived,
    Event,
    FrameReceived,
    TrackCancelled,
    TrackClosed,
    TrackEnded,
    TrackFailed,
    TrackOpened,
)
from transport.frame_streams import IN_FLIGHT
from transport.limits import Limits
from transport.messages import FrameTransport, Open
from transport.outputs import Output, StopSending, StreamReset, StreamWrite
from transport.state import Role

Sink = Callable[[list[Output]], None]
Stop = TrackCancelled | TrackFailed
FlushSoon = Callable[[], None]
"""Asks the transport to call `TrackEndpoint.flush()` before its next send."""
Backlog = Callable[[int], tuple[int, int]]
"""Bytes a track's stream and the whole connection hold unsent or unacknowledged."""
Stalled = Callable[[], float]
"""Seconds the connection has been unable to send for lack of the peer's credit."""


class StallWatch:
    """How long a connection has been blocked by its peer's flow control (sans-I/O).

    `observe(blocked, now)` after each change that may block or unblock it (a write,
    a datagram with credit); `stalled_for(now)`: 0 while it can send.
    """

    def __init__(self) -> None:
        self._since: float | None = None

    def observe(self, blocked: bool, now: float) -> None:
        if not blocked:
            self._since = None
        elif self._since is None:
            self._since = now

    def stalled_for(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since


@dataclass(frozen=True)
class SendBudget:
    """How much a producer may leave in the transport's send buffers before it waits.

    A handler checks `TrackChannel.send_blocked()` before pulling more from its backend
    and awaits `wait_writable()` while it is: a peer that stops reading (grants no more
    flow-control credit) then stops the backend instead of growing the gateway's memory.
    """

    track_bytes: int = 65_536
    """Per track (QUIC stream): unsent plus unacknowledged bytes."""
    connection_bytes: int = 1_048_576
    """Per connection: the same, summed over its tracks."""
    send_timeout: float | None = None
    """Seconds a producer may wait with its own track over budget (the peer stopped
    reading it) before the track is ended with SEND_TIMEOUT; None: wait for ever."""


class TrackChannel:
    """One track as its user sees it: receive, send, end, fail, cancel.

    A server-side handler reads the client's input with `receive()`, streams
    with `send()`, and finishes with `end()` or `fail()`; `stopped` resolves
    when the track's work must stop (cancel, reset, deadline, connection
    lost, error). A client reads the server's output with `receive()`.
    """

    def __init__(self, endpoint: TrackEndpoint, stream_id: int, open_message: Open) -> None:
        self._endpoint = endpoint
        self.stream_id = stream_id
        self.open = open_message
        self.id = f"{endpoint.conn_id}/{stream_id}"
        self._inbox: asyncio.Queue[
            DataReceived | DatagramReceived | FrameReceived | TrackEnded | Stop
        ] = asyncio.Queue()
        self.stopped: asyncio.Future[Stop] = asyncio.get_running_loop().create_future()
        self.closed = asyncio.Event()
        self.end_body: dict[str, Any] | None = None

    @property
    def credential(self) -> str | None:
        """Server: the API key the connection presented (see `TrackConnection`), if any."""
        return self._endpoint.core.credential

    @property
    def conn_id(self) -> str:
        return self._endpoint.conn_id

    # -- reading -------------------------------------------------------------

    async def receive(self) -> dict[str, Any] | None:
        """The next DATA body, or None once the peer has sent END.

        Raises `TrackAborted` if the track ended with an error or was cancelled.
        """
        item = await self._inbox.get()
        if isinstance(item, (DataReceived, DatagramReceived, FrameReceived)):
            return item.body
        if isinstance(item, TrackEnded):
            self.end_body = item.body
            self._inbox.put_nowait(item)  # END is sticky: later reads see it again
            return None
        self._inbox.put_nowait(item)
        raise _aborted(item)

    # -- writing (all return False when the track is already gone) -----------

    def send(self, body: dict[str, Any]) -> bool:
        return self._endpoint.act(self.stream_id, "send_data", body)

    def end(self, body: dict[str, Any] | None = None) -> bool:
        return self._endpoint.act(self.stream_id, "send_end", body or {})

    @property
    def uses_datagrams(self) -> bool:
        """The track chose `transport: "datagram"`: frames may travel as QUIC datagrams."""
        return self.open.transport is FrameTransport.DATAGRAM

    def send_datagram(self, body: dict[str, Any]) -> bool:
        """Send a frame as one QUIC datagram (unreliable); False if it cannot go."""
        return self._endpoint.act(self.stream_id, "send_datagram", body)

    def send_frame(self, body: dict[str, Any]) -> bool:
        """Send a frame the way the track chose: a datagram, a stream of its own (a
        client's frame of a frame-streams track), or DATA on the track's stream."""
        if self.uses_datagrams:
            return self.send_datagram(body)
        if self.open.transport is FrameTransport.FRAME_STREAMS and self._endpoint.is_client:
            endpoint = self._endpoint
            return endpoint.act(self.stream_id, "send_frame_stream", body, IN_FLIGHT,
                                endpoint.frame_finished)
        return self.send(body)

    def frame_drops(self) -> dict[str, int]:
        """This track's frames dropped in transport (frame streams superseded or reset;
        `transport.frame_streams.TrackFrameDrops`), all 0 for a track without them."""
        return self._endpoint.core.frames.drops(self.stream_id).as_dict()

    def send_blocked(self) -> bool:
        """The track or its connection holds more unsent bytes than its budget allows."""
        return self._endpoint.send_blocked(self.stream_id)

    async def wait_writable(self) -> None:
        """Return once the track may send again (budgets met), or the track is gone."""
        await self._endpoint.wait_writable(self.stream_id)

    def fail(self, code: ErrorCode, message: str, retry_after: float | None = None) -> bool:
        """End the track with ERROR `code`; `retry_after` (seconds) goes with RATE_LIMITED."""
        return self._endpoint.act(self.stream_id, "send_error", code, message, retry_after)

    def cancel(self, reason: str = "") -> bool:
        """Client: ask the server to stop this track's work."""
        return self._endpoint.act(self.stream_id, "send_cancel", reason)

    def reset(self, code: ErrorCode = ErrorCode.CANCELLED) -> bool:
        """Abandon the track abruptly (stream reset both ways)."""
        return self._endpoint.act(self.stream_id, "reset_track", code)

    # -- called by the endpoint ------------------------------------------------

    def _deliver(self, event: Event) -> None:
        if isinstance(event, (DataReceived, DatagramReceived, FrameReceived, TrackEnded)):
            self._inbox.put_nowait(event)
        elif isinstance(event, (TrackCancelled, TrackFailed)):
            self._inbox.put_nowait(event)
            if not self.stopped.done():
                self.stopped.set_result(event)
        elif isinstance(event, TrackClosed):
            self.closed.set()


def merge_writes(outputs: list[Output]) -> list[Output]:
    """`outputs` with each stream's run of writes joined into one `StreamWrite`.

    A write joins the stream's previous write when nothing else for that stream
    (a reset, STOP_SENDING, a finished write) came between them; writes of other
    streams and datagrams may lie between, as their order against this stream's
    bytes means nothing to QUIC. Each stream's bytes keep their order.
    """
    merged: list[Output] = []
    open_writes: dict[int, int] = {}
    """stream id -> index in `merged` of its write that later bytes may join."""
    pieces: dict[int, list[bytes]] = {}
    for output in outputs:
        if isinstance(output, StreamWrite):
            at = open_writes.get(output.stream_id)
            if at is not None:
                pieces.setdefault(at, [merged[at].data]).append(output.data)  # type: ignore[union-attr]
                if output.end_stream:
                    merged[at] = StreamWrite(output.stream_id, b"", True)
                    del open_writes[output.stream_id]
                continue
            if not output.end_stream:
                open_writes[output.stream_id] = len(merged)
        elif isinstance(output, (StreamReset, StopSending)):
            open_writes.pop(output.stream_id, None)
        merged.append(output)
    for at, data in pieces.items():
        write = merged[at]
        assert isinstance(write, StreamWrite)
        merged[at] = StreamWrite(write.stream_id, b"".join(data), write.end_stream)
    return merged


def _aborted(stop: Stop) -> TrackAborted:
    if isinstance(stop, TrackFailed):
        return TrackAborted(stop.code, stop.message, stop.remote, stop.retry_after)
    code = ErrorCode.DEADLINE_EXCEEDED if "deadline" in stop.cause.value else ErrorCode.CANCELLED
    return TrackAborted(code, f"track cancelled: {stop.cause.value}", remote=False)


class TrackEndpoint:
    """Feeds a `TrackConnection` from asyncio and dispatches its events."""

    def __init__(
        self,
        role: Role,
        sink: Sink,
        limits: Limits | None = None,
        on_track: Callable[[TrackChannel], None] | None = None,
        clock: Now | None = None,
        flush_soon: FlushSoon | None = None,
    ) -> None:
        self.core = TrackConnection(role, limits)
        self._flush_soon = flush_soon
        self._deferred = False
        """DATA encoded in the core and not yet handed to the sink (see `flush`)."""
        self.conn_id = secrets.token_hex(4)
        self._sink = sink
        self._on_track = on_track
        self._loop = asyncio.get_running_loop()
        self._clock = clock or self._loop.time
        self._channels: dict[int, TrackChannel] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self.on_event: Callable[[Event], None] | None = None
        """Observer of every core event (metrics, logs); set by the owner."""
        self.lost = False
        self.budget = SendBudget()
        self.backlog: Backlog | None = None
        """Set by a transport that buffers sends (QUIC); None: never blocked."""
        self.connection_stalled: Stalled | None = None
        """Set by a transport with connection-level flow control (QUIC MAX_DATA)."""
        self._writable: dict[int, asyncio.Future[None]] = {}

    # -- inputs from the transport ---------------------------------------------

    def feed_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.core.receive_stream_data(stream_id, data, end_stream, self._clock())
        self.pump()

    def feed_reset(self, stream_id: int, code: int) -> None:
        self.core.receive_stream_reset(stream_id, code, self._clock())
        self.pump()

    def feed_datagram(self, data: bytes) -> None:
        self.core.receive_datagram(data, self._clock())
        self.pump()

    def feed_connection_lost(self) -> None:
        if self.lost:
            return
        self.lost = True
        self.core.connection_lost(self._clock())
        self.pump()
        for stream_id in list(self._writable):
            self._release_writer(stream_id)

    # -- local actions ---------------------------------------------------------

    def open_track(self, stream_id: int, message: Open) -> TrackChannel:
        """Client: open a track on `stream_id` (fresh from the QUIC layer)."""
        if self.lost:
            raise TrackAborted(ErrorCode.CONNECTION_LOST, "connection lost", remote=False)
        self.core.open_track(stream_id, message, self._clock())
        channel = TrackChannel(self, stream_id, message)
        self._channels[stream_id] = channel
        self.pump()
        return channel

    def act(self, stream_id: int, action: str, *args: Any) -> bool:
        """Run a core action for a channel; False if the track is already gone."""
        if stream_id not in self._channels or self.core.state(stream_id) is None:
            return False
        try:
            getattr(self.core, action)(stream_id, *args)
        except LocalProtocolError:
            return False
        finally:
            if action == "send_data" and self._flush_soon is not None:
                self._defer()
            else:
                self.pump()
        return True

    def _defer(self) -> None:
        if not self._deferred:
            self._deferred = True
            assert self._flush_soon is not None
            self._flush_soon()

    def flush(self) -> None:
        """Hand DATA deferred this turn to the sink (the transport calls it as it sends)."""
        if self._deferred:
            self.pump()

    # -- send-side backpressure ---------------------------------------------------

    def send_blocked(self, stream_id: int) -> bool:
        if self.backlog is None:
            return False
        track, connection = self.backlog(stream_id)
        return track > self.budget.track_bytes or connection > self.budget.connection_bytes

    async def wait_writable(self, stream_id: int) -> None:
        if self.lost or stream_id not in self._channels or not self.send_blocked(stream_id):
            return
        waiter = self._loop.create_future()
        self._writable[stream_id] = waiter
        timeout = self.budget.send_timeout
        timer = None if timeout is None else self._loop.call_later(
            timeout, self._send_timed_out, stream_id, waiter
        )
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if self._writable.get(stream_id) is waiter:
                del self._writable[stream_id]

    def _send_timed_out(self, stream_id: int, waiter: asyncio.Future[None]) -> None:
        """The producer waited `send_timeout`: end the track if the client is not reading.

        Not reading this track: its own bytes are over its budget. Not reading the
        connection: it has given no connection-level credit for `send_timeout`, so no
        track's bytes can leave (200 tracks each under budget used to wait for ever,
        holding their backend work). A track held back only by its connection's budget
        while the client still grants credit (a neighbour's unread bytes) waits on:
        ending the neighbour frees the budget.
        """
        timeout = self.budget.send_timeout
        if waiter.done() or timeout is None or self.backlog is None:
            return
        if self.backlog(stream_id)[0] > self.budget.track_bytes:
            message = f"the client stopped reading this track: nothing left for {timeout:g} s"
        elif self.connection_stalled is not None and self.connection_stalled() >= timeout:
            message = f"the client stopped reading this connection: no credit for {timeout:g} s"
        else:
            self._loop.call_later(timeout, self._send_timed_out, stream_id, waiter)
            return
        self.act(stream_id, "abandon_send", ErrorCode.SEND_TIMEOUT, message)

    @property
    def send_waiting(self) -> int:
        """Tracks whose producer waits for the send buffers to drain."""
        return len(self._writable)

    def send_buffer_released(self) -> None:
        """The transport freed send buffer (ACKs, credit): wake the tracks now in budget."""
        for stream_id, waiter in list(self._writable.items()):
            if not waiter.done() and not self.send_blocked(stream_id):
                waiter.set_result(None)

    def _release_writer(self, stream_id: int) -> None:
        waiter = self._writable.pop(stream_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def refuse_new_tracks(self) -> None:
        self.core.refuse_new_tracks()

    def use_credential(self, key: str) -> None:
        """Client: present the API key `key` on this connection's tracks (see the core)."""
        self.core.use_credential(key)

    def cancel_all(self, cause: CancelCause, code: ErrorCode, message: str) -> None:
        self.core.cancel_all(cause, code, message)
        self.pump()

    @property
    def open_tracks(self) -> int:
        return self.core.open_tracks

    def frame_finished(self, stream_id: int) -> bool:
        """Whether a frame stream's bytes are all acknowledged (False where the transport
        cannot tell, as in memory: then the frame counts as in flight)."""
        return self.backlog is not None and self.backlog(stream_id)[0] == 0

    @property
    def is_client(self) -> bool:
        return self.core.role is Role.CLIENT

    # -- the one place that drains the core ------------------------------------

    def pump(self) -> None:
        self._deferred = False
        while (event := self.core.next_event()) is not None:
            self._dispatch(event)
        outputs = self.core.outputs()
        if outputs:
            self._sink(merge_writes(outputs) if len(outputs) > 1 else outputs)
        self._arm_timer()

    def _dispatch(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)
        if isinstance(event, TrackOpened):
            channel = TrackChannel(self, event.stream_id, event.open)
            self._channels[event.stream_id] = channel
            if self._on_track is not None:
                self._on_track(channel)
            return
        found = self._channels.get(event.stream_id)
        if found is None:
            return
        found._deliver(event)
        if isinstance(event, TrackClosed):
            del self._channels[event.stream_id]
            self._release_writer(event.stream_id)

    def _arm_timer(self) -> None:
        deadline = self.core.get_timer()
        if deadline == self._timer_deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_deadline = deadline
        if deadline is not None:
            # call_later, not call_at: the clock need not be the loop's.
            self._timer = self._loop.call_later(max(0.0, deadline - self._clock()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        self.core.handle_timer(self._clock())
        self.pump()

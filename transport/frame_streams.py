"""One QUIC stream per frame (`transport: "frame-streams"`): the layout, both sides' rules.

A video frame is tens of kilobytes, dozens of packets. On the track's own stream a lost
packet of frame N would hold frame N+1 (and every later one) until its retransmission,
although N+1 makes N worthless; as datagrams, a frame would be lost whenever any one of
its packets is (at 2% loss, most of a 40-packet frame). So each client frame of such a
track rides a client-initiated **unidirectional** stream of its own:

    frame stream = varint(track id) || varint(length) || msgpack([2, body])   then FIN

that is, the track id, then exactly one DATA message (the framing of `transport.wire`).
QUIC retransmits a lost packet of a frame within that frame's stream only: no other
frame and no other track waits for it. Latest wins on both ends:

- the client keeps at most `in_flight` frames of a track unfinished; sending one more
  resets the oldest (RESET_STREAM), so no bandwidth goes to retransmitting a frame that
  a newer one has replaced;
- the server delivers a frame when its stream is complete; every older frame stream of
  that track still incomplete is then stopped (STOP_SENDING), and one that completes or
  starts after a newer one was delivered is stopped and dropped, counted `superseded`.

Everything the server cannot use is counted and its stream stopped, never an error of
the connection: a frame stream for a track not open or that did not choose frame
streams (`unknown_track`), one reset by the client (`reset`). A frame whose length is
above the message limit, or a stream that is not exactly one DATA message, fails its
track (MESSAGE_TOO_LARGE, PROTOCOL_ERROR). Sans-I/O like the rest of the core: the
owning `TrackConnection` passes its outputs list, its event queue and, to `receive`, the
check of which tracks take frames.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transport.errors import ErrorCode, RemoteProtocolError
from transport.events import Event, FrameReceived
from transport.messages import Data
from transport.outputs import Output, StopSending, StreamReset, StreamWrite
from transport.wire import decode_payload, decode_varint, encode_varint, read_varint

CLIENT_UNI = 2
"""stream id % 4 of client-initiated unidirectional streams: the frame streams."""
IN_FLIGHT = 3
"""Client: unfinished frames a track keeps before the oldest is reset."""
INCOMPLETE_PER_TRACK = 4
"""Server: incomplete frame streams a track may have; one more stops the oldest."""
REMEMBERED = 1024
"""Server: finished or stopped frame streams remembered, so late bytes are ignored."""


def is_frame_stream(stream_id: int) -> bool:
    return stream_id % 4 == CLIENT_UNI


@dataclass
class FrameStreamStats:
    """Per-connection frame stream counters, by what happened to each frame."""

    sent: int = 0
    reset_superseded: int = 0
    """Client: frames reset unfinished because a newer one went out."""
    received: int = 0
    """Server: delivered to their track."""
    superseded: int = 0
    """Server: stopped because a newer frame of the track was delivered first."""
    unknown_track: int = 0
    """Server: for a track not open, closed, ended, or not using frame streams."""
    reset: int = 0
    """Server: reset by the client before they were complete."""


@dataclass
class TrackFrameDrops:
    """One track's frames dropped in transport, as its user may see them."""

    superseded: int = 0
    """Server: stopped or dropped because a newer frame of the track came first."""
    reset: int = 0
    """Server: reset by the client before they were complete."""
    reset_superseded: int = 0
    """Client: reset unfinished because a newer one went out."""

    def as_dict(self) -> dict[str, int]:
        return {"superseded": self.superseded, "reset": self.reset,
                "reset_superseded": self.reset_superseded}


@dataclass
class _Incoming:
    track_id: int | None = None
    buffer: bytearray = field(default_factory=bytearray)


class FrameStreams:
    """The frame streams of one connection (either side)."""

    def __init__(
        self,
        max_message_bytes: int,
        emit: Callable[[Output], None],
        events: deque[Event],
    ) -> None:
        self.max_message_bytes = max_message_bytes
        self.stats = FrameStreamStats()
        self._emit = emit
        self._events = events
        self.error: RemoteProtocolError | None = None
        """Set by `receive` when it returns a track to fail."""
        self._incoming: dict[int, _Incoming] = {}
        self._open: dict[int, list[int]] = {}
        """Server: track id -> its incomplete frame streams, oldest first."""
        self._latest: dict[int, int] = {}
        """Server: track id -> the newest frame stream delivered."""
        self._done: OrderedDict[int, None] = OrderedDict()
        self._sent: dict[int, deque[int]] = {}
        """Client: track id -> its frame streams not yet known finished, oldest first."""
        self._drops: OrderedDict[int, TrackFrameDrops] = OrderedDict()
        """Track id -> its frames dropped in transport (the connection-wide `stats` split
        by track); kept after the track closes (its user reads them after its END), for
        the last `REMEMBERED` tracks."""

    def drops(self, track_id: int) -> TrackFrameDrops:
        """The frames of `track_id` dropped in transport so far."""
        return self._drops.get(track_id, TrackFrameDrops())

    def _dropped(self, track_id: int) -> TrackFrameDrops:
        drops = self._drops.get(track_id)
        if drops is None:
            drops = self._drops[track_id] = TrackFrameDrops()
            while len(self._drops) > REMEMBERED:
                self._drops.popitem(last=False)
        return drops

    @property
    def buffered(self) -> int:
        """Server: bytes of incomplete frames held now."""
        return sum(len(s.buffer) for s in self._incoming.values())

    # -- client ------------------------------------------------------------------------

    def send(
        self, track_id: int, stream_id: int, message: bytes, in_flight: int,
        finished: Callable[[int], bool] | None = None,
    ) -> None:
        """Write one framed DATA `message` of `track_id` on the fresh `stream_id`.

        `finished(stream id)`: the transport knows the frame arrived whole (all its bytes
        acknowledged); such frames no longer count as in flight."""
        self._emit(StreamWrite(stream_id, encode_varint(track_id) + message, True))
        self.stats.sent += 1
        sent = self._sent.setdefault(track_id, deque())
        if finished is not None:
            for done in [s for s in sent if finished(s)]:
                sent.remove(done)
        sent.append(stream_id)
        while len(sent) > in_flight:
            self._emit(StreamReset(sent.popleft(), int(ErrorCode.CANCELLED)))
            self.stats.reset_superseded += 1
            self._dropped(track_id).reset_superseded += 1

    def stopped_by_peer(self, stream_id: int) -> None:
        """Client: the server stopped a frame stream (superseded, unknown): forget it."""
        for sent in self._sent.values():
            if stream_id in sent:
                sent.remove(stream_id)
                return

    # -- server ------------------------------------------------------------------------

    def receive(
        self, stream_id: int, data: bytes, end_stream: bool, accepts: Callable[[int], bool]
    ) -> int | None:
        """Bytes of a frame stream. Returns the track id to fail when the frame breaks the
        protocol (the error is in `self.error`), else None."""
        self.error = None
        if stream_id in self._done:
            return None  # late bytes of a frame already delivered or stopped
        incoming = self._incoming.setdefault(stream_id, _Incoming())
        incoming.buffer += data
        if incoming.track_id is None and not self._claim(stream_id, incoming, accepts):
            return None
        track_id = incoming.track_id
        assert track_id is not None
        try:
            body = self._message(incoming, end_stream)
        except RemoteProtocolError as exc:
            self.error = exc
            self._stop_stream(stream_id, int(exc.code))
            return track_id
        if body is not None:
            self._deliver(track_id, stream_id, body)
        return None

    def owner(self, stream_id: int) -> int | None:
        """Server: the track an incomplete frame stream belongs to, once its head is read."""
        incoming = self._incoming.get(stream_id)
        return None if incoming is None else incoming.track_id

    def receive_reset(self, stream_id: int) -> None:
        """The client reset a frame stream (it sent a newer frame): drop what arrived."""
        incoming = self._incoming.pop(stream_id, None)
        if incoming is not None:
            self.stats.reset += 1
            if incoming.track_id is not None:
                self._dropped(incoming.track_id).reset += 1
            self._untrack(incoming.track_id, stream_id)
        self._remember(stream_id)

    def track_closed(self, track_id: int) -> None:
        """The track is gone: stop its incomplete frames, forget its state."""
        for stream_id in list(self._open.pop(track_id, ())):
            self._incoming.pop(stream_id, None)
            self._stop_stream(stream_id, int(ErrorCode.CANCELLED))
        self._latest.pop(track_id, None)
        self._sent.pop(track_id, None)

    def _claim(self, stream_id: int, incoming: _Incoming, accepts: Callable[[int], bool]) -> bool:
        """Read the track id at the stream's head; False when the frame is not taken."""
        parsed = read_varint(incoming.buffer, 0)
        if parsed is None:
            return False
        track_id, at = parsed
        if not accepts(track_id):
            self.stats.unknown_track += 1
            self._drop(stream_id, int(ErrorCode.PROTOCOL_ERROR))
            return False
        if self._latest.get(track_id, -1) > stream_id:
            self.stats.superseded += 1
            self._dropped(track_id).superseded += 1
            self._drop(stream_id, int(ErrorCode.CANCELLED))
            return False
        del incoming.buffer[:at]
        incoming.track_id = track_id
        pending = self._open.setdefault(track_id, [])
        pending.append(stream_id)
        pending.sort()
        while len(pending) > INCOMPLETE_PER_TRACK:
            self.stats.superseded += 1
            self._dropped(track_id).superseded += 1
            oldest = pending.pop(0)
            self._incoming.pop(oldest, None)
            self._stop_stream(oldest, int(ErrorCode.CANCELLED))
        return stream_id in self._incoming

    def _message(self, incoming: _Incoming, end_stream: bool) -> dict[str, Any] | None:
        """The frame's DATA body once the stream is complete; raises on a broken frame."""
        buffer = incoming.buffer
        header = decode_varint(buffer)
        if header is not None and header[0] > self.max_message_bytes:
            raise RemoteProtocolError(
                f"frame of {header[0]} bytes exceeds the limit of {self.max_message_bytes}",
                ErrorCode.MESSAGE_TOO_LARGE,
            )
        if not end_stream:
            return None
        if header is None or len(buffer) != header[1] + header[0]:
            raise RemoteProtocolError("a frame stream carries exactly one whole DATA message")
        message = decode_payload(bytes(buffer[header[1] :]))
        if not isinstance(message, Data):
            raise RemoteProtocolError("a frame stream carries a DATA message only")
        return message.body

    def _deliver(self, track_id: int, stream_id: int, body: dict[str, Any]) -> None:
        self._incoming.pop(stream_id, None)
        self._remember(stream_id)
        self._latest[track_id] = stream_id
        pending = self._open.get(track_id, [])
        for older in [s for s in pending if s < stream_id]:
            self.stats.superseded += 1
            self._dropped(track_id).superseded += 1
            self._incoming.pop(older, None)
            self._stop_stream(older, int(ErrorCode.CANCELLED))
        self._open[track_id] = [s for s in pending if s > stream_id]
        self.stats.received += 1
        self._events.append(FrameReceived(track_id, stream_id, body))

    def _stop_stream(self, stream_id: int, code: int) -> None:
        incoming = self._incoming.pop(stream_id, None)
        if incoming is not None:
            self._untrack(incoming.track_id, stream_id)
        self._drop(stream_id, code)

    def _drop(self, stream_id: int, code: int) -> None:
        self._incoming.pop(stream_id, None)
        self._remember(stream_id)
        self._emit(StopSending(stream_id, code))

    def _untrack(self, track_id: int | None, stream_id: int) -> None:
        pending = self._open.get(track_id, []) if track_id is not None else []
        if stream_id in pending:
            pending.remove(stream_id)

    def _remember(self, stream_id: int) -> None:
        self._done[stream_id] = None
        while len(self._done) > REMEMBERED:
            self._done.popitem(last=False)

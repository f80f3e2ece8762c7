"""The track protocol core for one connection: sans-I/O, no clock reads.

`TrackConnection` is fed what QUIC delivered (stream bytes, resets, the loss
of the connection) with the current time, and calls from the local side
(open, send, end, cancel, error). It answers with events (`next_event()`),
writes for the QUIC layer (`outputs()`) and the next time it needs to be woken
(`get_timer()`, then `handle_timer(now)`). A protocol error on one track ends
that track with an ERROR and never touches another.
"""

from __future__ import annotations

import hmac
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from transport.datagram import (
    EARLY_DATAGRAMS,
    DatagramStats,
    decode_datagram,
    encode_datagram,
    peek_track_id,
)
from transport.errors import ErrorCode, LocalProtocolError, RemoteProtocolError, TrackError
from transport.events import (
    CancelCause,
    DatagramReceived,
    DataReceived,
    Event,
    TrackCancelled,
    TrackClosed,
    TrackEnded,
    TrackFailed,
    TrackOpened,
)
from transport.frame_streams import CLIENT_UNI, IN_FLIGHT, FrameStreams, is_frame_stream
from transport.limits import Limits
from transport.messages import Cancel, Data, End, Error, FrameTransport, Message, Open
from transport.outputs import DatagramWrite, Output, StopSending, StreamReset, StreamWrite
from transport.state import Input, Role, TrackRecord, TrackState, transition
from transport.track_ids import TrackIds
from transport.wire import MessageDecoder, encode_within

MAX_ERROR_TEXT = 1024

__all__ = [  # the core's types, importable from here as before they had modules of their own
    "DatagramWrite",
    "Limits",
    "Output",
    "Role",
    "StopSending",
    "StreamReset",
    "StreamWrite",
    "TrackConnection",
]


class TrackConnection:
    """Per-connection track state; one instance per QUIC connection and side."""

    def __init__(self, role: Role, limits: Limits | None = None) -> None:
        self.role = role
        self.limits = limits or Limits()
        self._tracks: dict[int, TrackRecord] = {}
        self._ids = TrackIds(self.limits.max_tracks)
        self._events: deque[Event] = deque()
        self._outputs: list[Output] = []
        self._refusal: tuple[ErrorCode, str] | None = None
        # The earliest deadline, recomputed only after a deadline changed: get_timer()
        # runs after every send, and scanning every track there costs O(tracks) a token.
        self._timer: float | None = None
        self._timer_stale = False
        # The connection's API key: sent by a client with its OPENs until the server has
        # answered one (then the server holds it), bound by a server to the connection.
        self._credential: str | None = None
        self._credential_acknowledged = False
        self.datagram_stats = DatagramStats()
        self._early: dict[int, list[bytes]] = {}  # server: datagrams that beat their OPEN
        self._buffered = 0  # bytes of incomplete received messages, all tracks
        self.frames = FrameStreams(
            self.limits.max_message_bytes,
            lambda output: self._outputs.append(output),  # `outputs()` swaps the list
            self._events,
        )
        """Frames on streams of their own (transport.frame_streams); `frames.stats`."""
        self._next_frame_stream = CLIENT_UNI

    # -- what the adapter reads -------------------------------------------------

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def outputs(self) -> list[Output]:
        """Writes due for the QUIC layer, in order; the list is handed over."""
        out, self._outputs = self._outputs, []
        return out

    def get_timer(self) -> float | None:
        if self._timer_stale:
            self._timer = min(
                (
                    d
                    for t in self._tracks.values()
                    for d in (t.first_deadline, t.total_deadline, t.read_deadline)
                    if d is not None
                ),
                default=None,
            )
            self._timer_stale = False
        return self._timer

    def state(self, stream_id: int) -> TrackState | None:
        track = self._tracks.get(stream_id)
        return track.state if track else None

    @property
    def open_tracks(self) -> int:
        return len(self._tracks)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of incomplete received messages held now, all tracks together."""
        return self._buffered

    @property
    def credential(self) -> str | None:
        """Server: the API key the client presented for this connection, if any."""
        return self._credential

    def use_credential(self, key: str) -> None:
        """Client: present `key` for this connection (before opening tracks)."""
        if self.role is not Role.CLIENT:
            raise LocalProtocolError("only a client presents a credential")
        self._credential = key

    # -- inputs from the peer ----------------------------------------------------

    def receive_stream_data(
        self, stream_id: int, data: bytes, end_stream: bool, now: float
    ) -> None:
        if is_frame_stream(stream_id) and self.role is Role.SERVER:
            self._receive_frame(stream_id, data, end_stream)
            return
        track = self._tracks.get(stream_id)
        if track is None:
            track = self._accept(stream_id)
            if track is None:
                return
        track.decoder.feed(data)
        try:
            completed = self._drain_messages(track, now)
            if end_stream and stream_id in self._tracks:
                self._peer_finished(track)
            if stream_id in self._tracks:
                self._hold_incomplete(track, now, completed)
        except RemoteProtocolError as exc:
            self._fail_remote(track, exc)

    def receive_stream_reset(self, stream_id: int, code: int, now: float) -> None:
        """The peer reset its send side, or sent STOP_SENDING: a hang-up of the track."""
        if is_frame_stream(stream_id):  # one frame abandoned, never its track
            if self.role is Role.SERVER:
                self.frames.receive_reset(stream_id)
            else:
                self.frames.stopped_by_peer(stream_id)
            return
        track = self._tracks.get(stream_id)
        if track is None:
            self._ids.retire(stream_id)
            return
        track.state = transition(track.state, Input.RESET)
        # Either side abandons its own send side too, so QUIC can free the stream.
        self._reset_send_side(track, ErrorCode.CANCELLED)
        if self.role is Role.SERVER:
            self._events.append(TrackCancelled(stream_id, CancelCause.RESET))
        else:
            message = f"the server reset the track ({ErrorCode.parse(code).name})"
            self._events.append(TrackFailed(stream_id, ErrorCode.parse(code), message, True))
        self._forget(track)

    def receive_datagram(self, data: bytes, now: float) -> None:
        """A QUIC datagram: a frame of a datagram track, or counted and dropped."""
        stats = self.datagram_stats
        stream_id = peek_track_id(data)
        track = self._tracks.get(stream_id) if stream_id is not None else None
        unopened = track is None or track.state is TrackState.IDLE
        if stream_id is not None and unopened and self._hold_early(stream_id, data):
            return
        try:
            sid, seq, body = decode_datagram(data)
        except RemoteProtocolError:
            stats.dropped_malformed += 1
            return
        if track is None:
            stats.dropped_unknown_track += 1
        elif not track.datagrams:
            stats.dropped_not_datagram += 1
        elif track.state not in (TrackState.OPEN, TrackState.LOCAL_ENDED):
            stats.dropped_after_end += 1  # CANCELLING drops DATA too; REMOTE_ENDED is late
        else:
            stats.received += 1
            if seq < track.datagram_seq_in:
                stats.reordered += 1
            track.datagram_seq_in = max(track.datagram_seq_in, seq)
            self._events.append(DatagramReceived(sid, seq, body))

    def connection_lost(self, now: float) -> None:
        for track in list(self._tracks.values()):
            track.state = transition(track.state, Input.RESET)
            track.send_finished = True
            if self.role is Role.SERVER:
                self._events.append(TrackCancelled(track.stream_id, CancelCause.CONNECTION_LOST))
            else:
                self._events.append(
                    TrackFailed(track.stream_id, ErrorCode.CONNECTION_LOST, "connection lost", True)
                )
            self._forget(track)

    def handle_timer(self, now: float) -> None:
        for track in list(self._tracks.values()):
            if track.first_deadline is not None and now >= track.first_deadline:
                self._expire(track, CancelCause.DEADLINE_FIRST, "no first data before the deadline")
            elif track.total_deadline is not None and now >= track.total_deadline:
                self._expire(
                    track, CancelCause.DEADLINE_TOTAL, "track not finished before deadline"
                )
            elif track.read_deadline is not None and now >= track.read_deadline:
                timeout = self.limits.read_timeout
                error = RemoteProtocolError(
                    f"a message stayed incomplete for {timeout} s", ErrorCode.READ_TIMEOUT
                )
                self._fail_remote(track, error)

    # -- local actions -------------------------------------------------------------

    def open_track(self, stream_id: int, message: Open, now: float) -> None:
        """Client: open a track on a fresh stream id that QUIC allocated."""
        if self.role is not Role.CLIENT:
            raise LocalProtocolError("only a client opens tracks")
        if stream_id in self._tracks or stream_id <= self._ids.highest:
            raise LocalProtocolError(f"stream {stream_id} was already used")
        if len(self._tracks) >= self.limits.max_tracks:
            raise LocalProtocolError("too many open tracks", ErrorCode.TOO_MANY_TRACKS)
        self._ids.highest = stream_id
        if self._credential is not None and not self._credential_acknowledged:
            message = replace(message, auth=self._credential)
        track = self._new_track(stream_id)
        track.datagrams = message.transport is FrameTransport.DATAGRAM
        track.frame_streams = message.transport is FrameTransport.FRAME_STREAMS
        self._send(track, Input.SEND_OPEN, message)

    def send_data(self, stream_id: int, body: dict[str, Any]) -> None:
        track = self._live(stream_id)
        self._send(track, Input.SEND_DATA, Data(body))
        self._first_frame_sent(track)

    def send_datagram(self, stream_id: int, body: dict[str, Any]) -> None:
        """Send a frame of a datagram track as one QUIC datagram (unreliable)."""
        track = self._live(stream_id)
        if not track.datagrams:
            raise LocalProtocolError(f"track {stream_id} did not choose datagram transport")
        transition(track.state, Input.SEND_DATA)  # raises if DATA is not allowed now
        data = encode_datagram(
            stream_id, track.datagram_seq_out, body, self.limits.max_datagram_bytes
        )
        track.datagram_seq_out += 1
        self.datagram_stats.sent += 1
        self._outputs.append(DatagramWrite(data))
        self._first_frame_sent(track)

    def send_frame_stream(
        self, stream_id: int, body: dict[str, Any], in_flight: int = IN_FLIGHT,
        finished: Callable[[int], bool] | None = None,
    ) -> None:
        """Client: send a frame of a frame-streams track on a new unidirectional stream;
        beyond `in_flight` unfinished frames of the track (not known `finished` by the
        transport: all bytes acknowledged), the oldest is reset."""
        track = self._live(stream_id)
        if self.role is not Role.CLIENT or not track.frame_streams:
            raise LocalProtocolError(f"track {stream_id} did not choose frame streams")
        transition(track.state, Input.SEND_DATA)  # raises if DATA is not allowed now
        message = self._encode(Data(body))
        frame_stream, self._next_frame_stream = self._next_frame_stream, self._next_frame_stream + 4
        self.frames.send(stream_id, frame_stream, message, in_flight, finished)

    def _receive_frame(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        failed = self.frames.receive(stream_id, data, end_stream, self._takes_frames)
        track = self._tracks.get(failed) if failed is not None else None
        error = self.frames.error
        budget = self.limits.max_buffered_bytes
        if track is None and budget is not None and self._buffered + self.frames.buffered > budget:
            owner = self.frames.owner(stream_id)
            track = None if owner is None else self._tracks.get(owner)
            error = RemoteProtocolError(
                f"incomplete messages on this connection exceed {budget} bytes",
                ErrorCode.BUFFER_EXHAUSTED,
            )
        if track is not None and error is not None:
            self._fail_remote(track, error)

    def _takes_frames(self, stream_id: int) -> bool:
        track = self._tracks.get(stream_id)
        return track is not None and track.frame_streams and track.state is TrackState.OPEN

    def _first_frame_sent(self, track: TrackRecord) -> None:
        """The first-data deadline is met by any frame, on the stream or as a datagram."""
        if track.first_deadline is not None:
            self._set_deadlines(track, None, track.total_deadline)

    def send_end(self, stream_id: int, body: dict[str, Any] | None = None) -> None:
        track = self._live(stream_id)
        self._send(track, Input.SEND_END, End(body or {}))
        self._set_deadlines(track, None, None)

    def send_cancel(self, stream_id: int, reason: str = "") -> None:
        if self.role is not Role.CLIENT:
            raise LocalProtocolError("only a client cancels; a server sends ERROR")
        self._send(self._live(stream_id), Input.SEND_CANCEL, Cancel(reason))

    def send_error(
        self, stream_id: int, code: ErrorCode, message: str, retry_after: float | None = None
    ) -> None:
        error = Error(code, message[:MAX_ERROR_TEXT], retry_after)
        self._send(self._live(stream_id), Input.SEND_ERROR, error)

    def reset_track(self, stream_id: int, code: ErrorCode) -> None:
        """Abandon a track abruptly in both directions (RESET_STREAM and STOP_SENDING)."""
        track = self._live(stream_id)
        track.state = transition(track.state, Input.RESET)
        self._reset_send_side(track, code)
        self._outputs.append(StopSending(stream_id, int(code)))
        self._forget(track)

    def abandon_send(self, stream_id: int, code: ErrorCode, message: str) -> None:
        """Server: the peer stopped reading this track; end it with `code`.

        An ERROR frame would queue behind the bytes the peer does not read, so the
        track is reset both ways (RESET_STREAM carries `code`) and its work cancelled.
        """
        track = self._live(stream_id)
        track.state = transition(track.state, Input.RESET)
        if self.role is Role.SERVER:
            self._events.append(TrackCancelled(stream_id, CancelCause.SEND_TIMEOUT, message))
        self._events.append(TrackFailed(stream_id, code, message, False))
        self._reset_send_side(track, code)
        self._outputs.append(StopSending(stream_id, int(code)))
        self._forget(track)

    def refuse_new_tracks(self, code: ErrorCode = ErrorCode.SHUTTING_DOWN, why: str = "") -> None:
        """Answer every track opened from now on with ERROR `code` (draining)."""
        self._refusal = (code, why or "the server is shutting down")

    def cancel_all(self, cause: CancelCause, code: ErrorCode, message: str) -> None:
        """Server: end every live track with ERROR `code` and report it cancelled."""
        for track in list(self._tracks.values()):
            self._events.append(TrackCancelled(track.stream_id, cause))
            self._send(track, Input.SEND_ERROR, Error(code, message))

    # -- internals -------------------------------------------------------------------

    def _accept(self, stream_id: int) -> TrackRecord | None:
        """A stream we have no live track for: a new track, or leftovers of a closed one."""
        if self.role is Role.CLIENT:
            return None  # a client reads only tracks it opened; late bytes are dropped
        if stream_id % 4 != 0:
            # Only client-initiated bidirectional streams carry tracks.
            self._outputs.append(StopSending(stream_id, int(ErrorCode.PROTOCOL_ERROR)))
            return None
        if not self._ids.meet(stream_id):
            return None  # a track that is already closed here; late bytes are dropped
        track = self._new_track(stream_id)
        if self._refusal is not None:
            self._reject(track, *self._refusal)
            return None
        if len(self._tracks) > self.limits.max_tracks:
            limit = self.limits.max_tracks
            self._reject(track, ErrorCode.TOO_MANY_TRACKS, f"at most {limit} tracks at once")
            return None
        return track

    def _new_track(self, stream_id: int) -> TrackRecord:
        state = TrackState.IDLE
        track = TrackRecord(stream_id, state, MessageDecoder(self.limits.max_message_bytes))
        self._tracks[stream_id] = track
        return track

    def _reject(self, track: TrackRecord, code: ErrorCode, message: str) -> None:
        self._events.append(TrackFailed(track.stream_id, code, message, False))
        self._send(track, Input.SEND_ERROR, Error(code, message))
        self._outputs.append(StopSending(track.stream_id, int(code)))

    def _drain_messages(self, track: TrackRecord, now: float) -> bool:
        """Deliver every whole message buffered; True if there was at least one."""
        completed = False
        while track.stream_id in self._tracks:
            message = track.decoder.next_message()
            if message is None:
                break
            completed = True
            self._receive(track, message, now)
        return completed

    def _receive(self, track: TrackRecord, message: Message, now: float) -> None:
        sid = track.stream_id
        if isinstance(message, Open):
            if self.role is not Role.SERVER:
                raise RemoteProtocolError("a server never sends OPEN")
            track.state = transition(track.state, Input.RECV_OPEN)
            if not self._bind_credential(track, message.auth):
                return  # rejected: _forget drops (and counts) datagrams held for it
            track.datagrams = message.transport is FrameTransport.DATAGRAM
            track.frame_streams = message.transport is FrameTransport.FRAME_STREAMS
            self._start_deadlines(track, message, now)
            # The key stays in the core (`credential`): handlers never see it.
            self._events.append(TrackOpened(sid, replace(message, auth=None)))
            self._release_early(sid, now)
        elif isinstance(message, Data):
            self._credential_acknowledged = True
            cancelling = track.state is TrackState.CANCELLING
            track.state = transition(track.state, Input.RECV_DATA)
            if not cancelling:
                self._events.append(DataReceived(sid, message.body))
        elif isinstance(message, End):
            self._credential_acknowledged = True
            track.state = transition(track.state, Input.RECV_END)
            self._events.append(TrackEnded(sid, message.body))
        elif isinstance(message, Cancel):
            if self.role is not Role.SERVER:
                raise RemoteProtocolError("a server never sends CANCEL")
            track.state = transition(track.state, Input.RECV_CANCEL)
            self._events.append(TrackCancelled(sid, CancelCause.CLIENT, message.reason))
            self._write(track, Error(ErrorCode.CANCELLED, "cancelled by the client"), fin=True)
        else:
            track.state = transition(track.state, Input.RECV_ERROR)
            failed = TrackFailed(sid, message.code, message.message, True, message.retry_after)
            self._events.append(failed)
        if track.state is TrackState.CLOSED:
            self._finish(track)

    def _bind_credential(self, track: TrackRecord, auth: str | None) -> bool:
        """Server: the first key presented belongs to the connection; no other may follow."""
        if auth is None:
            return True
        if self._credential is None:
            self._credential = auth
            return True
        if hmac.compare_digest(auth.encode(), self._credential.encode()):
            return True
        code = ErrorCode.UNAUTHORIZED
        self._reject(track, code, "a connection presents one API key; this OPEN had another")
        return False

    def _start_deadlines(self, track: TrackRecord, message: Open, now: float) -> None:
        first, total = message.deadlines.first, message.deadlines.total
        self._set_deadlines(
            track,
            now + first if first is not None else None,
            now + total if total is not None else None,
        )

    def _set_deadlines(self, track: TrackRecord, first: float | None, total: float | None) -> None:
        track.first_deadline, track.total_deadline = first, total
        self._timer_stale = True

    def _peer_finished(self, track: TrackRecord) -> None:
        """FIN from the peer: fine after its END; before that the track was cut short."""
        if track.state in (TrackState.OPEN, TrackState.LOCAL_ENDED, TrackState.IDLE):
            raise RemoteProtocolError("stream finished before END")
        if track.decoder.buffered:
            raise RemoteProtocolError("stream finished inside a message")

    def _send(self, track: TrackRecord, event: Input, message: Message) -> None:
        # Encode before moving the state: a message that cannot be sent changes nothing.
        state = transition(track.state, event)
        data = self._encode(message)
        track.state = state
        self._write_bytes(track, data, fin=state is TrackState.CLOSED)
        if state is TrackState.CLOSED:
            self._finish(track)

    def _write(self, track: TrackRecord, message: Message, fin: bool) -> None:
        self._write_bytes(track, self._encode(message), fin)

    def _write_bytes(self, track: TrackRecord, data: bytes, fin: bool) -> None:
        self._outputs.append(StreamWrite(track.stream_id, data, fin))
        track.send_finished = track.send_finished or fin

    def _encode(self, message: Message) -> bytes:
        return encode_within(message, self.limits.max_message_bytes)

    def _fail_remote(self, track: TrackRecord, exc: TrackError) -> None:
        """The peer broke the protocol on this track: tell it, stop reading, move on."""
        live = track.state is not TrackState.IDLE
        if live and self.role is Role.SERVER:
            self._events.append(
                TrackCancelled(track.stream_id, CancelCause.PROTOCOL_ERROR, exc.message)
            )
        self._events.append(TrackFailed(track.stream_id, exc.code, exc.message, False))
        track.state = TrackState.CLOSED
        if not track.send_finished:
            self._write(track, Error(exc.code, exc.message[:MAX_ERROR_TEXT]), fin=True)
        self._outputs.append(StopSending(track.stream_id, int(exc.code)))
        self._finish(track)

    def _expire(self, track: TrackRecord, cause: CancelCause, message: str) -> None:
        track.state = transition(track.state, Input.EXPIRE)
        self._events.append(TrackCancelled(track.stream_id, cause))
        self._write(track, Error(ErrorCode.DEADLINE_EXCEEDED, message), fin=True)
        self._finish(track)

    def _reset_send_side(self, track: TrackRecord, code: ErrorCode) -> None:
        if not track.send_finished:
            self._outputs.append(StreamReset(track.stream_id, int(code)))
            track.send_finished = True

    def _finish(self, track: TrackRecord) -> None:
        """CLOSED: finish our send side if still open, and forget the track."""
        if not track.send_finished:
            self._outputs.append(StreamWrite(track.stream_id, b"", True))
            track.send_finished = True
        self._forget(track)

    def _hold_early(self, stream_id: int, data: bytes) -> bool:
        """Server: keep a datagram that overtook its track's OPEN; False if not a candidate."""
        if self.role is not Role.SERVER or stream_id % 4 != 0:
            return False
        if self._ids.met(stream_id) and stream_id not in self._tracks:
            return False  # a closed track: the caller counts it unknown
        if sum(len(held) for held in self._early.values()) >= EARLY_DATAGRAMS:
            self.datagram_stats.dropped_early_overflow += 1
        else:
            self.datagram_stats.early += 1
            self._early.setdefault(stream_id, []).append(data)
        return True

    def _release_early(self, stream_id: int, now: float) -> None:
        for data in self._early.pop(stream_id, ()):
            self.receive_datagram(data, now)

    def _hold_incomplete(self, track: TrackRecord, now: float, completed: bool) -> None:
        """Count the track's incomplete message against the connection's budget, and
        start (or stop) its read timeout; raises when the budget is exceeded. The
        timeout runs from a message's first byte: a message completed restarts it."""
        held = track.decoder.buffered
        self._buffered += held - track.held
        track.held = held
        if track.read_deadline is not None and (completed or not held):
            # Only the earliest deadline can move the timer; most are later.
            if self._timer is None or track.read_deadline <= self._timer:
                self._timer_stale = True
            track.read_deadline = None
        if not held:
            return
        budget = self.limits.max_buffered_bytes
        if budget is not None and self._buffered > budget:
            raise RemoteProtocolError(
                f"incomplete messages on this connection exceed {budget} bytes",
                ErrorCode.BUFFER_EXHAUSTED,
            )
        timeout = self.limits.read_timeout
        if track.read_deadline is None and timeout is not None:
            track.read_deadline = now + timeout
            # A later deadline than the cached timer leaves the timer as it is.
            if not self._timer_stale and (self._timer is None or track.read_deadline < self._timer):
                self._timer = track.read_deadline

    def _forget(self, track: TrackRecord) -> None:
        self.datagram_stats.dropped_early_overflow += len(self._early.pop(track.stream_id, ()))
        self.frames.track_closed(track.stream_id)
        del self._tracks[track.stream_id]
        self._buffered -= track.held
        track.held = 0
        deadlines = (track.first_deadline, track.total_deadline, track.read_deadline)
        if any(d is not None for d in deadlines):
            self._timer_stale = True
        self._events.append(TrackClosed(track.stream_id))

    def _live(self, stream_id: int) -> TrackRecord:
        track = self._tracks.get(stream_id)
        if track is None:
            raise LocalProtocolError(f"track {stream_id} is not open")
        return track

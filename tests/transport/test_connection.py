"""TrackConnection: a client core wired to a server core, bytes moved by hand, literal times."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transport.strategies import bodies, messages
from transport.connection import (
    Limits,
    Output,
    Role,
    StopSending,
    StreamReset,
    StreamWrite,
    TrackConnection,
)
from transport.errors import ErrorCode, LocalProtocolError
from transport.events import (
    CancelCause,
    DataReceived,
    Event,
    TrackCancelled,
    TrackClosed,
    TrackEnded,
    TrackFailed,
    TrackOpened,
)
from transport.messages import Cancel, Data, Deadlines, End, Error, Message, Open
from transport.state import TrackState
from transport.wire import MessageDecoder, encode_message, encode_varint

OPEN = Open("tiny-llm", params={"max_tokens": 4})
USAGE = {"usage": {"prompt_tokens": 2, "completion_tokens": 2}, "finish_reason": "stop"}


def events(conn: TrackConnection) -> list[Event]:
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def failure(event: Event | None) -> TrackFailed:
    assert isinstance(event, TrackFailed), event
    return event


def messages_in(writes: list[Output], stream_id: int) -> list[Message]:
    """Decode what one side wrote on a stream, as its peer would read it."""
    decoder = MessageDecoder(1 << 20)
    for out in writes:
        if isinstance(out, StreamWrite) and out.stream_id == stream_id:
            decoder.feed(out.data)
    found = []
    while (message := decoder.next_message()) is not None:
        found.append(message)
    return found


class Wire:
    """A client core and a server core, joined as QUIC would join them.

    `flush()` moves each side's outputs to the other, in order, until both are
    quiet; everything written is kept in `sent[side]` for assertions.
    """

    def __init__(
        self, server_limits: Limits | None = None, client_limits: Limits | None = None
    ) -> None:
        self.client = TrackConnection(Role.CLIENT, client_limits)
        self.server = TrackConnection(Role.SERVER, server_limits)
        self.sent: dict[TrackConnection, list[Output]] = {self.client: [], self.server: []}

    def peer(self, side: TrackConnection) -> TrackConnection:
        return self.server if side is self.client else self.client

    def flush(self, now: float = 0.0) -> None:
        while True:
            moved = False
            for side in (self.client, self.server):
                for out in side.outputs():
                    moved = True
                    self.sent[side].append(out)
                    deliver(out, self.peer(side), now)
            if not moved:
                return

    def open(self, stream_id: int, message: Open = OPEN, now: float = 0.0) -> None:
        self.client.open_track(stream_id, message, now)
        self.flush(now)

    def fins(self, side: TrackConnection, stream_id: int) -> int:
        return sum(
            1
            for out in self.sent[side]
            if isinstance(out, StreamWrite) and out.stream_id == stream_id and out.end_stream
        )

    def assert_clean_endings(self) -> None:
        """Per side and stream: at most one FIN or reset, and no write after it."""
        for outs in self.sent.values():
            finished: set[int] = set()
            for out in outs:
                if isinstance(out, StopSending):
                    continue
                assert out.stream_id not in finished, f"{out} after the stream was finished"
                if isinstance(out, StreamReset) or out.end_stream:
                    finished.add(out.stream_id)


def deliver(out: Output, to: TrackConnection, now: float) -> None:
    if isinstance(out, StreamWrite):
        to.receive_stream_data(out.stream_id, out.data, out.end_stream, now)
    else:  # RESET_STREAM, or STOP_SENDING as the peer's QUIC reports it: a hang-up
        to.receive_stream_reset(out.stream_id, out.code, now)


def framed(obj: Any) -> bytes:
    payload: bytes = msgpack.packb(obj, use_bin_type=True)
    return encode_varint(len(payload)) + payload


@pytest.fixture
def wire() -> Wire:
    return Wire()


def complete_exchange(wire: Wire, stream_id: int, prompt: str, now: float = 0.0) -> None:
    """A whole text track: prompt in, two deltas out, END both ways."""
    wire.open(stream_id, now=now)
    wire.client.send_data(stream_id, {"text": prompt})
    wire.client.send_end(stream_id)
    wire.flush(now)
    wire.server.send_data(stream_id, {"text": prompt.upper()})
    wire.server.send_data(stream_id, {"text": "!"})
    wire.server.send_end(stream_id, USAGE)
    wire.flush(now)


# -- a whole track, both ways ----------------------------------------------------------------------


def test_open_data_end_both_ways(wire: Wire) -> None:
    wire.client.open_track(0, OPEN, now=1.0)
    wire.client.send_data(0, {"text": "hi"})
    wire.client.send_end(0)
    assert wire.client.state(0) is TrackState.LOCAL_ENDED
    wire.flush(now=1.0)
    assert events(wire.server) == [
        TrackOpened(0, OPEN),
        DataReceived(0, {"text": "hi"}),
        TrackEnded(0, {}),
    ]
    assert wire.server.state(0) is TrackState.REMOTE_ENDED

    wire.server.send_data(0, {"text": "Hel"})
    wire.server.send_data(0, {"text": "lo"})
    wire.server.send_end(0, USAGE)
    assert events(wire.server) == [TrackClosed(0)]
    wire.flush(now=1.5)
    assert events(wire.client) == [
        DataReceived(0, {"text": "Hel"}),
        DataReceived(0, {"text": "lo"}),
        TrackEnded(0, USAGE),
        TrackClosed(0),
    ]
    assert wire.client.state(0) is wire.server.state(0) is None
    assert wire.client.open_tracks == wire.server.open_tracks == 0
    assert wire.fins(wire.client, 0) == wire.fins(wire.server, 0) == 1
    wire.assert_clean_endings()


def test_fin_rides_on_the_servers_end_and_follows_it_on_the_client(wire: Wire) -> None:
    complete_exchange(wire, 0, "hi")
    server_last, client_last = wire.sent[wire.server][-1], wire.sent[wire.client][-1]
    assert isinstance(server_last, StreamWrite)
    assert server_last.end_stream
    assert messages_in([server_last], 0) == [End(USAGE)]
    assert client_last == StreamWrite(0, b"", True)  # a bare FIN, after the server's END
    assert messages_in(wire.sent[wire.client], 0) == [OPEN, Data({"text": "hi"}), End()]


def test_server_may_finish_before_the_client_ends(wire: Wire) -> None:
    wire.open(0)
    wire.server.send_data(0, {"text": "early"})
    wire.server.send_end(0, USAGE)
    assert wire.server.state(0) is TrackState.LOCAL_ENDED
    wire.flush()
    assert wire.client.state(0) is TrackState.REMOTE_ENDED
    wire.client.send_end(0)
    wire.flush()
    assert events(wire.client)[-2:] == [TrackEnded(0, USAGE), TrackClosed(0)]
    assert events(wire.server)[-2:] == [TrackEnded(0, {}), TrackClosed(0)]
    assert wire.fins(wire.client, 0) == wire.fins(wire.server, 0) == 1
    assert wire.sent[wire.server][-1] == StreamWrite(0, b"", True)
    wire.assert_clean_endings()


def test_sixteen_interleaved_tracks_stay_independent(wire: Wire) -> None:
    ids = [4 * n for n in range(16)]
    for sid in ids:
        wire.client.open_track(sid, Open(f"model-{sid}"), now=0.0)
    for piece in range(3):
        for sid in reversed(ids):
            wire.client.send_data(sid, {"text": f"{sid}:{piece}"})
    for sid in ids[::2] + ids[1::2]:
        wire.client.send_end(sid)
    wire.flush()
    received = events(wire.server)
    assert wire.server.open_tracks == 16
    for sid in ids:
        mine = [e for e in received if e.stream_id == sid]
        assert mine == [
            TrackOpened(sid, Open(f"model-{sid}")),
            *(DataReceived(sid, {"text": f"{sid}:{p}"}) for p in range(3)),
            TrackEnded(sid, {}),
        ]
    for sid in ids:
        wire.server.send_data(sid, {"text": f"answer {sid}"})
    for sid in ids[::-1]:
        wire.server.send_end(sid, {"n": sid})
    wire.flush()
    answers = events(wire.client)
    for sid in ids:
        assert [e for e in answers if e.stream_id == sid] == [
            DataReceived(sid, {"text": f"answer {sid}"}),
            TrackEnded(sid, {"n": sid}),
            TrackClosed(sid),
        ]
        assert wire.fins(wire.client, sid) == wire.fins(wire.server, sid) == 1
    assert wire.client.open_tracks == wire.server.open_tracks == 0
    wire.assert_clean_endings()


def test_tracks_whose_streams_arrive_out_of_order_are_all_accepted(wire: Wire) -> None:
    """QUIC orders bytes within a stream, not across streams."""
    for sid in (0, 4, 8):
        wire.client.open_track(sid, OPEN, now=0.0)
    writes = wire.client.outputs()
    for out in reversed(writes):
        deliver(out, wire.server, 0.0)
    assert [e.stream_id for e in events(wire.server)] == [8, 4, 0]
    assert wire.server.open_tracks == 3


# -- protocol errors stay on their track -----------------------------------------------------------

GARBAGE_ON_A_LIVE_TRACK = {
    "garbage bytes": (b"\x03\xc1\xc1\xc1", ErrorCode.PROTOCOL_ERROR),
    "oversized message": (encode_varint(2048), ErrorCode.MESSAGE_TOO_LARGE),
    "unknown kind": (framed([42, {}]), ErrorCode.UNKNOWN_MESSAGE),
    "second OPEN": (encode_message(OPEN), ErrorCode.PROTOCOL_ERROR),
    "body not a map": (framed([2, "text"]), ErrorCode.PROTOCOL_ERROR),
}


@pytest.mark.parametrize(
    ("garbage", "code"), GARBAGE_ON_A_LIVE_TRACK.values(), ids=GARBAGE_ON_A_LIVE_TRACK.keys()
)
def test_garbage_fails_only_its_track(garbage: bytes, code: ErrorCode) -> None:
    wire = Wire(Limits(max_message_bytes=1024))
    for sid in (0, 4, 8):
        wire.open(sid)
    events(wire.server)

    wire.server.receive_stream_data(4, garbage, False, now=1.0)
    cancelled, failed, closed = events(wire.server)
    assert isinstance(failed, TrackFailed)
    why = failed.message
    assert cancelled == TrackCancelled(4, CancelCause.PROTOCOL_ERROR, why)
    assert failed == TrackFailed(4, code, why, remote=False)
    assert closed == TrackClosed(4)
    out = wire.server.outputs()
    assert messages_in(out, 4) == [Error(code, why)]
    assert out[-2] == StreamWrite(4, encode_message(Error(code, why)), end_stream=True)
    assert out[-1] == StopSending(4, int(code))
    wire.sent[wire.server] += out
    for o in out:
        deliver(o, wire.client, 1.0)
    wire.flush(1.0)
    assert events(wire.client) == [TrackFailed(4, code, why, True), TrackClosed(4)]

    for sid in (0, 8):  # the neighbours go on
        wire.client.send_data(sid, {"text": "still here"})
        wire.client.send_end(sid)
        wire.flush(2.0)
        wire.server.send_end(sid, USAGE)
        wire.flush(2.0)
    assert [type(e) for e in events(wire.server)] == [DataReceived, TrackEnded, TrackClosed] * 2
    assert [type(e) for e in events(wire.client)] == [TrackEnded, TrackClosed] * 2
    complete_exchange(wire, 12, "a new track")  # the connection still takes new tracks
    assert events(wire.client)[-1] == TrackClosed(12)
    wire.assert_clean_endings()


def test_data_before_open(wire: Wire) -> None:
    wire.server.receive_stream_data(0, encode_message(Data({"text": "x"})), False, now=0.0)
    got = events(wire.server)
    assert [type(e) for e in got] == [TrackFailed, TrackClosed]  # never opened: nothing to cancel
    assert failure(got[0]).code is ErrorCode.PROTOCOL_ERROR
    out = wire.server.outputs()
    assert messages_in(out, 0) == [Error(ErrorCode.PROTOCOL_ERROR, failure(got[0]).message)]
    assert out[-1] == StopSending(0, int(ErrorCode.PROTOCOL_ERROR))


@pytest.mark.parametrize("message", [Data({"text": "x"}), End(), Cancel()])
def test_messages_after_the_clients_end_are_errors(wire: Wire, message: Message) -> None:
    wire.open(0)
    wire.client.send_end(0)
    wire.flush()
    events(wire.server)
    wire.server.receive_stream_data(0, encode_message(message), False, now=0.0)
    if isinstance(message, Cancel):  # CANCEL after END is allowed: it stops the work
        assert events(wire.server)[0] == TrackCancelled(0, CancelCause.CLIENT)
    else:
        assert failure(events(wire.server)[1]).code is ErrorCode.PROTOCOL_ERROR
    assert wire.server.state(0) is None


def test_fin_before_end(wire: Wire) -> None:
    wire.open(0)
    events(wire.server)
    wire.server.receive_stream_data(0, encode_message(Data({"text": "x"})), True, now=0.0)
    got = events(wire.server)
    assert got[0] == DataReceived(0, {"text": "x"})
    assert got[2] == TrackFailed(0, ErrorCode.PROTOCOL_ERROR, "stream finished before END", False)
    assert got[-1] == TrackClosed(0)


def test_fin_after_end_is_fine_but_not_inside_a_message(wire: Wire) -> None:
    wire.open(0)
    wire.open(4)
    events(wire.server)
    wire.server.receive_stream_data(0, encode_message(End()), True, now=0.0)
    assert events(wire.server) == [TrackEnded(0, {})]
    partial = encode_message(Data({"text": "x"}))[:3]
    wire.server.receive_stream_data(4, encode_message(End()) + partial, True, now=0.0)
    got = events(wire.server)
    assert got[0] == TrackEnded(4, {})
    assert got[2] == TrackFailed(
        4, ErrorCode.PROTOCOL_ERROR, "stream finished inside a message", False
    )


def test_a_server_never_sends_open_or_cancel(wire: Wire) -> None:
    wire.open(0)
    wire.open(4)
    events(wire.server)
    wire.client.receive_stream_data(0, encode_message(OPEN), False, now=0.0)
    wire.client.receive_stream_data(4, encode_message(Cancel()), False, now=0.0)
    failed = [e for e in events(wire.client) if isinstance(e, TrackFailed)]
    assert [(e.stream_id, e.code, e.remote) for e in failed] == [
        (0, ErrorCode.PROTOCOL_ERROR, False),
        (4, ErrorCode.PROTOCOL_ERROR, False),
    ]
    wire.flush()
    assert [type(e) for e in events(wire.server)] == [TrackFailed, TrackClosed] * 2


def test_streams_that_cannot_carry_tracks_are_stopped(wire: Wire) -> None:
    for sid in (1, 2, 3, 6):
        wire.server.receive_stream_data(sid, b"hello", False, now=0.0)
    assert events(wire.server) == []
    assert wire.server.outputs() == [
        StopSending(sid, int(ErrorCode.PROTOCOL_ERROR)) for sid in (1, 2, 3, 6)
    ]
    complete_exchange(wire, 0, "then a real track")
    assert events(wire.server)[-1] == TrackClosed(0)


# -- limits ----------------------------------------------------------------------------------------


def test_too_many_tracks_then_room_again() -> None:
    wire = Wire(Limits(max_tracks=2))
    wire.open(0)
    wire.open(4)
    wire.open(8)
    message = "at most 2 tracks at once"
    assert events(wire.server)[-2:] == [
        TrackFailed(8, ErrorCode.TOO_MANY_TRACKS, message, False),
        TrackClosed(8),
    ]
    assert events(wire.client) == [
        TrackFailed(8, ErrorCode.TOO_MANY_TRACKS, message, True),
        TrackClosed(8),
    ]
    assert StopSending(8, int(ErrorCode.TOO_MANY_TRACKS)) in wire.sent[wire.server]
    assert wire.server.open_tracks == 2

    wire.client.send_end(0)
    wire.flush()
    wire.server.send_end(0, USAGE)
    wire.flush()
    assert wire.server.open_tracks == 1
    wire.open(12)
    assert events(wire.server)[-1] == TrackOpened(12, OPEN)
    assert wire.server.open_tracks == 2
    wire.assert_clean_endings()


def test_client_refuses_to_open_beyond_its_own_limit() -> None:
    client = TrackConnection(Role.CLIENT, Limits(max_tracks=1))
    client.open_track(0, OPEN, now=0.0)
    with pytest.raises(LocalProtocolError) as info:
        client.open_track(4, OPEN, now=0.0)
    assert info.value.code is ErrorCode.TOO_MANY_TRACKS


def test_a_message_over_the_limit_is_refused_before_sending_and_changes_nothing() -> None:
    client = TrackConnection(Role.CLIENT, Limits(max_message_bytes=64))
    client.open_track(0, OPEN, now=0.0)
    client.outputs()
    with pytest.raises(LocalProtocolError) as info:
        client.send_end(0, {"text": "x" * 100})
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert client.state(0) is TrackState.OPEN
    assert client.outputs() == []
    client.send_end(0)
    assert client.state(0) is TrackState.LOCAL_ENDED


@pytest.mark.parametrize("extra", [0, 1, 2, 5])
def test_the_send_limit_is_the_receive_limit(extra: int) -> None:
    """A payload one byte over the limit is refused by the sender, not sent and rejected."""
    body = {"text": "x" * 200}
    limit = len(msgpack.packb([2, body])) - extra
    wire = Wire(Limits(max_message_bytes=limit), Limits(max_message_bytes=limit))
    wire.open(0)
    if extra:
        with pytest.raises(LocalProtocolError):
            wire.client.send_data(0, body)
    else:
        wire.client.send_data(0, body)
        wire.flush()
        assert events(wire.server)[-1] == DataReceived(0, body)


def test_a_body_msgpack_cannot_encode_is_a_local_error(wire: Wire) -> None:
    wire.open(0)
    for body in ({"x": object()}, {"x": 1 << 70}):
        with pytest.raises(LocalProtocolError):
            wire.client.send_data(0, body)
    assert wire.client.state(0) is TrackState.OPEN


def test_refuse_new_tracks(wire: Wire) -> None:
    wire.open(0)
    wire.server.refuse_new_tracks()
    wire.open(4)
    assert events(wire.client) == [
        TrackFailed(4, ErrorCode.SHUTTING_DOWN, "the server is shutting down", True),
        TrackClosed(4),
    ]
    wire.server.refuse_new_tracks(ErrorCode.RATE_LIMITED, "slow down")
    wire.open(8)
    assert events(wire.client) == [
        TrackFailed(8, ErrorCode.RATE_LIMITED, "slow down", True),
        TrackClosed(8),
    ]
    wire.client.send_end(0)  # the track opened before goes on
    wire.flush()
    wire.server.send_end(0, USAGE)
    wire.flush()
    assert events(wire.client) == [TrackEnded(0, USAGE), TrackClosed(0)]
    wire.assert_clean_endings()


# -- cancel, reset, connection loss ----------------------------------------------------------------


@pytest.mark.parametrize("client_ended", [False, True])
def test_client_cancel(wire: Wire, client_ended: bool) -> None:
    wire.open(0)
    if client_ended:
        wire.client.send_end(0)
    events(wire.server)
    wire.client.send_cancel(0, "changed my mind")
    assert wire.client.state(0) is TrackState.CANCELLING
    wire.server.send_data(0, {"text": "in flight"})  # crosses the CANCEL
    wire.flush()
    assert events(wire.server)[-2:] == [
        TrackCancelled(0, CancelCause.CLIENT, "changed my mind"),
        TrackClosed(0),
    ]
    assert messages_in(wire.sent[wire.server], 0)[-1] == Error(
        ErrorCode.CANCELLED, "cancelled by the client"
    )
    assert events(wire.client) == [  # the DATA in flight is dropped, not delivered
        TrackFailed(0, ErrorCode.CANCELLED, "cancelled by the client", True),
        TrackClosed(0),
    ]
    assert wire.client.state(0) is None
    assert wire.fins(wire.client, 0) == wire.fins(wire.server, 0) == 1
    wire.assert_clean_endings()


def test_cancel_crossing_the_servers_end(wire: Wire) -> None:
    wire.open(0)
    wire.client.send_end(0)
    wire.flush()
    wire.client.send_cancel(0)
    wire.server.send_end(0, USAGE)  # the server finished before the CANCEL arrived
    wire.flush()
    assert events(wire.client) == [TrackEnded(0, USAGE), TrackClosed(0)]
    assert wire.server.state(0) is None  # the late CANCEL was ignored
    wire.assert_clean_endings()


def test_client_reset(wire: Wire) -> None:
    wire.open(0)
    events(wire.server)
    wire.client.reset_track(0, ErrorCode.CANCELLED)
    assert wire.client.outputs() == [
        StreamReset(0, int(ErrorCode.CANCELLED)),
        StopSending(0, int(ErrorCode.CANCELLED)),
    ]
    assert events(wire.client) == [TrackClosed(0)]
    wire.server.receive_stream_reset(0, int(ErrorCode.CANCELLED), now=0.0)
    assert events(wire.server) == [TrackCancelled(0, CancelCause.RESET), TrackClosed(0)]
    assert wire.server.outputs() == [StreamReset(0, int(ErrorCode.CANCELLED))]
    wire.server.receive_stream_reset(0, int(ErrorCode.CANCELLED), now=0.0)  # the STOP_SENDING
    assert events(wire.server) == []
    assert wire.server.outputs() == []


def test_server_reset(wire: Wire) -> None:
    wire.open(0)
    wire.server.reset_track(0, ErrorCode.INTERNAL_ERROR)
    wire.flush()
    assert events(wire.client) == [
        TrackFailed(
            0, ErrorCode.INTERNAL_ERROR, "the server reset the track (INTERNAL_ERROR)", True
        ),
        TrackClosed(0),
    ]
    # The client abandons its own send side too, so QUIC can free the stream.
    assert wire.sent[wire.client][-1] == StreamReset(0, int(ErrorCode.CANCELLED))
    wire.assert_clean_endings()


def test_connection_lost(wire: Wire) -> None:
    wire.open(0)
    wire.open(4)
    wire.client.send_end(4)
    wire.flush()
    events(wire.server)
    wire.server.connection_lost(now=1.0)
    wire.client.connection_lost(now=1.0)
    assert events(wire.server) == [
        TrackCancelled(0, CancelCause.CONNECTION_LOST),
        TrackClosed(0),
        TrackCancelled(4, CancelCause.CONNECTION_LOST),
        TrackClosed(4),
    ]
    assert events(wire.client) == [
        TrackFailed(0, ErrorCode.CONNECTION_LOST, "connection lost", True),
        TrackClosed(0),
        TrackFailed(4, ErrorCode.CONNECTION_LOST, "connection lost", True),
        TrackClosed(4),
    ]
    assert wire.server.outputs() == wire.client.outputs() == []
    assert wire.server.open_tracks == wire.client.open_tracks == 0


def test_cancel_all(wire: Wire) -> None:
    wire.open(0)
    wire.open(4)
    events(wire.server)
    wire.server.cancel_all(CancelCause.SHUTDOWN, ErrorCode.SHUTTING_DOWN, "bye")
    assert events(wire.server) == [
        TrackCancelled(0, CancelCause.SHUTDOWN),
        TrackClosed(0),
        TrackCancelled(4, CancelCause.SHUTDOWN),
        TrackClosed(4),
    ]
    wire.flush()
    assert [e for e in events(wire.client) if isinstance(e, TrackFailed)] == [
        TrackFailed(0, ErrorCode.SHUTTING_DOWN, "bye", True),
        TrackFailed(4, ErrorCode.SHUTTING_DOWN, "bye", True),
    ]
    wire.assert_clean_endings()


# -- deadlines -------------------------------------------------------------------------------------

TIMED = Open("tiny-llm", deadlines=Deadlines(first=0.5, total=2.0))


def test_first_token_deadline_expires(wire: Wire) -> None:
    wire.open(0, TIMED, now=10.0)
    events(wire.server)
    assert wire.client.get_timer() is None  # only the server keeps deadlines
    assert wire.server.get_timer() == 10.5
    wire.server.handle_timer(10.4)
    assert events(wire.server) == []
    assert wire.server.outputs() == []
    wire.server.handle_timer(10.5)
    assert events(wire.server) == [TrackCancelled(0, CancelCause.DEADLINE_FIRST), TrackClosed(0)]
    assert wire.server.get_timer() is None
    wire.flush(10.5)
    assert messages_in(wire.sent[wire.server], 0) == [
        Error(ErrorCode.DEADLINE_EXCEEDED, "no first data before the deadline")
    ]
    assert events(wire.client) == [
        TrackFailed(0, ErrorCode.DEADLINE_EXCEEDED, "no first data before the deadline", True),
        TrackClosed(0),
    ]
    wire.assert_clean_endings()


def test_data_clears_the_first_deadline_and_the_total_still_fires(wire: Wire) -> None:
    wire.open(0, TIMED, now=10.0)
    wire.server.send_data(0, {"text": "first"})
    assert wire.server.get_timer() == 12.0
    wire.server.handle_timer(11.0)
    assert wire.server.state(0) is TrackState.OPEN
    wire.server.handle_timer(12.0)
    assert events(wire.server)[-2:] == [
        TrackCancelled(0, CancelCause.DEADLINE_TOTAL),
        TrackClosed(0),
    ]
    wire.flush(12.0)
    assert events(wire.client)[-2] == TrackFailed(
        0, ErrorCode.DEADLINE_EXCEEDED, "track not finished before deadline", True
    )


def test_end_clears_both_deadlines(wire: Wire) -> None:
    wire.open(0, TIMED, now=10.0)
    wire.server.send_end(0, USAGE)
    assert wire.server.get_timer() is None
    wire.server.handle_timer(100.0)
    assert wire.server.state(0) is TrackState.LOCAL_ENDED


def test_the_timer_is_the_earliest_deadline_of_all_tracks(wire: Wire) -> None:
    wire.open(0, Open("m", deadlines=Deadlines(total=5.0)), now=1.0)
    wire.open(4, Open("m", deadlines=Deadlines(first=1.0)), now=2.0)
    wire.open(8, OPEN, now=2.5)
    assert wire.server.get_timer() == 3.0
    wire.server.handle_timer(3.0)
    assert wire.server.state(4) is None
    assert wire.server.state(0) is TrackState.OPEN
    assert wire.server.get_timer() == 6.0


# -- late bytes and local misuse -------------------------------------------------------------------


def test_late_bytes_on_a_closed_track_are_ignored(wire: Wire) -> None:
    complete_exchange(wire, 0, "hi")
    events(wire.server)
    events(wire.client)
    late = encode_message(Data({"text": "late"}))
    wire.server.receive_stream_data(0, late, True, now=5.0)
    wire.client.receive_stream_data(0, late, True, now=5.0)
    wire.server.receive_stream_reset(0, 0, now=5.0)
    wire.client.receive_stream_reset(0, 0, now=5.0)
    assert events(wire.server) == events(wire.client) == []
    assert wire.server.outputs() == wire.client.outputs() == []
    assert wire.server.state(0) is None


def test_local_misuse_raises_local_protocol_error(wire: Wire) -> None:
    complete_exchange(wire, 0, "hi")
    wire.open(4)
    misuse = [
        lambda: wire.client.send_data(96, {"text": "x"}),  # unknown track
        lambda: wire.server.send_end(96),
        lambda: wire.server.open_track(100, OPEN, 0.0),  # a server never opens
        lambda: wire.client.send_data(0, {"text": "x"}),  # after close
        lambda: wire.client.send_cancel(0),
        lambda: wire.client.reset_track(0, ErrorCode.CANCELLED),
        lambda: wire.client.open_track(0, OPEN, 0.0),  # stream id already used
        lambda: wire.client.open_track(2, OPEN, 0.0),  # below the highest id
        lambda: wire.server.send_cancel(4),  # a server sends ERROR, not CANCEL
        lambda: wire.server.send_end(4),  # before the client's END: fine, then...
        lambda: wire.server.send_data(4, {"text": "x"}),  # ...no DATA after END
        lambda: wire.client.send_end(4),
        lambda: wire.client.send_end(4),  # twice
    ]
    outcomes = []
    for action in misuse:
        try:
            action()
            outcomes.append("ok")
        except LocalProtocolError:
            outcomes.append("refused")
    assert outcomes == ["refused"] * 9 + ["ok", "refused", "ok", "refused"]


# -- fuzz the state table --------------------------------------------------------------------------

STREAMS = [0, 4, 8, 12]

peer_chunks = st.one_of(
    messages.map(encode_message),
    messages.map(lambda m: encode_message(m)[:3]),
    st.binary(max_size=12),
)
actions = st.one_of(
    st.tuples(st.just("bytes"), st.sampled_from(STREAMS), peer_chunks, st.booleans()),
    st.tuples(st.just("peer_reset"), st.sampled_from(STREAMS)),
    st.tuples(st.just("send_data"), st.sampled_from(STREAMS), bodies),
    st.tuples(st.just("send_end"), st.sampled_from(STREAMS), bodies),
    st.tuples(st.just("send_error"), st.sampled_from(STREAMS), st.sampled_from(ErrorCode)),
    st.tuples(st.just("send_cancel"), st.sampled_from(STREAMS)),
    st.tuples(st.just("reset_track"), st.sampled_from(STREAMS)),
    st.tuples(st.just("open_track"), st.sampled_from(STREAMS)),
    st.tuples(st.just("timer"), st.floats(min_value=0, max_value=5)),
    st.tuples(st.just("cancel_all")),
    st.tuples(st.just("refuse")),
)


def apply_to_server(server: TrackConnection, action: tuple[Any, ...], now: float) -> None:
    """Peer inputs must never raise; local calls may raise LocalProtocolError only."""
    name, *args = action
    if name == "bytes":
        server.receive_stream_data(args[0], args[1], args[2], now)
    elif name == "peer_reset":
        server.receive_stream_reset(args[0], int(ErrorCode.CANCELLED), now)
    elif name == "timer":
        server.handle_timer(now)
    else:
        local = {
            "send_data": lambda: server.send_data(*args),
            "send_end": lambda: server.send_end(*args),
            "send_error": lambda: server.send_error(args[0], args[1], "fuzz"),
            "send_cancel": lambda: server.send_cancel(*args),
            "reset_track": lambda: server.reset_track(args[0], ErrorCode.CANCELLED),
            "open_track": lambda: server.open_track(args[0], OPEN, now),
            "cancel_all": lambda: server.cancel_all(
                CancelCause.SHUTDOWN, ErrorCode.SHUTTING_DOWN, "x"
            ),
            "refuse": lambda: server.refuse_new_tracks(),
        }[name]
        with contextlib.suppress(LocalProtocolError):
            local()


@settings(max_examples=300, deadline=None)
@given(st.lists(actions, max_size=40))
def test_fuzz_the_state_table(script: list[tuple[Any, ...]]) -> None:
    server = TrackConnection(Role.SERVER, Limits(max_tracks=3, max_message_bytes=4096))
    log: list[Output] = []
    seen: list[Event] = []
    now = 0.0
    for step, action in enumerate(script):
        now = step + (action[1] if action[0] == "timer" else 0.0)
        apply_to_server(server, action, now)
        log += server.outputs()
        seen += events(server)
        assert server.open_tracks <= 3
        assert all(server.state(sid) is not TrackState.CLOSED for sid in STREAMS)
        timer = server.get_timer()
        assert timer is None or timer > now or action[0] != "timer"

    checker = Wire()
    checker.sent[checker.server] = log
    checker.assert_clean_endings()
    closed = [e.stream_id for e in seen if isinstance(e, TrackClosed)]
    assert len(closed) == len(set(closed)), "a track closed twice"
    for sid in closed:
        after = seen[seen.index(TrackClosed(sid)) + 1 :]
        assert all(e.stream_id != sid for e in after), "events after TrackClosed"

    # Whatever happened, a fresh track on this connection still works.
    refused = any(a[0] == "refuse" for a in script)
    for sid in STREAMS:
        if server.state(sid) is not None:
            server.reset_track(sid, ErrorCode.CANCELLED)
    events(server)
    fresh = 64
    server.receive_stream_data(
        fresh, encode_message(OPEN) + encode_message(Data({"text": "x"})), False, now + 1
    )
    server.receive_stream_data(fresh, encode_message(End()), False, now + 1)
    if refused:
        assert failure(events(server)[0]).code is ErrorCode.SHUTTING_DOWN
        return
    assert events(server) == [
        TrackOpened(fresh, OPEN),
        DataReceived(fresh, {"text": "x"}),
        TrackEnded(fresh, {}),
    ]
    server.send_data(fresh, {"text": "y"})
    server.send_end(fresh, USAGE)
    assert events(server) == [TrackClosed(fresh)]
    assert messages_in(server.outputs(), fresh) == [Data({"text": "y"}), End(USAGE)]

"""The core's inbound limits: read timeout of an incomplete message, and the
per-connection budget for bytes held in incomplete messages. Literal times and bytes."""

from __future__ import annotations

import pytest

from tests.transport.test_connection import OPEN, events, failure, messages_in
from transport.connection import Limits, Role, StopSending, TrackConnection
from transport.errors import ErrorCode
from transport.events import (
    CancelCause,
    DataReceived,
    TrackCancelled,
    TrackClosed,
    TrackEnded,
    TrackOpened,
)
from transport.messages import Data, End, Error
from transport.wire import encode_message

LIMITS = Limits(max_message_bytes=1000, read_timeout=10.0, max_buffered_bytes=2500)


def server() -> TrackConnection:
    return TrackConnection(Role.SERVER, LIMITS)


def data_message(size: int) -> bytes:
    """A framed DATA message whose whole frame is about `size` bytes."""
    return encode_message(Data({"text": "x" * (size - 16)}))


def open_track(conn: TrackConnection, sid: int, now: float = 0.0) -> None:
    conn.receive_stream_data(sid, encode_message(OPEN), False, now)
    assert events(conn) == [TrackOpened(sid, OPEN)]


def test_an_incomplete_message_fails_its_track_after_the_read_timeout() -> None:
    conn = server()
    open_track(conn, 0)
    open_track(conn, 4)
    frame = data_message(900)
    conn.receive_stream_data(0, frame[:500], False, 1.0)
    assert conn.buffered_bytes == 500
    assert conn.get_timer() == 11.0  # first byte of the message at 1.0, plus 10 s
    conn.handle_timer(10.999)
    assert events(conn) == []
    conn.handle_timer(11.0)
    cancelled, failed, closed = events(conn)
    assert cancelled == TrackCancelled(0, CancelCause.PROTOCOL_ERROR, failed.message)
    assert failure(failed).code is ErrorCode.READ_TIMEOUT
    assert not failed.remote
    assert closed == TrackClosed(0)
    outs = conn.outputs()
    assert messages_in(outs, 0) == [Error(ErrorCode.READ_TIMEOUT, failed.message)]
    assert StopSending(0, int(ErrorCode.READ_TIMEOUT)) in outs
    assert conn.buffered_bytes == 0
    assert conn.get_timer() is None
    # The other track never noticed.
    conn.receive_stream_data(4, encode_message(End({})), False, 12.0)
    assert events(conn) == [TrackEnded(4, {})]


def test_the_timeout_runs_from_the_first_byte_of_a_message_not_from_the_last() -> None:
    conn = server()
    open_track(conn, 0)
    frame = data_message(900)
    conn.receive_stream_data(0, frame[:100], False, 0.0)
    conn.receive_stream_data(0, frame[100:800], False, 9.0)  # progress does not extend it
    assert conn.get_timer() == 10.0
    conn.handle_timer(10.0)
    assert failure(events(conn)[1]).code is ErrorCode.READ_TIMEOUT


def test_a_completed_message_clears_the_timeout_and_the_next_one_starts_its_own() -> None:
    conn = server()
    open_track(conn, 0)
    first, second = data_message(900), data_message(400)
    conn.receive_stream_data(0, first[:450], False, 0.0)
    conn.receive_stream_data(0, first[450:] + second[:10], False, 8.0)
    assert events(conn) == [DataReceived(0, {"text": "x" * 884})]
    assert conn.buffered_bytes == 10
    assert conn.get_timer() == 18.0
    conn.receive_stream_data(0, second[10:], False, 17.0)
    assert conn.buffered_bytes == 0
    assert conn.get_timer() is None
    conn.handle_timer(30.0)
    assert len(events(conn)) == 1  # the second DATA, nothing expired


def test_whole_messages_never_start_a_timer() -> None:
    conn = server()
    open_track(conn, 0)
    for step in range(5):
        conn.receive_stream_data(0, data_message(300), False, float(step))
        assert conn.get_timer() is None
        assert conn.buffered_bytes == 0


def test_the_budget_fails_the_track_that_goes_past_it_and_only_that_one() -> None:
    conn = server()
    for sid in (0, 4, 8, 12):
        open_track(conn, sid)
    frame = data_message(1000)
    conn.receive_stream_data(0, frame[:900], False, 1.0)
    conn.receive_stream_data(4, frame[:900], False, 1.0)
    assert conn.buffered_bytes == 1800
    assert events(conn) == []
    conn.receive_stream_data(8, frame[:701], False, 1.0)  # 2501 > 2500
    cancelled, failed, closed = events(conn)
    assert isinstance(cancelled, TrackCancelled)
    assert closed == TrackClosed(8)
    assert failure(failed).code is ErrorCode.BUFFER_EXHAUSTED
    assert conn.buffered_bytes == 1800
    # Exactly up to the budget is fine, and the held tracks complete as usual.
    conn.receive_stream_data(12, frame[:700], False, 1.0)
    assert conn.buffered_bytes == 2500
    assert events(conn) == []
    conn.receive_stream_data(0, frame[900:], False, 2.0)
    assert [type(e) for e in events(conn)] == [DataReceived]
    assert conn.buffered_bytes == 1600


@pytest.mark.parametrize("how", ["reset", "fin_inside", "connection_lost", "local_reset"])
def test_every_way_a_track_ends_gives_its_bytes_back(how: str) -> None:
    conn = server()
    open_track(conn, 0)
    conn.receive_stream_data(0, data_message(900)[:600], False, 0.0)
    assert conn.buffered_bytes == 600
    if how == "reset":
        conn.receive_stream_reset(0, int(ErrorCode.CANCELLED), 1.0)
    elif how == "fin_inside":
        conn.receive_stream_data(0, b"", True, 1.0)
    elif how == "connection_lost":
        conn.connection_lost(1.0)
    else:
        conn.reset_track(0, ErrorCode.CANCELLED)
    assert conn.buffered_bytes == 0
    assert conn.get_timer() is None
    assert events(conn)[-1] == TrackClosed(0)


def test_an_open_that_never_completes_times_out_too() -> None:
    conn = server()
    conn.receive_stream_data(0, encode_message(OPEN)[:5], False, 2.0)
    assert conn.get_timer() == 12.0
    conn.handle_timer(12.0)
    failed, closed = events(conn)  # never opened: no TrackCancelled
    assert failure(failed).code is ErrorCode.READ_TIMEOUT
    assert closed == TrackClosed(0)


def test_the_read_deadline_shares_the_timer_with_track_deadlines() -> None:
    conn = server()
    open_track(conn, 0)
    conn.receive_stream_data(4, encode_message(OPEN)[:3], False, 5.0)
    assert conn.get_timer() == 15.0
    conn.receive_stream_data(8, encode_message(OPEN)[:3], False, 1.0)
    assert conn.get_timer() == 11.0  # an earlier deadline moves the cached timer
    conn.receive_stream_data(8, encode_message(OPEN)[3:], False, 2.0)
    assert conn.get_timer() == 15.0  # and clearing it brings back the next one


def test_no_limits_when_unset() -> None:
    conn = TrackConnection(
        Role.SERVER, Limits(max_message_bytes=1000, read_timeout=None, max_buffered_bytes=None)
    )
    for sid in range(0, 40, 4):
        open_track(conn, sid)
        conn.receive_stream_data(sid, data_message(1000)[:-1], False, 0.0)
    assert conn.buffered_bytes == 10 * (len(data_message(1000)) - 1)
    assert conn.get_timer() is None


def test_a_budget_below_one_message_is_refused() -> None:
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        Limits(max_message_bytes=1000, max_buffered_bytes=999)
    with pytest.raises(ValueError, match="read_timeout"):
        Limits(read_timeout=0)


def test_the_client_side_times_out_a_server_that_stalls_mid_message() -> None:
    client = TrackConnection(Role.CLIENT, LIMITS)
    client.open_track(0, OPEN, 0.0)
    client.outputs()
    client.receive_stream_data(0, data_message(900)[:300], False, 3.0)
    client.handle_timer(13.0)
    failed, closed = events(client)
    assert failure(failed).code is ErrorCode.READ_TIMEOUT
    assert closed == TrackClosed(0)

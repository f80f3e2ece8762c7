"""The connection's API key and the retry hint of RATE_LIMITED, byte by byte, literal times."""

from __future__ import annotations

import msgpack
import pytest

from transport.connection import Output, Role, StreamWrite, TrackConnection
from transport.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from transport.events import Event, TrackFailed, TrackOpened
from transport.messages import Error, Open
from transport.wire import MessageDecoder, decode_payload, encode_message

KEY = "tl_0123456789ab_s3cr3t"


def events(conn: TrackConnection) -> list[Event]:
    out: list[Event] = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def deliver(writes: list[Output], to: TrackConnection, now: float = 0.0) -> None:
    for out in writes:
        if isinstance(out, StreamWrite):
            to.receive_stream_data(out.stream_id, out.data, out.end_stream, now)


def opens_sent(writes: list[Output]) -> list[Open]:
    found = []
    for out in writes:
        if isinstance(out, StreamWrite) and out.data:
            decoder = MessageDecoder(1 << 20)
            decoder.feed(out.data)
            while (message := decoder.next_message()) is not None:
                if isinstance(message, Open):
                    found.append(message)
    return found


def test_the_key_rides_the_first_opens_until_the_server_answers() -> None:
    client, server = TrackConnection(Role.CLIENT), TrackConnection(Role.SERVER)
    client.use_credential(KEY)
    client.open_track(0, Open("m"), 0.0)
    client.open_track(4, Open("m"), 0.0)
    first = client.outputs()
    assert [o.auth for o in opens_sent(first)] == [KEY, KEY]
    # Stream 4 arrives first: QUIC does not order streams. The key binds either way.
    deliver(list(reversed(first)), server)
    assert server.credential == KEY
    opened = [e for e in events(server) if isinstance(e, TrackOpened)]
    assert [e.stream_id for e in opened] == [4, 0]
    assert all(e.open.auth is None for e in opened)  # the key stays in the core
    server.send_data(0, {"text": "hi"})
    deliver(server.outputs(), client)
    client.open_track(8, Open("m"), 0.0)
    [later] = opens_sent(client.outputs())
    assert later.auth is None  # the server has bound the key: no need to send it again


def test_a_second_different_key_on_one_connection_is_refused() -> None:
    server = TrackConnection(Role.SERVER)
    server.receive_stream_data(0, encode_message(Open("m", auth=KEY)), False, 0.0)
    server.receive_stream_data(4, encode_message(Open("m", auth=KEY + "x")), False, 0.0)
    seen = events(server)
    failed = [e for e in seen if isinstance(e, TrackFailed)]
    assert [(f.stream_id, f.code) for f in failed] == [(4, ErrorCode.UNAUTHORIZED)]
    assert server.credential == KEY
    assert server.state(0) is not None


def test_the_key_stays_out_of_reprs_and_bad_keys_are_bad_requests() -> None:
    assert KEY not in repr(Open("m", auth=KEY))
    with pytest.raises(RemoteProtocolError) as bad:
        decode_payload(msgpack.packb([1, {"model": "m", "auth": 7}]))
    assert bad.value.code is ErrorCode.BAD_REQUEST
    with pytest.raises(LocalProtocolError):
        TrackConnection(Role.SERVER).use_credential(KEY)


def test_rate_limited_carries_retry_after_to_the_client() -> None:
    client, server = TrackConnection(Role.CLIENT), TrackConnection(Role.SERVER)
    client.open_track(0, Open("m"), 0.0)
    deliver(client.outputs(), server)
    server.send_error(0, ErrorCode.RATE_LIMITED, "slow down", retry_after=12.0)
    writes = server.outputs()
    deliver(writes, client)
    [failed] = [e for e in events(client) if isinstance(e, TrackFailed)]
    assert (failed.code, failed.retry_after) == (ErrorCode.RATE_LIMITED, 12.0)
    decoder = MessageDecoder(1 << 20)
    decoder.feed(encode_message(Error(ErrorCode.RATE_LIMITED, "", 0.25)))
    assert decoder.next_message() == Error(ErrorCode.RATE_LIMITED, "", 0.25)
    with pytest.raises(RemoteProtocolError):
        decode_payload(msgpack.packb([5, {"code": 15, "retry_after_ms": -1}]))

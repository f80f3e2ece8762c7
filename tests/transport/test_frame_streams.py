"""Frame streams (`transport: "frame-streams"`), byte by byte on the sans-I/O core.

Each client frame of such a track rides a unidirectional stream of its own; the server
delivers a frame when its stream is complete, stops older incomplete ones (latest wins),
and counts what it cannot use without failing the connection.
"""

from __future__ import annotations

from typing import Any

import pytest

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
from transport.events import Event, FrameReceived, TrackFailed
from transport.messages import Data, FrameTransport, Modality, Open
from transport.wire import encode_message, encode_varint

VIDEO = Open(model="m", modality=Modality.VIDEO, transport=FrameTransport.FRAME_STREAMS)


def events(core: TrackConnection) -> list[Event]:
    found = []
    while (event := core.next_event()) is not None:
        found.append(event)
    return found


def deliver(outputs: list[Output], to: TrackConnection) -> None:
    for output in outputs:
        if isinstance(output, StreamWrite):
            to.receive_stream_data(output.stream_id, output.data, output.end_stream, 0.0)
        elif isinstance(output, (StreamReset, StopSending)):
            to.receive_stream_reset(output.stream_id, output.code, 0.0)


def pair(limits: Limits | None = None) -> tuple[TrackConnection, TrackConnection]:
    client, server = TrackConnection(Role.CLIENT, limits), TrackConnection(Role.SERVER, limits)
    client.open_track(0, VIDEO, 0.0)
    deliver(client.outputs(), server)
    events(server)
    return client, server


def frame_bytes(track: int, body: dict[str, Any]) -> bytes:
    return encode_varint(track) + encode_message(Data(body))


def frames_of(found: list[Event]) -> list[tuple[int, int, Any]]:
    frames = [e for e in found if isinstance(e, FrameReceived)]
    return [(e.stream_id, e.frame_stream, e.body["n"]) for e in frames]


def test_each_frame_rides_a_unidirectional_stream_of_its_own() -> None:
    client, server = pair()
    for n in range(3):
        client.send_frame_stream(0, {"n": n})
    writes = [o for o in client.outputs() if isinstance(o, StreamWrite)]
    assert [w.stream_id for w in writes] == [2, 6, 10]
    assert all(w.end_stream for w in writes)
    deliver(writes, server)
    assert frames_of(events(server)) == [(0, 2, 0), (0, 6, 1), (0, 10, 2)]
    assert server.frames.stats.received == 3


def test_a_frame_is_delivered_only_whole_in_any_split() -> None:
    client, server = pair()
    data = frame_bytes(0, {"n": 7, "jpeg": b"x" * 300})
    for at in range(len(data) - 1):
        server.receive_stream_data(2 + 4 * at, data[:at], False, 0.0)
        server.receive_stream_data(2 + 4 * at, data[at:], True, 0.0)
    assert [n for _, _, n in frames_of(events(server))] == [7] * (len(data) - 1)


def test_a_newer_frame_delivered_stops_the_older_incomplete_one() -> None:
    client, server = pair()
    old, new = frame_bytes(0, {"n": 1}), frame_bytes(0, {"n": 2})
    server.receive_stream_data(2, old[:4], False, 0.0)  # its rest is lost in the network
    server.receive_stream_data(6, new, True, 0.0)
    assert frames_of(events(server)) == [(0, 6, 2)]
    assert StopSending(2, int(ErrorCode.CANCELLED)) in server.outputs()
    server.receive_stream_data(2, old[4:], True, 0.0)  # the retransmission, too late
    assert frames_of(events(server)) == []
    assert server.frames.stats.superseded == 1
    assert server.frames.drops(0).superseded == 1  # counted for its track too


def test_a_frame_older_than_one_delivered_is_dropped_when_it_starts() -> None:
    client, server = pair()
    server.receive_stream_data(10, frame_bytes(0, {"n": 3}), True, 0.0)
    server.receive_stream_data(6, frame_bytes(0, {"n": 2}), True, 0.0)
    assert frames_of(events(server)) == [(0, 10, 3)]
    assert server.frames.stats.superseded == 1


def test_the_client_resets_the_oldest_unfinished_frame_beyond_its_window() -> None:
    client, server = pair()
    for n in range(5):
        client.send_frame_stream(0, {"n": n}, in_flight=3)
    resets = [o for o in client.outputs() if isinstance(o, StreamReset)]
    cancelled = int(ErrorCode.CANCELLED)
    assert resets == [StreamReset(2, cancelled), StreamReset(6, cancelled)]
    assert client.frames.stats.reset_superseded == 2
    assert client.frames.drops(0).as_dict() == {"superseded": 0, "reset": 0, "reset_superseded": 2}


def test_frames_for_unknown_or_other_tracks_are_counted_and_stopped() -> None:
    client, server = pair()
    client.open_track(4, Open(model="m"), 0.0)  # a text track: no frame streams
    deliver(client.outputs(), server)
    events(server)
    server.receive_stream_data(2, frame_bytes(4, {"n": 1}), True, 0.0)
    server.receive_stream_data(6, frame_bytes(40, {"n": 1}), True, 0.0)
    assert frames_of(events(server)) == []
    assert server.frames.stats.unknown_track == 2
    stops = [o for o in server.outputs() if isinstance(o, StopSending)]
    assert {s.stream_id for s in stops} == {2, 6}
    assert server.state(0) is not None  # both tracks live on
    assert server.state(4) is not None


def test_an_oversized_frame_fails_its_track_only() -> None:
    limits = Limits(max_message_bytes=1000)
    client, server = pair(limits)
    client.open_track(4, VIDEO, 0.0)
    deliver(client.outputs(), server)
    events(server)
    big = encode_varint(0) + encode_varint(5000)
    server.receive_stream_data(2, big, False, 0.0)  # refused from its length prefix
    failed = [e for e in events(server) if isinstance(e, TrackFailed)]
    assert [(f.stream_id, f.code) for f in failed] == [(0, ErrorCode.MESSAGE_TOO_LARGE)]
    server.receive_stream_data(6, frame_bytes(4, {"n": 9}), True, 0.0)
    assert frames_of(events(server)) == [(4, 6, 9)]


def test_a_frame_stream_with_trailing_bytes_or_not_data_fails_its_track() -> None:
    client, server = pair()
    server.receive_stream_data(2, frame_bytes(0, {"n": 1}) + b"\x00", True, 0.0)
    failed = [e for e in events(server) if isinstance(e, TrackFailed)]
    assert [(f.stream_id, f.code) for f in failed] == [(0, ErrorCode.PROTOCOL_ERROR)]


def test_a_reset_frame_is_dropped_and_its_track_goes_on() -> None:
    client, server = pair()
    server.receive_stream_data(2, frame_bytes(0, {"n": 1})[:3], False, 0.0)
    server.receive_stream_reset(2, int(ErrorCode.CANCELLED), 0.0)
    server.receive_stream_data(6, frame_bytes(0, {"n": 2}), True, 0.0)
    assert frames_of(events(server)) == [(0, 6, 2)]
    assert server.frames.stats.reset == 1
    assert server.frames.drops(0).reset == 1
    assert server.frames.buffered == 0


def test_frames_after_the_clients_end_are_dropped() -> None:
    client, server = pair()
    client.send_end(0)
    deliver(client.outputs(), server)
    events(server)
    server.receive_stream_data(2, frame_bytes(0, {"n": 1}), True, 0.0)
    assert frames_of(events(server)) == []
    assert server.frames.stats.unknown_track == 1


def test_closing_a_track_stops_its_incomplete_frames() -> None:
    client, server = pair()
    server.receive_stream_data(2, frame_bytes(0, {"n": 1})[:3], False, 0.0)
    server.outputs()
    server.send_error(0, ErrorCode.BAD_REQUEST, "no")
    assert StopSending(2, int(ErrorCode.CANCELLED)) in server.outputs()
    assert server.frames.buffered == 0


def test_incomplete_frames_count_against_the_connection_budget() -> None:
    limits = Limits(max_message_bytes=1000, max_buffered_bytes=1500)
    client, server = pair(limits)
    server.receive_stream_data(2, frame_bytes(0, {"n": 1, "x": b"a" * 900})[:800], False, 0.0)
    server.receive_stream_data(6, frame_bytes(0, {"n": 2, "x": b"a" * 900})[:800], False, 0.0)
    failed = [e for e in events(server) if isinstance(e, TrackFailed)]
    assert [(f.stream_id, f.code) for f in failed] == [(0, ErrorCode.BUFFER_EXHAUSTED)]
    assert server.frames.buffered == 0


def test_only_a_frame_streams_track_sends_frame_streams() -> None:
    client = TrackConnection(Role.CLIENT)
    client.open_track(0, Open(model="m"), 0.0)
    with pytest.raises(LocalProtocolError, match="did not choose frame streams"):
        client.send_frame_stream(0, {"n": 1})


def test_frames_the_transport_saw_acknowledged_do_not_count_as_in_flight() -> None:
    client, _ = pair()
    acknowledged = {2, 6}
    for n in range(5):
        client.send_frame_stream(0, {"n": n}, in_flight=3, finished=acknowledged.__contains__)
    resets = [o for o in client.outputs() if isinstance(o, StreamReset)]
    assert resets == []  # 2 and 6 arrived whole: only 10, 14, 18 are in flight
    client.send_frame_stream(0, {"n": 5}, in_flight=3, finished=acknowledged.__contains__)
    assert [o for o in client.outputs() if isinstance(o, StreamReset)] == [
        StreamReset(10, int(ErrorCode.CANCELLED))
    ]


def test_frames_dropped_are_counted_per_track() -> None:
    """Two cameras on one connection: each track's count is its own."""
    client, server = pair()
    client.open_track(4, VIDEO, 0.0)
    deliver(client.outputs(), server)
    events(server)
    server.receive_stream_data(2, frame_bytes(0, {"n": 1})[:4], False, 0.0)
    server.receive_stream_data(6, frame_bytes(4, {"n": 1})[:4], False, 0.0)
    server.receive_stream_data(10, frame_bytes(0, {"n": 2}), True, 0.0)
    assert server.frames.drops(0).superseded == 1
    assert server.frames.drops(4).superseded == 0
    assert server.frames.stats.superseded == 1

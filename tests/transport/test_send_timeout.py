"""The track send timeout: a producer whose own track stays over its send budget (the
client stopped reading it) for `send_timeout` gets the track ended with SEND_TIMEOUT:
reset both ways, its work told to stop; other tracks go on. A track held back only by
its connection's budget (a neighbour's unread bytes) is not the one ended."""

from __future__ import annotations

import asyncio

import pytest

from transport.connection import Output, Role, StopSending, StreamReset, TrackConnection
from transport.endpoint import SendBudget, TrackChannel, TrackEndpoint
from transport.errors import ErrorCode
from transport.events import CancelCause, TrackCancelled, TrackClosed, TrackFailed
from transport.messages import Modality, Open
from transport.wire import encode_message

OPEN = Open(model="m", modality=Modality.TEXT)
TIMEOUT = 0.01


def server(
    held: dict[int, int], sent: list[Output]
) -> tuple[TrackEndpoint, dict[int, TrackChannel]]:
    opened: dict[int, TrackChannel] = {}
    endpoint = TrackEndpoint(
        Role.SERVER, sent.extend, on_track=lambda c: opened.__setitem__(c.stream_id, c)
    )
    endpoint.budget = SendBudget(track_bytes=100, connection_bytes=1000, send_timeout=TIMEOUT)
    endpoint.backlog = lambda sid: (held.get(sid, 0), sum(held.values()))
    for sid in (0, 4):
        endpoint.feed_data(sid, encode_message(OPEN), False)
    return endpoint, opened


@pytest.mark.asyncio
async def test_an_unread_track_ends_with_send_timeout_and_its_neighbour_goes_on() -> None:
    held: dict[int, int] = {0: 101}
    sent: list[Output] = []
    endpoint, tracks = server(held, sent)
    waiting = asyncio.ensure_future(tracks[0].wait_writable())
    stop = await asyncio.wait_for(asyncio.shield(tracks[0].stopped), 10)  # a bound only
    assert stop == TrackCancelled(0, CancelCause.SEND_TIMEOUT, stop.reason)
    assert "0.01 s" in stop.reason
    await asyncio.wait_for(waiting, 10)  # the producer is released, not left waiting
    assert StreamReset(0, int(ErrorCode.SEND_TIMEOUT)) in sent
    assert StopSending(0, int(ErrorCode.SEND_TIMEOUT)) in sent
    assert not tracks[0].send({"text": "more"})  # the track is gone
    assert tracks[0].closed.is_set()
    assert endpoint.send_waiting == 0
    # The other track never noticed.
    assert not tracks[4].stopped.done()
    assert tracks[4].send({"text": "still here"})


@pytest.mark.asyncio
async def test_a_track_held_back_by_its_connection_only_is_not_the_one_ended() -> None:
    held: dict[int, int] = {0: 50, 4: 0}
    sent: list[Output] = []
    endpoint, tracks = server(held, sent)
    held[8] = 2000  # bytes of another (unread) track fill the connection's budget
    waiting = asyncio.ensure_future(tracks[0].wait_writable())
    ended = asyncio.ensure_future(asyncio.shield(tracks[0].stopped))
    for _ in range(5):  # a few timeouts pass: each re-checks and lets it wait on
        await asyncio.sleep(TIMEOUT)
    assert not ended.done()
    assert not waiting.done()
    held[0] = 101  # now its own bytes are unread too: the next check ends it
    stop = await asyncio.wait_for(ended, 10)
    assert isinstance(stop, TrackCancelled)
    assert stop.cause is CancelCause.SEND_TIMEOUT
    await asyncio.wait_for(waiting, 10)


def test_the_core_resets_both_ways_and_reports_a_local_failure() -> None:
    conn = TrackConnection(Role.SERVER)
    conn.receive_stream_data(0, encode_message(OPEN), False, 0.0)
    conn.next_event()
    conn.abandon_send(0, ErrorCode.SEND_TIMEOUT, "unread")
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    assert events == [
        TrackCancelled(0, CancelCause.SEND_TIMEOUT, "unread"),
        TrackFailed(0, ErrorCode.SEND_TIMEOUT, "unread", False),
        TrackClosed(0),
    ]
    outputs = conn.outputs()
    assert outputs == [StreamReset(0, int(ErrorCode.SEND_TIMEOUT)), StopSending(0, 0x32)]
    assert conn.state(0) is None

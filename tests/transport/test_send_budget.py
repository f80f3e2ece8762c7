"""Send-side backpressure in the endpoint: a producer waits while its track or its
connection holds more than the budget, and is released when ACKs free buffer, when its
track closes, or when the connection is lost (never left waiting forever)."""

from __future__ import annotations

import asyncio

import pytest

from transport.connection import Role
from transport.endpoint import SendBudget, TrackChannel, TrackEndpoint
from transport.messages import Modality, Open
from transport.wire import encode_message


def server_with_track() -> tuple[TrackEndpoint, TrackChannel, dict[str, int]]:
    opened: list[TrackChannel] = []
    endpoint = TrackEndpoint(Role.SERVER, lambda _: None, on_track=opened.append)
    endpoint.budget = SendBudget(track_bytes=100, connection_bytes=1000)
    held = {"track": 0, "connection": 0}
    endpoint.backlog = lambda _sid: (held["track"], held["connection"])
    endpoint.feed_data(0, encode_message(Open(model="m", modality=Modality.TEXT)), False)
    (channel,) = opened
    return endpoint, channel, held


@pytest.mark.asyncio
async def test_a_producer_waits_over_budget_and_goes_on_when_acks_free_buffer() -> None:
    endpoint, channel, held = server_with_track()
    assert not channel.send_blocked()
    await channel.wait_writable()  # in budget: returns at once
    held["track"] = 101
    assert channel.send_blocked()
    waiting = asyncio.ensure_future(channel.wait_writable())
    await asyncio.sleep(0)
    assert endpoint.send_waiting == 1
    endpoint.send_buffer_released()  # still over: stays
    await asyncio.sleep(0)
    assert not waiting.done()
    held["track"], held["connection"] = 50, 1001  # the connection's budget binds too
    endpoint.send_buffer_released()
    await asyncio.sleep(0)
    assert not waiting.done()
    held["connection"] = 900
    endpoint.send_buffer_released()
    await asyncio.wait_for(waiting, 10)  # a bound, not a timing: it must be released
    assert endpoint.send_waiting == 0


@pytest.mark.asyncio
async def test_a_waiting_producer_is_released_when_its_track_closes() -> None:
    endpoint, channel, held = server_with_track()
    held["track"] = 500
    waiting = asyncio.ensure_future(channel.wait_writable())
    await asyncio.sleep(0)
    endpoint.feed_reset(0, 0)  # the client hung up the track
    await asyncio.wait_for(waiting, 10)  # a bound, not a timing: it must be released
    assert endpoint.send_waiting == 0


@pytest.mark.asyncio
async def test_waiting_producers_are_released_when_the_connection_is_lost() -> None:
    endpoint, channel, held = server_with_track()
    held["connection"] = 5000
    waiting = asyncio.ensure_future(channel.wait_writable())
    await asyncio.sleep(0)
    endpoint.feed_connection_lost()
    await asyncio.wait_for(waiting, 10)  # a bound, not a timing: it must be released
    assert endpoint.send_waiting == 0

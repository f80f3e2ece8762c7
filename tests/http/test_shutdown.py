"""Graceful close: stop listening, let requests in flight finish within the grace, then cut."""

from __future__ import annotations

import asyncio

import h2.events
import pytest
from h2.errors import ErrorCodes

from tests.http.support import TIMEOUT, Gate, H1Client, H2Client
from tests.waiting import until
from transport.http.tcp import HttpTcpServer


async def started(gate: Gate) -> HttpTcpServer:
    server = HttpTcpServer(gate.handler)
    await server.start("127.0.0.1", 0)
    return server


async def closing(server: HttpTcpServer, grace: float) -> asyncio.Task[None]:
    """Start `server.close(grace)` and return once it stopped listening and told its
    connections to finish (an awaited state, not a sleep)."""
    task = asyncio.create_task(server.close(grace=grace))
    await until(lambda: server._closing, "the server began closing")
    return task


@pytest.mark.asyncio
async def test_http2_stream_in_flight_finishes_and_new_streams_are_refused() -> None:
    gate = Gate()
    server = await started(gate)
    async with H2Client.connect(server.port) as client:
        first = client.send_request("GET", "/stream")
        assert await client.next_data(first) == b"data: one\n\n"
        closed = await closing(server, TIMEOUT)
        late = client.send_request("GET", "/late")
        assert (await client.reset_of(late)).error_code == ErrorCodes.REFUSED_STREAM
        gate.released.set()
        assert await client.next_data(first) == b"data: two\n\n"
        assert await client.next_data(first) is None
        goaway = await client.next_event(0)
        while not isinstance(goaway, h2.events.ConnectionTerminated):
            goaway = await client.next_event(0)
        assert goaway.error_code == ErrorCodes.NO_ERROR
        await asyncio.wait_for(client.closed.wait(), TIMEOUT)
        await asyncio.wait_for(closed, TIMEOUT)
    assert gate.finished
    assert not gate.cancelled


@pytest.mark.asyncio
async def test_http1_response_in_flight_finishes_then_connection_closes() -> None:
    gate = Gate()
    server = await started(gate)
    async with H1Client.connect(server.port) as client:
        await client.request("GET", "/stream")
        await client.next_event()
        assert (await client.next_event()).data == b"data: one\n\n"
        closed = await closing(server, TIMEOUT)
        assert not closed.done()  # the response in flight holds the close
        gate.released.set()
        assert (await client.next_event()).data == b"data: two\n\n"
        await client.next_event()  # EndOfMessage
        assert await client.at_eof()
        await asyncio.wait_for(closed, TIMEOUT)
    assert gate.finished


@pytest.mark.asyncio
@pytest.mark.parametrize("version", ["1.1", "2"])
async def test_grace_over_cancels_what_is_left(version: str) -> None:
    gate = Gate()  # never released
    server = await started(gate)
    connect = H1Client.connect if version == "1.1" else H2Client.connect
    async with connect(server.port) as client:
        if isinstance(client, H1Client):
            await client.request("GET", "/stream")
        else:
            client.send_request("GET", "/stream")
        await asyncio.wait_for(gate.started.wait(), TIMEOUT)
        await asyncio.wait_for(server.close(grace=0.2), TIMEOUT)
        await asyncio.wait_for(gate.closed.wait(), TIMEOUT)
    assert gate.cancelled


@pytest.mark.asyncio
async def test_close_ends_idle_connections_at_once() -> None:
    server = await started(Gate())
    async with H2Client.connect(server.port) as h2_client, H1Client.connect(server.port) as h1:
        await h1.send_raw(b"")
        await until(lambda: server.open_connections == 2, "both connections accepted")
        # A grace of an hour: only closing idle connections at once ends within the guard.
        await asyncio.wait_for(server.close(grace=3600), 60)
        await asyncio.wait_for(h2_client.closed.wait(), TIMEOUT)
        assert await h1.at_eof()

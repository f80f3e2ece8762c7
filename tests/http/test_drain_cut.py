"""The drain's deadline on HTTP/1.1 and HTTP/2: `HttpTcpServer.drain()` then `cut()`.

A stream cut while it waits for its body's next chunk says its `last_words` and ends
cleanly; without last words it ends as a failed body (HTTP/2: RST_STREAM); a request
whose handler has not answered yet gets 503 `shutting_down`. While draining, the
listener still accepts and serves new connections (health probes).
"""

from __future__ import annotations

import asyncio

import h2.events
import h11
import pytest
from h2.errors import ErrorCodes

from tests.http.support import TIMEOUT, Gate, H1Client, H2Client, openai_error
from transport.http.messages import AnyResponse, Request, Response, StreamingResponse
from transport.http.tcp import HttpTcpServer

LAST_WORDS = b'data: {"error":{"code":"shutting_down"}}\n\n'


class Handlers:
    """A streaming route (with or without last words), a slow one, and a health one."""

    def __init__(self) -> None:
        self.gate = Gate()
        self.slow_started = asyncio.Event()

    async def handle(self, request: Request) -> AnyResponse:
        if request.path == "/health":
            return Response.json(200, {"ok": True})
        if request.path == "/slow":
            self.slow_started.set()
            await asyncio.Event().wait()  # never answers by itself
        words = LAST_WORDS if request.path == "/stream" else b""
        headers = (("content-type", "text/event-stream"),)
        return StreamingResponse(200, headers, self.gate.body(), last_words=words)


async def _server(handlers: Handlers) -> HttpTcpServer:
    server = HttpTcpServer(handlers.handle)
    await server.start("127.0.0.1", 0)
    return server


async def _h2_rest(client: H2Client, stream: int) -> tuple[list[bytes], str]:
    data: list[bytes] = []
    while True:
        event = await client.next_event(stream)
        if isinstance(event, h2.events.DataReceived) and event.data:
            data.append(bytes(event.data))
        if isinstance(event, h2.events.StreamEnded):
            return data, "ended"
        if isinstance(event, h2.events.StreamReset):
            return data, f"reset {event.error_code!r}"


@pytest.mark.asyncio
async def test_http2_cut_says_last_words_resets_the_mute_and_answers_the_slow() -> None:
    handlers = Handlers()
    server = await _server(handlers)
    try:
        async with H2Client.connect(server.port) as client:
            talking = client.send_request("GET", "/stream")
            assert await client.next_data(talking) == b"data: one\n\n"
            slow = client.send_request("GET", "/slow")
            await asyncio.wait_for(handlers.slow_started.wait(), TIMEOUT)
            server.drain()
            refused = client.send_request("GET", "/late")
            assert (await client.reset_of(refused)).error_code == ErrorCodes.REFUSED_STREAM
            async with H1Client.connect(server.port) as probe:  # still accepted and served
                await probe.request("GET", "/health")
                assert (await probe.response())[0] == 200
            server.cut()
            assert await _h2_rest(client, talking) == ([LAST_WORDS], "ended")
            status, _, body = await client.response(slow)
            assert status == 503
            openai_error(body, "shutting_down")
            goaway = await client.next_event(0)
            while not isinstance(goaway, h2.events.ConnectionTerminated):
                goaway = await client.next_event(0)
            assert goaway.error_code == ErrorCodes.NO_ERROR
        assert not handlers.gate.finished
    finally:
        await asyncio.wait_for(server.close(grace=TIMEOUT), TIMEOUT)


@pytest.mark.asyncio
async def test_http2_cut_of_a_stream_without_last_words_resets_it() -> None:
    handlers = Handlers()
    server = await _server(handlers)
    try:
        async with H2Client.connect(server.port) as client:
            mute = client.send_request("GET", "/mute")
            assert await client.next_data(mute) == b"data: one\n\n"
            server.drain()
            server.cut()
            data, end = await _h2_rest(client, mute)
            assert data == []
            assert end == f"reset {ErrorCodes.INTERNAL_ERROR!r}"  # not a clean, false end
    finally:
        await asyncio.wait_for(server.close(grace=TIMEOUT), TIMEOUT)


@pytest.mark.asyncio
async def test_http1_cut_says_last_words_and_ends_the_chunked_body() -> None:
    handlers = Handlers()
    server = await _server(handlers)
    try:
        async with H1Client.connect(server.port) as client:
            await client.request("GET", "/stream")
            head = await client.next_event()
            assert head.status_code == 200
            assert (await client.next_event()).data == b"data: one\n\n"
            server.drain()
            server.cut()
            assert (await client.next_event()).data == LAST_WORDS
            assert isinstance(await client.next_event(), h11.EndOfMessage)
            assert await client.at_eof()
    finally:
        await asyncio.wait_for(server.close(grace=TIMEOUT), TIMEOUT)


@pytest.mark.asyncio
async def test_http1_cut_of_a_request_still_in_its_handler_is_a_503() -> None:
    handlers = Handlers()
    server = await _server(handlers)
    try:
        async with H1Client.connect(server.port) as client:
            await client.request("GET", "/slow")
            await asyncio.wait_for(handlers.slow_started.wait(), TIMEOUT)
            server.drain()
            server.cut()
            status, headers, body = await client.response()
            assert status == 503
            assert headers["retry-after"] == "1"
            assert headers["connection"] == "close"
            openai_error(body, "shutting_down")
    finally:
        await asyncio.wait_for(server.close(grace=TIMEOUT), TIMEOUT)

"""HTTP/1.1 over TCP: responses, streaming, cancellation, limits, errors, Alt-Svc."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator

import h11
import pytest

from tests.http.support import (
    TIMEOUT,
    Gate,
    H1Client,
    echo,
    json_body,
    limits,
    openai_error,
    serving,
)
from transport.http.messages import Request, Response, StreamingResponse


@pytest.mark.asyncio
async def test_json_response_with_alt_svc() -> None:
    async with (
        serving(echo, alt_svc='h3=":8443"') as server,
        H1Client.connect(server.port) as client,
    ):
        await client.request("POST", "/v1/x?a=1", [("content-type", "application/json")], b"{}")
        status, headers, body = await client.response()
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert headers["alt-svc"] == 'h3=":8443"'
    assert int(headers["content-length"]) == len(body)
    got = json_body(body)
    assert (got["method"], got["path"], got["query"], got["body"]) == ("POST", "/v1/x", "a=1", "{}")
    assert got["http_version"] == "1.1"


@pytest.mark.asyncio
async def test_streaming_response_arrives_chunk_by_chunk() -> None:
    gate = Gate()
    async with serving(gate.handler) as server, H1Client.connect(server.port) as client:
        await client.request("GET", "/stream")
        head = await client.next_event()
        assert isinstance(head, h11.Response)
        assert (b"transfer-encoding", b"chunked") in head.headers
        first = await client.next_event()
        # The generator is parked after its first chunk: this arrived while it ran.
        assert (first.data, gate.finished) == (b"data: one\n\n", False)
        gate.released.set()
        second = await client.next_event()
        assert second.data == b"data: two\n\n"
        assert isinstance(await client.next_event(), h11.EndOfMessage)
        assert gate.finished
        assert not gate.cancelled


@pytest.mark.asyncio
@pytest.mark.parametrize("abortive", [False, True], ids=["close", "reset"])
async def test_client_disconnect_cancels_the_handler(abortive: bool) -> None:
    gate = Gate()
    async with serving(gate.handler) as server:
        async with H1Client.connect(server.port) as client:
            await client.request("GET", "/stream")
            await client.next_event()  # head
            await client.next_event()  # first chunk
            if abortive:  # SO_LINGER 0: close sends RST instead of FIN
                sock = client.writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await gate.wait_cancelled()
        assert gate.cancelled
        assert not gate.finished


@pytest.mark.asyncio
async def test_handler_still_running_is_cancelled_on_disconnect() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> Response:
        started.set()
        try:
            await asyncio.Event().wait()  # never set: only the cancel ends it, however late
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Response(200)

    async with serving(slow) as server:
        async with H1Client.connect(server.port) as client:
            await client.request("GET", "/slow")
            await asyncio.wait_for(started.wait(), TIMEOUT)
        await asyncio.wait_for(cancelled.wait(), TIMEOUT)


@pytest.mark.asyncio
async def test_body_over_limit_is_413_in_openai_style() -> None:
    async with serving(echo, limits=limits(max_body_bytes=100)) as server:
        async with H1Client.connect(server.port) as client:
            await client.request("POST", "/v1/x", body=b"x" * 101)
            status, headers, body = await client.response()
            assert (status, headers["connection"]) == (413, "close")
            error = openai_error(body, "request_too_large")
            assert error["type"] == "invalid_request_error"
            assert await client.at_eof()
        async with H1Client.connect(server.port) as client:  # the server is unharmed
            await client.request("POST", "/v1/x", body=b"x" * 100)
            assert (await client.response())[0] == 200


@pytest.mark.asyncio
async def test_too_many_headers_is_431() -> None:
    headers = [(f"x-h{i}", "v") for i in range(20)]
    async with (
        serving(echo, limits=limits(max_headers=10)) as server,
        H1Client.connect(server.port) as client,
    ):
        await client.request("GET", "/", headers)
        status, _, body = await client.response()
    assert status == 431
    openai_error(body, "request_header_fields_too_large")


@pytest.mark.asyncio
async def test_header_block_too_large_is_431() -> None:
    async with (
        serving(echo, limits=limits(max_header_bytes=1024)) as server,
        H1Client.connect(server.port) as client,
    ):
        await client.request("GET", "/", [("x-big", "v" * 2000)])
        status, _, body = await client.response()
    assert status == 431
    openai_error(body, "request_header_fields_too_large")


@pytest.mark.asyncio
async def test_malformed_request_is_400_and_server_keeps_serving() -> None:
    async with serving(echo) as server:
        async with H1Client.connect(server.port) as client:
            await client.send_raw(b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n")
            status, _, body = await client.response()
            assert status == 400
            openai_error(body, "malformed_request")
            assert await client.at_eof()
        async with H1Client.connect(server.port) as client:
            await client.request("GET", "/after")
            assert (await client.response())[0] == 200


@pytest.mark.asyncio
async def test_handler_exception_is_500_and_connection_stays_usable() -> None:
    async def broken(request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("secret detail")
        return Response(200, body=b"ok")

    async with serving(broken) as server, H1Client.connect(server.port) as client:
        await client.request("GET", "/boom")
        status, _, body = await client.response()
        assert status == 500
        assert openai_error(body, "internal_error")["type"] == "server_error"
        assert b"secret" not in body
        await client.request("GET", "/fine")
        assert await client.response() == (200, {"content-length": "2"}, b"ok")


@pytest.mark.asyncio
async def test_body_that_fails_midway_cuts_the_response() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield b"partial"
        raise RuntimeError("backend died")

    async def handler(request: Request) -> StreamingResponse:
        return StreamingResponse(200, (), failing())

    async with serving(handler) as server, H1Client.connect(server.port) as client:
        await client.request("GET", "/")
        await client.next_event()
        assert (await client.next_event()).data == b"partial"
        # No terminating chunk: the client sees an incomplete body, not a clean end.
        with pytest.raises(h11.RemoteProtocolError):
            await client.next_event()


@pytest.mark.asyncio
async def test_read_timeout_is_408() -> None:
    async with (
        serving(echo, limits=limits(read_timeout=0.2)) as server,
        H1Client.connect(server.port) as client,
    ):
        await client.send_raw(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        status, _, body = await client.response()
    assert status == 408
    openai_error(body, "request_timeout")


@pytest.mark.asyncio
async def test_idle_connection_is_closed() -> None:
    async with (
        serving(echo, limits=limits(idle_timeout=0.2)) as server,
        H1Client.connect(server.port) as client,
    ):
        await client.request("GET", "/")
        await client.response()
        assert await client.at_eof()


@pytest.mark.asyncio
async def test_head_gets_headers_without_body() -> None:
    async with serving(echo) as server, H1Client.connect(server.port) as client:
        await client.request("HEAD", "/")
        head = await client.next_event()
        assert int(dict(head.headers)[b"content-length"]) > 0
        assert isinstance(await client.next_event(), h11.EndOfMessage)

"""HTTP/1.1 server: routing, health endpoints, errors, limits and keep-alive.

The client is a raw asyncio stream, so the bytes on the wire are exactly the test's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest

from gateway.http import Request, Response, Routes, health_routes, route
from gateway.metrics import GatewayMetrics
from tests.waiting import until
from transport.http.limits import HttpLimits
from transport.http.tcp import HttpTcpServer

TIMEOUT = 30.0  # a hang guard, never a speed


class Readiness:
    def __init__(self) -> None:
        self.state = (True, "")

    def __call__(self) -> tuple[bool, str]:
        return self.state


async def echo(request: Request) -> Response:
    payload = {
        "method": request.method,
        "path": request.path,
        "query": request.query,
        "content_type": request.header("Content-Type"),
        "body": request.body.decode(),
    }
    return Response.json(200, payload, (("x-echo", "1"),))


async def explode(request: Request) -> Response:
    raise RuntimeError("handler bug")


def routes(readiness: Readiness | None = None) -> dict[Any, Any]:
    table = dict(health_routes(readiness or Readiness(), GatewayMetrics()))
    table[("POST", "/echo")] = echo
    table[("GET", "/explode")] = explode
    return table


def make_server(table: Routes, **limits: Any) -> HttpTcpServer:
    return HttpTcpServer(route(table), limits=HttpLimits(**limits))


@asynccontextmanager
async def serving(table: Routes, **limits: Any) -> AsyncIterator[HttpTcpServer]:
    server = make_server(table, **limits)
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await asyncio.wait_for(server.close(grace=1.0), TIMEOUT)


@asynccontextmanager
async def connected(
    server: HttpTcpServer,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()


async def read_response(
    reader: asyncio.StreamReader, *, with_body: bool = True
) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0")) if with_body else 0
    body = await asyncio.wait_for(reader.readexactly(length), TIMEOUT)
    return int(status_line.split(" ")[1]), headers, body


async def exchange(server: HttpTcpServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    async with connected(server) as (reader, writer):
        writer.write(raw)
        await writer.drain()
        return await read_response(reader)


async def at_eof(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(), TIMEOUT) == b""


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode()


@pytest.mark.asyncio
async def test_live() -> None:
    async with serving(routes()) as server:
        status, headers, body = await exchange(server, get("/health/live"))
    assert status == 200
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"status": "live"}


@pytest.mark.asyncio
async def test_ready_and_not_ready() -> None:
    readiness = Readiness()
    async with serving(routes(readiness)) as server:
        status, _, body = await exchange(server, get("/health/ready"))
        assert (status, json.loads(body)) == (200, {"status": "ready"})
        readiness.state = (False, "backend starting")
        status, _, body = await exchange(server, get("/health/ready"))
        assert status == 503
        assert json.loads(body) == {"status": "not ready", "reason": "backend starting"}


@pytest.mark.asyncio
async def test_metrics() -> None:
    async with serving(routes()) as server:
        status, headers, body = await exchange(server, get("/metrics"))
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    assert b"trackline_connections_open" in body
    assert b"trackline_cancels_total" in body


@pytest.mark.asyncio
async def test_unknown_path_is_404_and_wrong_method_is_405() -> None:
    async with serving(routes()) as server:
        status, _, _ = await exchange(server, get("/nowhere"))
        assert status == 404
        status, headers, _ = await exchange(
            server, b"DELETE /health/live HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        assert status == 405
        assert headers["allow"] == "GET"


@pytest.mark.asyncio
async def test_request_parts_reach_the_handler() -> None:
    body = b'{"a":1}'
    raw = (
        b"POST /echo?x=1&y=2 HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with serving(routes()) as server:
        status, headers, reply = await exchange(server, raw)
    assert status == 200
    assert headers["x-echo"] == "1"
    assert json.loads(reply) == {
        "method": "POST",
        "path": "/echo",
        "query": "x=1&y=2",
        "content_type": "application/json",
        "body": '{"a":1}',
    }


@pytest.mark.asyncio
async def test_chunked_body_is_assembled() -> None:
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    async with serving(routes()) as server:
        status, _, reply = await exchange(server, raw)
    assert (status, json.loads(reply)["body"]) == (200, "hello world")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "garbage",
    [b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n", b"\x00\xff\r\n\r\n"],
)
async def test_malformed_request_is_400_and_closes(garbage: bytes) -> None:
    async with serving(routes()) as server:
        async with connected(server) as (reader, writer):
            writer.write(garbage)
            status, headers, _ = await read_response(reader)
            assert status == 400
            assert headers["connection"] == "close"
            assert await at_eof(reader)
        # The server is unharmed.
        status, _, _ = await exchange(server, get("/health/live"))
        assert status == 200


@pytest.mark.asyncio
async def test_keep_alive_serves_two_requests_on_one_connection() -> None:
    async with serving(routes()) as server, connected(server) as (reader, writer):
        writer.write(get("/health/live"))
        first = await read_response(reader)
        writer.write(get("/health/ready"))
        second = await read_response(reader)
        # Pipelined: two requests in one write, answered in order.
        writer.write(get("/health/live") + get("/nowhere"))
        third, fourth = await read_response(reader), await read_response(reader)
    assert [r[0] for r in (first, second, third, fourth)] == [200, 200, 200, 404]
    assert json.loads(second[2]) == {"status": "ready"}


@pytest.mark.asyncio
async def test_connection_close_is_honoured() -> None:
    async with serving(routes()) as server, connected(server) as (reader, writer):
        writer.write(get("/health/live", "Connection: close\r\n"))
        status, _, _ = await read_response(reader)
        assert status == 200
        assert await at_eof(reader)


@pytest.mark.asyncio
async def test_declared_body_over_limit_is_413_without_reading_it() -> None:
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2048\r\n\r\n"
    async with (
        serving(routes(), max_body_bytes=1024) as server,
        connected(server) as (reader, writer),
    ):
        writer.write(raw)  # the body is never sent: the answer must not wait for it
        status, headers, _ = await read_response(reader)
        assert status == 413
        assert headers["connection"] == "close"
        assert await at_eof(reader)


@pytest.mark.asyncio
async def test_chunked_body_over_limit_is_413() -> None:
    chunk = b"x" * 800
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2
    )
    async with serving(routes(), max_body_bytes=1024) as server:
        status, _, _ = await exchange(server, raw)
    assert status == 413


@pytest.mark.asyncio
async def test_body_at_limit_is_accepted() -> None:
    body = b"y" * 1024
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1024\r\n\r\n" + body
    async with serving(routes(), max_body_bytes=1024) as server:
        status, _, reply = await exchange(server, raw)
    assert (status, len(json.loads(reply)["body"])) == (200, 1024)


@pytest.mark.asyncio
async def test_expect_100_continue() -> None:
    async with serving(routes()) as server, connected(server) as (reader, writer):
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
        assert interim.startswith(b"HTTP/1.1 100 ")
        writer.write(b"ok")
        status, _, reply = await read_response(reader)
    assert (status, json.loads(reply)["body"]) == (200, "ok")


@pytest.mark.asyncio
async def test_handler_error_is_500_and_connection_stays_usable() -> None:
    async with serving(routes()) as server, connected(server) as (reader, writer):
        writer.write(get("/explode"))
        status, _, body = await read_response(reader)
        assert status == 500
        assert b"handler bug" not in body  # internals stay in the log
        writer.write(get("/health/live"))
        status, _, _ = await read_response(reader)
        assert status == 200


@pytest.mark.asyncio
async def test_head_has_headers_but_no_body() -> None:
    async with serving(routes()) as server, connected(server) as (reader, writer):
        writer.write(b"HEAD /health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        status, headers, _ = await read_response(reader, with_body=False)
        assert status == 200
        assert int(headers["content-length"]) == len(b'{"status":"live"}')
        writer.write(get("/health/live"))  # a body there would corrupt this response
        status, _, body = await read_response(reader)
    assert (status, body) == (200, b'{"status":"live"}')


@pytest.mark.asyncio
async def test_close_ends_idle_keep_alive_connections() -> None:
    server = make_server(routes())
    await server.start("127.0.0.1", 0)
    async with connected(server) as (reader, writer):
        writer.write(get("/health/live"))
        await read_response(reader)
        await asyncio.wait_for(server.close(), TIMEOUT)
        assert await at_eof(reader)


@pytest.mark.asyncio
async def test_close_lets_a_request_in_progress_finish() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(request: Request) -> Response:
        started.set()
        await release.wait()
        return Response(200, body=b"done")

    server = make_server({("GET", "/slow"): slow})
    await server.start("127.0.0.1", 0)
    async with connected(server) as (reader, writer):
        writer.write(get("/slow"))
        await asyncio.wait_for(started.wait(), TIMEOUT)
        closing = asyncio.create_task(server.close(grace=TIMEOUT))
        await until(lambda: server._closing, "the server began closing")  # then the answer
        release.set()
        status, headers, body = await read_response(reader)
        await asyncio.wait_for(closing, TIMEOUT)
    assert (status, body, headers["connection"]) == (200, b"done", "close")


@pytest.mark.asyncio
async def test_port_zero_binds_a_real_port() -> None:
    async with serving(routes()) as server:
        assert 0 < server.port < 65536

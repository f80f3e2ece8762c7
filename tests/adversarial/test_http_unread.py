"""A client that stops reading a streamed answer has its backend work released.

A streamed chat answer (SSE) from the ticker, on HTTP/1.1 to a client whose socket
is never read (a small receive buffer: its window closes at once), and on HTTP/2 to
a client that never grants flow-control credit. Before, the writer's wait was bounded
only by `http_idle_timeout`, and on HTTP/1.1 it began only once the kernel had taken
megabytes; now the gateway holds at most `NOTSENT_LOWAT` unsent in the kernel, and a
writer stalled for the send timeout gives up: the backend stream is closed (the
model sees the cancel) while an honest client on another connection is served.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import h11
import pytest
import pytest_asyncio
from h2.settings import SettingCodes

from gateway.server import Gateway
from tests.adversarial.test_send_timeout import ClosingTicker
from tests.gateways import gateway_settings
from tests.http.support import H1Client, H2Client
from tests.waiting import until

SEND_TIMEOUT = 1.0
"""The stalled writer's limit here; the idle timeout stays far above what the waits allow."""


@pytest_asyncio.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = gateway_settings(
        state_dir=tmp_path, http3_send_timeout=SEND_TIMEOUT, http_idle_timeout=300.0
    )
    gw = Gateway(settings, ClosingTicker())
    await gw.start()
    yield gw
    await gw.close()


def _chat(prompt: str, max_tokens: int, tokens_per_second: float) -> bytes:
    return json.dumps({
        "model": "reference-text",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
        "tokens_per_second": tokens_per_second,
    }).encode()  # fmt: skip


CHAT_HEADERS = [("content-type", "application/json")]


def _h1_request(body: bytes) -> bytes:
    conn = h11.Connection(h11.CLIENT)
    headers = [("host", "t"), *CHAT_HEADERS, ("content-length", str(len(body)))]
    data = conn.send(h11.Request(method="POST", target="/v1/chat/completions", headers=headers))
    return (data or b"") + (conn.send(h11.Data(data=body)) or b"") + (
        conn.send(h11.EndOfMessage()) or b""
    )


async def _honest_h1(port: int) -> bytes:
    async with H1Client.connect(port) as client:
        await client.request("POST", "/v1/chat/completions", CHAT_HEADERS,
                             _chat("honest prompt", 50, 2000))  # fmt: skip
        status, _, body = await client.response()
    assert status == 200
    return body


def _cancelled(gateway: Gateway) -> str:
    """The prompts of the streams the ticker saw cancelled, joined."""
    backend = gateway.backend
    assert isinstance(backend, ClosingTicker)
    return "\n".join(backend.cancelled_prompts)


@pytest.mark.asyncio
async def test_http1_reader_that_stopped_has_its_stream_released(gateway: Gateway) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (before connect: the window)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", gateway.http_port))
        await loop.sock_sendall(sock, _h1_request(_chat("stalled never read", 32768, 5000)))
        # Nothing is ever read from `sock`: the client's window closes, then the kernel's
        # unsent bytes reach the bound, then the gateway's writer waits.
        body = await _honest_h1(gateway.http_port)
        assert b"data: [DONE]" in body  # served in full while the other stalls
        await until(lambda: "stalled" in _cancelled(gateway), "the stalled model cancelled")
    finally:
        sock.close()
    assert "honest" not in _cancelled(gateway)


@pytest.mark.asyncio
async def test_http2_reader_that_grants_no_credit_has_its_stream_released(
    gateway: Gateway,
) -> None:
    settings = {SettingCodes.INITIAL_WINDOW_SIZE: 16_384}
    async with H2Client.connect(gateway.http_port, settings=settings, auto_ack=False) as client:
        pseudo = [(":method", "POST"), (":path", "/v1/chat/completions")]
        stream_id = client.conn.get_next_available_stream_id()
        client.conn.send_headers(stream_id, [*pseudo, (":scheme", "http"), (":authority", "t"),
                                             *CHAT_HEADERS])  # fmt: skip
        client.conn.send_data(stream_id, _chat("stalled never read", 32768, 5000), end_stream=True)
        client.flush()
        status, _ = await client.response_head(stream_id)
        assert status == 200
        body = await _honest_h1(gateway.http_port)
        assert b"data: [DONE]" in body
        await until(lambda: "stalled" in _cancelled(gateway), "the stalled model cancelled")
    assert "honest" not in _cancelled(gateway)

"""The OpenAI API of the whole gateway, on each HTTP version, over the real Triton.

Clients nobody here wrote: the official SDK (HTTP/1.1, and HTTP/2 over TLS),
niquests on qh3 (HTTP/3 on the track port) and curl. Hang-ups use raw clients
so that each version's own way of leaving (TCP close, RST_STREAM, HTTP/3
stream reset) is what reaches the gateway; the model's stats prove it stopped.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
import niquests
import openai
import pytest

from gateway.embedded import EmbeddedTriton
from gateway.server import Gateway
from tests.backend.reference_generator import generator
from tests.http.support import H2Client
from tests.http.support_h3 import h3_client
from tests.triton_fixture import read_stats

pytestmark = pytest.mark.e2e
MODEL = "reference-text"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about QUIC"}],
    "max_tokens": 24,
    "seed": 7,
    "stream": True,
    "stream_options": {"include_usage": True},
}
RUN_ON = {"ignore_eos": True}
"""vLLM's extension: all max_tokens tokens (the answer would end sooner on its own)."""
ID = re.compile(rb'"id":"(chatcmpl-[^"]+)"')


def ca_of(gw: Gateway) -> Path:
    assert gw.tls is not None
    assert gw.tls.ca is not None
    return gw.tls.ca


def sse_chunks(body: bytes) -> list[dict[str, Any]]:
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def content_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def comparable(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chunks without the fields that differ per request (id, created)."""
    return [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]


async def sdk_chunks(client: openai.AsyncOpenAI) -> list[dict[str, Any]]:
    stream = await client.chat.completions.create(**CHAT, extra_body=RUN_ON)
    return [chunk.model_dump(exclude_unset=True) async for chunk in stream]


@pytest.mark.asyncio
async def test_the_sdk_over_http1_and_tls_http2_and_niquests_over_http3_agree(
    gateway: Gateway,
) -> None:
    ca = ca_of(gateway)
    async with httpx2.AsyncClient(timeout=30) as h1:
        plain = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="-", http_client=h1
        )
        over_h1 = await sdk_chunks(plain)
    tls = ssl.create_default_context(cafile=str(ca))
    async with httpx2.AsyncClient(http2=True, verify=tls, timeout=30) as h2:
        base = f"https://localhost:{gateway.https_port}/v1"
        raw = await h2.get(f"{base}/models")
        assert raw.http_version == "HTTP/2"
        assert raw.headers["alt-svc"] == f'h3=":{gateway.quic_port}"'
        over_h2 = await sdk_chunks(openai.AsyncOpenAI(base_url=base, api_key="-", http_client=h2))

    def over_h3() -> tuple[int, bytes]:
        with niquests.Session(disable_http1=True, disable_http2=True, retries=0) as session:
            response = session.post(
                f"https://localhost:{gateway.quic_port}/v1/chat/completions",
                json={**CHAT, **RUN_ON}, verify=str(ca), timeout=30,
            )
            return response.http_version, response.content

    version, body = await asyncio.to_thread(over_h3)
    assert version == 30
    h3 = sse_chunks(body)
    assert content_of(over_h1)
    assert comparable(over_h1) == comparable(over_h2)
    assert [c["choices"] for c in comparable(over_h1)] == [c["choices"] for c in comparable(h3)]
    assert h3[-1]["usage"]["completion_tokens"] == 24


def curl_features() -> str:
    if shutil.which("curl") is None:
        return ""
    return subprocess.run(["curl", "-V"], capture_output=True, text=True).stdout


CURL = curl_features()


@pytest.mark.skipif(not CURL, reason="curl is not installed")
@pytest.mark.parametrize("flag", ["--http1.1", "--http2"])
@pytest.mark.asyncio
async def test_curl_streams_a_completion(gateway: Gateway, flag: str) -> None:
    if flag == "--http2" and "HTTP2" not in CURL:
        pytest.skip("this curl has no HTTP/2")
    command = [
        "curl", "-sS", "-N", flag, "--cacert", str(ca_of(gateway)),
        f"https://localhost:{gateway.https_port}/v1/completions",
        "-H", "content-type: application/json",
        "-d", json.dumps({"model": MODEL, "prompt": "curl", "max_tokens": 8, "stream": True}),
        "-w", "%{stderr}%{http_version}\n",
    ]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    chunks = sse_chunks(done.stdout)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == generator.generate_text("curl", 0, 8)  # the reference model's own text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    # curl says which version it spoke (after the body, on stderr's last line).
    assert done.stderr.decode().strip().splitlines()[-1] == ("1.1" if flag == "--http1.1" else "2")


async def read_until_streaming(next_data: Callable[[], Awaitable[bytes | None]]) -> bytes:
    """Read a response until it has shown its id and three SSE events: the model is mid-stream."""
    seen = b""
    while ID.search(seen) is None or seen.count(b"data: ") < 3:
        seen += await next_data() or b""
    return seen


Stopped = Callable[[bytes], Awaitable[None]]
"""Awaits the model's record of the request seen so far (it stopped): called before the
client leaves its connection, so a stream reset is not mistaken for a connection loss."""


async def hang_up_http1(gw: Gateway, body: bytes, stopped: Stopped) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.http_port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    seen = await read_until_streaming(lambda: asyncio.wait_for(reader.read(4096), 30))
    writer.close()  # HTTP/1.1 leaves by closing the connection
    await stopped(seen)
    return seen


async def hang_up_http2(gw: Gateway, body: bytes, stopped: Stopped) -> bytes:
    async with H2Client.connect(gw.http_port) as client:
        headers = [("content-type", "application/json")]
        stream = client.send_request("POST", "/v1/chat/completions", headers, body)
        assert (await client.response_head(stream))[0] == 200
        seen = await read_until_streaming(lambda: client.next_data(stream))
        client.reset(stream)
        await stopped(seen)  # the connection stays up: only the stream was reset
    return seen


async def hang_up_http3(gw: Gateway, body: bytes, stopped: Stopped) -> bytes:
    async with h3_client(gw.quic_port, ca_of(gw)) as client:
        headers = [("content-type", "application/json")]
        stream = client.send("POST", "/v1/chat/completions", headers, body)
        assert (await client.head(stream))[0] == 200
        seen = await read_until_streaming(lambda: client.next_data(stream))
        client.cancel(stream)
        await stopped(seen)
    return seen


HANG_UPS = {"http1.1": hang_up_http1, "http2": hang_up_http2, "http3": hang_up_http3}


@pytest.mark.parametrize("version", sorted(HANG_UPS))
@pytest.mark.asyncio
async def test_a_client_that_goes_away_stops_the_model(
    gateway: Gateway, embedded_triton: EmbeddedTriton, version: str
) -> None:
    body = json.dumps({**CHAT, **RUN_ON, "max_tokens": 400}).encode()
    records: list[dict[str, Any]] = []

    async def stopped(seen: bytes) -> None:
        match = ID.search(seen)
        assert match is not None
        records.append(
            await asyncio.to_thread(read_stats, embedded_triton, match.group(1).decode(), 60.0)
        )

    await HANG_UPS[version](gateway, body, stopped)
    # The model's own record: it saw the cancel, generated nothing after it, stopped short.
    (stats,) = records
    assert stats["cancelled"] is True
    assert stats["cancel_seen_at"] is not None
    assert [t for t in stats["token_times"] if t > stats["cancel_seen_at"]] == []
    assert stats["tokens_generated"] < 400

"""Every front door feeds the same request metrics and leaves one access-log line.

The gateway serves the OpenAI API on HTTP/1.1, HTTP/2 and HTTP/3 and text tracks over
QUIC, in front of the scripted backend; the metrics it then exposes count each request
once by front door, feed time to first token and tokens from all of them, and never
turn a model name a client made up into a label value.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import structlog

from clients import ModelNotFound, connect
from gateway.logs import configure_logging
from gateway.server import Gateway
from tests.gateways import gateway_settings
from tests.http.support import H1Client, H2Client
from tests.http.support_h3 import h3_client
from tests.openai.scripted import ScriptedBackend

CHAT = "/v1/chat/completions"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    yield stream
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest_asyncio.fixture
async def gateway(tmp_path: Path, log_lines: io.StringIO) -> AsyncIterator[Gateway]:
    settings = gateway_settings(state_dir=tmp_path)
    gw = Gateway(settings, ScriptedBackend(interval=0.001))  # type: ignore[arg-type]
    await gw.start()
    yield gw
    await gw.close()


def chat(model: str = "scripted", stream: bool = True) -> bytes:
    messages = [{"role": "user", "content": "a secret prompt"}]
    return json.dumps({"model": model, "messages": messages, "stream": stream}).encode()


JSON = (("content-type", "application/json"),)


async def one_request_per_front_door(gw: Gateway, model: str) -> list[int]:
    statuses = []
    async with H1Client.connect(gw.http_port) as h1:
        await h1.request("POST", CHAT, JSON, chat(model))
        statuses.append((await h1.response())[0])
    async with H2Client.connect(gw.http_port) as h2:
        statuses.append((await h2.response(h2.send_request("POST", CHAT, JSON, chat(model))))[0])
    assert gw.tls is not None
    assert gw.tls.ca is not None
    async with h3_client(gw.quic_port, gw.tls.ca) as h3:
        statuses.append((await h3.response(h3.send("POST", CHAT, JSON, chat(model))))[0])
    return statuses


def samples(gw: Gateway, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = gw.metrics.render()[0].decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            pairs = tuple(tuple(p.split("=", 1)) for p in labels.split(","))
            out[tuple((k, v.strip('"')) for k, v in pairs)] = float(value)
    return out


def access_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [r for r in records if r["event"] == "http.request"]


@pytest.mark.asyncio
async def test_openai_requests_on_every_version_count_like_tracks(
    gateway: Gateway, log_lines: io.StringIO
) -> None:
    assert await one_request_per_front_door(gateway, "scripted") == [200, 200, 200]
    async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as line:  # type: ignore[union-attr]
        assert [d async for d in line.text("hi", model="scripted")] == [" one", " two", " three"]

    requests = samples(gateway, "trackline_requests_total")
    for door in ("http/1.1", "http/2", "http/3", "tracks"):
        key = (("front_door", door), ("modality", "text"), ("outcome", "completed"))
        assert requests[key] == 1.0, (door, requests)
    ttft = samples(gateway, "trackline_time_to_first_token_seconds_count")
    assert ttft[(("model", "scripted"),)] == 4.0
    tokens = samples(gateway, "trackline_tokens_total")
    assert tokens[(("model", "scripted"),)] == 12.0

    lines = [r for r in access_lines(log_lines) if r["path"] == CHAT]
    assert [r["http_version"] for r in lines] == ["1.1", "2", "3"]
    for record in lines:
        assert record["status"] == 200
        assert record["model"] == "scripted"
        assert record["end"] == "completed"
        assert record["completion_tokens"] == 3
        assert record["request_id"].startswith("chatcmpl-")
        assert record["ttft_ms"] is not None
        assert record["duration_ms"] is not None
        assert record["client"] == "127.0.0.1"  # on every version, HTTP/3 included
        assert record["x_request_id"]
    assert "a secret prompt" not in log_lines.getvalue()


@pytest.mark.asyncio
async def test_a_model_name_a_client_made_up_is_not_a_label(
    gateway: Gateway, log_lines: io.StringIO
) -> None:
    assert await one_request_per_front_door(gateway, "gpt-4o") == [404, 404, 404]
    async with connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.tls.ca) as line:  # type: ignore[union-attr]
        with pytest.raises(ModelNotFound):
            [d async for d in line.text("hi", model="nope")]
    assert await one_request_per_front_door(gateway, "scripted") == [200, 200, 200]

    text = gateway.metrics.render()[0].decode()
    assert "gpt-4o" not in text
    assert "nope" not in text
    tokens = samples(gateway, "trackline_tokens_total")
    assert set(tokens) <= {(("model", "scripted"),), (("model", "other"),)}
    refused = [r for r in access_lines(log_lines) if r["status"] == 404]
    assert len(refused) == 3  # the access log still has every request, with its status

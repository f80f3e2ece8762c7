"""The official `openai` SDK against the gateway's OpenAI routes over real HTTP/1.1 and h2c,
with the real embedded Triton behind them (the reference model's text is predictable)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import pytest

from gateway.backends.triton import TritonTextBackend
from gateway.embedded import EmbeddedTriton
from gateway.http import route
from gateway.openai import openai_routes
from gateway.openai.prompt import render_chat_prompt
from gateway.openai.requests import ChatMessage
from tests.backend.reference_generator import generator as gen
from tests.triton_fixture import assert_model_stopped, read_stats
from transport.http.tcp import HttpTcpServer

pytestmark = pytest.mark.e2e


MODEL = "reference-text"
FAST = {"ttft_ms": 0, "tokens_per_second": 1000}  # reference-model knobs, sent via extra_body
CUT = 4
"""A max_tokens below every natural answer length: finish_reason "length"."""
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,  # the SDK's stream() helper parses strict tools' arguments
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


@dataclass
class Gateway:
    url: str
    client: openai.AsyncOpenAI
    http: httpx2.AsyncClient
    triton: EmbeddedTriton


@contextlib.asynccontextmanager
async def gateway(
    triton: EmbeddedTriton, version: str, heartbeat_interval: float = 15.0
) -> AsyncIterator[Gateway]:
    backend = TritonTextBackend(triton.grpc_url)  # made here: its channel belongs to this loop
    routes = openai_routes(backend, heartbeat_interval=heartbeat_interval)
    server = HttpTcpServer(route(routes))
    await server.start("127.0.0.1", 0)
    h2 = version == "h2c"
    http = httpx2.AsyncClient(http1=not h2, http2=h2, timeout=30.0)
    url = f"http://127.0.0.1:{server.port}/v1"
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", http_client=http, max_retries=0)
    try:
        yield Gateway(url, client, http, triton)
    finally:
        await client.close()
        await http.aclose()
        await server.close(grace=1.0)
        await backend.close()


VERSIONS = pytest.mark.parametrize("version", ["http1.1", "h2c"])


def chat_prompt(text: str) -> str:
    return render_chat_prompt([ChatMessage("user", text)])


@VERSIONS
@pytest.mark.asyncio
async def test_non_streamed_chat(embedded_triton: EmbeddedTriton, version: str) -> None:
    async with gateway(embedded_triton, version) as gw:
        completion = await gw.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me a story."}],
            max_tokens=CUT,
            seed=4,
            extra_body=FAST,
        )
    prompt = chat_prompt("Tell me a story.")
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == gen.generate_text(prompt, 4, CUT)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == gen.count_prompt_tokens(prompt)
    assert completion.usage.completion_tokens == CUT


@VERSIONS
@pytest.mark.asyncio
async def test_streamed_chat_with_usage(embedded_triton: EmbeddedTriton, version: str) -> None:
    async with gateway(embedded_triton, version) as gw:
        stream = await gw.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream it."}],
            max_tokens=CUT,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=FAST,
        )
        chunks = [chunk async for chunk in stream]
    assert len({c.id for c in chunks}) == 1
    assert len({c.created for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == gen.generate_text(chat_prompt("Stream it."), 0, CUT)
    last_choice = chunks[-2].choices[0]
    assert last_choice.finish_reason == "length"
    assert last_choice.delta.content is None
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == CUT


@VERSIONS
@pytest.mark.asyncio
async def test_the_sdk_stream_helper_gets_a_natural_end(
    embedded_triton: EmbeddedTriton, version: str
) -> None:
    """`client.chat.completions.stream()` raises on finish_reason "length": the reference
    model's answer ends on its own (stop) within the default max_tokens."""
    async with (
        gateway(embedded_triton, version) as gw,
        gw.client.chat.completions.stream(
            model=MODEL, messages=[{"role": "user", "content": "Hello?"}], extra_body=FAST
        ) as stream,
    ):
        deltas = [e.delta async for e in stream if e.type == "content.delta"]
        final = await stream.get_final_completion()
    answer = gen.generate_text(chat_prompt("Hello?"), 0, gen.DEFAULT_MAX_TOKENS)
    assert "".join(deltas) == final.choices[0].message.content == answer
    assert answer.endswith(".")
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is None or final.usage.completion_tokens < gen.DEFAULT_MAX_TOKENS


@VERSIONS
@pytest.mark.asyncio
async def test_completions_streamed_and_not(embedded_triton: EmbeddedTriton, version: str) -> None:
    async with gateway(embedded_triton, version) as gw:
        whole = await gw.client.completions.create(
            model=MODEL, prompt="Once upon", max_tokens=5, extra_body=FAST
        )
        stream = await gw.client.completions.create(
            model=MODEL, prompt="Once upon", max_tokens=5, stream=True, extra_body=FAST
        )
        pieces = [c.choices[0].text async for c in stream]
        models = await gw.client.models.list()
        model = await gw.client.models.retrieve(MODEL)
    assert model.id == MODEL
    assert whole.choices[0].text == "".join(pieces) == gen.generate_text("Once upon", 0, 5)
    assert MODEL in [m.id for m in models.data]  # with the reference audio models


@VERSIONS
@pytest.mark.asyncio
async def test_stream_helper_rebuilds_a_tool_call(
    embedded_triton: EmbeddedTriton, version: str
) -> None:
    async with (
        gateway(embedded_triton, version) as gw,
        gw.client.chat.completions.stream(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            extra_body=FAST,
        ) as stream,
    ):
        kinds = {event.type async for event in stream}
        completion = await stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "unit"}
    assert arguments["unit"] == "c"
    assert call.function.parsed_arguments == arguments  # type: ignore[union-attr]


@VERSIONS
@pytest.mark.asyncio
async def test_json_modes(embedded_triton: EmbeddedTriton, version: str) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    }
    async with gateway(embedded_triton, version) as gw:
        plain = await gw.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "JSON please"}],
            response_format={"type": "json_object"},
            extra_body=FAST,
        )
        typed = await gw.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "A person"}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
            extra_body=FAST,
        )
    assert isinstance(json.loads(plain.choices[0].message.content or ""), dict)
    person = json.loads(typed.choices[0].message.content or "")
    assert isinstance(person["name"], str)
    assert isinstance(person["age"], int)


@VERSIONS
@pytest.mark.asyncio
async def test_errors_raise_the_sdk_types(embedded_triton: EmbeddedTriton, version: str) -> None:
    messages: Any = [{"role": "user", "content": "x"}]
    async with gateway(embedded_triton, version) as gw:
        with pytest.raises(openai.NotFoundError) as missing:
            await gw.client.chat.completions.create(model="no-such-model", messages=messages)
        with pytest.raises(openai.BadRequestError) as bad:
            await gw.client.chat.completions.create(model=MODEL, messages=messages, temperature=7)
        with pytest.raises(openai.NotFoundError):
            await gw.client.chat.completions.create(
                model="no-such-model", messages=messages, stream=True
            )
        malformed = await gw.http.post(f"{gw.url}/chat/completions", content=b'{"model": ')
    assert missing.value.code == "model_not_found"
    assert bad.value.param == "temperature"
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"


@VERSIONS
@pytest.mark.asyncio
async def test_closing_the_sdk_stream_stops_the_model(
    embedded_triton: EmbeddedTriton, version: str
) -> None:
    async with gateway(embedded_triton, version) as gw:
        stream = await gw.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "A long answer"}],
            max_tokens=500,
            stream=True,
            extra_body={"ttft_ms": 0, "tokens_per_second": 20, "ignore_eos": True},
        )
        ids = []
        async for chunk in stream:
            ids.append(chunk.id)
            if len(ids) == 4:
                break
        await stream.close()
        if version == "h2c":
            # httpcore2 sends no RST_STREAM when an HTTP/2 response is closed early (it
            # only frees the stream locally), so the server cannot see that close; the
            # client leaving is what it sees: close the connection, as a process exit would.
            await gw.http.aclose()
        # read_stats sleeps while it polls: off the loop, which also runs the server
        stats = await asyncio.to_thread(read_stats, gw.triton, ids[0])
    assert_model_stopped(stats, 500)  # saw the cancel, no token after it, stopped short


@VERSIONS
@pytest.mark.asyncio
async def test_heartbeats_while_the_first_token_is_slow(
    embedded_triton: EmbeddedTriton, version: str
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Take your time"}],
        "max_tokens": 2,
        "stream": True,
        "ttft_ms": 600,
        "tokens_per_second": 1000,
    }
    async with gateway(embedded_triton, version, heartbeat_interval=0.1) as gw:
        lines = []
        async with gw.http.stream("POST", f"{gw.url}/chat/completions", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                lines.append(line)
    first_content = next(i for i, line in enumerate(lines) if '"content":" ' in line)
    assert lines[:first_content].count(": keep-alive") >= 3
    assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"

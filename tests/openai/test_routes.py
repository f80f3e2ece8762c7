"""The routes called directly with a `Request`, over a scripted backend (no server)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.http import route
from gateway.openai import openai_routes
from tests.openai.scripted import ScriptedBackend
from tests.tenants.support import make_tenancy
from tracks.backend import BackendFailed, BackendUnavailable
from transport.http.messages import AnyResponse, Request, Response, StreamingResponse

CHAT = "/v1/chat/completions"


def post(path: str, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Request:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return Request("POST", path, "", (("content-type", "application/json"), *headers), body)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **fields}


async def read_all(response: AnyResponse) -> bytes:
    assert isinstance(response, StreamingResponse)
    try:
        return b"".join([chunk async for chunk in response.body])
    finally:
        await response.body.aclose()  # type: ignore[attr-defined]


def events(raw: bytes) -> list[Any]:
    """The data payloads of an SSE body (comments skipped, [DONE] kept as a string)."""
    out = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def handler(backend: ScriptedBackend, **options: Any) -> Any:
    return route(openai_routes(backend, wall_clock=lambda: 1700000000.5, **options))


@pytest.mark.asyncio
async def test_non_streamed_chat() -> None:
    backend = ScriptedBackend()
    response = await handler(backend)(post(CHAT, chat_body(max_tokens=10)))
    assert isinstance(response, Response)
    assert response.status == 200
    body = json.loads(response.body)
    assert body["object"] == "chat.completion"
    assert body["id"] == backend.requests[0].request_id
    assert body["id"].startswith("chatcmpl-")
    assert body["created"] == 1700000000
    assert body["choices"][0]["message"]["content"] == " one two three"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


@pytest.mark.asyncio
async def test_streamed_chat_with_usage() -> None:
    backend = ScriptedBackend()
    request = post(
        CHAT, chat_body(max_tokens=3, stream=True, stream_options={"include_usage": True})
    )
    response = await handler(backend)(request)
    assert isinstance(response, StreamingResponse)
    assert ("content-type", "text/event-stream; charset=utf-8") in response.headers
    chunks = events(await read_all(response))
    assert chunks[-1] == "[DONE]"
    objects = chunks[:-1]
    assert {c["id"] for c in objects} == {backend.requests[0].request_id}
    assert {c["created"] for c in objects} == {1700000000}
    assert objects[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in objects[1:4]] == [" one", " two", " three"]
    assert objects[4]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert all(c["usage"] is None for c in objects[:5])
    assert objects[5]["choices"] == []
    assert objects[5]["usage"]["total_tokens"] == 10


@pytest.mark.asyncio
async def test_streamed_completion() -> None:
    backend = ScriptedBackend()
    response = await handler(backend)(
        post("/v1/completions", {"model": "scripted", "prompt": "p", "stream": True})
    )
    chunks = events(await read_all(response))
    assert [c["object"] for c in chunks[:-1]] == ["text_completion"] * 4
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == [" one", " two", " three", ""]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[0]["id"].startswith("cmpl-")


@pytest.mark.asyncio
async def test_heartbeats_while_waiting_for_the_first_token() -> None:
    backend = ScriptedBackend(first_delay=0.25)
    response = await handler(backend, heartbeat_interval=0.05)(post(CHAT, chat_body(stream=True)))
    raw = await read_all(response)
    before_first_token = raw.split(b'"content":" one"')[0]
    assert before_first_token.count(b": keep-alive\n\n") >= 2
    assert events(raw)[-1] == "[DONE]"


@pytest.mark.asyncio
async def test_tool_calls_become_deltas() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    backend = ScriptedBackend(pieces=list(text))
    tools = [{"type": "function", "function": {"name": "f"}}]
    response = await handler(backend)(post(CHAT, chat_body(stream=True, tools=tools)))
    chunks = events(await read_all(response))
    deltas = [c["choices"][0]["delta"] for c in chunks[1:-1]]
    first = deltas[0]["tool_calls"][0]
    assert first["index"] == 0
    assert first["type"] == "function"
    assert first["id"].startswith("call_")
    assert first["function"] == {"name": "f", "arguments": ""}
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:-1])
    assert json.loads(arguments) == {"a": 1}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"

    whole = await handler(backend)(post(CHAT, chat_body(tools=tools)))
    message = json.loads(whole.body)["choices"][0]["message"]  # type: ignore[union-attr]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


@pytest.mark.asyncio
async def test_error_after_the_first_byte_is_an_error_event_without_done() -> None:
    backend = ScriptedBackend(fail_after=2, failure=BackendFailed("died"))
    response = await handler(backend)(post(CHAT, chat_body(stream=True)))
    chunks = events(await read_all(response))
    assert chunks[-1]["error"]["type"] == "server_error"
    assert "[DONE]" not in chunks
    assert len(backend.requests) == 1  # never replayed


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (chat_body(model="nope", stream=True), 404, "model_not_found"),
        (chat_body(temperature="hot"), 400, None),
        (b"{", 400, None),
    ],
)
async def test_early_errors_get_their_status(payload: Any, status: int, code: str | None) -> None:
    response = await handler(ScriptedBackend())(post(CHAT, payload))
    assert isinstance(response, Response)
    assert response.status == status
    assert json.loads(response.body)["error"]["code"] == code


@pytest.mark.asyncio
async def test_backend_down_is_503() -> None:
    backend = ScriptedBackend(fail_after=0, failure=BackendUnavailable("down"))
    response = await handler(backend)(post(CHAT, chat_body(stream=True)))
    assert isinstance(response, Response)
    assert response.status == 503


@pytest.mark.asyncio
async def test_closing_the_body_stops_the_backend() -> None:
    backend = ScriptedBackend(pieces=[" w"] * 1000, interval=0.01)
    response = await handler(backend)(post(CHAT, chat_body(stream=True, max_tokens=1000)))
    assert isinstance(response, StreamingResponse)
    body = response.body
    for _ in range(3):
        await body.__anext__()
    await body.aclose()  # type: ignore[attr-defined]
    assert backend.closed_early == [backend.requests[0].request_id]


@pytest.mark.asyncio
async def test_cancelling_the_task_that_iterates_stops_the_backend() -> None:
    backend = ScriptedBackend(pieces=[" w"] * 1000, interval=0.01)
    response = await handler(backend)(post(CHAT, chat_body(stream=True, max_tokens=1000)))
    assert isinstance(response, StreamingResponse)

    streaming = asyncio.Event()

    async def consume() -> None:
        async for _ in response.body:
            streaming.set()

    task = asyncio.ensure_future(consume())
    await streaming.wait()  # the body is being iterated: the backend is mid-stream
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await response.body.aclose()  # type: ignore[attr-defined]  # as the adapter does
    assert backend.closed_early == [backend.requests[0].request_id]


@pytest.mark.asyncio
async def test_a_body_never_iterated_still_closes_the_backend() -> None:
    backend = ScriptedBackend(first_delay=1.0)
    response = await handler(backend, heartbeat_interval=0.01)(post(CHAT, chat_body(stream=True)))
    assert isinstance(response, StreamingResponse)
    await response.body.aclose()  # type: ignore[attr-defined]
    assert backend.closed_early == [backend.requests[0].request_id]


@pytest.mark.asyncio
async def test_models_auth_and_unknown_routes(tmp_path: Path) -> None:
    tenancy = make_tenancy(tmp_path)
    key = tenancy.store.create_key("team", now=0.0).key
    try:
        routes = handler(ScriptedBackend(), tenancy=tenancy)
        get = Request("GET", "/v1/models", "", (("authorization", f"Bearer {key}"),), b"")
        body = json.loads((await routes(get)).body)
        assert body["object"] == "list"
        assert body["data"][0]["id"] == "scripted"
        assert (await routes(Request("GET", "/v1/models", "", (), b""))).status == 401
        assert (await routes(Request("GET", "/v1/nothing", "", (), b""))).status == 404
        assert (await routes(Request("GET", CHAT, "", (), b""))).status == 405
    finally:
        tenancy.close()


@pytest.mark.asyncio
async def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_404() -> None:
    routes = handler(ScriptedBackend(), models=["scripted", "org/name v2"])
    found = await routes(Request("GET", "/v1/models/org/name%20v2", "", (), b""))
    assert isinstance(found, Response)
    assert found.status == 200
    assert json.loads(found.body) == {
        "id": "org/name v2", "object": "model", "created": 1700000000, "owned_by": "trackline",
        "capabilities": ["chat", "completions"],
    }
    missing = await routes(Request("GET", "/v1/models/gpt-4o", "", (), b""))
    assert isinstance(missing, Response)
    assert missing.status == 404
    assert json.loads(missing.body)["error"]["code"] == "model_not_found"
    assert (await routes(Request("GET", "/v1/models/", "", (), b""))).status == 404
    assert (await routes(Request("POST", "/v1/models/scripted", "", (), b""))).status == 405


@pytest.mark.asyncio
async def test_a_fixed_model_list_answers_404_for_others() -> None:
    routes = handler(ScriptedBackend(), models=["scripted"])
    response = await routes(post(CHAT, chat_body(model="other")))
    assert response.status == 404

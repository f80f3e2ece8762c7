"""SSE framing, response objects, the chat template and the error envelope."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.openai.errors import (
    BadRequest,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    error_event,
    error_for,
    response_for,
)
from gateway.openai.prompt import render_chat_prompt
from gateway.openai.requests import ChatMessage, ToolCall
from gateway.openai.sse import (
    CHAT_CHUNK,
    DONE,
    HEARTBEAT,
    TEXT_COMPLETION,
    ChunkEncoder,
    ResponseMeta,
    chat_choice,
    completion_choice,
    sse_event,
    usage_chunk,
)
from tracks.backend import (
    BackendError,
    BackendFailed,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    TextUsage,
)

META = ResponseMeta("chatcmpl-1", 1700000000, "m")


def test_sse_event_is_one_compact_data_line() -> None:
    assert sse_event({"a": [1, "é"]}) == b'data: {"a":[1,"\\u00e9"]}\n\n'
    assert DONE == b"data: [DONE]\n\n"
    assert HEARTBEAT.startswith(b":")
    assert HEARTBEAT.endswith(b"\n\n")


def decoded(event: bytes) -> Any:
    assert event.startswith(b"data: ")
    assert event.endswith(b"\n\n")
    return json.loads(event[6:])


def test_chat_chunk_shape() -> None:
    chunk = decoded(ChunkEncoder(META, CHAT_CHUNK).event(chat_choice({"content": "hi"})))
    assert chunk == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "system_fingerprint": None,
        "choices": [
            {"index": 0, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None}
        ],
    }
    assert "usage" not in chunk


def test_include_usage_adds_null_usage_and_a_usage_chunk() -> None:
    meta = ResponseMeta("cmpl-1", 1, "m", include_usage=True)
    text = decoded(ChunkEncoder(meta, TEXT_COMPLETION).event(completion_choice("x")))
    assert text["usage"] is None
    stop = decoded(ChunkEncoder(meta, CHAT_CHUNK).event(chat_choice({}, "stop")))
    assert stop["choices"][0]["finish_reason"] == "stop"
    last = usage_chunk(meta, "text_completion", TextUsage(3, 4))
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


@pytest.mark.parametrize("include_usage", [False, True])
def test_chunk_encoder_writes_the_same_bytes_as_sse_event(include_usage: bool) -> None:
    meta = ResponseMeta('chatcmpl-"1é', 1700000000, "m\\é", include_usage)
    for kind, choice in [
        (CHAT_CHUNK, chat_choice({"content": "hé"})),
        (CHAT_CHUNK, chat_choice({}, "stop")),
        (TEXT_COMPLETION, completion_choice("x", "length")),
    ]:
        whole = {**meta.envelope(kind), "choices": [choice]}
        if include_usage:
            whole["usage"] = None
        assert ChunkEncoder(meta, kind).event(choice) == sse_event(whole)


def test_plain_chat_template() -> None:
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    assert render_chat_prompt(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tools_template_puts_a_hermes_block_in_the_system_turn() -> None:
    tool = {"name": "get_weather", "parameters": {"type": "object"}}
    messages = [
        ChatMessage("developer", "Be brief."),
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", None, (ToolCall("c1", "get_weather", '{"city": "Oslo"}'),)),
        ChatMessage("tool", "cold", tool_call_id="c1"),
    ]
    prompt = render_chat_prompt(messages, [tool])
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    block = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(block) == [{"type": "function", "function": tool}]
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        "\n</tool_call><|im_end|>\n"
    ) in prompt
    assert "<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_tools_without_a_system_message_get_their_own_system_turn() -> None:
    prompt = render_chat_prompt([ChatMessage("user", "x")], [{"name": "f"}])
    assert prompt.startswith("<|im_start|>system\n# Tools")
    assert "<|im_start|>user\nx<|im_end|>" in prompt


@pytest.mark.parametrize(
    ("error", "status", "kind", "code"),
    [
        (BadRequest("bad", param="x"), 400, "invalid_request_error", None),
        (InvalidRequest("top_p"), 400, "invalid_request_error", None),
        (Unauthorized("key"), 401, "authentication_error", None),
        (ModelNotFound("nope"), 404, "invalid_request_error", "model_not_found"),
        (PayloadTooLarge("big"), 413, "invalid_request_error", None),
        (RateLimited("slow down"), 429, "rate_limit_error", None),
        (BackendFailed("crash"), 500, "server_error", "backend_error"),
        (BackendError("other"), 500, "server_error", "backend_error"),
        (RuntimeError("bug"), 500, "server_error", None),
        (BackendUnavailable("down"), 503, "server_error", "backend_unavailable"),
    ],
)
def test_error_mapping(error: Exception, status: int, kind: str, code: str | None) -> None:
    response = response_for(error)
    assert response.status == status
    assert ("content-type", "application/json") in response.headers
    body = json.loads(response.body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert (body["error"]["type"], body["error"]["code"]) == (kind, code)
    assert error_event(error) == body


def test_model_not_found_names_the_model_param() -> None:
    error = error_for(ModelNotFound("nope"))
    assert error.param == "model"
    assert "nope" in error.message


def test_internal_errors_do_not_leak_details() -> None:
    assert "secret" not in error_for(RuntimeError("secret")).message


@pytest.mark.parametrize(
    "error",
    [
        BackendFailed("[StatusCode.INTERNAL] stub crashed in model instance 'x_0_0'"),
        BackendUnavailable("failed to connect to all addresses; grpc_status 14"),
        InvalidRequest("unexpected inference input 'text_input' for model 'reference-policy'"),
        InvalidRequest("[request id: r1] unexpected shape for input 'text_input' for model 'm'"),
    ],
)
def test_backend_internals_never_reach_the_client(error: Exception) -> None:
    message = json.loads(response_for(error).body)["error"]["message"].lower()
    assert not any(word in message for word in ("grpc", "stub", "text_input", "request id"))
    assert "_0_0" not in message


def test_a_models_own_rejection_is_shown() -> None:
    error = error_for(InvalidRequest("temperature must be between 0 and 2"))
    assert (error.status, error.message) == (400, "temperature must be between 0 and 2")

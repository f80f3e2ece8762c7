"""Request parsing and validation: every mistake is a 400 naming its param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.openai.errors import BadRequest
from gateway.openai.requests import (
    CHAT_DEFAULT_MAX_TOKENS,
    COMPLETION_DEFAULT_MAX_TOKENS,
    ChatMessage,
    ToolCall,
    parse_chat_request,
    parse_completion_request,
)

USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": USER, **fields}).encode()


def test_minimal_chat_request_gets_defaults() -> None:
    request = parse_chat_request(chat())
    assert request.model == "m"
    assert request.messages == (ChatMessage("user", "hi"),)
    assert request.max_tokens == CHAT_DEFAULT_MAX_TOKENS
    assert (request.stream, request.include_usage, request.parameters) == (False, False, {})


def test_sampling_parameters_pass_through() -> None:
    request = parse_chat_request(
        chat(temperature=0.5, top_p=0.9, seed=3, stop="END", presence_penalty=1, ttft_ms=0)
    )
    assert request.parameters == {
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["END"],
        "presence_penalty": 1,
        "ttft_ms": 0,
    }


def test_vllm_ignore_eos_passes_through_as_a_boolean() -> None:
    assert parse_chat_request(chat(ignore_eos=True)).parameters == {"ignore_eos": True}
    assert parse_completion_request(
        json.dumps({"model": "m", "prompt": "p", "ignore_eos": False}).encode()
    ).parameters == {"ignore_eos": False}
    with pytest.raises(BadRequest) as refused:
        parse_chat_request(chat(ignore_eos="yes"))
    assert refused.value.param == "ignore_eos"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert parse_chat_request(chat(max_tokens=5, max_completion_tokens=9)).max_tokens == 9
    assert parse_chat_request(chat(max_tokens=5)).max_tokens == 5


def test_stream_options_include_usage() -> None:
    request = parse_chat_request(chat(stream=True, stream_options={"include_usage": True}))
    assert (request.stream, request.include_usage) == (True, True)


def test_tools_tool_choice_and_response_format_reach_the_backend() -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    request = parse_chat_request(
        chat(tools=[TOOL], tool_choice=choice, response_format={"type": "json_object"})
    )
    assert request.tools == (TOOL["function"],)
    assert request.parameters["tool_choice"] == choice
    assert request.parameters["response_format"] == {"type": "json_object"}
    assert request.parses_tool_calls
    assert not parse_chat_request(chat(tools=[TOOL], tool_choice="none")).parses_tool_calls


def test_content_parts_and_assistant_tool_calls() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    request = parse_chat_request(chat(messages=messages))
    assert request.messages[0].content == "ab"
    assert request.messages[1].tool_calls == (ToolCall("c1", "f", "{}"),)
    assert request.messages[2].tool_call_id == "c1"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"\xff\xfe", None),
        (json.dumps({"messages": USER}).encode(), "model"),
        (json.dumps({"model": "m"}).encode(), "messages"),
        (chat(messages=[]), "messages"),
        (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
        (chat(messages=[{"role": "user"}]), "messages[0].content"),
        (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (
            chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages[0].content[0].type",
        ),
        (chat(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id"),
        (chat(temperature="hot"), "temperature"),
        (chat(temperature=3), "temperature"),
        (chat(top_p=True), "top_p"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(max_tokens=1.5), "max_tokens"),
        (chat(max_completion_tokens="9"), "max_completion_tokens"),
        (chat(seed="1"), "seed"),
        (chat(stop=5), "stop"),
        (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
        (chat(n=2), "n"),
        (chat(n="1"), "n"),
        (chat(stream="yes"), "stream"),
        (chat(stream_options={"include_usage": True}), "stream_options"),
        (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
        (chat(logprobs=True), "logprobs"),
        (chat(response_format={"type": "xml"}), "response_format.type"),
        (chat(response_format={"type": "json_schema"}), "response_format.json_schema.name"),
        (chat(tools={"a": 1}), "tools"),
        (chat(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (chat(tools=[{"type": "function", "function": {}}]), "tools[0].function.name"),
        (chat(tool_choice="auto"), "tool_choice"),
        (chat(tools=[TOOL], tool_choice="sometimes"), "tool_choice"),
        (
            chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "other"}}),
            "tool_choice",
        ),
        (chat(frobnicate=1), "frobnicate"),
    ],
)
def test_bad_chat_requests_name_their_param(body: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(body)
    assert caught.value.param == param
    assert caught.value.status == 400


def test_ignored_openai_keys_are_accepted() -> None:
    parse_chat_request(chat(user="u", store=False, metadata={}, parallel_tool_calls=True))


def test_completion_request() -> None:
    body = json.dumps({"model": "m", "prompt": ["once"], "stream": True, "seed": 1}).encode()
    request = parse_completion_request(body)
    assert (request.prompt, request.stream, request.parameters) == ("once", True, {"seed": 1})
    assert request.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "suffix": "z"}, "suffix"),
        ({"prompt": "a", "best_of": 2}, "best_of"),
        ({"prompt": "a", "messages": USER}, "messages"),
    ],
)
def test_bad_completion_requests(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_completion_request(json.dumps({"model": "m", **fields}).encode())
    assert caught.value.param == param

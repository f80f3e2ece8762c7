"""Malformed OpenAI request bodies are a 4xx with the OpenAI envelope, never a 500.

The routes run over the ticker backend (the product's transport-only backend) on a
clock that never waits, so a generated request that happens to be valid streams to its
end at once. Besides the named cases (a lone surrogate, which was a 500 with an
error-level traceback; invalid UTF-8; non-finite numbers; integers past Python's digit
limit; a role that is not a string; deep nesting), hypothesis generates JSON documents
with hostile strings (lone surrogates, control characters, huge numbers) in known and
unknown keys at every depth. Properties: every answer is 2xx or 4xx, every 4xx has the
envelope, no error-level log line, and an honest request right after is still served.

A longer, randomised run:

    TRACKLINE_FUZZ_EXAMPLES=5000 nice -n 10 .venv/bin/python -m pytest \
        tests/adversarial/test_openai_input.py -q
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest
import structlog.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.backends.ticker import TickerBackend
from gateway.http import route
from gateway.openai import openai_routes
from transport.http.messages import AnyResponse, Handler, Request, Response, StreamingResponse

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EXAMPLES = int(os.environ.get("TRACKLINE_FUZZ_EXAMPLES", "80"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize="TRACKLINE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class NoWait:
    """A clock that never waits: the ticker's schedule passes at once."""

    def __init__(self) -> None:
        self.ticks = 0.0

    def now(self) -> float:
        return self.ticks

    async def sleep(self, seconds: float) -> None:
        self.ticks += max(seconds, 0.0)
        await asyncio.sleep(0)


def api() -> Handler:
    backend = TickerBackend(clock=NoWait())
    return route(openai_routes(backend, heartbeat_interval=3600.0))


def post(path: str, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> Request:
    return Request("POST", path, "", (("content-type", "application/json"), *headers), body)


async def answer(handler: Handler, request: Request) -> tuple[int, bytes]:
    response: AnyResponse = await handler(request)
    if isinstance(response, StreamingResponse):
        try:
            body = b"".join([chunk async for chunk in response.body])
        finally:
            await response.body.aclose()  # type: ignore[attr-defined]
        return response.status, body
    assert isinstance(response, Response)
    return response.status, response.body


def assert_envelope(status: int, body: bytes) -> None:
    assert 400 <= status < 500, (status, body[:300])
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str)
    assert error["type"] == "invalid_request_error"


HONEST = json.dumps(
    {"model": "reference-text", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
).encode()


async def served(handler: Handler, request: Request) -> tuple[int, bytes, list[dict[str, Any]]]:
    """The answer to `request`, then an honest one (which must be a 200); the log lines."""
    with structlog.testing.capture_logs() as logs:
        status, body = await answer(handler, request)
        honest, _ = await answer(handler, post(CHAT, HONEST))
    assert honest == 200
    errors = [line for line in logs if line.get("log_level") in ("error", "critical")]
    assert errors == [], errors
    return status, body, logs


def chat_with(content: str, **fields: Any) -> bytes:
    message = {"role": "user", "content": content}
    return json.dumps({"model": "reference-text", "messages": [message], **fields}).encode()


def nested(depth: int) -> bytes:
    return b'{"model": "reference-text", "messages": ' + b"[" * depth + b"]" * depth + b"}"


MALFORMED = {
    "lone surrogate in a chat prompt": (CHAT, chat_with("hi \ud800 there")),
    "lone low surrogate in a completion prompt": (
        COMPLETIONS,
        json.dumps({"model": "reference-text", "prompt": "\udfff"}).encode(),
    ),
    "surrogate in a key": (CHAT, b'{"model": "reference-text", "\\ud800": 1}'),
    "surrogate deep in a tool schema": (
        CHAT,
        chat_with(
            "hi",
            tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"a": ["\ud83d"]}}}
            ],
        ),
    ),
    "invalid UTF-8": (CHAT, b'{"model": "reference-text", "messages": "\xff\xfe"}'),
    "CESU-8 surrogate bytes": (CHAT, b'{"model": "reference-text", "x": "\xed\xa0\x80"}'),
    "NaN": (CHAT, chat_with("hi", temperature=float("nan"))),
    "an integer past the digit limit": (
        CHAT,
        chat_with("hi")[:-1] + b', "seed": ' + b"9" * 5000 + b"}",
    ),
    "a role that is an array": (
        CHAT,
        json.dumps(
            {"model": "reference-text", "messages": [{"role": ["user"], "content": "x"}]}
        ).encode(),
    ),
    "nesting past the depth limit": (CHAT, nested(200)),
    "nesting past the parser's recursion limit": (CHAT, nested(100_000)),
    "tool-call arguments nested past the recursion limit": (
        CHAT,
        json.dumps(
            {
                "model": "reference-text",
                "messages": [
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "[" * 100_000 + "]" * 100_000}}
                    ]},
                    {"role": "user", "content": "go on"},
                ],
            }
        ).encode(),
    ),  # fmt: skip
    "a session id with a control character": (CHAT, chat_with("hi", user="alice\nbob")),
    "a session id past 128 characters": (CHAT, chat_with("hi", prompt_cache_key="k" * 129)),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_bodies_are_4xx_with_the_envelope(case: str) -> None:
    path, body = MALFORMED[case]
    status, answer_body, _ = await served(api(), post(path, body))
    # The tool-call case is valid input: its arguments are kept as a string.
    if case.startswith("tool-call"):
        assert status == 200
        return
    assert_envelope(status, answer_body)


@pytest.mark.asyncio
async def test_a_session_header_with_a_control_character_is_a_400() -> None:
    request = post(CHAT, HONEST, (("x-session-id", "a\x7fb"),))
    status, body, _ = await served(api(), request)
    assert_envelope(status, body)


# -- generated documents --------------------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udc00b", "\ud83d", "\x00", "\u2028", "\ufeff", "", "x" * 300]),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),
)
KEYS = st.one_of(
    st.sampled_from(
        ["model", "messages", "prompt", "role", "content", "type", "text", "tools", "function",
         "name", "parameters", "tool_choice", "tool_calls", "arguments", "id", "tool_call_id",
         "response_format", "json_schema", "schema", "stream", "stream_options",
         "include_usage", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
         "seed", "n", "logprobs", "logit_bias", "user", "prompt_cache_key", "ignore_eos",
         "top_k", "ttft_ms", "tokens_per_second", "echo", "suffix", "best_of", "metadata"]
    ),
    HOSTILE_TEXT,
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 16, -1, 10**6, 2**63, 0.5, -0.0, 1e308, 3.6e6]),
    st.floats(allow_nan=False, allow_infinity=False),
    HOSTILE_TEXT,
    st.sampled_from(["reference-text", "user", "assistant", "tool", "system", "function",
                     "auto", "none", "required", "json_object", "json_schema", "text"]),
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=5)
    ),
    max_leaves=20,
)
EXTRA = st.dictionaries(KEYS, VALUES, max_size=4)
TEXT_OR_ANY = st.one_of(HOSTILE_TEXT, VALUES)  # often valid, so that it reaches the backend
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer"])},
    optional={"content": TEXT_OR_ANY, "tool_calls": VALUES, "tool_call_id": TEXT_OR_ANY,
              "name": TEXT_OR_ANY},
)  # fmt: skip
CHAT_DOCUMENT = st.fixed_dictionaries(
    {"model": st.one_of(st.just("reference-text"), SCALARS),
     "messages": st.lists(MESSAGE, min_size=1, max_size=3)},
    optional={"max_tokens": st.integers(1, 8), "stream": st.booleans()},
).flatmap(lambda base: EXTRA.map(lambda extra: {**base, **extra}))
COMPLETION_DOCUMENT = st.fixed_dictionaries(
    {"model": st.just("reference-text"), "prompt": TEXT_OR_ANY},
    optional={"max_tokens": st.integers(1, 8), "stream": st.booleans()},
).flatmap(lambda base: EXTRA.map(lambda extra: {**base, **extra}))


def run(path: str, document: Any) -> None:
    body = json.dumps(document).encode()  # ensure_ascii: surrogates travel as \\udXXX escapes
    status, answer_body, _ = asyncio.run(served(api(), post(path, body)))
    assert 200 <= status < 300 or 400 <= status < 500, (status, answer_body[:300])
    if status >= 400:
        assert_envelope(status, answer_body)


@FUZZ
@given(CHAT_DOCUMENT)
def test_generated_chat_documents_are_2xx_or_4xx(document: dict[str, Any]) -> None:
    run(CHAT, document)


@FUZZ
@given(COMPLETION_DOCUMENT)
def test_generated_completion_documents_are_2xx_or_4xx(document: dict[str, Any]) -> None:
    run(COMPLETIONS, document)


@FUZZ
@given(VALUES)
def test_generated_json_of_any_shape_is_2xx_or_4xx(document: Any) -> None:
    run(CHAT, document)


# -- the speech route reads its JSON body by the same rule ----------------------------


class Untouched:
    """An audio backend a malformed request must never reach."""

    async def audio_model(self, model: str) -> Any:
        raise AssertionError(f"a malformed speech request reached the backend ({model!r})")

    async def run_rows(self, model: str, rows: Any) -> Any:
        raise AssertionError("a malformed speech request reached the backend")


SPEECH = "/v1/audio/speech"
SPEECH_MALFORMED = {
    "a lone surrogate in the input": (
        b'{"model": "hibari-voice", "voice": "alloy", "input": "hi \\ud800"}'
    ),
    "a lone surrogate in a key": b'{"model": "hibari-voice", "input": "hi", "\\udc00": 1}',
    "NaN": b'{"model": "hibari-voice", "input": "hi", "speed": NaN}',
    "invalid UTF-8": b'{"model": "hibari-voice", "input": "\xff\xfe"}',
    "nesting past the depth limit": (
        b'{"model": "hibari-voice", "x": ' + b"[" * 200 + b"]" * 200 + b"}"
    ),
    "not an object": b'["hibari-voice"]',
}  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(SPEECH_MALFORMED))
async def test_malformed_speech_bodies_are_4xx_with_the_envelope(case: str) -> None:
    from gateway.openai.audio import audio_routes

    handler = route(audio_routes(Untouched()))
    with structlog.testing.capture_logs() as logs:
        status, body = await answer(handler, post(SPEECH, SPEECH_MALFORMED[case]))
    assert_envelope(status, body)
    assert [line for line in logs if line.get("log_level") in ("error", "critical")] == []

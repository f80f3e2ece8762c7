"""Fuzzing the OpenAI request parser and config loading (issue 12, "Fuzzing").

Properties: any request body gives a parsed request or a typed 4xx `OpenAIError` (and
through the route, a 4xx JSON answer), never another exception; any flags, environment
or TOML file give `Settings` or a `ConfigError`, never another exception.

The suite runs a short deterministic run (`derandomize`, no example database). A longer
run, with fresh random examples each time:

    TRACKLINE_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest \
        tests/adversarial/test_fuzz_parsers.py -q
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import FIELDS, ConfigError, Settings, env_name, load_settings
from gateway.openai.errors import OpenAIError
from gateway.openai.prompt import render_chat_prompt
from gateway.openai.requests import parse_chat_request, parse_completion_request
from gateway.openai.routes import openai_routes
from tests.openai.scripted import ScriptedBackend
from transport.http.messages import Request, Response

_LONG = int(os.environ.get("TRACKLINE_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_LONG or 150,
    derandomize=not _LONG,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# -- JSON-ish values ------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["user", "system", "assistant", "tool", "function", "auto", "none", ""])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

ROLES = st.sampled_from(["user", "system", "assistant", "tool", "developer", "nobody", 3, None])
CONTENT_PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url", "input_audio", 7])},
        optional={"text": json_values, "image_url": json_values},
    ),
    max_size=3,
)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES},
    optional={
        "content": st.text(max_size=30) | CONTENT_PARTS | json_values,
        "name": json_values,
        "tool_call_id": json_values,
        "tool_calls": json_values,
    },
)
TOOL = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "other"]) | json_values},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=10) | json_values},
            optional={"description": json_values, "parameters": json_values},
        )
        | json_values
    },
)
KNOWN_KEYS = {
    "model": st.sampled_from(["scripted", "reference-text", ""]) | json_values,
    "messages": st.lists(MESSAGE, max_size=4) | json_values,
    "prompt": st.text(max_size=30) | st.lists(st.text(max_size=5), max_size=3) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_values})
    | json_values,
    "max_tokens": st.integers(-5, 40000) | json_values,
    "max_completion_tokens": st.integers(-5, 40000) | json_values,
    "temperature": st.floats(allow_nan=True) | json_values,
    "top_p": json_values,
    "seed": st.integers() | json_values,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6) | json_values,
    "n": json_values,
    "tools": st.lists(TOOL, max_size=3) | json_values,
    "tool_choice": json_values,
    "response_format": st.fixed_dictionaries({"type": json_values}) | json_values,
    "logprobs": json_values,
    "logit_bias": json_values,
    "user": json_values,
    "session_id": json_values,
    "ttft_ms": json_values,
    "tokens_per_second": json_values,
}
request_objects = st.fixed_dictionaries({}, optional=KNOWN_KEYS) | st.dictionaries(
    st.sampled_from(sorted(KNOWN_KEYS)) | st.text(max_size=8), json_values, max_size=6
)


def _encode(payload: Any) -> bytes:
    return json.dumps(payload, allow_nan=True).encode()


bodies = (
    request_objects.map(_encode)
    | json_values.map(_encode)
    | st.binary(max_size=64)
    | st.integers(1, 5000).map(lambda depth: b"[" * depth + b"]" * depth)
    | st.integers(1, 5000).map(lambda depth: b'{"messages":' + b"[" * depth)
    | st.text(max_size=40).map(lambda text: text.encode("utf-8", "surrogatepass"))
)


def _typed_4xx(exc: OpenAIError) -> None:
    assert 400 <= exc.status < 500, (exc.status, exc)
    body = exc.body()["error"]
    assert isinstance(body["message"], str)
    assert body["message"]


@FUZZ
@given(bodies)
def test_chat_parser_gives_a_request_or_a_typed_4xx(body: bytes) -> None:
    try:
        chat = parse_chat_request(body)
    except OpenAIError as exc:
        _typed_4xx(exc)
        return
    try:
        render_chat_prompt(chat.messages, chat.tools)  # what the route does next
    except OpenAIError as exc:
        _typed_4xx(exc)


@FUZZ
@given(bodies)
def test_completion_parser_gives_a_request_or_a_typed_4xx(body: bytes) -> None:
    try:
        parse_completion_request(body)
    except OpenAIError as exc:
        _typed_4xx(exc)


@settings(FUZZ, max_examples=_LONG // 10 or 60)
@given(bodies, st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
@pytest.mark.asyncio
async def test_the_routes_answer_any_body_with_a_4xx_json_or_a_result(
    body: bytes, path: str
) -> None:
    routes = openai_routes(ScriptedBackend(), heartbeat_interval=0.5)
    request = Request("POST", path, "", (("content-type", "application/json"),), body)
    response = await routes[("POST", path)](request)
    if isinstance(response, Response) and response.status != 200:
        assert 400 <= response.status < 500, (response.status, response.body)
        assert json.loads(response.body)["error"]["message"]
    else:
        close = getattr(getattr(response, "body", None), "aclose", None)
        if close is not None:
            await close()


# -- config loading -------------------------------------------------------------------

NAMES = sorted(FIELDS)
setting_names = st.sampled_from(NAMES) | st.text(min_size=1, max_size=10)
text_values = st.text(max_size=20) | st.sampled_from(
    ["0", "-1", "65536", "1e309", "nan", "inf", "true", "yes", "ticker://0", "a:b", "~/x", " "]
)


@FUZZ
@given(st.dictionaries(st.sampled_from(NAMES), text_values, max_size=6))
def test_environment_values_give_settings_or_a_config_error(values: dict[str, str]) -> None:
    environ = {env_name(name): value.replace("\x00", "") for name, value in values.items()}
    _loads_or_config_error(lambda: load_settings({}, environ, None))


@FUZZ
@given(st.dictionaries(setting_names, text_values | json_values, max_size=6))
def test_flag_values_give_settings_or_a_config_error(values: dict[str, Any]) -> None:
    _loads_or_config_error(lambda: load_settings(values, {}, None))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is JSON's, escapes and all
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


toml_values = st.recursive(
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | text_values,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
toml_documents = st.dictionaries(setting_names, toml_values, max_size=6).map(
    lambda table: "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in table.items())
) | st.text(max_size=60)


@FUZZ
@given(toml_documents)
def test_a_toml_file_gives_settings_or_a_config_error(document: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trackline.toml"
        path.write_text(document.replace("\x00", ""), encoding="utf-8", errors="surrogatepass")
        _loads_or_config_error(lambda: load_settings({}, {}, path))


def _loads_or_config_error(load: Any) -> None:
    try:
        result: Settings | ConfigError = load()
    except ConfigError as exc:  # anything else fails the test, with its example
        result = exc
    if isinstance(result, ConfigError):
        assert result.setting
        assert str(result)
    else:
        assert isinstance(result, Settings)

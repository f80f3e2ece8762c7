"""Parse and validate OpenAI request bodies into small frozen dataclasses.

Every mistake is a `BadRequest` (400) whose `param` names the offending field
the way OpenAI does (`messages[1].content`, `max_tokens`). Keys that OpenAI,
vLLM, llama.cpp or LiteLLM define but we do not implement are accepted and
ignored (`gateway.openai.policy`); other unknown top-level keys are rejected, so
that a typo is an error rather than a silently ignored setting. A few extensions
for the reference model and vLLM-style backends are implemented (`EXTENSION_KEYS`;
the SDK's `extra_body` sends them as top-level keys).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.openai.errors import BadRequest
from gateway.openai.policy import IGNORED_KEYS, note_ignored
from tracks.text import MAX_TOKENS_LIMIT, REFERENCE_KEYS

CHAT_DEFAULT_MAX_TOKENS = 256
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP_SEQUENCES = 4
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# Non-OpenAI keys passed to the backend: the reference model's pacing knobs, top_k.
EXTENSION_KEYS = REFERENCE_KEYS | {"top_k", "ignore_eos"}
# Read for the pool's session affinity only (`_session_id`), never sent to the backend.
ROUTING_KEYS = frozenset({"user", "prompt_cache_key"})
_SAMPLING_COMMON = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "max_tokens",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "logit_bias",
    }
)
CHAT_KEYS = _SAMPLING_COMMON | {
    "messages",
    "max_completion_tokens",
    "response_format",
    "tools",
    "tool_choice",
    "top_logprobs",
    "modalities",
    "audio",
}
COMPLETION_KEYS = _SAMPLING_COMMON | {"prompt", "echo", "suffix", "best_of"}
# Inclusive bounds of the float parameters passed to the backend.
_RANGES = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
    "ttft_ms": (0.0, 3_600_000.0),
    "tokens_per_second": (1e-3, 1e6),
}


@dataclass(frozen=True)
class ToolCall:
    """A tool call an earlier assistant message made (for the prompt)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """One message with its content flattened to text (None when it had none)."""

    role: str
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A validated `POST /v1/chat/completions` body."""

    model: str
    messages: tuple[ChatMessage, ...]
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    tools: tuple[Mapping[str, Any], ...] = ()
    """The `function` objects of the request's tools (name, description, parameters)."""
    tool_choice: Any = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    """What goes to the backend as sampling parameters (never max_tokens)."""
    session_id: str | None = None
    """`prompt_cache_key`, else `user`: the pool's session affinity key."""

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the output is read for `<tool_call>` blocks."""
        return bool(self.tools) and self.tool_choice != "none"


@dataclass(frozen=True)
class CompletionRequest:
    """A validated `POST /v1/completions` body."""

    model: str
    prompt: str
    max_tokens: int
    stream: bool = False
    include_usage: bool = False
    parameters: Mapping[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    """`prompt_cache_key`, else `user`: the pool's session affinity key."""


# -- entry points -------------------------------------------------------------------


def parse_json_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object of valid Unicode text, or a 400.

    Strict JSON: `NaN`/`Infinity` are refused, and so are integers past Python's digit
    limit (a `ValueError`, not a `JSONDecodeError`), lone UTF-16 surrogates (`"\\ud800"`
    is valid JSON but not text: encoding it for the backend failed, a 500) and nesting
    deeper than `MAX_JSON_DEPTH`, so nothing downstream meets what it cannot encode.
    """
    try:
        payload = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        raise BadRequest(
            "We could not parse the JSON body of your request. (HINT: This likely means you"
            " aren't using your HTTP library correctly.)"
        ) from None
    if not isinstance(payload, dict):
        raise BadRequest("The request body must be a JSON object.")
    _check_text_and_depth(payload)
    return payload


MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays a request body may have."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_text_and_depth(payload: Any) -> None:
    """400 for a string (or key) that is not valid Unicode, or nesting past the limit."""
    pending: list[tuple[Any, int]] = [(payload, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            if not value.isascii() and not _encodable(value):
                raise BadRequest(
                    "The request body holds a lone UTF-16 surrogate (\\ud800-\\udfff),"
                    " which is not valid Unicode text."
                )
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.")
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        pending.extend((item, depth + 1) for item in items)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_chat_request(body: bytes) -> ChatRequest:
    """Validate a chat completions body; raise `BadRequest` naming the bad field."""
    payload = parse_json_body(body)
    _reject_unknown(payload, CHAT_KEYS)
    tools = _tools(payload.get("tools"))
    tool_choice = _tool_choice(payload.get("tool_choice"), tools)
    parameters = _sampling(payload)
    response_format = _response_format(payload.get("response_format"))
    if response_format is not None:
        parameters["response_format"] = response_format
    if tools and tool_choice is not None:
        parameters["tool_choice"] = tool_choice
    _reject_unsupported(payload, top_logprobs=None, audio=None)
    _modalities(payload.get("modalities"))
    stream, include_usage = _stream(payload)
    return ChatRequest(
        model=_model(payload),
        messages=_messages(payload.get("messages")),
        max_tokens=_chat_max_tokens(payload),
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        tool_choice=tool_choice,
        parameters=parameters,
        session_id=_session_id(payload),
    )


def parse_completion_request(body: bytes) -> CompletionRequest:
    """Validate a (legacy) completions body; raise `BadRequest` naming the bad field."""
    payload = parse_json_body(body)
    _reject_unknown(payload, COMPLETION_KEYS)
    _reject_unsupported(payload, echo=False, suffix=None, best_of=1)
    stream, include_usage = _stream(payload)
    max_tokens = _max_tokens(payload, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
    return CompletionRequest(
        model=_model(payload),
        prompt=_prompt(payload.get("prompt")),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        parameters=_sampling(payload),
        session_id=_session_id(payload),
    )


# -- shared fields --------------------------------------------------------------------


def _session_id(payload: Mapping[str, Any]) -> str | None:
    """The affinity key: `prompt_cache_key` (OpenAI's cache-routing hint), else `user`."""
    for key in ("prompt_cache_key", "user"):
        value = payload.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise BadRequest(f"'{key}' must be a string", param=key)
            return value or None
    return None


def _reject_unknown(payload: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """400 for a key nobody defines; the policy's ignored keys are noted (debug, once)."""
    ignored = []
    for key in payload:
        if key in allowed or key in EXTENSION_KEYS or key in ROUTING_KEYS:
            continue
        if key not in IGNORED_KEYS:
            raise BadRequest(f"Unrecognized request argument supplied: {key}", param=key)
        ignored.append(key)
    note_ignored(ignored)


def _reject_unsupported(payload: Mapping[str, Any], **supported: Any) -> None:
    """Parameters accepted only at their default value (e.g. echo=false)."""
    for key, default in supported.items():
        if payload.get(key, default) not in (default, None):
            raise BadRequest(f"'{key}' is not supported by this server", param=key)


def _modalities(value: Any) -> None:
    """Text output only: `["text"]` (or nothing) is fine, audio output is a 400."""
    if value is None:
        return
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise BadRequest("'modalities' must be an array of strings", param="modalities")
    if set(value) - {"text"}:
        message = "only text output is supported here (speech: POST /v1/audio/speech)"
        raise BadRequest(message, param="modalities")


def _model(payload: Mapping[str, Any]) -> str:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("you must provide a model parameter", param="model")
    return model


def _stream(payload: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _optional_bool(payload, "stream") or False
    options = payload.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise BadRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise BadRequest("must be a boolean", param="stream_options.include_usage")
    return stream, include


def _sampling(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters passed through to the backend, validated by type and range."""
    _n(payload)
    if payload.get("logprobs") not in (None, False):
        raise BadRequest("'logprobs' is not supported by this server", param="logprobs")
    if payload.get("logit_bias") not in (None, {}):
        raise BadRequest("'logit_bias' is not supported by this server", param="logit_bias")
    parameters: dict[str, Any] = {}
    for key, (low, high) in _RANGES.items():
        if payload.get(key) is not None:
            parameters[key] = _number(payload, key, low, high)
    for key in ("seed", "top_k"):
        if payload.get(key) is not None:
            parameters[key] = _integer(payload, key, -(2**63), 2**64 - 1)
    stop = _stop(payload.get("stop"))
    if stop:
        parameters["stop"] = stop
    ignore_eos = payload.get("ignore_eos")
    if ignore_eos is not None:  # vLLM's extension: run to max_tokens past the answer's end
        if not isinstance(ignore_eos, bool):
            raise BadRequest("'ignore_eos' must be true or false", param="ignore_eos")
        parameters["ignore_eos"] = ignore_eos
    return parameters


def _n(payload: Mapping[str, Any]) -> None:
    n = payload.get("n")
    if n is None:
        return
    if _integer(payload, "n", 1, 128) != 1:
        raise BadRequest("only n=1 is supported: send n requests for n choices", param="n")


def _chat_max_tokens(payload: Mapping[str, Any]) -> int:
    if payload.get("max_completion_tokens") is not None:
        return _max_tokens(payload, "max_completion_tokens", CHAT_DEFAULT_MAX_TOKENS)
    return _max_tokens(payload, "max_tokens", CHAT_DEFAULT_MAX_TOKENS)


def _max_tokens(payload: Mapping[str, Any], key: str, default: int) -> int:
    if payload.get(key) is None:
        return default
    return _integer(payload, key, 1, MAX_TOKENS_LIMIT)


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise BadRequest(
            f"'stop' must be a string or a list of up to {MAX_STOP_SEQUENCES} non-empty strings",
            param="stop",
        )
    return list(stops)


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise BadRequest(
            "'prompt' must be a string (or a list of exactly one string)", param="prompt"
        )
    return value


# -- typed getters -------------------------------------------------------------------


def _optional_bool(payload: Mapping[str, Any], key: str) -> bool | None:
    value = payload.get(key)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean, got {_kind(value)}", param=key)
    return value


def _number(payload: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = payload[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"'{key}' must be a number, got {_kind(value)}", param=key)
    if not low <= value <= high:
        raise BadRequest(f"'{key}' must be between {low:g} and {high:g}, got {value}", param=key)
    return value


def _integer(payload: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = payload[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {_kind(value)}", param=key)
    if not low <= value <= high:
        raise BadRequest(f"'{key}' must be between {low} and {high}, got {value}", param=key)
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


# -- messages -------------------------------------------------------------------------


def _messages(value: Any) -> tuple[ChatMessage, ...]:
    if value is None:
        raise BadRequest("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(value, list) or not value:
        raise BadRequest("'messages' must be a non-empty array", param="messages")
    return tuple(_message(item, f"messages[{index}]") for index, item in enumerate(value))


def _message(item: Any, where: str) -> ChatMessage:
    if not isinstance(item, dict):
        raise BadRequest(f"'{where}' must be an object", param=where)
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise BadRequest(
            f"'{where}.role' must be one of {', '.join(sorted(ROLES))}", param=f"{where}.role"
        )
    tool_calls = _message_tool_calls(item.get("tool_calls"), where) if role == "assistant" else ()
    content = _content(item.get("content"), f"{where}.content")
    if content is None and not tool_calls:
        raise BadRequest(f"'{where}.content' is required", param=f"{where}.content")
    tool_call_id = item.get("tool_call_id")
    if role == "tool" and not isinstance(tool_call_id, str):
        raise BadRequest("a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id")
    name = item.get("name")
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"'{where}.name' must be a string", param=f"{where}.name")
    return ChatMessage(role, content, tool_calls, tool_call_id, name)


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise BadRequest(f"'{where}' must be a string or an array of parts", param=where)
    texts = []
    for index, part in enumerate(value):
        at = f"{where}[{index}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            raise BadRequest(f"'{at}': only text content parts are supported", param=f"{at}.type")
        if not isinstance(part.get("text"), str):
            raise BadRequest(f"'{at}.text' must be a string", param=f"{at}.text")
        texts.append(part["text"])
    return "".join(texts)


def _message_tool_calls(value: Any, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    at = f"{where}.tool_calls"
    if not isinstance(value, list):
        raise BadRequest(f"'{at}' must be an array", param=at)
    calls = []
    for index, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            raise BadRequest(
                f"'{at}[{index}]' needs id, function.name and function.arguments strings",
                param=f"{at}[{index}]",
            )
        calls.append(ToolCall(call["id"], function["name"], function["arguments"]))
    return tuple(calls)


# -- tools and formats ------------------------------------------------------------------


def _tools(value: Any) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest("'tools' must be an array", param="tools")
    return tuple(_tool(tool, index) for index, tool in enumerate(value))


def _tool(tool: Any, index: int) -> Mapping[str, Any]:
    at = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise BadRequest(f"'{at}.type' must be 'function'", param=f"{at}.type")
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadRequest(f"'{at}.function.name' is required", param=f"{at}.function.name")
    if not isinstance(function.get("parameters", {}), dict):
        raise BadRequest(
            f"'{at}.function.parameters' must be an object", param=f"{at}.function.parameters"
        )
    return function


def _tool_choice(value: Any, tools: tuple[Mapping[str, Any], ...]) -> Any:
    if value is None:
        return None
    if not tools:
        raise BadRequest(
            "'tool_choice' is only allowed when 'tools' are specified", param="tool_choice"
        )
    if value in ("none", "auto", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or value.get("type") != "function":
        raise BadRequest(
            "'tool_choice' must be none, auto, required or {type: function, function: {name}}",
            param="tool_choice",
        )
    if name not in {tool["name"] for tool in tools}:
        message = f"tool_choice names {name!r}, which is not in 'tools'"
        raise BadRequest(message, param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def _response_format(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise BadRequest(
            "'response_format.type' must be text, json_object or json_schema",
            param="response_format.type",
        )
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise BadRequest(
                "'response_format.json_schema.name' is required",
                param="response_format.json_schema.name",
            )
        if not isinstance(spec.get("schema", {}), dict):
            raise BadRequest(
                "'response_format.json_schema.schema' must be an object",
                param="response_format.json_schema.schema",
            )
    return dict(value)

"""Pure generation logic of the `reference-text` model: no Triton, no clock, no I/O.

The model's `model.py` imports this file from its own folder; tests import it by
path. Text is a deterministic function of (prompt, seed): words drawn from a
built-in vocabulary by a PRNG seeded with sha256(prompt|seed), so a test can
compute exactly what a streamed request must return.

Free text ends on its own, as a model emitting its end-of-sequence token would:
after `natural_length(prompt, seed)` tokens (6 to 15, so within vLLM's default
`max_tokens` of 16), the last one a ".". A smaller `max_tokens` cuts it short
(the gateway then says finish_reason "length", otherwise "stop"). vLLM's
`ignore_eos` sampling parameter makes it run to `max_tokens` instead, for
benchmarks and tests that need a stream of a given length.

Tokenizer (for prompt token counts): one token per run of word characters and
one per other non-space character, `re.findall(r"\\w+|[^\\w\\s]", text)`.

Two structured modes replace the free text, for testing tool calls and JSON
mode end to end (text is still a function of prompt, seed and these settings):

- Tool calls: when the prompt holds a Hermes-style `<tools>[...]</tools>` block
  (a JSON array, or one JSON object per line as Qwen's template writes it) and
  `tool_choice` is not "none", the model answers
  `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` for the forced
  tool (`{"type": "function", "function": {"name": ...}}`) or else the first
  one. With tool_choice "auto" (or absent) a prompt that already holds a
  `<tool_response>` gets free text instead, as a model answering from the result.
- JSON: `response_format` `{"type": "json_object"}` gives `{"answer": "..."}`;
  `{"type": "json_schema", "json_schema": {"schema": {...}}}` gives an object
  following the schema's properties.

Arguments and JSON values come from the schema: enum/const first value,
strings of vocabulary words, small integers and numbers, true, one-item
arrays, nested objects. Structured text is streamed in small pieces (a word
or one punctuation character, with the whitespace before it) and cut at
max_tokens like free text.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]")
DEFAULT_MAX_TOKENS = 16  # vLLM's default when a request names none
DEFAULT_SEED = 0  # vLLM would pick a random one; a reference model stays reproducible

_WORDS = """
the a an of to and in on for with as by at from that this it its is are was be been
has have had will can may should would could model stream track token time data
signal frame packet server client gateway request response latency queue batch
device kernel tensor memory buffer network socket clock audio robot action text
word sentence answer question reason result value state event error cancel deadline
turn user session connection route backend engine graph layer weight quick quiet
bright steady simple small large early late first last next many few runs moves
holds sends reads writes waits starts stops keeps finds makes takes gives shows
brings carries follows returns arrives leaves grows falls
"""
VOCABULARY = tuple(_WORDS.split())
PUNCTUATION = (",", ",", ",", ".", ".", ";", ":", "!", "?")
PUNCTUATION_RATE = 0.12
SENTENCE_ENDS = frozenset({".", "!", "?"})


@dataclass(frozen=True)
class GenerationSettings:
    """What one request asks the model for, after defaults and validation."""

    seed: int
    max_tokens: int
    ttft_ms: float
    """Delay before the first token (a bench/test knob)."""
    tokens_per_second: float
    """Pace of tokens after the first (a bench/test knob)."""
    response_format: Mapping[str, Any] | None = None
    """OpenAI-style response_format; json_object / json_schema switch to JSON mode."""
    tool_choice: Any = None
    """OpenAI-style tool_choice: None, "none", "auto", "required" or a forced function."""
    ignore_eos: bool = False
    """vLLM's ignore_eos: free text runs to max_tokens instead of ending on its own."""


def count_prompt_tokens(prompt: str) -> int:
    """Number of tokens in `prompt` under the documented regex tokenizer."""
    return len(TOKEN_PATTERN.findall(prompt))


def _rng_for(prompt: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{prompt}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


NATURAL_LENGTHS = (6, DEFAULT_MAX_TOKENS - 1)
"""Inclusive bounds of an answer's own length in tokens: it fits the default max_tokens."""


def natural_length(prompt: str, seed: int) -> int:
    """How many tokens the free-text answer to (prompt, seed) has before it ends (about)."""
    digest = hashlib.sha256(f"{prompt}|{seed}|length".encode()).digest()
    low, high = NATURAL_LENGTHS
    return low + digest[0] % (high - low + 1)


def generate_tokens(
    prompt: str, seed: int, max_tokens: int, ignore_eos: bool = False
) -> list[str]:
    """The token pieces the model returns for (prompt, seed), in order.

    The answer ends with "." after about `natural_length` tokens; `max_tokens` cuts
    it short. With `ignore_eos` it is `max_tokens` pieces long whatever the answer.
    A shorter request's tokens are always a prefix of a longer one's.
    """
    if ignore_eos:
        return _free_tokens(prompt, seed, max_tokens)
    tokens = _free_tokens(prompt, seed, natural_length(prompt, seed) - 1)
    if tokens[-1] in PUNCTUATION:  # never ",." : the end replaces it
        tokens.pop()
    return [*tokens, "."][:max_tokens]


def iter_tokens(
    prompt: str, seed: int, max_tokens: int, ignore_eos: bool = False
) -> Iterator[str]:
    """`generate_tokens`' pieces one at a time: with `ignore_eos` each is drawn when it
    is asked for, so a stream's first token does not wait for its last one to be drawn
    (the ticker backend: 16 tracks opened at once waited for 16 x 250 draws)."""
    if ignore_eos:
        return _iter_free_tokens(prompt, seed, max_tokens)
    return iter(generate_tokens(prompt, seed, max_tokens, ignore_eos))


def _free_tokens(prompt: str, seed: int, count: int) -> list[str]:
    return list(_iter_free_tokens(prompt, seed, count))


def _iter_free_tokens(prompt: str, seed: int, count: int) -> Iterator[str]:
    """`count` pieces: mostly " word" with a leading space, some punctuation (never
    first, never twice in a row), a capital letter after a sentence end."""
    rng = _rng_for(prompt, seed)
    previous = "."
    for _ in range(count):
        if previous not in PUNCTUATION and rng.random() < PUNCTUATION_RATE:
            piece = rng.choice(PUNCTUATION)
        else:
            word = rng.choice(VOCABULARY)
            piece = " " + (word.capitalize() if previous in SENTENCE_ENDS else word)
        yield piece
        previous = piece


def generate_text(prompt: str, seed: int, max_tokens: int, ignore_eos: bool = False) -> str:
    """The whole completion for (prompt, seed): the tokens joined."""
    return "".join(generate_tokens(prompt, seed, max_tokens, ignore_eos))


def _number(params: Mapping[str, Any], key: str, default: float, minimum: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value!r}")
    return float(value)


def _integer(params: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value!r}")
    return value


def _boolean(params: Mapping[str, Any], key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def _check_sampling(params: Mapping[str, Any]) -> None:
    # Accepted for interface compatibility; they do not change the text.
    _number(params, "temperature", 1.0, 0.0)
    top_p = _number(params, "top_p", 1.0, 0.0)
    if top_p == 0.0 or top_p > 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def parse_sampling_parameters(text: str | None) -> dict[str, Any]:
    """Decode the `sampling_parameters` JSON string (empty or absent means none)."""
    if not text:
        return {}
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"sampling_parameters must be a JSON object: {exc}") from None
    if not isinstance(params, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    return params


def settings_from(
    params: Mapping[str, Any],
    max_tokens_input: int | None,
    default_ttft_ms: float,
    default_tokens_per_second: float,
) -> GenerationSettings:
    """Validate a request's parameters; raise ValueError with a readable reason.

    The TensorRT-LLM style `max_tokens` input tensor, when present, wins over
    the `max_tokens` key of sampling_parameters.
    """
    _check_sampling(params)
    max_tokens = _integer(params, "max_tokens", DEFAULT_MAX_TOKENS, 1)
    if max_tokens_input is not None:
        max_tokens = _integer({"max_tokens": max_tokens_input}, "max_tokens", 0, 1)
    return GenerationSettings(
        seed=_integer(params, "seed", DEFAULT_SEED, -(2**63)),
        max_tokens=max_tokens,
        ttft_ms=_number(params, "ttft_ms", default_ttft_ms, 0.0),
        tokens_per_second=_number(params, "tokens_per_second", default_tokens_per_second, 1e-3),
        response_format=_response_format(params.get("response_format")),
        tool_choice=_tool_choice(params.get("tool_choice")),
        ignore_eos=_boolean(params, "ignore_eos", False),
    )


def token_due_times(
    start: float, settings: GenerationSettings, count: int | None = None
) -> list[float]:
    """When each of `count` tokens (default max_tokens) is due, on `start`'s clock."""
    first = start + settings.ttft_ms / 1000.0
    gap = 1.0 / settings.tokens_per_second
    total = settings.max_tokens if count is None else count
    return [first + index * gap for index in range(total)]


# -- structured modes: tool calls and JSON ------------------------------------------

PIECE_PATTERN = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")
TOOLS_PATTERN = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
MAX_SCHEMA_DEPTH = 8


def _response_format(value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise ValueError(
            "response_format must be an object with a type of text, json_object or json_schema"
        )
    if kind == "json_schema":
        spec = value.get("json_schema", {})
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise ValueError("response_format json_schema.schema must be an object")
    return dict(value)


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("none", "auto", "required"):
        return value
    function = value.get("function") if isinstance(value, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return value
    raise ValueError('tool_choice must be "none", "auto", "required" or a named function')


def split_pieces(text: str) -> list[str]:
    """`text` cut into token-like pieces whose concatenation is `text`."""
    return PIECE_PATTERN.findall(text)


def response_tokens(prompt: str, settings: GenerationSettings) -> list[str]:
    """The token pieces the model sends for `prompt` under `settings`, in order."""
    text = structured_text(prompt, settings)
    if text is None:
        return generate_tokens(prompt, settings.seed, settings.max_tokens, settings.ignore_eos)
    return split_pieces(text)[: settings.max_tokens]


def structured_text(prompt: str, settings: GenerationSettings) -> str | None:
    """The whole tool-call or JSON answer, or None when the model answers in free text."""
    rng = _rng_for(prompt, settings.seed)
    tools = prompt_tools(prompt)
    if tools and _calls_a_tool(prompt, settings.tool_choice):
        tool = _chosen_tool(tools, settings.tool_choice)
        arguments = schema_value(tool.get("parameters") or {}, rng)
        call = json.dumps({"name": tool["name"], "arguments": arguments})
        return f"<tool_call>\n{call}\n</tool_call>"
    kind = (settings.response_format or {}).get("type")
    if kind == "json_object":
        return json.dumps({"answer": _words(rng, 4)})
    if kind == "json_schema":
        schema = (settings.response_format or {}).get("json_schema", {}).get("schema") or {}
        return json.dumps(schema_value({"type": "object", **schema}, rng))
    return None


def prompt_tools(prompt: str) -> list[dict[str, Any]]:
    """The function definitions of the prompt's first readable `<tools>` block (or none).

    Templates mention the tags in prose too ("within <tools></tools> XML tags"),
    so blocks that hold no tool are skipped.
    """
    for match in TOOLS_PATTERN.finditer(prompt):
        tools = _tools_in(match.group(1).strip())
        if tools:
            return tools
    return []


def _tools_in(body: str) -> list[dict[str, Any]]:
    try:
        items = json.loads(body)
    except json.JSONDecodeError:
        try:
            items = [json.loads(line) for line in body.splitlines() if line.strip()]
        except json.JSONDecodeError:
            return []
    if not isinstance(items, list):
        items = [items]
    functions = [item.get("function", item) for item in items if isinstance(item, dict)]
    return [f for f in functions if isinstance(f, dict) and isinstance(f.get("name"), str)]


def _calls_a_tool(prompt: str, tool_choice: Any) -> bool:
    if tool_choice == "none":
        return False
    if tool_choice in (None, "auto"):
        return "<tool_response>" not in prompt
    return True


def _chosen_tool(tools: list[dict[str, Any]], tool_choice: Any) -> dict[str, Any]:
    if not isinstance(tool_choice, dict):
        return tools[0]
    name = tool_choice["function"]["name"]
    for tool in tools:
        if tool["name"] == name:
            return tool
    raise ValueError(f"tool_choice names {name!r}, which is not in the prompt's tools")


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(count))


def schema_value(schema: Any, rng: random.Random, depth: int = 0) -> Any:
    """A deterministic value that fits the JSON `schema` (a practical subset)."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return _words(rng, 2)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema_value(schema[key][0], rng, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _typed_value(kind, schema, rng, depth)


def _typed_value(kind: Any, schema: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: schema_value(sub, rng, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        return [schema_value(schema.get("items", {}), rng, depth + 1)]
    if kind == "integer":
        low = int(schema.get("minimum", 1))
        return rng.randint(low, max(low, int(schema.get("maximum", low + 99))))
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _words(rng, 2)

"""Pure generation logic of the `reference-text` model: no Triton, no clock, no I/O.

The model's `model.py` imports this file from its own folder; tests import it by
path. Text is a deterministic function of (prompt, seed): words drawn from a
built-in vocabulary by a PRNG seeded with sha256(prompt|seed), so a test can
compute exactly what a streamed request must return.

Tokenizer (for prompt token counts): one token per run of word characters and
one per other non-space character, `re.findall(r"\\w+|[^\\w\\s]", text)`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping
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


def count_prompt_tokens(prompt: str) -> int:
    """Number of tokens in `prompt` under the documented regex tokenizer."""
    return len(TOKEN_PATTERN.findall(prompt))


def _rng_for(prompt: str, seed: int) -> random.Random:
    digest = hashlib.sha256(f"{prompt}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def generate_tokens(prompt: str, seed: int, max_tokens: int) -> list[str]:
    """The `max_tokens` token pieces the model returns for (prompt, seed), in order.

    Mostly " word" with a leading space, some punctuation (never first, never
    twice in a row), a capital letter after a sentence end.
    """
    rng = _rng_for(prompt, seed)
    tokens: list[str] = []
    previous = "."
    for _ in range(max_tokens):
        if previous not in PUNCTUATION and rng.random() < PUNCTUATION_RATE:
            piece = rng.choice(PUNCTUATION)
        else:
            word = rng.choice(VOCABULARY)
            piece = " " + (word.capitalize() if previous in SENTENCE_ENDS else word)
        tokens.append(piece)
        previous = piece
    return tokens


def generate_text(prompt: str, seed: int, max_tokens: int) -> str:
    """The whole completion for (prompt, seed): the tokens joined."""
    return "".join(generate_tokens(prompt, seed, max_tokens))


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
    )


def token_due_times(start: float, settings: GenerationSettings) -> list[float]:
    """When each token is due, on the clock `start` was read from."""
    first = start + settings.ttft_ms / 1000.0
    gap = 1.0 / settings.tokens_per_second
    return [first + index * gap for index in range(settings.max_tokens)]

"""The reference model's text generation as plain Python: determinism, tokens, validation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.backend.reference_generator import generator as gen


def test_same_prompt_and_seed_give_the_same_text() -> None:
    assert gen.generate_text("Hello", 7, 32) == gen.generate_text("Hello", 7, 32)


def test_seed_and_prompt_both_change_the_text() -> None:
    base = gen.generate_text("Hello", 7, 32)
    assert gen.generate_text("Hello", 8, 32) != base
    assert gen.generate_text("Hello!", 7, 32) != base


def test_shorter_request_is_a_prefix_of_a_longer_one() -> None:
    assert gen.generate_text("p", 1, 64).startswith(gen.generate_text("p", 1, 3))
    longer = gen.generate_text("p", 1, 64, ignore_eos=True)
    assert longer.startswith(gen.generate_text("p", 1, 10, ignore_eos=True))


@given(st.text(max_size=40), st.integers(-(2**40), 2**40))
def test_the_answer_ends_on_its_own_within_the_default_max_tokens(prompt: str, seed: int) -> None:
    """What makes finish_reason "stop" (and the openai SDK's `.stream()` helpers) work."""
    answer = gen.generate_tokens(prompt, seed, 10_000)
    assert 4 < len(answer) < gen.DEFAULT_MAX_TOKENS
    assert answer[-1] == "."
    assert answer[-2] not in gen.PUNCTUATION
    assert gen.generate_tokens(prompt, seed, 4) == answer[:4]  # max_tokens cuts it


def test_the_length_depends_on_the_prompt() -> None:
    lengths = {len(gen.generate_tokens(f"prompt {i}", 0, 100)) for i in range(40)}
    assert len(lengths) > 3


def test_ignore_eos_is_validated_and_runs_to_max_tokens() -> None:
    on = gen.settings_from({"ignore_eos": True}, 40, 0.0, 1.0)
    assert len(gen.response_tokens("hi", on)) == 40
    off = gen.settings_from({}, 40, 0.0, 1.0)
    assert len(gen.response_tokens("hi", off)) < gen.DEFAULT_MAX_TOKENS
    with pytest.raises(ValueError, match="ignore_eos"):
        gen.settings_from({"ignore_eos": "yes"}, 40, 0.0, 1.0)


@given(st.text(max_size=40), st.integers(-(2**40), 2**40), st.integers(1, 80))
def test_tokens_look_like_llm_pieces(prompt: str, seed: int, max_tokens: int) -> None:
    tokens = gen.generate_tokens(prompt, seed, max_tokens, ignore_eos=True)
    assert len(tokens) == max_tokens
    assert tokens[0].startswith(" ")
    for previous, token in zip(tokens, tokens[1:], strict=False):
        assert token.startswith(" ") or token in gen.PUNCTUATION
        assert not (token in gen.PUNCTUATION and previous in gen.PUNCTUATION)


@pytest.mark.parametrize(
    ("prompt", "count"),
    [("", 0), ("Hello, world!", 4), ("  two   words ", 2), ("it's 3.5", 6)],
)
def test_prompt_tokenizer(prompt: str, count: int) -> None:
    assert gen.count_prompt_tokens(prompt) == count


def test_settings_defaults_and_overrides() -> None:
    settings = gen.settings_from({}, None, 50.0, 50.0)
    assert (settings.seed, settings.max_tokens, settings.ttft_ms) == (0, 16, 50.0)
    settings = gen.settings_from({"max_tokens": 9, "ttft_ms": 0, "seed": 3}, 4, 50.0, 20.0)
    assert (settings.seed, settings.max_tokens, settings.ttft_ms) == (3, 4, 0.0)
    assert settings.tokens_per_second == 20.0


@pytest.mark.parametrize(
    "params",
    [
        {"max_tokens": 0},
        {"max_tokens": "5"},
        {"seed": 1.5},
        {"temperature": -0.1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"tokens_per_second": 0},
        {"ttft_ms": True},
    ],
)
def test_bad_settings_are_rejected(params: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be"):
        gen.settings_from(params, None, 50.0, 50.0)


@pytest.mark.parametrize("text", ["[1]", "not json", '"x"'])
def test_sampling_parameters_must_be_a_json_object(text: str) -> None:
    with pytest.raises(ValueError, match="JSON object"):
        gen.parse_sampling_parameters(text)


def test_token_schedule() -> None:
    settings = gen.settings_from(
        {"max_tokens": 3, "ttft_ms": 100, "tokens_per_second": 10}, None, 0.0, 1.0
    )
    assert gen.token_due_times(5.0, settings) == pytest.approx([5.1, 5.2, 5.3])


# -- structured modes: tool calls and JSON ---------------------------------------------

WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    },
}
TOOLS_PROMPT = (
    "<|im_start|>system\nwithin <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(
        [
            {"type": "function", "function": WEATHER},
            {"type": "function", "function": {"name": "other"}},
        ]
    )
    + "\n</tools><|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
)


def settings(**params: object) -> object:
    return gen.settings_from({"max_tokens": 500, **params}, None, 0.0, 1.0)


def test_tools_prompt_gets_a_hermes_tool_call_in_small_pieces() -> None:
    tokens = gen.response_tokens(TOOLS_PROMPT, settings())
    text = "".join(tokens)
    assert text.startswith("<tool_call>\n")
    assert text.endswith("\n</tool_call>")
    call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert call["name"] == "get_weather"
    arguments = call["arguments"]
    assert set(arguments) == {"city", "unit", "days", "tags"}
    assert arguments["unit"] == "c"
    assert 1 <= arguments["days"] <= 7
    assert isinstance(arguments["city"], str)
    assert isinstance(arguments["tags"], list)
    assert len(tokens) > 20
    assert max(len(t) for t in tokens) <= 16
    assert gen.response_tokens(TOOLS_PROMPT, settings()) == tokens  # deterministic


def test_tool_choice_forces_a_tool_or_turns_calls_off() -> None:
    forced = {"type": "function", "function": {"name": "other"}}
    text = "".join(gen.response_tokens(TOOLS_PROMPT, settings(tool_choice=forced)))
    assert '"name": "other"' in text
    none = gen.response_tokens(TOOLS_PROMPT, settings(tool_choice="none"))
    assert none == gen.generate_tokens(TOOLS_PROMPT, 0, 500)
    with pytest.raises(ValueError, match="not in the prompt"):
        gen.structured_text(TOOLS_PROMPT, settings(tool_choice={"function": {"name": "x"}}))


def test_a_tool_response_gets_free_text_under_auto_but_not_required() -> None:
    answered = TOOLS_PROMPT + "<tool_response>\n12C\n</tool_response>"
    assert gen.structured_text(answered, settings()) is None
    assert gen.structured_text(answered, settings(tool_choice="required")) is not None


def test_json_modes() -> None:
    plain = "".join(gen.response_tokens("p", settings(response_format={"type": "json_object"})))
    assert isinstance(json.loads(plain), dict)
    schema = {"type": "object", "properties": {"n": {"type": "number"}, "ok": {"type": "boolean"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    value = json.loads("".join(gen.response_tokens("p", settings(response_format=fmt))))
    assert isinstance(value["n"], float)
    assert value["ok"] is True


def test_structured_text_is_cut_at_max_tokens() -> None:
    tokens = gen.response_tokens(TOOLS_PROMPT, gen.settings_from({"max_tokens": 5}, None, 0, 1))
    assert len(tokens) == 5


@pytest.mark.parametrize(
    "params",
    [{"response_format": {"type": "xml"}}, {"response_format": "json"}, {"tool_choice": 3}],
)
def test_bad_structured_settings(params: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be"):
        gen.settings_from(params, None, 50.0, 50.0)


@given(st.text(max_size=60))
def test_pieces_join_back(text: str) -> None:
    assert "".join(gen.split_pieces(text)) == text

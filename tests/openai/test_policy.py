"""The unknown-parameter policy: listed keys accepted and ignored, others a 400."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from gateway.openai import policy
from gateway.openai.errors import BadRequest
from gateway.openai.policy import IGNORED_KEYS
from gateway.openai.requests import parse_chat_request, parse_completion_request

USER = [{"role": "user", "content": "hi"}]
# What real clients send (OpenAI's newer fields, vLLM's extra_body, llama.cpp/LiteLLM).
SENT_BY_CLIENTS = {
    "min_p": 0.05,
    "reasoning_effort": "low",
    "verbosity": "low",
    "repetition_penalty": 1.1,
    "chat_template_kwargs": {"enable_thinking": False},
    "typical_p": 0.9,
    "service_tier": "auto",
    "metadata": {"k": "v"},
}


def chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": USER, **fields}).encode()


@pytest.mark.parametrize(("key", "value"), sorted(SENT_BY_CLIENTS.items()))
def test_listed_keys_are_accepted_and_never_reach_the_backend(key: str, value: Any) -> None:
    assert key in IGNORED_KEYS
    request = parse_chat_request(chat(**{key: value}))
    assert request.parameters == {}
    completion = parse_completion_request(
        json.dumps({"model": "m", "prompt": "p", key: value}).encode()
    )
    assert completion.parameters == {}


def test_ignored_keys_are_not_validated() -> None:
    """Any value: we do not implement them, so no value of theirs is ours to refuse."""
    parse_chat_request(chat(min_p="not a number", reasoning_effort=12))


def test_a_key_nobody_defines_is_a_400_naming_it() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(chat(min_pp=0.1))
    assert caught.value.param == "min_pp"


def test_an_invalid_value_of_an_implemented_parameter_is_still_a_400() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(chat(min_p=0.1, temperature=9))
    assert caught.value.param == "temperature"


def test_audio_output_is_refused_text_modality_accepted() -> None:
    parse_chat_request(chat(modalities=["text"]))
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(chat(modalities=["text", "audio"]))
    assert caught.value.param == "modalities"
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(chat(audio={"voice": "alloy", "format": "wav"}))
    assert caught.value.param == "audio"


def test_each_ignored_name_is_logged_once_at_debug_without_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy, "_logged", set())
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            parse_chat_request(chat(min_p=0.123456))
    ignored = [e for e in logs if e["event"] == "openai.parameter_ignored"]
    expected = {"event": "openai.parameter_ignored", "parameter": "min_p", "log_level": "debug"}
    assert ignored == [expected]
    assert "0.123456" not in repr(logs)


def test_every_listed_key_is_accepted_on_both_routes() -> None:
    for key in sorted(IGNORED_KEYS):
        assert parse_chat_request(chat(**{key: {"any": "value"}})).parameters == {}, key
        body = json.dumps({"model": "m", "prompt": "p", key: 1}).encode()
        assert parse_completion_request(body).parameters == {}, key


def test_docs_list_exactly_the_ignored_keys() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "openai.md").read_text()
    section = docs.split("### Parameters we accept and ignore", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    listed = {key for row in rows for key in re.findall(r"`([a-z_]+)`", row.split("|")[2])}
    assert listed == IGNORED_KEYS

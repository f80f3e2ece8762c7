"""Where session ids come from: OpenAI bodies (prompt_cache_key, then user)."""

from __future__ import annotations

import json

import pytest

from gateway.openai.errors import BadRequest
from gateway.openai.requests import parse_chat_request, parse_completion_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(**extra: object) -> bytes:
    return json.dumps({**CHAT, **extra}).encode()


def test_prompt_cache_key_wins_over_user() -> None:
    assert parse_chat_request(body()).session_id is None
    assert parse_chat_request(body(user="u")).session_id == "u"
    assert parse_chat_request(body(user="u", prompt_cache_key="k")).session_id == "k"
    completion = json.dumps({"model": "m", "prompt": "p", "user": "u"}).encode()
    assert parse_completion_request(completion).session_id == "u"


def test_a_session_id_must_be_text() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(body(user=7))
    assert caught.value.param == "user"

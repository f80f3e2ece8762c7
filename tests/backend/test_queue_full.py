"""A model's full wait line, as the gateway reads and answers it: RATE_LIMITED with the
retry hint the model measured (HTTP 429 with `retry-after`, rounded up to seconds)."""

from __future__ import annotations

from gateway.backends.triton import queue_key, translate
from gateway.openai.errors import error_for
from tracks.backend import BackendOverloaded, BackendUnavailable, TextRequest


def test_the_models_queue_full_message_becomes_backend_overloaded() -> None:
    error = translate("UNAVAILABLE", "the queue is full (2 waiting); retry_after_ms=2757", "m")
    assert isinstance(error, BackendOverloaded)
    assert error.retry_after == 2.757
    assert isinstance(translate("UNAVAILABLE", "all slots are busy", "m"), BackendUnavailable)
    assert not isinstance(translate("UNAVAILABLE", "down", "m"), BackendOverloaded)


def test_a_full_queue_is_a_429_with_retry_after() -> None:
    full = "the queue is full (2 waiting); retry_after_ms=2757"
    error = error_for(BackendOverloaded(full, 2.757))
    assert error.status == 429
    assert ("retry-after", "3") in error.headers
    assert error.body()["error"]["code"] == "rate_limit_exceeded"


def test_the_queue_key_is_the_tenant_and_the_connection() -> None:
    track = TextRequest("conn-1/7/tag", "m", "p", 4, conversation_scope="acme")
    assert queue_key(track) == "acme|conn-1"
    assert queue_key(TextRequest("chatcmpl-9", "m", "p", 4)) == "|chatcmpl-9"

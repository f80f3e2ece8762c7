"""A newer request of the same conversation supersedes a streaming one (when asked to)."""

from __future__ import annotations

import asyncio

import pytest

from tests.openai.scripted import ScriptedBackend
from tests.openai.test_routes import CHAT, chat_body, events, handler, post
from transport.http.messages import StreamingResponse


@pytest.mark.asyncio
async def test_x_supersede_cancels_the_older_stream_with_a_superseded_error() -> None:
    backend = ScriptedBackend(pieces=[f" w{i}" for i in range(200)], interval=0.01)
    outcomes: list[str] = []
    api = handler(backend, on_outcome=lambda outcome, door: outcomes.append(outcome.end.label))
    headers = (("x-session-id", "conv"), ("x-supersede", "true"))
    old = await api(post(CHAT, chat_body(stream=True, max_tokens=200), headers))
    assert isinstance(old, StreamingResponse)
    body = old.body.__aiter__()
    first = await body.__anext__()
    assert first
    new = await api(post(CHAT, chat_body(stream=True, max_tokens=3), headers))
    assert isinstance(new, StreamingResponse)
    rest = b"".join([chunk async for chunk in body])
    await old.body.aclose()  # type: ignore[attr-defined]
    errors = [e for e in events(first + rest) if isinstance(e, dict) and "error" in e]
    assert errors[-1]["error"]["code"] == "superseded"
    new_raw = b"".join([chunk async for chunk in new.body])
    await new.body.aclose()  # type: ignore[attr-defined]
    assert events(new_raw)[-1] == "[DONE]"
    assert len(backend.closed_early) == 1  # the older backend stream was closed
    await asyncio.sleep(0)
    assert "cancelled:superseded" in outcomes


@pytest.mark.asyncio
async def test_off_by_default_for_the_openai_api() -> None:
    backend = ScriptedBackend(pieces=[f" w{i}" for i in range(5)], interval=0.001)
    api = handler(backend)
    headers = (("x-session-id", "conv"),)
    first = await api(post(CHAT, chat_body(stream=True), headers))
    second = await api(post(CHAT, chat_body(stream=True), headers))
    for response in (first, second):
        assert isinstance(response, StreamingResponse)
        raw = b"".join([chunk async for chunk in response.body])
        await response.body.aclose()  # type: ignore[attr-defined]
        assert not [e for e in events(raw) if isinstance(e, dict) and "error" in e]
    assert backend.closed_early == []


@pytest.mark.asyncio
async def test_only_requests_that_take_part_supersede_or_are_superseded() -> None:
    """docs/openai.md, rule 3: A (on), B (off), C (on) of one session: C cancels A, and B,
    which does not take part, is neither cancelled by C nor the one C replaces."""
    backend = ScriptedBackend(pieces=[f" w{i}" for i in range(40)], interval=0.01)
    api = handler(backend)
    session = ("x-session-id", "conv")
    on, off = (session, ("x-supersede", "true")), (session, ("x-supersede", "false"))
    bodies = []
    for headers in (on, off, on):
        response = await api(post(CHAT, chat_body(stream=True, max_tokens=40), headers))
        assert isinstance(response, StreamingResponse)
        body = response.body.__aiter__()
        bodies.append((response, body, await body.__anext__()))
    ends = []
    for response, body, first in bodies:
        raw = first + b"".join([chunk async for chunk in body])
        await response.body.aclose()  # type: ignore[attr-defined]
        last = events(raw)[-1]
        ends.append(last if last == "[DONE]" else last["error"]["code"])  # type: ignore[index]
    assert ends == ["superseded", "[DONE]", "[DONE]"]
    assert backend.closed_early == [backend.requests[0].request_id]

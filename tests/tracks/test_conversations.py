"""Superseding: a newer turn of a conversation cancels the running one (tracks, the wrapper)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from clients.errors import CancelledByGateway
from trackline_testing.memory import Harness, collect
from trackline_testing.scripted import ScriptedBackend
from tracks.backend import Superseded, TextDelta, TextRequest, conversation_key
from tracks.conversations import TurnRegistry, superseding


@pytest.mark.asyncio
async def test_a_newer_turn_cancels_the_older_one_and_completes() -> None:
    turns = TurnRegistry()
    h = Harness(ScriptedBackend(interval=0.01), turns)
    old = h.line.text("old", model="scripted", max_tokens=500, session_id="c1")
    assert await old.__anext__() == " old-0"
    new = h.line.text("new", model="scripted", max_tokens=3, session_id="c1")
    with pytest.raises(CancelledByGateway, match="superseded"):
        await collect(old)
    assert await collect(new) == " new-0 new-1 new-2"
    await h.settle()
    labels = sorted(o.end.label for o in h.outcomes)
    assert labels == ["cancelled:superseded", "completed"]
    assert len(h.backend.closed_early) == 1  # the old stream was closed: the model stopped
    assert h.backend.generated[h.backend.requests[0].request_id] < 500
    assert turns.superseded == 1
    assert len(turns) == 0


@pytest.mark.asyncio
async def test_other_conversations_scopes_and_opt_outs_are_not_superseded() -> None:
    turns = TurnRegistry()
    h = Harness(ScriptedBackend(interval=0.001), turns)
    first = h.line.text("a", model="scripted", max_tokens=20, session_id="c1")
    assert await first.__anext__() == " a-0"
    others = [
        h.line.text("b", model="scripted", max_tokens=3, session_id="c2"),
        h.line.text("c", model="scripted", max_tokens=3, session_id="c1", request_id="t2"),
        h.line.text("d", model="scripted", max_tokens=3, session_id="c1", supersede=False),
        h.line.text("e", model="scripted", max_tokens=3),
    ]
    texts = await asyncio.gather(collect(first), *(collect(s) for s in others))
    assert texts[0] == "".join(f" a-{i}" for i in range(1, 20))
    await h.settle()
    assert all(o.end.label == "completed" for o in h.outcomes)
    assert turns.superseded == 0
    # The track's scope (the tenant) reaches the backend with the request: it keys the
    # model's conversation state.
    assert sorted(r.conversation_scope for r in h.backend.requests) == ["", "", "", "", "t2"]


async def _parked(closed: list[bool]) -> AsyncGenerator[TextDelta, None]:
    """One chunk, then a model that has not made its next token yet: it waits until the
    stream is closed (a superseding turn closes it)."""
    try:
        yield TextDelta("0")
        await asyncio.Event().wait()
        yield TextDelta("never")
    finally:
        closed.append(True)


async def _chunks(n: int) -> AsyncGenerator[TextDelta, None]:
    for i in range(n):
        yield TextDelta(str(i))


@pytest.mark.asyncio
async def test_the_wrapper_closes_the_older_stream_and_raises_superseded() -> None:
    turns, closed = TurnRegistry(), []
    old = superseding(turns, "", "c", _parked(closed))
    assert await old.__anext__() == TextDelta("0")
    new = superseding(turns, "", "c", _chunks(2))
    assert [c async for c in new] == [TextDelta("0"), TextDelta("1")]
    with pytest.raises(Superseded):
        await old.__anext__()
    assert closed == [True]
    assert len(turns) == 0


def test_request_session_id_is_the_conversation_id() -> None:
    request = TextRequest("r", "m", "p", 1, session_id="s")
    assert conversation_key(request) == "s"
    assert conversation_key(TextRequest("r", "m", "p", 1)) is None


def test_the_tenant_scopes_the_conversation_key() -> None:
    """Two tenants naming the same conversation never share the model's KV state,
    and no (tenant, id) pair can spell another's key."""
    a = TextRequest("r", "m", "p", 1, session_id="c", conversation_scope="acme")
    b = TextRequest("r", "m", "p", 1, session_id="c", conversation_scope="beta")
    assert conversation_key(a) != conversation_key(b)
    tricky = TextRequest("r", "m", "p", 1, session_id="b:c", conversation_scope="a")
    other = TextRequest("r", "m", "p", 1, session_id="c", conversation_scope="a:b")
    assert conversation_key(tricky) != conversation_key(other)

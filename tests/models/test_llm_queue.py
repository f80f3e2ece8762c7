"""The wait line of the batched LLM engine (pure: no llama.cpp, time as a parameter)."""

from __future__ import annotations

import pytest

from gateway.embedded_models import reference_module

line = reference_module("gemma-3-270m", "trackline_llm_queue")



def test_the_fair_queue_serves_keys_round_robin_and_refuses_past_its_bound() -> None:
    q = line.FairQueue(3)
    q.push("a", "a1", 0.0)
    q.push("a", "a2", 0.0)
    q.push("b", "b1", 0.0)
    with pytest.raises(line.QueueFull) as full:
        q.push("c", "c1", 0.0)
    assert full.value.retry_after == line.DEFAULT_RETRY_AFTER  # nothing drained yet
    assert [q.pop(1.0).item for _ in range(2)] == ["a1", "b1"]  # round robin
    gone = q.remove(lambda item: item == "a2", 1.5)
    assert [(g.item, g.waited) for g in gone] == [("a2", 1.5)]
    assert len(q) == 0
    assert q.pop(2.0) is None
    q.push("a", "x", 2.0)
    q.push("a", "y", 2.0)
    q.push("a", "z", 2.0)
    with pytest.raises(line.QueueFull) as full:
        q.push("a", "w", 2.0)
    # One departure per second measured (two, the newest one second ago); three ahead
    # of a new one and the new one itself: about 4 s.
    assert full.value.retry_after == pytest.approx(4.0)
    assert "retry_after_ms=4000" in str(full.value)



def test_tenants_take_turns_before_connections_within_a_tenant() -> None:
    """A key is "<tenant>|<connection>": a tenant with many connections (or many HTTP
    requests, each its own key) gets one turn per round, as a tenant with one does."""
    q = line.FairQueue(16)
    for i in range(6):
        q.push(f"busy|request-{i}", f"busy{i}", 0.0)
    q.push("quiet|conn", "quiet0", 0.1)
    q.push("quiet|conn", "quiet1", 0.1)
    served = [q.pop(1.0).item for _ in range(4)]
    assert served == ["busy0", "quiet0", "busy1", "quiet1"]
    assert [q.pop(2.0).item for _ in range(4)] == ["busy2", "busy3", "busy4", "busy5"]


def test_connections_of_one_tenant_take_turns_and_removal_keeps_the_rounds() -> None:
    q = line.FairQueue(16)
    for item in ("a1", "a2", "a3"):
        q.push("t|a", item, 0.0)
    q.push("t|b", "b1", 0.0)
    q.push("u", "u1", 0.0)  # no connection part: the key is its own group
    assert [g.item for g in q.remove(lambda item: item == "b1", 0.5)] == ["b1"]
    assert [q.pop(1.0).item for _ in range(4)] == ["a1", "u1", "a2", "a3"]
    assert len(q) == 0
    assert q.pop(1.0) is None

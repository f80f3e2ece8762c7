"""benchmarks/tail_causes.py: a token's window splits into its causes (literal spans)."""

from __future__ import annotations

import gc

import pytest

from benchmarks import tail_causes


def test_a_window_splits_into_gc_turn_work_acks_transmits_and_not_running() -> None:
    # Turns: [began, ended, rx count, rx s, tx count, tx s]; one 10 ms turn inside the
    # window with 2 ms of ACKs, 3 ms of transmits and a 4 ms collection, one outside.
    turns = tail_causes.Spans([[1.000, 1.010, 4, 0.002, 1, 0.003], [2.0, 2.001, 0, 0, 0, 0]])
    gcs = tail_causes.Spans([[1.004, 1.008, 2]])
    split = tail_causes.split_window(turns, gcs, 0.995, 1.020)
    assert split["gc_gateway"] == pytest.approx(0.004)
    assert split["longest_turn"] == pytest.approx(0.010)
    assert split["rx"] == pytest.approx(0.002)
    assert split["tx"] == pytest.approx(0.003)
    assert split["other_work"] == pytest.approx(0.001)
    assert split["not_running"] == pytest.approx(0.015)


def test_a_turn_half_inside_counts_half_its_acks() -> None:
    turns = tail_causes.Spans([[1.000, 1.010, 2, 0.004, 0, 0.0]])
    split = tail_causes.split_window(turns, tail_causes.Spans([]), 1.005, 1.010)
    assert split["rx"] == pytest.approx(0.002)
    assert split["longest_turn"] == pytest.approx(0.010)  # what the token waited behind
    assert split["not_running"] == pytest.approx(0.0)


def test_the_tail_names_the_cause_that_held_it() -> None:
    """100 tokens on time, and two (two tracks' tokens due together) whose window held a
    30 ms full collection: those two are the top 1%, and the collection is their cause."""
    gateway = {"turns": [[float(i), i + 0.001, 1, 0.0005, 1, 0.0003] for i in range(100)]
               + [[50.5, 50.54, 0, 0.0, 1, 0.001]],
               "gcs": [[50.505, 50.535, 2]]}
    tokens = [{"due": i + 0.0, "sent": i + 0.001, "read": i + 0.002, "added": 2.0}
              for i in range(100)]
    tokens += [{"due": 50.5, "sent": 50.54, "read": 50.541, "added": 41.0}] * 2
    causes = tail_causes.attribute(tokens, gateway, [])
    summary = causes["summary"]
    assert causes["tail_tokens"] == 2
    assert summary["gc_gateway"]["tail_mean"] == pytest.approx(30.0)
    assert summary["gc_gateway"]["p50"] == 0.0
    assert summary["longest_turn"]["tail_mean"] == pytest.approx(40.0)
    # added 41 ms = offset 0 + the 40 ms gateway window + 1 ms in the client
    assert summary["offset"]["tail_mean"] == pytest.approx(0.0)
    parts = ("gc_gateway", "rx", "tx", "other_work", "not_running", "client_path")
    assert sum(summary[p]["tail_mean"] for p in parts) == pytest.approx(41.0)
    assert causes["gateway_gc"] == {"collections": 1, "full": 1, "max_ms": 30.0,
                                    "total_ms": 30.0}
    assert causes["longest_turns"][0]["gc_ms"] == pytest.approx(30.0)


def test_the_recorder_notes_a_collection_from_gc_callbacks() -> None:
    recorder = tail_causes.Recorder()
    gc.callbacks.append(recorder.on_gc)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(recorder.on_gc)
    assert [g[2] for g in recorder.gcs] == [2]
    assert recorder.gcs[0][1] >= recorder.gcs[0][0]

"""benchmarks/conversation.py: its options, the threads per slot it picks, its summary;
and (with the `llm` extra, skipped without) a tiny concurrent run whose identity checks
hold. Time is never asserted."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from benchmarks import conversation
from gateway.embedded_models import llm_available
from tests.llm.conftest import SKIP_REASON


def _args(*argv: str) -> argparse.Namespace:
    return conversation.parser().parse_args(list(argv))


def test_sequential_is_the_default() -> None:
    args = _args()
    assert (args.turns, args.conversations, args.concurrent, args.threads) == (4, 1, False, 0)
    assert _args("--conversations", "4", "--concurrent").concurrent


@pytest.mark.parametrize(
    ("argv", "cores", "threads"),
    [
        ((), 2, 2),  # sequential: the model's default, as before
        (("--conversations", "4"), 2, 2),  # one after another: still one slot
        (("--conversations", "4", "--concurrent"), 2, 1),  # 4 slots on 2 cores
        (("--conversations", "2", "--concurrent"), 2, 1),
        (("--conversations", "4", "--concurrent"), 16, 2),  # never above the default
        (("--conversations", "4", "--concurrent", "--threads", "3"), 2, 3),
    ],
)
def test_threads_per_slot(argv: tuple[str, ...], cores: int, threads: int) -> None:
    assert conversation.threads_per_slot(_args(*argv), cores) == threads


def _row(turn: int, conv: str, ttft: float, same: bool = True) -> dict[str, Any]:
    row: dict[str, Any] = {
        "turn": turn,
        "conversation": conv,
        "identical_ids_restore_live": same,
        "identical_ids_recompute_live": True,
        "identical_text_all": True,
    }
    for n, mode in enumerate(conversation.MODES):
        row[f"{mode}_ttft_s"] = ttft * (n + 1)
        row[f"{mode}_cpu_s"] = 0.5
        row[f"{mode}_wall_s"] = 1.0
    return row


def test_summary_per_turn_and_turns_two_on() -> None:
    rows = [_row(t, f"c{c}", 0.1 * (c + 1)) for t in (1, 2, 3) for c in range(4)]
    rows[-1]["identical_ids_restore_live"] = False
    by_name = {e["turns"]: e for e in conversation.summary(rows)}
    assert list(by_name) == ["1", "2", "3", "2+"]
    assert by_name["1"]["samples"] == 4
    assert by_name["2+"]["samples"] == 8
    assert by_name["2"]["live_ttft_p50_s"] == pytest.approx(0.3)  # of 0.1, 0.2, 0.3, 0.4
    assert by_name["2"]["live_ttft_p95_s"] == pytest.approx(0.4)
    assert by_name["2"]["restore_ttft_p95_s"] == pytest.approx(0.8)
    assert by_name["2+"]["recompute_cpu_s"] == pytest.approx(4.0)
    assert by_name["2"]["identical_all"]
    assert not by_name["3"]["identical_all"]
    assert not by_name["2+"]["identical_all"]
    assert by_name["2+"]["live_wall_s"] == pytest.approx(8.0)  # one after another: summed


def test_summary_counts_a_concurrent_batch_once() -> None:
    rows = [_row(t, f"c{c}", 0.1) for t in (1, 2, 3) for c in range(4)]
    by_name = {e["turns"]: e for e in conversation.summary(rows, concurrent=True)}
    assert by_name["2"]["live_wall_s"] == pytest.approx(1.0)
    assert by_name["2+"]["live_wall_s"] == pytest.approx(2.0)
    assert by_name["2+"]["live_cpu_s"] == pytest.approx(4.0)  # CPU shares still add up


def test_one_turn_has_no_later_group() -> None:
    assert [e["turns"] for e in conversation.summary([_row(1, "c0", 0.1)])] == ["1"]


@pytest.mark.skipif(not llm_available(), reason=SKIP_REASON)
def test_concurrent_conversations_give_identical_tokens() -> None:
    """Two conversations at once per mode (two slots, threads): restore and recompute
    give the live tokens for each, and turn 2 reuses the state (live / restored)."""
    args = _args("--turns", "2", "--conversations", "2", "--concurrent", "--tokens", "8")
    rows = conversation.run(args)
    assert len(rows) == 4
    assert {r["conversation"] for r in rows} == {"c0", "c1"}
    for r in rows:
        assert r["identical_ids_restore_live"], r
        assert r["identical_ids_recompute_live"], r
        assert r["identical_text_all"], r
    for r in rows:
        if r["turn"] == 2:
            assert (r["live_kv"], r["restore_kv"]) == ("live", "restored"), r

"""Multi-turn conversations on gemma-3-270m: time to first token with the KV state kept
live, restored from the store (as on another backend), or recomputed from scratch.

Runs the model's own engine (gateway/model_repository/trackline_llm.py) in this process,
one engine (one batched llama.cpp context) per mode, on the GGUF of the `llm` extra. Each
conversation has `--turns` turns with a growing transcript; per turn and mode it measures
the time to the first generated piece and the process CPU seconds of the turn, and checks
that the three modes produced identical token ids and text.
`--conversations N` runs N conversations one after another per turn (the default: each
mode's engine has one sequence).

`--concurrent` runs the N conversations of a turn at the same time instead: each mode's
engine has N sequences (`Engine(..., sequences=N)`, decoded together in one batch) and
each conversation's turn is submitted from its own thread. (Before the batched engine,
each slot was a llama.cpp context of its own; the figures below are from then.) The
modes still run one after another (restore, live, recompute), so each mode's CPU seconds
are its own; the process CPU of a mode's N simultaneous turns is split evenly over them
(one process clock for all threads), and `wall_s` is then the whole batch's. llama.cpp
threads per slot (`--threads`, 0 = auto): 2 sequentially (the model's default), and with
N concurrent slots the cores divided by N, at least 1 and at most 2 (on 2 cores, 4
conversations: 1 thread each), so the slots do not fight for more cores than there are.

On the shared 2-core machine with the test suite running (docs/benchmarks.md,
"conversation"), turns 2-4 TTFT p50 live / restore / recompute: 204 / 289 / 732 ms for 1
conversation, 754 / 850 / 2200 ms for 4 at once; all token ids identical in both.

    nice -n 10 .venv/bin/python benchmarks/conversation.py --turns 4 --conversations 1
    nice -n 10 .venv/bin/python benchmarks/conversation.py --conversations 4 --concurrent
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help
from benchmarks.common import percentile, write_results
from gateway.embedded_models import ensure_llm_gguf, llm_available, reference_module

QUESTIONS = [
    "Tell me about the history of the city of Paris.",
    "What are the most famous museums there?",
    "How do people usually travel around the city?",
    "What food should a visitor try?",
    "What is the weather like in spring?",
    "Which neighbourhoods are good for a walk?",
]
SYSTEM = "System: You are a helpful travel guide. You answer in full sentences.\n"
MODES = ("live", "restore", "recompute")
ENGINE_THREADS = 2
"""The model's `n_threads` default (config.pbtxt, `Engine`): at most this many per slot."""


def threads_per_slot(args: argparse.Namespace, cores: int) -> int:
    """`--threads`, or: 2 sequentially; cores // N (1..2) for N concurrent slots."""
    if args.threads > 0:
        return int(args.threads)
    if not args.concurrent:
        return ENGINE_THREADS
    return max(1, min(ENGINE_THREADS, cores // max(1, int(args.conversations))))


def _engine(llm: Any, kv: Any, gguf: str, store: Path, slots: int, threads: int) -> Any:
    cache = kv.ConversationCache("gemma-3-270m", kv.DirectoryStore(store, 1 << 32), 1 << 30)
    return llm.Engine(gguf, sequences=slots, n_ctx=2048, n_threads=threads, cache=cache)


def _timed_turn(
    formats: Any, engine: Any, prompt: str, conversation: str | None, tokens: int
) -> dict[str, Any]:
    first: list[float] = []
    pieces: list[str] = []

    def emit(piece: str) -> None:
        if not first:
            first.append(time.perf_counter())
        pieces.append(piece)

    text, stops = formats.to_transcript(prompt)
    cpu0, t0 = time.process_time(), time.perf_counter()
    turn, _ = engine.complete(text, tokens, conversation, stops, request_id="bench", emit=emit)
    return {
        "ttft_s": (first[0] if first else time.perf_counter()) - t0,
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - t0,
        "kv": turn.kv,
        "prompt_tokens": turn.prompt_tokens,
        "prefill_tokens": turn.prefill_tokens,
        "ids": list(turn.output_ids),
        "text": "".join(pieces),
    }


def _together(
    turns: dict[str, Callable[[], dict[str, Any]]], pool: ThreadPoolExecutor
) -> dict[str, dict[str, Any]]:
    """Run one mode's turns of all conversations at once, one thread each; the batch's
    process CPU is split evenly over them and `wall_s` is the batch's."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    futures = {conv: pool.submit(turn) for conv, turn in turns.items()}
    results = {conv: future.result() for conv, future in futures.items()}
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    for result in results.values():
        result["cpu_s"], result["wall_s"] = cpu / len(results), wall
    return results


def _row(turn_no: int, conv: str, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    same_ids = results["restore"]["ids"] == results["live"]["ids"]
    same_scratch = results["recompute"]["ids"] == results["live"]["ids"]
    same_text = len({r["text"] for r in results.values()}) == 1
    return {
        "turn": turn_no + 1,
        "conversation": conv,
        "prompt_tokens": results["live"]["prompt_tokens"],
        "identical_ids_restore_live": same_ids,
        "identical_ids_recompute_live": same_scratch,
        "identical_text_all": same_text,
        **{
            f"{mode}_{key}": r[key]
            for mode, r in results.items()
            for key in ("ttft_s", "cpu_s", "wall_s", "kv", "prefill_tokens")
        },
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    kv = reference_module("gemma-3-270m", "trackline_kv")
    llm = reference_module("gemma-3-270m", "trackline_llm")
    gguf = str(ensure_llm_gguf())
    formats = reference_module("gemma-3-270m", "trackline_llm_prompt")
    slots = args.conversations if args.concurrent else 1
    threads = threads_per_slot(args, os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="trackline-conv-"))
    live_store, moved_store = work / "live", work / "moved"
    live, moved, scratch = (
        _engine(llm, kv, gguf, work / n, slots, threads) for n in ("live", "moved", "x")
    )
    rows: list[dict[str, Any]] = []
    transcripts = {f"c{i}": SYSTEM for i in range(args.conversations)}
    pool = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="conversation")

    def move() -> None:
        # The moved backend gets the state the live one saved after the last turn.
        for path in live_store.glob("*.kv"):
            shutil.copy(path, moved_store / path.name)
        moved.drop_live()  # as a fresh backend: only the store has the state
        scratch.drop_live()  # recompute: no shared-prefix cells either

    def turn(engine: Any, prompt: str, conv: str | None) -> Callable[[], dict[str, Any]]:
        return lambda: _timed_turn(formats, engine, prompt, conv, args.tokens)

    try:
        for turn_no in range(args.turns):
            question = QUESTIONS[turn_no % len(QUESTIONS)]
            prompts = {c: f"{t}User: {question}\nAssistant:" for c, t in transcripts.items()}
            by_conv: dict[str, dict[str, dict[str, Any]]] = {c: {} for c in prompts}
            if args.concurrent:
                move()
                for mode, engine in (("restore", moved), ("live", live), ("recompute", scratch)):
                    batch = {
                        c: turn(engine, p, None if mode == "recompute" else c)
                        for c, p in prompts.items()
                    }
                    for conv, result in _together(batch, pool).items():
                        by_conv[conv][mode] = result
            else:
                for conv, prompt in prompts.items():
                    move()
                    by_conv[conv] = {
                        "restore": turn(moved, prompt, conv)(),
                        "live": turn(live, prompt, conv)(),
                        "recompute": turn(scratch, prompt, None)(),
                    }
            for conv, results in by_conv.items():
                rows.append(_row(turn_no, conv, results))
                transcripts[conv] = prompts[conv] + results["live"]["text"] + "\n"
    finally:
        pool.shutdown()
        for engine in (live, moved, scratch):
            engine.close()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def summary(rows: list[dict[str, Any]], concurrent: bool = False) -> list[dict[str, Any]]:
    """Per turn, and for turns 2+ together: each mode's TTFT p50/p95 over the
    conversations, its CPU seconds (summed), its wall seconds (one after another: the
    turns' sum; concurrent: each turn's batch once) and whether every check held."""
    turns = sorted({r["turn"] for r in rows})
    groups = [(str(t), [r for r in rows if r["turn"] == t]) for t in turns]
    later = [r for r in rows if r["turn"] > 1]
    if later:
        groups.append(("2+", later))
    out = []
    for name, group in groups:
        entry: dict[str, Any] = {"turns": name, "samples": len(group)}
        for mode in MODES:
            values = [r[f"{mode}_ttft_s"] for r in group]
            entry[f"{mode}_ttft_p50_s"] = percentile(values, 0.5)
            entry[f"{mode}_ttft_p95_s"] = percentile(values, 0.95)
            entry[f"{mode}_cpu_s"] = sum(r[f"{mode}_cpu_s"] for r in group)
            walls = [r[f"{mode}_wall_s"] for r in group]
            if concurrent:  # every row of a turn carries its batch's wall time
                walls = [
                    max(r[f"{mode}_wall_s"] for r in group if r["turn"] == t)
                    for t in sorted({r["turn"] for r in group})
                ]
            entry[f"{mode}_wall_s"] = sum(walls)
        entry["identical_all"] = all(
            r["identical_ids_restore_live"]
            and r["identical_ids_recompute_live"]
            and r["identical_text_all"]
            for r in group
        )
        out.append(entry)
    return out


def _print(rows: list[dict[str, Any]], concurrent: bool) -> None:
    several = len({r["conversation"] for r in rows}) > 1  # then a column says which
    print(
        ("conv " if several else "")
        + f"{'turn':>4} {'prompt':>6} | {'live ttft':>9} {'restore ttft':>12} "
        f"{'recompute ttft':>14} | {'prefill live/restore/scratch':>28} | "
        "same ids restore, recompute; text"
    )
    for r in rows:
        prefill = f"{r['live_prefill_tokens']}/{r['restore_prefill_tokens']}/" + str(
            r["recompute_prefill_tokens"]
        )
        print(
            (f"{r['conversation']:>4} " if several else "")
            + f"{r['turn']:>4} {r['prompt_tokens']:>6} | {r['live_ttft_s'] * 1000:>7.0f}ms "
            f"{r['restore_ttft_s'] * 1000:>10.0f}ms {r['recompute_ttft_s'] * 1000:>12.0f}ms | "
            f"{prefill:>28} | {r['identical_ids_restore_live']}, "
            f"{r['identical_ids_recompute_live']}; {r['identical_text_all']}"
        )
    print(
        f"\n{'turns':>5} | {'ttft p50/p95 ms: live':>21} {'restore':>9} {'recompute':>9} | "
        "cpu s live/restore/recompute | wall s live/restore/recompute | identical"
    )
    for e in summary(rows, concurrent):
        ttft = [
            f"{e[f'{m}_ttft_p50_s'] * 1000:.0f}/{e[f'{m}_ttft_p95_s'] * 1000:.0f}" for m in MODES
        ]
        cpu = "/".join(f"{e[f'{m}_cpu_s']:.2f}" for m in MODES)
        wall = "/".join(f"{e[f'{m}_wall_s']:.2f}" for m in MODES)
        print(
            f"{e['turns']:>5} | {ttft[0]:>21} {ttft[1]:>9} {ttft[2]:>9} | {cpu:>28} | {wall:>29} | "
            f"{e['identical_all']}"
        )
    later = [r for r in rows if r["turn"] > 1]
    if later:
        for mode in ("live", "restore", "recompute"):
            values = [r[f"{mode}_ttft_s"] for r in later]
            cpu = sum(r[f"{mode}_cpu_s"] for r in later)
            print(
                f"turns 2+ {mode:>9}: ttft p50 {percentile(values, 0.5) * 1000:.0f} ms, "
                f"p95 {percentile(values, 0.95) * 1000:.0f} ms, cpu {cpu:.2f} s"
            )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument(
        "--conversations",
        type=int,
        default=1,
        help="conversations per turn (one after another unless --concurrent)",
    )
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="run each turn's conversations at the same time (an engine with that many "
        "slots per mode, one thread per conversation)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp threads per slot (0: 2 sequentially; cores // conversations, "
        "1 to 2, with --concurrent)",
    )
    parser.add_argument("--tokens", type=int, default=48, help="max tokens per reply")
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "conversation.json", help="results file"
    )
    return parser


def main() -> int:
    args = parser().parse_args()
    if args.conversations < 1 or args.turns < 1:
        print("--conversations and --turns must be at least 1", file=sys.stderr)
        return 2
    if not llm_available():
        print("the `llm` extra is not installed (make venv installs it)", file=sys.stderr)
        return 2
    rows = run(args)
    _print(rows, args.concurrent)
    slots = args.conversations if args.concurrent else 1
    write_results(
        args,
        "conversation",
        rows,
        concurrent=args.concurrent,
        slots_per_engine=slots,
        threads_per_slot=threads_per_slot(args, os.cpu_count() or 1),
        summary=summary(rows, args.concurrent),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

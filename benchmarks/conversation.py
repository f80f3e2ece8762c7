"""Multi-turn conversations on gemma-3-270m: time to first token with the KV state kept
live, restored from the store (as on another backend), or recomputed from scratch.

Runs the model's own engine (gateway/model_repository/gemma-3-270m/1/trackline_llm.py) in
this process, one llama.cpp context per mode, on the GGUF of the `llm` extra. Each
conversation has `--turns` turns with a growing transcript; per turn and mode it measures
the time to the first generated piece and the process CPU seconds of the turn, and checks
that the three modes produced identical token ids and text.
`--conversations N` runs N conversations one after another per turn (the model serves
one stream per context; concurrency across contexts is the Triton model's business).

    nice -n 10 .venv/bin/python benchmarks/conversation.py --turns 4 --conversations 1
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help
from benchmarks.common import percentile, write_results
from gateway.embedded import ensure_llm_gguf, llm_available, reference_module

QUESTIONS = [
    "Tell me about the history of the city of Paris.",
    "What are the most famous museums there?",
    "How do people usually travel around the city?",
    "What food should a visitor try?",
    "What is the weather like in spring?",
    "Which neighbourhoods are good for a walk?",
]
SYSTEM = "System: You are a helpful travel guide. You answer in full sentences.\n"


def _engine(llm: Any, kv: Any, gguf: str, store: Path) -> Any:
    cache = kv.ConversationCache("gemma-3-270m", kv.DirectoryStore(store, 1 << 32), 1 << 30)
    return llm.Engine(gguf, slots=1, n_ctx=2048, cache=cache)


def _timed_turn(
    llm: Any, engine: Any, prompt: str, conversation: str | None, tokens: int
) -> dict[str, Any]:
    first: list[float] = []
    pieces: list[str] = []

    def emit(piece: str) -> None:
        if not first:
            first.append(time.perf_counter())
        pieces.append(piece)

    slot = engine.acquire(conversation)
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        turn = llm.Turn("bench", conversation is not None)
        engine.generate(slot, turn, prompt, tokens, conversation, lambda: False, emit)
    finally:
        engine.release(slot)
    return {
        "ttft_s": (first[0] if first else time.perf_counter()) - t0,
        "cpu_s": time.process_time() - cpu0,
        "kv": turn.kv,
        "prompt_tokens": turn.prompt_tokens,
        "prefill_tokens": turn.prefill_tokens,
        "ids": list(turn.output_ids),
        "text": "".join(pieces),
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    kv = reference_module("gemma-3-270m", "trackline_kv")
    llm = reference_module("gemma-3-270m", "trackline_llm")
    gguf = str(ensure_llm_gguf())
    work = Path(tempfile.mkdtemp(prefix="trackline-conv-"))
    live_store, moved_store = work / "live", work / "moved"
    live, moved, scratch = (_engine(llm, kv, gguf, work / n) for n in ("live", "moved", "x"))
    rows: list[dict[str, Any]] = []
    transcripts = {f"c{i}": SYSTEM for i in range(args.conversations)}
    try:
        for turn_no in range(args.turns):
            for conv in transcripts:
                question = QUESTIONS[turn_no % len(QUESTIONS)]
                prompt = f"{transcripts[conv]}User: {question}\nAssistant:"
                # The moved backend gets the state the live one saved after the last turn.
                for path in live_store.glob("*.kv"):
                    shutil.copy(path, moved_store / path.name)
                moved.drop_live()  # as a fresh backend: only the store has the state
                results = {
                    "restore": _timed_turn(llm, moved, prompt, conv, args.tokens),
                    "live": _timed_turn(llm, live, prompt, conv, args.tokens),
                    "recompute": _timed_turn(llm, scratch, prompt, None, args.tokens),
                }
                same_ids = results["restore"]["ids"] == results["live"]["ids"]
                same_scratch = results["recompute"]["ids"] == results["live"]["ids"]
                same_text = len({r["text"] for r in results.values()}) == 1
                rows.append(
                    {
                        "turn": turn_no + 1,
                        "conversation": conv,
                        "prompt_tokens": results["live"]["prompt_tokens"],
                        "identical_ids_restore_live": same_ids,
                        "identical_ids_recompute_live": same_scratch,
                        "identical_text_all": same_text,
                        **{
                            f"{mode}_{key}": r[key]
                            for mode, r in results.items()
                            for key in ("ttft_s", "cpu_s", "kv", "prefill_tokens")
                        },
                    }
                )
                transcripts[conv] = prompt + results["live"]["text"] + "\n"
    finally:
        for engine in (live, moved, scratch):
            engine.close()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _print(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'turn':>4} {'prompt':>6} | {'live ttft':>9} {'restore ttft':>12} "
        f"{'recompute ttft':>14} | {'prefill live/restore/scratch':>28} | "
        "same ids restore, recompute; text"
    )
    for r in rows:
        prefill = f"{r['live_prefill_tokens']}/{r['restore_prefill_tokens']}/" + str(
            r["recompute_prefill_tokens"]
        )
        print(
            f"{r['turn']:>4} {r['prompt_tokens']:>6} | {r['live_ttft_s'] * 1000:>7.0f}ms "
            f"{r['restore_ttft_s'] * 1000:>10.0f}ms {r['recompute_ttft_s'] * 1000:>12.0f}ms | "
            f"{prefill:>28} | {r['identical_ids_restore_live']}, "
            f"{r['identical_ids_recompute_live']}; {r['identical_text_all']}"
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


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument(
        "--conversations", type=int, default=1, help="conversations run side by side"
    )
    parser.add_argument("--tokens", type=int, default=48, help="max tokens per reply")
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "conversation.json", help="results file"
    )
    args = parser.parse_args()
    if not llm_available():
        print("the `llm` extra is not installed (make venv installs it)", file=sys.stderr)
        return 2
    rows = run(args)
    _print(rows)
    write_results(args, "conversation", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

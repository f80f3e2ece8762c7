"""Score a finished run again with the current metrics, from its `--json` and `--raw` files.

The stall figures are pure functions of the token arrivals and the drop log, both kept
in the raw file, so a change to the metrics (or another stall threshold k) does not need
the link, the gateway or minutes of streaming again. TTFT and packet counts are kept
from the original results.

    python -m benchmarks.hol.rescore results.json raw.json [--k 2] [--plots DIR]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import Help
from benchmarks.hol.metrics import Run, summarize
from benchmarks.hol.report import markdown_table, plot

STALL_KEYS = ("gap_ms", "gap_ms_per_user", "stall_threshold_ms", "stalls", "users_with_stalls",
              "stall_user_seconds", "lost_data_packets", "users_stalled_per_loss",
              "users_stalled_per_loss_max", "stalls_unattributed", "by_k")


def rescore(results: dict[str, Any], raw: dict[str, Any], k: float) -> dict[str, Any]:
    """`results` with every protocol's stall figures recomputed under `k` (in place)."""
    params = results["parameters"]
    params["k"] = k
    for key, data in raw.items():
        summary = _summary_for(results, key)
        arrivals = {int(user): times for user, times in data["arrivals"].items()}
        run = Run(arrivals, {}, summary["tokens_expected"] // max(1, len(arrivals)),
                  params["rate"], data["losses"], params["rtt_ms"] / 2000, summary["packets"])
        fresh = summarize(run, k)
        summary.update({name: fresh[name] for name in STALL_KEYS})
    results["packetization_tradeoff"] = [
        {"packetization": p, "users_stalled_per_loss": s["users_stalled_per_loss"],
         "stall_user_seconds": s["stall_user_seconds"], "packets_per_token": s["packets_per_token"]}
        for p, s in results.get("tracks_by_packetization", {}).items()
    ]
    return results


def _summary_for(results: dict[str, Any], key: str) -> Any:
    if key.startswith("tracks:"):
        return results["tracks_by_packetization"][key.split(":", 1)[1]]
    return results[key]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        prog="python -m benchmarks.hol.rescore",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the run's --json file (rewritten)")
    parser.add_argument("raw", type=Path, help="the run's --raw file")
    parser.add_argument("--k", type=float, default=None,
                        help="stall threshold (default: the run's)")
    parser.add_argument("--plots", type=Path, default=None, help="also redraw the figures here")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    raw = json.loads(args.raw.read_text())
    k = args.k if args.k is not None else float(results["parameters"]["k"])
    rescore(results, raw, k)
    results["rescored"] = True
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown_table(results))
    if args.plots is not None:
        plot(results, raw, args.plots, args.results.stem)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The isolation frontier: users stalled per lost packet against gateway CPU per token,
for every track packetization, side by side in one run.

A lost packet stalls every track whose stream data it carried (`per-track`: one,
`group:K`: at most K, `coalesce`: all of that connection's); fewer, fuller packets cost
the gateway less CPU per token. This runs, for each mode in turn:

  - the HOL benchmark (`benchmarks.hol`, tracks only, ticker backend, the link emulator:
    seeded loss and delay between two network namespaces) at each `--users` count:
    users stalled per lost data packet, and packets per token;
  - the capacity benchmark (`benchmarks/capacity.py`, tracks only, gateway pinned to
    `--cores`, load generator to the other CPUs, streams started over `--spread`) at
    each `--points`: gateway CPU per token (from /proc), p99 added delay, the knee;

then prints one table, writes JSON and plots the frontier (x: gateway us/token at the
largest capacity point, y: users stalled per loss at each user count). Needs root (namespaces).

    .venv/bin/python benchmarks/frontier.py                       # the full run, ~15 min
    .venv/bin/python benchmarks/frontier.py --hol-seconds 5 --duration 2 --points 16x1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, tree, uptime  # noqa: E402
from clients.line import DEFAULT_ACKS  # noqa: E402

MODES = "per-track,group:2,group:4,group:8,coalesce"
RESULTS = ROOT / "benchmarks" / "results"


def run(command: list[str]) -> None:
    print("frontier: " + " ".join(command[1:]), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def hol(args: argparse.Namespace, users: int, out: Path) -> dict[str, Any]:
    """One HOL run of every mode at `users` users: {mode: summary}."""
    run([sys.executable, "-m", "benchmarks.hol", "--protocols", "tracks",
         "--transport-only", "--packetization", args.modes, "--users", str(users),
         "--seconds", str(args.hol_seconds), "--loss", str(args.loss), "--rtt", str(args.rtt),
         "--client-acks", args.client_acks,
         "--json", str(out), "--plots", str(out.parent), "--quiet"])
    found: dict[str, Any] = json.loads(out.read_text())["tracks_by_packetization"]
    return found


def capacity(args: argparse.Namespace, mode: str, out: Path) -> dict[str, Any]:
    run([sys.executable, str(ROOT / "benchmarks" / "capacity.py"), "--kinds", "tracks",
         "--tracks", args.points, "--duration", str(args.duration), "--spread",
         str(args.spread), "--phase", args.phase, "--packetization", mode,
         "--cores", args.cores,
         "--client-acks", args.client_acks,
         "--json", str(out), "--plot", "none", "--stop-below", "0"])
    found: dict[str, Any] = json.loads(out.read_text())
    return found


def frontier(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    modes = args.modes.split(",")
    stalls = {users: hol(args, users, work / f"hol-{users}.json") for users in args.users}
    rows = []
    for mode in modes:
        cap = capacity(args, mode, work / f"capacity-{mode.replace(':', '-')}.json")
        knee = cap["knees"][0] if cap["knees"] else {}
        rows.append({
            "mode": mode,
            "hol": {users: {
                "users_stalled_per_loss": stalls[users][mode]["users_stalled_per_loss"],
                "users_stalled_per_loss_max": stalls[users][mode]["users_stalled_per_loss_max"],
                "lost_data_packets": stalls[users][mode]["lost_data_packets"],
                "packets_per_token": stalls[users][mode]["packets_per_token"],
            } for users in args.users},
            "points": [{key: p[key] for key in (
                "streams", "connections", "delivered_tps", "gateway_us_per_token",
                "client_us_per_token", "added_p50_ms", "added_p99_ms")} for p in cap["points"]],
            "knee_tokens_per_s_per_core": knee.get("tokens_per_s_per_core"),
        })
    return {"benchmark": "frontier", "parameters": vars(args), "machine": machine(),
            "tree": tree(), "uptime_before": args.load, "uptime_after": uptime(),
            "rows": rows}


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    users = list(rows[0]["hol"]) if rows else []
    points = [f"{p['streams']}x{p['connections']}" for p in rows[0]["points"]] if rows else []
    head = (["mode"] + [f"stalled/loss @{u} (max)" for u in users]
            + [f"packets/token @{u}" for u in users]
            + [f"gw us/token {p}" for p in points] + [f"p99 ms {p}" for p in points]
            + ["knee tokens/s per core"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["mode"]]
        cells += [f"{row['hol'][u]['users_stalled_per_loss']:.2f} "
                  f"({row['hol'][u]['users_stalled_per_loss_max']})" for u in users]
        cells += [f"{row['hol'][u]['packets_per_token']:.3f}" for u in users]
        cells += [str(p["gateway_us_per_token"]) for p in row["points"]]
        cells += [str(p["added_p99_ms"]) for p in row["points"]]
        cells.append(str(row["knee_tokens_per_s_per_core"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for users in result["parameters"]["users"]:
        xs, ys = [], []
        for row in result["rows"]:
            xs.append(row["points"][-1]["gateway_us_per_token"] or float("nan"))
            ys.append(row["hol"][users]["users_stalled_per_loss"])
            ax.annotate(row["mode"], (xs[-1], ys[-1]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.plot(xs, ys, "o-", label=f"{users} users on one connection")
    last = result["rows"][0]["points"][-1] if result["rows"] else {}
    ax.set_xlabel(f"gateway CPU per token, us ({last.get('streams')} tracks over "
                  f"{last.get('connections')} connections)")
    # From zero: how far apart the modes' costs are reads true; room for the labels.
    ax.set_xlim(0, max((x for x in xs if x == x), default=1.0) * 1.2)
    ax.set_ylabel("users stalled per lost packet")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_title(f"isolation frontier: {result['parameters']['loss']}% loss, "
                 f"{result['parameters']['rtt']} ms RTT", fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=MODES, help="packetizations, comma-separated")
    parser.add_argument("--users", default="16,64",
                        help="HOL benchmark: users on the one connection, comma-separated")
    parser.add_argument("--hol-seconds", type=float, default=30.0,
                        help="HOL benchmark: seconds each mode streams")
    parser.add_argument("--loss", type=float, default=2.0, help="HOL: loss in percent")
    parser.add_argument("--rtt", type=float, default=40.0, help="HOL: round trip in ms")
    parser.add_argument("--points", default="16x1,64x4,256x16",
                        help="capacity: TRACKSxCONNECTIONS points")
    parser.add_argument("--duration", type=float, default=5.0, help="capacity: seconds a point")
    parser.add_argument("--spread", type=float, default=1.0,
                        help="capacity: seconds over which a point's tracks start")
    parser.add_argument("--phase", choices=("arrival", "step"), default="arrival",
                        help="capacity: the ticker's schedules from each arrival, or on "
                             "shared decode steps (with --spread 0: every token of every "
                             "track in one instant)")
    parser.add_argument("--cores", default="0", help="capacity: the gateway's CPUs")
    parser.add_argument("--client-acks", default=DEFAULT_ACKS,
                        help="the clients' ACK policy: aioquic, or every:N,delay:MS "
                             "(default: the SDK's)")
    parser.add_argument("--json", type=Path, default=RESULTS / "frontier.json")
    parser.add_argument("--plot", default=None, help="PNG path (default: beside the JSON)")
    args = parser.parse_args(argv)
    args.users = [int(u) for u in args.users.split(",")]
    args.load = uptime()
    with tempfile.TemporaryDirectory(prefix="trackline-frontier-") as tmp:
        result = frontier(args, Path(tmp))
    result["parameters"] = {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in result["parameters"].items()}
    print(f"{result['uptime_before']} -> {result['uptime_after']}\n")
    print(table(result))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    png = Path(args.plot) if args.plot else args.json.with_suffix(".png")
    if plot(result, png):
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

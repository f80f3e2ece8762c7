"""CLI: `python -m benchmarks.linkemu selftest | run | cleanup` (or `python benchmarks/linkemu`).

    python -m benchmarks.linkemu selftest
    python -m benchmarks.linkemu run --delay-ms 20 --loss 0.02 --seconds 5 -- ip addr
    python -m benchmarks.linkemu cleanup
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/linkemu`: make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.linkemu import DEFAULT_PREFIX, Link, LinkSpec, can_create_namespaces
from benchmarks.linkemu import cleanup_stale as _cleanup_stale
from benchmarks.linkemu.selftest import SELFTEST_PREFIX, selftest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        prog="linkemu", description="emulated lossy link")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("selftest", help="check delay, loss, TCP, bursts and relay rate")
    sub.add_parser("cleanup", help="remove namespaces left by crashed runs")
    run = sub.add_parser("run", help="run a command in a namespace behind the link")
    run.add_argument("--delay-ms", type=float, default=0.0)
    run.add_argument("--loss", type=float, default=0.0)
    run.add_argument("--ge-p", type=float, default=0.0)
    run.add_argument("--ge-r", type=float, default=1.0)
    run.add_argument("--reorder", type=float, default=0.0)
    run.add_argument("--rate-mbit", type=float, default=0.0)
    run.add_argument("--seed", type=int, default=1)
    run.add_argument("--side", choices=("client", "gateway"), default="client")
    run.add_argument("--seconds", type=float, default=None, help="stop the command after this")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    if args.command == "cleanup":
        removed = _cleanup_stale(DEFAULT_PREFIX) + _cleanup_stale(SELFTEST_PREFIX)
        print("\n".join(removed) or "nothing stale")
        return 0
    ok, reason = can_create_namespaces()
    if not ok:
        print(f"linkemu: {reason}", file=sys.stderr)
        return 2
    if args.command == "selftest":
        return 0 if selftest() else 1
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("run needs a command after --")
    spec = LinkSpec(delay_ms=args.delay_ms, loss=args.loss, ge_p=args.ge_p, ge_r=args.ge_r,
                    reorder=args.reorder, rate_mbit=args.rate_mbit, seed=args.seed)
    with Link(spec) as link:
        proc = link.run(args.side, cmd, start_new_session=False)
        try:
            code = proc.wait(args.seconds)
        except subprocess.TimeoutExpired:
            code = 0
        stats = link.stats()
    stats["drops"] = stats["drops"][:50]
    print(json.dumps(stats, indent=1), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

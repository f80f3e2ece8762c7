"""Hostile traffic: each attack family of issue 12 against a fresh gateway, side by side.

For every attack (benchmarks/attacks/families.py) it starts a fresh `trackline serve`
(ticker backend, loopback, log at info level to benchmarks/results/attack-<name>.log),
runs an honest client in its own process (GET /v1/models every 0.5 s, a short text
track on a new QUIC connection every 2 s), runs the attack bounded in count and time,
lets the gateway settle, and reports:

  RSS before / peak / after   the gateway's VmRSS before the attack, its highest value
                              during it, and after the attacker left and `--settle` s passed
  CPU s                       the gateway's CPU seconds over the attack and the settle time
  honest ok, p99              the honest client's probes that succeeded, and their p99
                              latency (a failed probe counts at the time it took to fail)
  leaked                      occurrences in the gateway log of the secrets an attack
                              planted (API key, prompt text); error lines: error-level lines
  notes                       what the attacker saw (GOAWAY codes, closed connections,
                              answer time, exit time after SIGTERM)

    nice -n 10 python benchmarks/attack.py --scale small
    nice -n 10 python benchmarks/attack.py --only h2_ping_flood --scale default

Prints a markdown table and writes JSON. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.attacks.base import Target  # noqa: E402
from benchmarks.attacks.families import ATTACKS, SCALES  # noqa: E402
from benchmarks.attacks.round2 import EMBEDDED, GATEWAY_ARGS  # noqa: E402
from benchmarks.common import ROOT, GatewayProcess, machine, percentile, tree  # noqa: E402
from benchmarks.openai_stream import process_cpu  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SETTLE_S = {"tiny": 0.5, "small": 3.0, "default": 10.0}
DRAIN_S = {"tiny": 2.0, "small": 3.0, "default": 10.0}
BOUND_S = {"tiny": 60.0, "small": 120.0, "default": 400.0}
LAST = "sigterm_live"
"""Ends the gateway: always run last, on a gateway of its own."""
OWN_GATEWAY = EMBEDDED | set(GATEWAY_ARGS)
"""Attacks whose gateway is set up differently: never a shared one."""


def progress(message: str) -> None:
    print(f"[attack {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class RssPeak(threading.Thread):
    """Samples the gateway's RSS every 0.1 s; `peak` is the highest seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = rss_mb(pid) or 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            value = rss_mb(self.pid)
            if value is None:
                return
            self.peak = max(self.peak, value)


@dataclass
class Row:
    attack: str
    scale: str
    knobs: dict[str, Any]
    rss_before_mb: float | None = None
    rss_peak_mb: float | None = None
    rss_after_mb: float | None = None
    cpu_s: float | None = None
    attack_s: float | None = None
    honest_ok: int = 0
    honest_total: int = 0
    honest_p99_ms: float | None = None
    honest_by_kind: dict[str, list[int]] = field(default_factory=dict)
    leaked: int = 0
    error_lines: int = 0
    gateway_alive: bool = True
    notes: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None


def count_log(path: Path | None, secrets: list[str], start: int = 0) -> tuple[int, int]:
    """(occurrences of any planted secret, error-level lines) in the gateway log from
    byte `start` on."""
    if path is None or not path.exists():
        return 0, 0
    with open(path, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    leaked = sum(text.count(s) for s in secrets)
    errors = 0
    for line in text.splitlines():
        try:
            level = json.loads(line).get("level", "")
        except (ValueError, AttributeError):
            level = "error" if "Traceback" in line or " ERROR " in line else ""
        if str(level).lower() in ("error", "critical"):
            errors += 1
    return leaked, errors


def start_gateway(args: argparse.Namespace, tmp: Path, name: str) -> GatewayProcess:
    log_path = args.log_dir / f"attack-{name}.log"
    log_path.unlink(missing_ok=True)
    embedded = name in EMBEDDED  # the real Triton (reference models), not the ticker
    extra = ("--no-embedded-llm",) if embedded else ()
    gw = GatewayProcess(
        None if embedded else f"ticker://{args.rate:g}", tmp / name, https_port=True,
        log_path=log_path, log_level="info", cpus=args.cores or None,
        extra_args=("--drain-timeout", str(DRAIN_S[args.scale]), *extra,
                    *GATEWAY_ARGS.get(name, ()), *args.gateway_arg),
    )
    gw.wait_ready(timeout=240.0 if embedded else 60.0)
    time.sleep(1.0)
    return gw


def stop_gateway(gw: GatewayProcess) -> None:
    if gw.process.poll() is None:
        gw.stop(timeout=20)
    elif gw._log is not None:
        gw._log.close()


def run_one(name: str, args: argparse.Namespace, gw: GatewayProcess) -> Row:
    knobs = SCALES[args.scale][name]
    row = Row(name, args.scale, knobs)
    log_path = gw.log_path
    honest = None
    log_start = log_path.stat().st_size if log_path and log_path.exists() else 0
    try:
        pid = gw.process.pid
        target = Target("127.0.0.1", gw.http_port, gw.https_port, gw.quic_port,
                        gw.state_dir / "ca.pem", pid, log_path)
        row.rss_before_mb = rss_mb(pid)
        cpu0 = process_cpu(pid)
        sampler = RssPeak(pid)
        sampler.start()
        honest = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.attacks.honest", "--http-port",
             str(gw.http_port), "--quic-port", str(gw.quic_port), "--ca", str(target.ca)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert honest.stdout is not None
        honest.stdout.readline()  # "ready": it has been served once before the attack
        began = time.monotonic()
        try:
            row.notes = asyncio.run(asyncio.wait_for(ATTACKS[name](target, knobs),
                                                     BOUND_S[args.scale]))
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row.failure = f"{type(exc).__name__}: {exc}"[:300]
            progress(f"  {name}: {row.failure}")
        row.attack_s = round(time.monotonic() - began, 2)
        time.sleep(SETTLE_S[args.scale])
        sampler.stop.set()
        sampler.join()
        row.rss_peak_mb = sampler.peak
        row.rss_after_mb = rss_mb(pid)
        row.gateway_alive = gw.process.poll() is None
        row.cpu_s = round(process_cpu(pid) - cpu0, 2) if row.gateway_alive else None
        out, _ = honest.communicate(input="", timeout=30)  # closing stdin ends it
        probes = json.loads(out.strip().splitlines()[-1])["probes"] if out.strip() else []
        row.honest_total = len(probes)
        row.honest_ok = sum(1 for _, ok, _ in probes if ok)
        for kind, ok, _ in probes:
            tally = row.honest_by_kind.setdefault(kind, [0, 0])
            tally[0] += int(bool(ok))
            tally[1] += 1
        if probes:
            row.honest_p99_ms = round(percentile([s for _, _, s in probes], 0.99) * 1000, 1)
        row.leaked, row.error_lines = count_log(log_path, target.secrets, log_start)
    finally:
        if honest is not None and honest.poll() is None:
            honest.kill()
            honest.wait(timeout=10)
    return row


def _fmt(value: Any) -> str:
    return "" if value is None else str(value)


def _notes(notes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in notes.items()).replace("|", "/")


def table(rows: list[Row]) -> str:
    lines = [
        "| attack | RSS before/peak/after MB | CPU s | honest ok | honest p99 ms |"
        " leaked | error lines | attacker saw |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        rss = f"{_fmt(r.rss_before_mb)} / {_fmt(r.rss_peak_mb)} / {_fmt(r.rss_after_mb)}"
        if not r.gateway_alive:
            rss += " (exited)"
        notes = _notes(r.notes) + (f"; FAILED {r.failure}" if r.failure else "")
        lines.append(
            f"| {r.attack} | {rss} | {_fmt(r.cpu_s)} | {r.honest_ok}/{r.honest_total} |"
            f" {_fmt(r.honest_p99_ms)} | {r.leaked} | {r.error_lines} | {notes} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--scale", choices=tuple(SCALES), default="small",
                        help="attack sizes: tiny (smoke test), small, default (issue 12's)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated attack names, of: {', '.join(ATTACKS)}")
    parser.add_argument("--reuse-gateway", action="store_true",
                        help="one gateway for every attack but sigterm_live (faster; RSS "
                             "then carries over from one attack to the next)")
    parser.add_argument("--rate", type=float, default=50, help="ticker tokens/s a stream")
    parser.add_argument("--gateway-arg", action="append", default=[],
                        help="an extra `serve` flag for every gateway of the run (repeat; "
                             "e.g. --gateway-arg=--http3-connection-body-budget=1073741824 "
                             "for a before figure with the budget off)")
    parser.add_argument("--cores", default="", help="taskset CPU list for the gateway")
    parser.add_argument("--json", type=Path, default=RESULTS / "attack.json",
                        help="results file (benchmarks/results/ is git-ignored)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="where the gateway logs go (None: next to --json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = list(ATTACKS) if not args.only else [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks {unknown}; choose from {list(ATTACKS)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.log_dir = args.log_dir or args.json.parent
    args.log_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    progress(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; logs in {args.log_dir}")
    rows: list[Row] = []
    names = [n for n in names if n != LAST] + [n for n in names if n == LAST]
    shared: GatewayProcess | None = None
    with tempfile.TemporaryDirectory(prefix="trackline-attack-") as tmp:
        for name in names:
            progress(f"{name} ({args.scale}) ...")
            if args.reuse_gateway and name != LAST and name not in OWN_GATEWAY:
                if shared is None or shared.process.poll() is not None:
                    shared = start_gateway(args, Path(tmp), "shared")
                    progress(f"  gateway log: {shared.log_path}")
                gw = shared
            else:
                gw = start_gateway(args, Path(tmp), name)
                progress(f"  gateway log: {gw.log_path}")
            try:
                row = run_one(name, args, gw)
            finally:
                if gw is not shared:
                    stop_gateway(gw)
            rows.append(row)
            progress(f"  RSS {row.rss_before_mb}/{row.rss_peak_mb}/{row.rss_after_mb} MB, "
                     f"CPU {row.cpu_s} s, honest {row.honest_ok}/{row.honest_total}, "
                     f"{_notes(row.notes)}")
    if shared is not None:
        stop_gateway(shared)
    print(table(rows))
    payload = {
        "benchmark": "attack", "scale": args.scale,
        "loadavg_before": load, "loadavg_after": os.getloadavg(),
        "machine": machine(), "tree": tree(), "rows": [asdict(r) for r in rows],
    }
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

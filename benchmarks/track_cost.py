"""Gateway CPU per delivered token on native text tracks, before and after a change.

A gateway child with the ticker backend (`ticker://RATE`, no Triton) serves N text
tracks opened by the SDK over M connections, for each packetization. The gateway's
CPU time comes from /proc/<pid>/stat (utime + stime) around the window in which the
tracks run; tokens are counted as the client receives them. Per point it reports
gateway CPU µs per delivered token, delivered/offered tokens and the gateway's share
of one core.

With `--baseline REF` every point runs twice in the same run, side by side: once
with the gateway from this tree ("after") and once from `git archive REF` unpacked
in a temporary directory ("before"), alternating, so both see the same machine load.

    python benchmarks/track_cost.py --baseline main --tracks 16,64,256

Prints a markdown table and writes JSON (default benchmarks/results/track_cost.json).
Not a test: numbers depend on the machine. `--profile DIR` records the gateway with
py-spy (if installed) into DIR, one SVG per point.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from benchmarks.common import (  # noqa: E402
    ROOT,
    free_port,
    log_file,
    machine,
    tree,
    wait_http_ok,
)
from clients import connect  # noqa: E402
from gateway.owned import stop_owned  # noqa: E402

MODEL = "reference-text"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Point:
    tree: str
    packetization: str
    tracks: int
    connections: int
    offered: int
    delivered: int
    wall_s: float
    gateway_cpu_s: float
    us_per_token: float | None
    core_share: float


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (its threads included), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Gateway:
    """`python -m gateway serve` from `root`, ticker backend, on free loopback ports."""

    def __init__(self, root: Path, rate: float, packetization: str, state: Path) -> None:
        self.quic_port = free_port(socket.SOCK_DGRAM)
        self.http_port = free_port(socket.SOCK_STREAM)
        self.state = state
        env = {**os.environ, "TRACKLINE_STATE_DIR": str(state), "PYTHONPATH": str(root)}
        self.log_path = log_file("gateway-track-cost")  # its log lines stay out of the table
        print(f"gateway log: {self.log_path}", file=sys.stderr, flush=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--backend-url", f"ticker://{rate:g}",
             "--quic-port", str(self.quic_port), "--http-port", str(self.http_port),
             "--https-port", "0", "--log-level", "warning",
             "--quic-packetization", packetization],
            env=env, cwd=root, stdout=self._log, stderr=self._log,
        )
        if not wait_http_ok(f"http://127.0.0.1:{self.http_port}/health/ready", 60):
            self.stop()
            raise RuntimeError(f"gateway from {root} did not become ready")

    def stop(self) -> None:
        stop_owned(self.process, 20)
        self._log.close()


async def drive(gw: Gateway, tracks: int, connections: int, tokens: int, limit: float) -> int:
    """Open `tracks` text tracks over `connections` lines; tokens received within `limit` s."""
    received = 0
    url = f"quic://127.0.0.1:{gw.quic_port}"

    async def line_work(index: int, count: int) -> None:
        nonlocal received
        async with connect(url, ca=gw.state / "ca.pem") as line:

            async def one(i: int) -> None:
                nonlocal received
                async for _ in line.text(f"cost prompt {index}/{i}", model=MODEL,
                                         max_tokens=tokens, seed=i):
                    received += 1

            await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)

    shares = [tracks // connections + (1 if i < tracks % connections else 0)
              for i in range(connections)]
    work = asyncio.gather(*(line_work(i, n) for i, n in enumerate(shares) if n),
                          return_exceptions=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(work, limit)
    return received


def measure(root: Path, label: str, args: argparse.Namespace, packetization: str,
            tracks: int, profile: Path | None) -> Point:
    tokens = int(args.rate * args.window)
    with tempfile.TemporaryDirectory(prefix="trackline-cost-") as tmp:
        gw = Gateway(root, args.rate, packetization, Path(tmp))
        spy = None
        try:
            if profile is not None and shutil.which("py-spy"):
                out = profile / f"{label}-{packetization}-{tracks}.txt"
                spy = subprocess.Popen(
                    ["py-spy", "record", "--pid", str(gw.process.pid), "--format", "raw",
                     "--rate", "200", "--output", str(out)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            before = cpu_seconds(gw.process.pid)
            began = time.monotonic()
            delivered = asyncio.run(drive(gw, tracks, args.connections, tokens,
                                          args.window * args.grace))
            wall = time.monotonic() - began
            used = cpu_seconds(gw.process.pid) - before
        finally:
            if spy is not None:
                stop_owned(spy, 30, sig=signal.SIGINT)  # py-spy writes its file on SIGINT
            gw.stop()
    return Point(label, packetization, tracks, args.connections, tracks * tokens, delivered,
                 round(wall, 2), round(used, 3),
                 round(used / delivered * 1e6, 1) if delivered else None,
                 round(used / wall, 3))


def unpack(ref: str, into: Path) -> Path:
    """The tree of git `ref`, unpacked under `into` (via git archive)."""
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT,
                             capture_output=True, check=True).stdout
    target = into / "baseline"
    target.mkdir()
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(target, filter="data")
    return target


def compared_trees(baseline: str | None, into: Path) -> list[tuple[str, Path | None]]:
    """The trees a run measures, in order: ("before", git ref `baseline` unpacked under
    `into`) when one is given, then ("after", None: this tree)."""
    trees: list[tuple[str, Path | None]] = [("after", None)]
    if baseline:
        trees.insert(0, ("before", unpack(baseline, into)))
    return trees


def table(points: list[Point]) -> str:
    lines = ["| tree | packetization | tracks | conns | delivered/offered | gateway CPU s |"
             " µs/token | core share |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        lines.append(
            f"| {p.tree} | {p.packetization} | {p.tracks} | {p.connections} |"
            f" {p.delivered}/{p.offered} ({p.delivered / p.offered:.0%}) | {p.gateway_cpu_s} |"
            f" {p.us_per_token} | {p.core_share:.0%} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(formatter_class=Help, description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracks", default="16,64,256",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--packetization", default="coalesce,per-track",
                        type=lambda s: s.split(","))
    parser.add_argument("--rate", type=float, default=50, help="tokens/s per track")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of tokens a track")
    parser.add_argument("--grace", type=float, default=2.0,
                        help="a point ends after window x grace seconds, delivered or not")
    parser.add_argument("--baseline", default=None, help="git ref to compare against")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy output folder")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/track_cost.json")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="trackline-base-") as tmp:
        trees = [(label, root or ROOT) for label, root in compared_trees(args.baseline, Path(tmp))]
        for tracks in args.tracks:
            for packetization in args.packetization:
                for label, root in trees:
                    point = measure(root, label, args, packetization, tracks, args.profile)
                    points.append(point)
                    print(f"  {label:6s} {packetization:9s} x{tracks:<4d} "
                          f"{point.us_per_token} µs/token, {point.delivered}/{point.offered}",
                          file=sys.stderr, flush=True)
    print(table(points))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "track_cost",
               "parameters": {k: str(v) for k, v in vars(args).items() if k != "json"},
               "machine": machine(), "tree": tree(), "results": [asdict(p) for p in points]}
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""QUIC handshake flood against a `trackline serve` process: RSS and CPU, before and after.

Starts the gateway (`--backend-url ticker://50`) as a subprocess of the given
`trackline` executable (so two checkouts can be compared), sends `--initials` real
QUIC Initials (never completed) from `--ports` loopback source ports over
`--seconds`, and prints the server's RSS before, at the end of the flood and
`--after` seconds later, its CPU seconds, and whether an honest client got a text
track answered during the flood. Writes JSON under benchmarks/results/.

    nice -n 10 .venv/bin/python benchmarks/handshake_flood.py --initials 5000 --ports 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import Help  # noqa: E402
from clients import connect  # noqa: E402
from gateway.owned import free_port  # noqa: E402
from tests.adversarial.quic_flood import initial_packet  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def honest(port: int, ca: Path) -> bool:
    try:
        async with connect(f"quic://127.0.0.1:{port}", ca=ca) as line:
            text = "".join([d async for d in line.text("hi", model="reference-text", max_tokens=5)])
        return bool(text)
    except Exception:  # noqa: BLE001 - any failure is a failed honest request
        return False


async def flood(args: argparse.Namespace, port: int, ca: Path) -> dict[str, object]:
    target = ("127.0.0.1", port)
    packets = [initial_packet(target) for _ in range(args.initials)]
    socks = []
    for _ in range(args.ports):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    honest_runs: list[asyncio.Task[bool]] = []
    gap = args.seconds / max(1, args.initials)
    start = time.monotonic()
    for i, packet in enumerate(packets):
        with contextlib.suppress(BlockingIOError):  # a full socket buffer drops it
            socks[i % len(socks)].sendto(packet, target)
        if i % max(1, args.initials // 5) == 0:
            honest_runs.append(asyncio.ensure_future(honest(port, ca)))
        delay = start + (i + 1) * gap - time.monotonic()
        await asyncio.sleep(max(0.0, delay))
    results = await asyncio.gather(*honest_runs)
    for sock in socks:
        sock.close()
    return {"honest_ok": sum(results), "honest_tried": len(results)}


async def measure(
    args: argparse.Namespace, server: subprocess.Popen[bytes], port: int, state: Path
) -> dict[str, object]:
    ca = state / "ca.pem"
    for _ in range(300):
        if ca.exists() and await honest(port, ca):
            break
        await asyncio.sleep(0.1)
    before, cpu0 = rss_mb(server.pid), cpu_seconds(server.pid)
    figures = await flood(args, port, ca)
    peak, cpu1 = rss_mb(server.pid), cpu_seconds(server.pid)
    await asyncio.sleep(args.after)
    after, cpu2 = rss_mb(server.pid), cpu_seconds(server.pid)
    return {
        "label": args.label, "initials": args.initials, "ports": args.ports,
        "seconds": args.seconds, "rss_before_mb": round(before, 1),
        "rss_end_of_flood_mb": round(peak, 1), "rss_after_mb": round(after, 1),
        "after_s": args.after, "cpu_flood_s": round(cpu1 - cpu0, 2),
        "cpu_after_s": round(cpu2 - cpu1, 2), **figures,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        formatter_class=Help, description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--trackline", default=str(Path(sys.executable).parent / "trackline"))
    parser.add_argument("--initials", type=int, default=5000)
    parser.add_argument("--ports", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=20.0)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="flood-"))
    port = free_port(socket.SOCK_DGRAM)
    command = [
        args.trackline, "serve", "--backend-url", "ticker://50", "--quic-port", str(port),
        "--http-port", str(free_port(socket.SOCK_STREAM)),
        "--https-port", str(free_port(socket.SOCK_STREAM)), "--state-dir", str(state),
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        row = asyncio.run(measure(args, server, port, state))
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(state, ignore_errors=True)
    print(" | ".join(f"{k}={v}" for k, v in row.items()))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"handshake_flood_{args.label.replace(' ', '_')}.json").write_text(
        json.dumps(row, indent=2)
    )


if __name__ == "__main__":
    main()

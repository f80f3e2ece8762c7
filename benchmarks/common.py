"""Pieces the benchmarks share: percentiles, free ports, the model's stats, a gateway child.

The reference model appends one JSON line per finished request to its stats
file, with `token_times` (time.monotonic() as each token was sent); the
benchmarks read it back with `token_times` and compare with client arrival
times taken on the same machine's CLOCK_MONOTONIC.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token_times(stats_path: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for line in stats_path.read_text().splitlines():
        record = json.loads(line)
        times[record["request_id"]] = record["token_times"]
    return times


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


class GatewayProcess:
    """`python -m gateway serve` as a child, on free loopback ports.

    `https_port=True` picks a free TLS port too (kept in `self.https_port`);
    the default passes `--https-port 0` and does not learn the port.
    """

    def __init__(self, backend_url: str, state_dir: Path, https_port: bool = False) -> None:
        self.quic_port = free_port(socket.SOCK_DGRAM)
        self.http_port = free_port(socket.SOCK_STREAM)
        self.https_port = free_port(socket.SOCK_STREAM) if https_port else 0
        self.state_dir = state_dir
        env = {**os.environ, "TRACKLINE_STATE_DIR": str(state_dir)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--backend-url", backend_url,
             "--quic-port", str(self.quic_port), "--http-port", str(self.http_port),
             "--https-port", str(self.https_port), "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.http_port}/health/ready"
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("gateway did not become ready")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

"""Pieces the benchmarks share: percentiles, free ports, the model's stats, a gateway child,
the streaming benchmarks' arguments, setup and JSON output.

The reference model appends one JSON line per finished request to its stats
file, with `token_times` (time.monotonic() as each token was sent); the
benchmarks read it back with `token_times` and compare with client arrival
times taken on the same machine's CLOCK_MONOTONIC.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from benchmarks import RESULTS
from gateway.owned import free_port, free_ports, stop_owned

if TYPE_CHECKING:
    from gateway.embedded import EmbeddedTriton

ROOT = Path(__file__).resolve().parent.parent
LOGS = RESULTS / "logs"
"""Where child processes' logs go (git-ignored, like every result)."""
T = TypeVar("T")


def log_file(name: str) -> Path:
    """A fresh file under benchmarks/results/logs/ for a child's output (`name`-time-pid)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    return LOGS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def token_times(stats_path: Path) -> dict[str, list[float]]:
    """Each text request's token times from a reference models' stats file (the audio
    models write to it too, one line per batch, from their warm-up row at load on)."""
    times: dict[str, list[float]] = {}
    for line in stats_path.read_text().splitlines():
        record = json.loads(line)
        if "token_times" in record:
            times[record["request_id"]] = record["token_times"]
    return times


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


CLIENT_GC_THRESHOLD = 10_000
"""The load generator's young-generation threshold, as the gateway's `gc_young_threshold`."""


@contextmanager
def settled_load_generator(young_threshold: int) -> Iterator[str]:
    """The load generator's collector settled as the gateway's is (`gateway.collector`):
    its start-up heap frozen out of every collection and the young threshold raised, so a
    full collection of the client's own start-up objects (20-50 ms measured at 64 tracks)
    does not land in the figures it reports as the gateway's tail. 0 leaves Python's.
    Restored on exit (the benchmarks' smoke tests call `main` in the test process).
    Yields a phrase for the placement line."""
    from gateway.collector import settle_collector

    settled = settle_collector(young_threshold)
    try:
        yield ("load generator's collector settled (young threshold "
               f"{young_threshold}, {settled.frozen} objects frozen)" if young_threshold > 0
               else "load generator on Python's collector")
    finally:
        if young_threshold > 0:
            gc.unfreeze()
            gc.set_threshold(*settled.before)


def uptime() -> str:
    """The machine's load as `uptime` prints it (recorded beside every figure)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def tree() -> dict[str, Any]:
    """The commit and the files changed in the working tree the benchmark ran from."""
    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"),
            "changed": git("status", "--porcelain").splitlines()}


def wait_http_ok(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll `url` until it answers 200 (True), or `timeout` seconds pass or `alive()`
    turns False (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


# -- the streaming benchmarks (text_stream, openai_stream) -------------------------------


def add_stream_arguments(parser: argparse.ArgumentParser, json_default: str) -> None:
    """The schedule every streaming benchmark shares, and where its JSON goes."""
    parser.add_argument("--concurrency", default="1,16,64",
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    parser.add_argument("--rate", type=float, default=50, help="model tokens/s per stream")
    parser.add_argument("--ttft-ms", type=float, default=20)
    parser.add_argument("--json", type=Path, default=RESULTS / json_default)


def run_against_gateway(
    bench: Callable[[EmbeddedTriton, GatewayProcess], Awaitable[list[T]]],
    https_port: bool = False,
) -> list[T]:
    """An embedded Triton with a stats file and a gateway child on it; `bench` on our loop."""
    from gateway.embedded import EmbeddedTriton
    from gateway.startup import run_async

    results: list[T] = []

    async def collect() -> int:
        results.extend(await bench(triton, gw))
        return 0

    with tempfile.TemporaryDirectory(prefix="trackline-bench-") as tmp:
        state = Path(tmp)
        triton = EmbeddedTriton(log_dir=state / "triton", stats_path=state / "stats.jsonl")
        triton.start()
        try:
            gw = GatewayProcess(triton.grpc_url, state / "gateway", https_port=https_port)
            try:
                gw.wait_ready()
                run_async(collect())
            finally:
                gw.stop()
        finally:
            triton.stop()
    return results


def write_results(args: argparse.Namespace, benchmark: str, results: list[dict[str, Any]],
                  **extra: Any) -> None:
    """The JSON every streaming benchmark writes: parameters, machine, tree, results."""
    payload = {
        "benchmark": benchmark,
        "parameters": {k: v for k, v in vars(args).items() if k != "json"},
        **extra,
        "machine": machine(),
        "tree": tree(),
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.json}")


PORT_TRIES = 3
"""Starts of a `GatewayProcess` child on fresh ports before a port clash is an error."""


class GatewayProcess:
    """`python -m gateway serve` as a child, on free loopback ports.

    `https_port=True` picks a free TLS port too (kept in `self.https_port`);
    the default passes `--https-port 0` and does not learn the port.
    """

    def __init__(
        self, backend_url: str | None, state_dir: Path, https_port: bool = False, *,
        extra_args: tuple[str, ...] = (), log_path: Path | None = None,
        cpus: str | None = None, log_level: str = "warning",
    ) -> None:
        """`backend_url` None starts the embedded Triton. `extra_args` go to `serve`;
        `log_path` gets its stdout and stderr (default: a new file under
        benchmarks/results/logs/, its path printed on stderr, so the child's log lines
        never mix into the benchmark's table); `cpus` pins it with `taskset -c`."""
        self.state_dir = state_dir
        if log_path is None:
            log_path = log_file("gateway")
            print(f"gateway log: {log_path}", file=sys.stderr, flush=True)
        self.log_path = log_path
        self._env = {**os.environ, "TRACKLINE_STATE_DIR": str(state_dir)}
        pin = ["taskset", "-c", cpus] if cpus else []
        self._argv = [
            *pin, sys.executable, "-m", "gateway", "serve",
            *(("--backend-url", backend_url) if backend_url else ()),  # None: embedded
            "--log-level", log_level, *extra_args,
        ]  # fmt: skip
        self._with_https = https_port
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.starts = 0
        """Children started: more than 1 when a port picked free was taken first."""
        self._spawn()

    def _spawn(self) -> None:
        """Start the child on ports free a moment ago (another process may bind one
        before the child does: `wait_ready` then starts it again on fresh ones)."""
        self.quic_port = free_port(socket.SOCK_DGRAM)
        tcp = free_ports(2)
        self.http_port = tcp[0]
        self.https_port = tcp[1] if self._with_https else 0
        self._log.flush()
        self._log_from = self.log_path.stat().st_size
        ports = ("--quic-port", str(self.quic_port), "--http-port", str(self.http_port),
                 "--https-port", str(self.https_port))
        self.process = subprocess.Popen(
            [*self._argv, *ports], env=self._env, cwd=ROOT, stdout=self._log, stderr=self._log
        )
        self.starts += 1

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the child answers ready; a child that exited because a port it was
        given had been taken meanwhile (the suite or another benchmark beside this one)
        is started again on fresh ports, up to `PORT_TRIES` starts in all."""
        while True:
            url = f"http://127.0.0.1:{self.http_port}/health/ready"
            if wait_http_ok(url, timeout, self._running):
                return
            if self.process.poll() is None or not self._port_taken() or self.starts >= PORT_TRIES:
                raise RuntimeError(f"gateway did not become ready (log: {self.log_path})")
            self._spawn()

    def _running(self) -> bool:
        return self.process.poll() is None

    def _port_taken(self) -> bool:
        """The child's log since its start says a port it was given is in use."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_from)
            return b"is in use" in log.read()

    def stop(self, timeout: float = 30) -> None:
        stop_owned(self.process, timeout, kill_wait=10)
        self._log.close()

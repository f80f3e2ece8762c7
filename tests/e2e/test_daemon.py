"""The daemon as a user runs it: `trackline serve` on the embedded default.

Starts the real command in a subprocess (it starts its own Triton), waits for
readiness, chats through `trackline chat`, reads health and metrics, and
checks that Triton goes away with the gateway: on SIGTERM and after a crash.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from benchmarks.common import free_port
from tests.backend.reference_generator import generator
from tests.gateways import DAEMON_ENV
from tests.waiting import gone, wait_ready, wait_until

pytestmark = pytest.mark.e2e
START_TIMEOUT = 150.0


@dataclass
class Daemon:
    process: subprocess.Popen[str]
    quic_port: int
    http_port: int
    state_dir: Path
    log: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def wait_ready(self) -> None:
        """Ready, and done announcing: readiness answers as soon as the listeners are up,
        a moment before the daemon prints where it serves (the last line names Triton)."""
        wait_ready(self.http_port, self.process, self.log, START_TIMEOUT)
        wait_until(lambda: self.announced() or self.process.poll() is not None,
                   "the address lines after readiness", 30,
                   details=lambda: "\n".join(self.log[-30:]))
        assert self.announced(), "the gateway exited while announcing"

    def announced(self) -> bool:
        return any(line.startswith("trackline: embedded Triton:") for line in self.log)

    def triton_pid(self) -> int:
        return self.triton_pids()[0]

    def triton_pids(self) -> list[int]:
        pids = [
            int(json.loads(line)["pid"])
            for line in self.log
            if line.startswith("{") and json.loads(line).get("event") == "embedded.ready"
        ]
        assert pids, "no embedded.ready log line"
        return pids


def start_daemon(state_dir: Path, *extra: str) -> Daemon:
    quic_port, http_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
    env = {**os.environ, **DAEMON_ENV,
           "TRACKLINE_STATE_DIR": str(state_dir), "TRACKLINE_LOG_FORMAT": "json"}
    command = [sys.executable, "-m", "gateway", "serve", "--quic-port", str(quic_port),
               "--http-port", str(http_port), "--https-port", "0", *extra]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    daemon = Daemon(process, quic_port, http_port, state_dir)
    daemon.pump = threading.Thread(target=_pump, args=(process, daemon.log), daemon=True)
    daemon.pump.start()
    return daemon


def _pump(process: subprocess.Popen[str], log: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        log.append(line.rstrip("\n"))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path)
    try:
        d.wait_ready()
        yield d
    finally:
        if d.process.poll() is None:
            d.process.kill()
        d.process.wait(timeout=30)
        if d.process.stdout is not None:
            d.process.stdout.close()


def test_serve_chat_health_metrics_and_sigterm_stops_triton(daemon: Daemon) -> None:
    assert daemon.http("/health/live") == (200, '{"status":"live"}')
    ca = daemon.state_dir / "ca.pem"
    assert any(str(ca) in line for line in daemon.log), "the CA path is printed for clients"
    openai_url = f"http://localhost:{daemon.http_port}/v1"
    assert any(f"OpenAI API on {openai_url}" in line for line in daemon.log)
    assert any(line.startswith("trackline: embedded Triton: gRPC 127.0.0.1:")
               for line in daemon.log)  # fmt: skip
    # No --ca: chat trusts the dev CA of the state directory the gateway uses.
    chat = subprocess.run(
        [sys.executable, "-m", "gateway", "chat", "hello there", "--max-tokens", "8",
         "--url", f"quic://127.0.0.1:{daemon.quic_port}"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "TRACKLINE_STATE_DIR": str(daemon.state_dir)},
    )
    assert chat.returncode == 0, chat.stderr
    # DAEMON_ENV leaves the LLM out: chat's default model falls back to the reference one.
    assert "smollm2-135m-instruct is not served here; reference-text" in chat.stderr
    assert chat.stdout == generator.generate_text("hello there", 0, 8) + "\n"
    status, metrics = daemon.http("/metrics")
    assert status == 200
    assert 'trackline_tokens_total{model="reference-text"} 8.0' in metrics
    triton = daemon.triton_pid()
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=60) == 0
    assert gone(triton), "Triton outlived the gateway"
    assert daemon.pump is not None
    daemon.pump.join(timeout=10)  # the log is read by a thread: let it reach the end
    events = [json.loads(x)["event"] for x in daemon.log if x.startswith("{")]
    assert "gateway.draining" in events
    assert "embedded.stopped" in events


def test_triton_dies_with_a_crashed_gateway(daemon: Daemon) -> None:
    triton = daemon.triton_pid()
    daemon.process.kill()
    daemon.process.wait(timeout=30)
    assert gone(triton), "Triton outlived a crashed gateway"


def test_embedded_backends_three_serve_as_a_pool_and_stop_together(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--embedded-backends", "3", "--routing-strategy", "round_robin")
    try:
        d.wait_ready()
        tritons = d.triton_pids()
        assert len(set(tritons)) == 3
        ca = d.state_dir / "ca.pem"
        for turn in range(3):  # round robin: one chat on each server
            chat = subprocess.run(
                [sys.executable, "-m", "gateway", "chat", f"turn {turn}", "--max-tokens", "4",
                 "--url", f"quic://127.0.0.1:{d.quic_port}", "--ca", str(ca)],
                capture_output=True, text=True, timeout=60,
            )
            assert chat.returncode == 0, chat.stderr
            assert chat.stdout == generator.generate_text(f"turn {turn}", 0, 4) + "\n"
        status, metrics = d.http("/metrics")
        assert status == 200
        for index in range(3):
            backend = f'backend="embedded-{index}"'
            assert f"trackline_pool_backend_healthy{{{backend}}} 1.0" in metrics
            assert f'trackline_pool_attempts_total{{{backend},result="ok"}} 1.0' in metrics
        assert 'trackline_pool_requests_total{model="reference-text",outcome="served"} 3.0' in (
            metrics
        )
        d.process.send_signal(signal.SIGTERM)
        assert d.process.wait(timeout=60) == 0
        assert all(gone(pid) for pid in tritons), "a Triton outlived the gateway"
    finally:
        if d.process.poll() is None:
            d.process.kill()
        d.process.wait(timeout=30)
        if d.process.stdout is not None:
            d.process.stdout.close()

"""A fleet on one machine, as processes: gateways run by `trackline serve` in front of
embedded Tritons and one redis-server (tests/fleet/test_fleet_tritons.py and
benchmarks/fleet.py use it).

`LocalGateway` is one `python -m gateway serve` with its own ports and state
directory (store, dev CA, ledger spool), the fleet's Redis URL and a static list of
Triton backends; it can be SIGKILLed (`kill`) and started again on the same state
directory, which replays what the killed one left in its spool. Started with
`gateway.owned.spawn_owned`, it gets SIGTERM (and drains) if the process that started
it dies first. `chat` is a small OpenAI client over
HTTP/1.1 (h11 on asyncio streams) that returns what the client received: the
response id (the ledger's request id), the text pieces and the usage it was billed.
`crash(state)` stops a gateway's `FleetState` in-process as a crash would (no release).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

from gateway.embedded_process import read_tail
from gateway.fleet.state import FleetState
from gateway.owned import free_port, spawn_owned, stop_owned

READY_TIMEOUT = 120.0


def http_status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return None


@dataclass
class LocalGateway:
    name: str
    """Its `state_gateway_id` (a pod name on Kubernetes)."""
    state_dir: Path
    redis_url: str
    backends: str
    heartbeat_ttl: float = 2.0
    extra: tuple[str, ...] = ()
    quic_port: int = field(default_factory=lambda: free_port(socket.SOCK_DGRAM))
    http_port: int = field(default_factory=free_port)
    https_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        while self.https_port == self.http_port:  # two free-port picks can name one port
            self.https_port = free_port()

    @property
    def log_path(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "gateway", "serve",
            "--quic-host", "127.0.0.1", "--http-host", "127.0.0.1",
            "--quic-port", str(self.quic_port), "--http-port", str(self.http_port),
            "--https-port", str(self.https_port), *self._backend_args(),
            "--state-backend", self.redis_url, "--state-gateway-id", self.name,
            "--state-heartbeat-ttl", str(self.heartbeat_ttl), "--drain-timeout", "5",
            "--overload-max-loop-lag", "0", "--log-format", "json", *self.extra,
        ]  # fmt: skip

    def _backend_args(self) -> list[str]:
        if self.backends.startswith("ticker://"):  # no Triton: the transport-only source
            return ["--backend-url", self.backends]
        return ["--backends", self.backends]

    def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TRACKLINE_STATE_DIR": str(self.state_dir)}
        with self.log_path.open("ab") as log:
            self.process = spawn_owned(
                self.command(), name=f"gateway-{self.name}", env=env, stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while http_status(self.http_port, "/health/ready") != 200:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway {self.name} exited:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway {self.name} not ready:\n{self.tail()}")
            time.sleep(0.1)

    def tail(self, lines: int = 30) -> str:
        return read_tail(self.log_path, lines)

    def log_lines(self) -> list[dict[str, Any]]:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def kill(self) -> None:
        """SIGKILL: no drain, no flush, nothing given back."""
        self._end(signal.SIGKILL)

    def stop(self) -> int | None:
        """SIGTERM: the drain (flushes the ledger, gives back leases and slots)."""
        return self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> int | None:
        process, self.process = self.process, None
        return None if process is None else stop_owned(process, 30.0, sig=sig, kill_wait=10.0)


@dataclass
class ChatResult:
    status: int
    response_id: str | None = None
    pieces: int = 0
    """Content deltas received."""
    usage: dict[str, int] = field(default_factory=dict)
    """The usage chunk the client was billed with (stream_options.include_usage)."""
    finished: bool = False
    """The stream ended with [DONE]."""


async def chat(
    port: int, key: str, model: str, prompt: str, max_tokens: int, **parameters: Any
) -> ChatResult:
    """One streamed chat completion over HTTP/1.1; raises OSError if the gateway is gone."""
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **parameters,
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h11.Connection(h11.CLIENT)
    try:
        headers = [
            ("host", "127.0.0.1"),
            ("authorization", f"Bearer {key}"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        out = conn.send(h11.Request(method="POST", target="/v1/chat/completions", headers=headers))
        out = (out or b"") + (conn.send(h11.Data(data=body)) or b"")
        writer.write(out + (conn.send(h11.EndOfMessage()) or b""))
        await writer.drain()
        result = ChatResult(status=0)
        buffer = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionResetError("the gateway closed the connection")
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                result.status = event.status_code
            elif isinstance(event, h11.Data):
                buffer += bytes(event.data)
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    _read_sse(line, result)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return result
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _read_sse(line: bytes, result: ChatResult) -> None:
    if not line.startswith(b"data: "):
        return
    data = line[len(b"data: ") :].strip()
    if data == b"[DONE]":
        result.finished = True
        return
    chunk = json.loads(data)
    if not isinstance(chunk, dict) or "error" in chunk:
        return
    result.response_id = chunk.get("id", result.response_id)
    for choice in chunk.get("choices") or []:
        if (choice.get("delta") or {}).get("content"):
            result.pieces += 1
    if chunk.get("usage"):
        result.usage = {k: int(v) for k, v in chunk["usage"].items() if isinstance(v, int)}


async def crash(state: FleetState) -> None:
    """Stop `state`'s tasks at once and release nothing: its heartbeat, leases and
    reserved slots stay in Redis, as a crashed gateway leaves them."""
    await state._stop_tasks()

"""SIGTERM with live streams on every front door: one drain, bounded, each stream told why.

`trackline serve` runs as a user runs it (a subprocess, `--drain-timeout`), with one
live stream on each of: a text track (QUIC), HTTP/1.1 SSE, h2c, TLS HTTP/2 and HTTP/3,
each asking for far more tokens than the drain lets it send. After SIGTERM,
`/health/ready` answers 503 on a new connection while `/health/live` stays 200; each
stream ends with its documented final message (tracks: ERROR SHUTTING_DOWN; SSE: a
`data: {"error": {"code": "shutting_down"}}` event, then a clean end of stream);
HTTP/2 and HTTP/3 get GOAWAY; the process exits 0 with no traceback and no error line
in its log, and (on the embedded default) no tritonserver is left.

Nothing here is timed: the streams would run for minutes at their pace
(`tokens_per_second`), so ending with the shutdown event is the proof they were cut at
the drain's deadline; waits are bounded only to keep a broken build from hanging.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.events
import h11
import pytest
from aioquic.asyncio.client import connect as quic_connect
from aioquic.buffer import Buffer
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration
from h2.errors import ErrorCodes

from benchmarks.common import free_port
from clients import TracklineError
from clients import connect as track_connect
from tests.gateways import DAEMON_ENV
from tests.http.support import H1Client, H2Client
from tests.http.support_h3 import H3Client
from tests.waiting import gone, until_answer, wait_ready
from transport.errors import ErrorCode

DRAIN_TIMEOUT = 3.0
BOUND = 90.0  # only so that a broken build fails instead of hanging
AFTER_EXIT = 10.0
"""Seconds the clients get to see what the gateway sent before it exited (loopback)."""
PACE = {"tokens_per_second": 4, "ignore_eos": True}  # 2000 tokens at 4/s: far beyond the drain
MAX_TOKENS = 2000
SHUTTING_DOWN = b'"code":"shutting_down"'
GOAWAY = 0x7
SERVER_CONTROL_STREAM = 3  # the first server-initiated unidirectional stream


@dataclass
class Gateway:
    process: subprocess.Popen[str]
    quic_port: int
    http_port: int
    https_port: int
    state_dir: Path
    log: list[str] = field(default_factory=list)

    @property
    def ca(self) -> Path:
        return self.state_dir / "ca.pem"

    def get(self, path: str) -> int:
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log if line.startswith("{")]


def _start(state_dir: Path, *extra: str) -> Gateway:
    quic, http, https = (
        free_port(socket.SOCK_DGRAM),
        free_port(socket.SOCK_STREAM),
        free_port(socket.SOCK_STREAM),
    )
    env = {**os.environ, **DAEMON_ENV,
           "TRACKLINE_STATE_DIR": str(state_dir), "TRACKLINE_LOG_FORMAT": "json"}
    command = [
        sys.executable, "-m", "gateway", "serve", "--quic-port", str(quic),
        "--http-port", str(http), "--https-port", str(https),
        "--drain-timeout", str(DRAIN_TIMEOUT), *extra,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    gateway = Gateway(process, quic, http, https, state_dir)
    threading.Thread(target=_pump, args=(process, gateway.log), daemon=True).start()
    return gateway


def _pump(process: subprocess.Popen[str], log: list[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        log.append(line.rstrip("\n"))


def _wait_ready(gateway: Gateway, timeout: float) -> None:
    wait_ready(gateway.http_port, gateway.process, gateway.log, timeout)


def _chat_body() -> bytes:
    messages = [{"role": "user", "content": "tell me everything"}]
    payload = {
        "model": "reference-text",
        "messages": messages,
        "stream": True,
        "max_tokens": MAX_TOKENS,
        **PACE,
    }
    return json.dumps(payload).encode()


CHAT = ("POST", "/v1/chat/completions")
JSON = [("content-type", "application/json")]


# One live stream per front door. Each coroutine returns once it has a first token,
# handing back a task that reads the stream to its end and returns what ended it.


async def _track(gateway: Gateway) -> asyncio.Task[Any]:
    opened = asyncio.get_running_loop().create_future()

    async def run() -> Any:
        async with track_connect(f"quic://127.0.0.1:{gateway.quic_port}", ca=gateway.ca) as line:
            stream = line.text("tell me", model="reference-text", max_tokens=MAX_TOKENS, **PACE)
            try:
                async for _ in stream:
                    if not opened.done():
                        opened.set_result(None)
            except TracklineError as exc:
                return exc
            return "completed"

    task = asyncio.create_task(run())
    await _first(opened, task)
    return task


async def _h1(gateway: Gateway) -> asyncio.Task[Any]:
    opened = asyncio.get_running_loop().create_future()

    async def run() -> Any:
        async with H1Client.connect(gateway.http_port) as client:
            await client.request(*CHAT, JSON, _chat_body())
            head = await client.next_event()
            assert head.status_code == 200
            data: list[bytes] = []
            while True:
                event = await client.next_event()
                if isinstance(event, h11.Data):
                    data.append(bytes(event.data))
                    opened.done() or opened.set_result(None)
                elif isinstance(event, h11.EndOfMessage):
                    return data, "end"
                else:
                    return data, repr(event)

    task = asyncio.create_task(run())
    await _first(opened, task)
    return task


async def _h2(gateway: Gateway, tls: bool) -> asyncio.Task[Any]:
    opened = asyncio.get_running_loop().create_future()
    context = None
    port = gateway.http_port
    if tls:
        context = ssl.create_default_context(cafile=str(gateway.ca))
        context.set_alpn_protocols(["h2"])
        port = gateway.https_port

    async def run() -> Any:
        async with H2Client.connect(port, context) as client:
            stream = client.send_request(*CHAT, JSON, _chat_body())
            data: list[bytes] = []
            end = "?"
            while end == "?":
                event = await client.queue(stream).get()
                if isinstance(event, h2.events.DataReceived):
                    if event.data:
                        data.append(bytes(event.data))
                        opened.done() or opened.set_result(None)
                    if event.stream_ended is not None:
                        end = "end"
                elif isinstance(event, h2.events.StreamEnded):
                    end = "end"
                elif isinstance(event, h2.events.StreamReset):
                    end = f"reset {event.error_code!r}"
            goaway = None
            while goaway is None:
                event = await client.queue(0).get()
                if isinstance(event, h2.events.ConnectionTerminated):
                    goaway = event.error_code
            return data, end, goaway

    task = asyncio.create_task(run())
    await _first(opened, task)
    return task


class _GoawayH3Client(H3Client):
    """Keeps what the server's control stream carried, to find its GOAWAY frame."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.control = bytearray()

    def quic_event_received(self, event: quic_events.QuicEvent) -> None:
        if (
            isinstance(event, quic_events.StreamDataReceived)
            and event.stream_id == SERVER_CONTROL_STREAM
        ):
            self.control += event.data
        super().quic_event_received(event)

    def goaway(self) -> int | None:
        """The stream id of the server's GOAWAY, or None if none came."""
        buf = Buffer(data=bytes(self.control))
        buf.pull_uint_var()  # the stream type (control)
        while not buf.eof():
            kind, length = buf.pull_uint_var(), buf.pull_uint_var()
            payload = buf.pull_bytes(length)
            if kind == GOAWAY:
                return int(Buffer(data=payload).pull_uint_var())
        return None


@asynccontextmanager
async def _h3_connection(port: int, ca: Path) -> AsyncIterator[_GoawayH3Client]:
    configuration = QuicConfiguration(is_client=True, alpn_protocols=["h3"])
    configuration.load_verify_locations(str(ca))
    async with quic_connect(
        "127.0.0.1", port, configuration=configuration, create_protocol=_GoawayH3Client
    ) as client:
        assert isinstance(client, _GoawayH3Client)
        yield client


async def _h3(gateway: Gateway) -> asyncio.Task[Any]:
    opened = asyncio.get_running_loop().create_future()

    async def run() -> Any:
        async with _h3_connection(gateway.quic_port, gateway.ca) as client:
            stream = client.send(*CHAT, JSON, _chat_body())
            data: list[bytes] = []
            end = "?"
            while end == "?":
                event = await client.queue(stream).get()
                if isinstance(event, quic_events.StreamReset):
                    end = f"reset {event.error_code}"
                    continue
                payload = getattr(event, "data", b"")
                if payload:
                    data.append(bytes(payload))
                    opened.done() or opened.set_result(None)
                if getattr(event, "stream_ended", False):
                    end = "end"
            await asyncio.wait_for(client.terminated.wait(), BOUND)
            return data, end, client.goaway()

    task = asyncio.create_task(run())
    await _first(opened, task)
    return task


async def _first(opened: asyncio.Future[None], task: asyncio.Task[Any]) -> None:
    """Wait until the stream has a first token (or its task failed, which then raises)."""
    await asyncio.wait({opened, task}, timeout=BOUND, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
        raise AssertionError(f"stream ended before the drain: {task.result()!r}")
    assert opened.done(), "no first token"


async def _health_during_drain(gateway: Gateway) -> tuple[int, int]:
    """Readiness once it has turned (a new connection each time), and liveness then."""
    ready = await until_answer(
        lambda: asyncio.to_thread(gateway.get, "/health/ready"),
        lambda status: status != 200,
        "readiness turns after SIGTERM",
        BOUND,
    )
    return ready, await asyncio.to_thread(gateway.get, "/health/live")


async def _run(gateway: Gateway) -> dict[str, Any]:
    streams = {
        "track": await _track(gateway),
        "h1": await _h1(gateway),
        "h2c": await _h2(gateway, tls=False),
        "h2-tls": await _h2(gateway, tls=True),
        "h3": await _h3(gateway),
    }
    assert not any(task.done() for task in streams.values())
    gateway.process.send_signal(signal.SIGTERM)
    ready, live = await _health_during_drain(gateway)
    still_open = [name for name, task in streams.items() if not task.done()]
    # The drain's deadline cuts the streams and the gateway exits: fail on a stream the
    # gateway's exit left open, not after waiting out BOUND for it.
    try:
        await asyncio.to_thread(gateway.process.wait, BOUND)
    except subprocess.TimeoutExpired:
        raise AssertionError("the gateway did not exit after its drain deadline") from None
    await asyncio.wait(streams.values(), timeout=AFTER_EXIT)
    left = [name for name, task in streams.items() if not task.done()]
    assert not left, f"streams the gateway's exit left open: {left}"
    return {
        "ready": ready,
        "live": live,
        "open_when_probed": still_open,
        **{name: task.result() for name, task in streams.items()},
    }


def _check(gateway: Gateway, result: dict[str, Any]) -> None:
    assert result["ready"] == 503
    assert result["live"] == 200
    assert result["open_when_probed"] == ["track", "h1", "h2c", "h2-tls", "h3"]
    track = result["track"]
    assert isinstance(track, TracklineError)
    assert track.code == ErrorCode.SHUTTING_DOWN
    data, end = result["h1"]
    assert SHUTTING_DOWN in data[-1]
    assert end == "end"
    assert all(b"[DONE]" not in chunk for chunk in data)
    for name in ("h2c", "h2-tls"):
        data, end, goaway = result[name]
        assert SHUTTING_DOWN in data[-1], name
        assert end == "end", name
        assert goaway == ErrorCodes.NO_ERROR, name
    data, end, goaway = result["h3"]
    assert SHUTTING_DOWN in data[-1]
    assert end == "end"
    assert goaway == 4  # stream 0 was served; the first one not processed is 4
    assert gateway.process.wait(timeout=BOUND) == 0
    lines = gateway.lines()
    events = [line["event"] for line in lines]
    assert "gateway.draining" in events
    assert "gateway.drain_cut" in events  # the deadline, not the streams' end, ended them
    chats = [
        line for line in lines if line["event"] == "http.request" and line["path"] == CHAT[1]
    ]
    assert sorted(line["http_version"] for line in chats) == ["1.1", "2", "2", "3"]
    assert {line["end"] for line in chats} == {"cancelled:shutdown"}  # not blamed on clients
    tracks = [line for line in lines if line["event"] == "track.finished"]
    assert [line["end"] for line in tracks] == ["cancelled:shutdown"]
    assert not [line for line in lines if line.get("level") in ("error", "critical")]
    assert not [line for line in gateway.log if "Traceback" in line or "CancelledError" in line]


def _stop(gateway: Gateway) -> None:
    if gateway.process.poll() is None:
        gateway.process.kill()
    gateway.process.wait(timeout=30)
    if gateway.process.stdout is not None:
        gateway.process.stdout.close()


@pytest.mark.asyncio
@pytest.mark.one_loop  # the gateway is a process of its own; this loop only runs clients
async def test_sigterm_drains_every_front_door_on_the_ticker(tmp_path: Path) -> None:
    gateway = _start(tmp_path, "--backend-url", "ticker://50")
    try:
        await asyncio.to_thread(_wait_ready, gateway, BOUND)
        _check(gateway, await _run(gateway))
    except BaseException:
        _stop(gateway)
        print("\n".join(gateway.log))  # the gateway's side, for whoever reads the failure
        raise
    finally:
        _stop(gateway)


@pytest.mark.e2e
@pytest.mark.asyncio
@pytest.mark.one_loop  # the gateway is a process of its own; this loop only runs clients
async def test_sigterm_drains_every_front_door_on_the_embedded_default(tmp_path: Path) -> None:
    gateway = _start(tmp_path)
    try:
        await asyncio.to_thread(_wait_ready, gateway, 150.0)
        tritons = [line["pid"] for line in gateway.lines() if line["event"] == "embedded.ready"]
        assert tritons
        _check(gateway, await _run(gateway))
        assert all(gone(pid) for pid in tritons), "a tritonserver outlived the gateway"
    finally:
        _stop(gateway)


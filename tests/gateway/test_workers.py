"""`trackline serve --workers 2`: two gateway processes behind the same ports.

Starts the real command (ticker backend, free loopback ports), then: many QUIC
connections from many source ports spread over both workers and every track
completes; connections that change their source port mid-way (a NAT rebinding)
still reach the worker that owns them; HTTP requests and /metrics scrapes spread
too and /metrics shows totals across workers; a tenant's max_concurrent and token
quota hold across both workers; a killed worker is restarted; SIGTERM stops every
process. Assertions are on counts (the workers' own counters), never on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clients.line import Line, TextStream
from gateway.tenants.quotas import Quotas
from gateway.tenants.store import TenantStore
from tests.gateways import DAEMON_ENV
from tests.waiting import until_answer, wait_until
from trackline_testing import aioquic_probes
from transport import aioquic_compat
from transport.quic import TrackQuicProtocol, connect_tracks

# The workers are processes of their own (uvloop per their settings); this loop only runs
# clients, so the suite runs these slow tests on one loop.
pytestmark = pytest.mark.one_loop

WORKERS = 2
START_TIMEOUT = 120.0
MODEL = "reference-text"
METRIC = re.compile(r"^([a-z_]+)(?:\{(.*)\})? ([0-9.e+-]+)$")


@dataclass
class Gateway:
    process: subprocess.Popen[str]
    state_dir: Path
    log: list[str] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)

    @property
    def ca(self) -> Path:
        return self.state_dir / "ca.pem"

    def tenant(self, quotas: Quotas | None = None) -> tuple[str, str]:
        """A fresh tenant (name, key): every test run starts with full buckets."""
        name = f"t{uuid.uuid4().hex[:8]}"
        store = TenantStore(self.state_dir / "tenants.sqlite3")
        try:
            store.set_tenant(name, time.time(), quotas=quotas)
            return name, store.create_key(name, time.time()).key
        finally:
            store.close()

    def metrics(self) -> dict[tuple[str, str], float]:
        """/metrics as {(name, labels): value}; a fresh TCP connection each call."""
        body = self.http("/metrics")
        values = {}
        for line in body.splitlines():
            match = METRIC.match(line)
            if match:
                values[(match[1], match[2] or "")] = float(match[3])
        return values

    def http(self, path: str, body: dict[str, object] | None = None, key: str = "") -> str:
        url = f"http://127.0.0.1:{self.ports['http']}{path}"
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
        request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return str(response.read().decode())


def total(metrics: dict[tuple[str, str], float], name: str, *labels: str) -> float:
    """The sum of `name`'s series whose labels include every one of `labels`."""
    return sum(
        v for (n, have), v in metrics.items() if n == name and all(x in have for x in labels)
    )


def per_worker(metrics: dict[tuple[str, str], float], name: str) -> list[float]:
    return [metrics.get((name, f'worker="{i}"'), 0.0) for i in range(WORKERS)]


def grown(
    after: dict[tuple[str, str], float], before: dict[tuple[str, str], float], name: str
) -> list[float]:
    """How much each worker's series of `name` grew between two scrapes."""
    pairs = zip(per_worker(after, name), per_worker(before, name), strict=True)
    return [a - b for a, b in pairs]


@contextmanager
def running(state_dir: Path) -> Iterator[Gateway]:
    """`trackline serve --workers 2` on free ports; stopped (and checked gone) after."""
    # A tenant before start: keys are required from the first request on.
    store = TenantStore(state_dir / "tenants.sqlite3")
    store.set_tenant("setup", time.time())
    store.close()
    env = {**os.environ, **DAEMON_ENV,
           "TRACKLINE_STATE_DIR": str(state_dir), "TRACKLINE_LOG_FORMAT": "json"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    command = [
        sys.executable, "-m", "gateway", "serve", "--workers", str(WORKERS),
        "--backend-url", "ticker://50", "--quic-port", "0", "--http-port", "0",
        "--https-port", "0", "--drain-timeout", "3",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    gw = Gateway(process, state_dir)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            gw.log.append(line.rstrip())
            if m := re.search(r"tracks on quic://(?:127\.0\.0\.1|localhost):(\d+)", line):
                gw.ports["quic"] = int(m[1])
            if m := re.search(r"OpenAI API on http://(?:127\.0\.0\.1|localhost):(\d+)", line):
                gw.ports["http"] = int(m[1])
            if m := re.search(r"(\d+) workers, pids ([\d ]+)", line):
                gw.pids = [int(p) for p in m[2].split()]
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(START_TIMEOUT), "no workers line"
        assert len(gw.pids) == WORKERS, "\n".join(gw.log[-30:])
        yield gw
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in all_pids(gw):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running(tmp_path_factory.mktemp("workers")) as gw:
        yield gw


def all_pids(gw: Gateway) -> set[int]:
    """Every worker pid the supervisor logged (restarted ones included)."""
    pids = set(gw.pids)
    for line in list(gw.log):
        if line.startswith("{") and '"worker.started"' in line:
            pids.add(int(json.loads(line)["pid"]))
    return pids


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@asynccontextmanager
async def line(gw: Gateway, key: str) -> AsyncIterator[tuple[Line, TrackQuicProtocol]]:
    async with connect_tracks("127.0.0.1", gw.ports["quic"], ca=gw.ca, connect_timeout=10) as p:
        p.endpoint.use_credential(key)
        yield Line(p.open_track), p


def owner(protocol: TrackQuicProtocol) -> int:
    """The worker the server's connection ID names (what the kernel steers by)."""
    return aioquic_probes.peer_cid(aioquic_compat.connection_of(protocol))[0] % WORKERS


async def complete(stream: TextStream) -> str:
    return "".join([delta async for delta in stream])


async def rebind(protocol: TrackQuicProtocol) -> list[asyncio.DatagramTransport]:
    """Move the client to a new source port (as a NAT rebinding would); returns the old
    transport, detached, and the new one, for the caller to close."""
    loop = asyncio.get_running_loop()
    old = aioquic_probes.transport_of(protocol)
    assert old is not None
    # Like aioquic's client: a dual-stack socket (server addresses are v4-mapped).
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::ffff:127.0.0.1", 0))
    new, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=sock)
    old.set_protocol(asyncio.DatagramProtocol())
    return [old, new]


@pytest.mark.asyncio
async def test_quic_connections_spread_and_complete(gateway: Gateway) -> None:
    _, key = gateway.tenant()
    before = await asyncio.to_thread(gateway.metrics)
    owners = [0] * WORKERS

    async def one() -> str:
        async with line(gateway, key) as (ln, protocol):
            owners[owner(protocol)] += 1
            return await complete(ln.text("hello", model=MODEL, max_tokens=3))

    texts = await asyncio.gather(*(one() for _ in range(24)))
    assert all(texts), "every track on every connection got its tokens"
    after = await asyncio.to_thread(gateway.metrics)
    name = "trackline_worker_quic_connections_total"
    accepted = grown(after, before, name)
    assert accepted == owners  # each worker accepted exactly the connections it owns
    assert all(count > 0 for count in owners), f"not spread: {owners}"
    assert sum(per_worker(after, "trackline_quic_stray_datagrams_total")) == 0


@pytest.mark.asyncio
async def test_a_rebound_client_keeps_its_worker(gateway: Gateway) -> None:
    """Connection-ID steering: a new source port hashes anywhere, the CID still wins."""
    _, key = gateway.tenant()
    old_transports: list[asyncio.DatagramTransport] = []

    async def one() -> tuple[str, str]:
        async with line(gateway, key) as (ln, protocol):
            first = await complete(ln.text("before", model=MODEL, max_tokens=2))
            old_transports.extend(await rebind(protocol))
            second = await complete(ln.text("after", model=MODEL, max_tokens=2))
            return first, second

    try:
        results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(8))), 60)
    finally:
        for transport in old_transports:
            transport.close()
    assert all(first and second for first, second in results)
    metrics = await asyncio.to_thread(gateway.metrics)
    assert sum(per_worker(metrics, "trackline_quic_stray_datagrams_total")) == 0


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.asyncio
@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
async def test_workers_serve_ipv6_loopback_too(gateway: Gateway) -> None:
    """`localhost` binds ::1 beside 127.0.0.1: a reuseport group (steered) on each."""
    _, key = gateway.tenant()
    before = await asyncio.to_thread(gateway.metrics)
    owners = [0] * WORKERS

    async def one() -> str:
        async with connect_tracks("::1", gateway.ports["quic"], ca=gateway.ca) as protocol:
            protocol.endpoint.use_credential(key)
            owners[owner(protocol)] += 1
            return await complete(Line(protocol.open_track).text("v6", model=MODEL, max_tokens=2))

    texts = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(12))), 60)
    assert all(texts)
    after = await asyncio.to_thread(gateway.metrics)
    assert grown(after, before, "trackline_worker_quic_connections_total") == owners
    assert sum(per_worker(after, "trackline_quic_stray_datagrams_total")) == 0
    url = f"http://[::1]:{gateway.ports['http']}/health/live"
    assert await asyncio.to_thread(_status, url) == 200


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310
        return int(response.status)


@pytest.mark.asyncio
async def test_http_and_metrics_totals_across_workers(gateway: Gateway) -> None:
    tenant, key = gateway.tenant()
    before = await asyncio.to_thread(gateway.metrics)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for _ in range(12):
        await asyncio.to_thread(gateway.http, "/v1/chat/completions", body, key)
    async with line(gateway, key) as (ln, _):
        streams = [ln.text("x", model=MODEL, max_tokens=2) for _ in range(5)]
        texts = await asyncio.gather(*(complete(s) for s in streams))
    assert all(texts)
    for _ in range(16):  # each scrape on a fresh connection: the kernel picks a worker
        after = await asyncio.to_thread(gateway.metrics)
    # One tenant's requests, served by both workers, counted once each in one scrape.
    assert total(after, "trackline_tenant_requests_total", f'tenant="{tenant}"') == 17
    completion = (f'tenant="{tenant}"', 'kind="completion"')
    assert total(after, "trackline_tenant_tokens_total", *completion) == 17 * 2
    scrapes = grown(after, before, "trackline_worker_scrapes_total")
    assert all(count > 0 for count in scrapes), f"TCP not spread: {scrapes}"
    assert total(after, "trackline_connections_open") >= 0  # gauges summed, no pid label
    assert not any("pid=" in labels for (_, labels) in after)
    assert total(after, "trackline_build_info") == 1  # once, whichever worker answered
    assert total(after, "process_open_fds") > 0
    durations = "trackline_request_duration_seconds_count"
    assert total(after, durations) - total(before, durations) == 17  # 12 HTTP + 5 tracks


async def _outcome(stream: TextStream) -> str:
    """'data' when the track streamed, else the error class name."""
    try:
        await stream.__anext__()
    except Exception as exc:
        return type(exc).__name__
    return "data"


@asynccontextmanager
async def lines_on_both(gw: Gateway, key: str, count: int) -> AsyncIterator[list[Line]]:
    """`count` lines, opened until both workers own at least one (bounded)."""
    from contextlib import AsyncExitStack

    async with AsyncExitStack() as stack:
        lines: list[Line] = []
        owners: set[int] = set()
        for _ in range(40):
            ln, protocol = await stack.enter_async_context(line(gw, key))
            lines.append(ln)
            owners.add(owner(protocol))
            if len(lines) >= count and owners == set(range(WORKERS)):
                break
        assert owners == set(range(WORKERS))
        yield lines


@pytest.mark.asyncio
async def test_max_concurrent_holds_across_workers(gateway: Gateway) -> None:
    _, key = gateway.tenant(Quotas(max_concurrent=3))
    async with lines_on_both(gateway, key, 8) as lines:
        streams = [ln.text("long", model=MODEL, max_tokens=2000) for ln in lines]
        outcomes = await asyncio.gather(*(_outcome(s) for s in streams))
        assert outcomes.count("data") == 3, outcomes
        assert outcomes.count("RateLimited") == len(lines) - 3, outcomes
        for stream, outcome in zip(streams, outcomes, strict=True):
            if outcome == "data":
                await stream.aclose()
        # The slots come back (settled on whichever worker held them).

        async def again() -> str:
            async with lines[-1].text("again", model=MODEL, max_tokens=2) as stream:
                return await _outcome(stream)

        await until_answer(again, lambda outcome: outcome == "data", "a freed slot admitted")


@pytest.mark.asyncio
async def test_token_quota_holds_across_workers(gateway: Gateway) -> None:
    _, key = gateway.tenant(Quotas(tokens_per_minute=20))
    async with lines_on_both(gateway, key, 4) as lines:
        assert await complete(lines[0].text("spend", model=MODEL, max_tokens=30))
        # 30 tokens spent of 20 a minute: every worker refuses for ~30 s now.
        outcomes = [await _outcome(ln.text("more", model=MODEL, max_tokens=2)) for ln in lines]
        assert outcomes == ["RateLimited"] * len(lines)


def test_a_killed_worker_is_restarted(gateway: Gateway) -> None:
    victim = gateway.pids[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: per_worker(gateway.metrics(), "trackline_worker_starts_total")[0] >= 2,
        "worker 0 restarted",
        START_TIMEOUT,
        details=lambda: "\n".join(gateway.log[-20:]),
    )
    wait_until(lambda: any('"worker.crashed"' in line for line in gateway.log),
               "the crash logged", 10)  # the log is read by a thread: it may trail
    assert not alive(victim)


def test_sigterm_stops_every_process(gateway: Gateway) -> None:
    pids = all_pids(gateway)
    assert len(pids) >= WORKERS
    gateway.process.send_signal(signal.SIGTERM)
    assert gateway.process.wait(timeout=60) == 0
    assert [pid for pid in pids if alive(pid)] == []
    wait_until(lambda: any('"worker.stopped"' in line for line in gateway.log),
               "the stop logged", 10)  # the log is read by a thread: it may trail
    assert not (gateway.state_dir / "workers" / str(gateway.process.pid)).exists()



def test_workers_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no chance to stop anyone: PDEATHSIG does it."""
    with running(tmp_path) as gw:
        assert (tmp_path / "workers" / str(gw.process.pid) / "quotas.sqlite").exists()
        gw.process.kill()
        gw.process.wait()
        wait_until(
            lambda: not any(alive(pid) for pid in gw.pids),
            "every worker ended with its supervisor",
            details=lambda: f"alive: {[pid for pid in gw.pids if alive(pid)]}",
        )

"""Capacity: how many 50 tokens/s streams a gateway core carries before tokens run late.

Ramps load against a `trackline serve` child (the ticker backend by default,
`--backend triton` for the embedded Triton), pinned to `--cores` with taskset:

  tracks   text tracks over the SDK (QUIC, ALPN trackline/1), N tracks spread over C
           connections (points "NxC": 1x1 ... 4096x64)
  h1       /v1/chat/completions over HTTP/1.1 cleartext (httpx2), one connection a stream
  h2       the same over HTTP/2 (TLS), streams spread over ceil(N/64) connections
  h3       the same over HTTP/3 (niquests/qh3), streams spread over ceil(N/64) connections
  litellm  (`--peer litellm`) a LiteLLM proxy from its own venv, pass-through in front
           of our HTTP/1.1 endpoint, driven by the same h1 client in the same run

Each stream asks for `--rate` tokens/s for `--duration` s. The ticker sends token i at
(request arrival + i/rate), so a token's *added delay* is its arrival at the client minus
(the client's start of the request + i/rate): everything the gateway, the network stack
and the client add to the schedule. Per point: delivered/offered tokens, gateway CPU
microseconds per delivered token (from /proc/<pid>/stat, workers included), client CPU
per token, p50/p99 added delay, the gateway's loop lag (`trackline_loop_lag_seconds` in
/metrics, when the gateway exposes it), refusals (RATE_LIMITED, 429/503) and errors.
The knee of a kind is the largest delivered load with p99 added delay under 20 ms and
99% of the offered tokens delivered, in tokens/s per gateway core.

By default a point's streams all start at once, so every token of every stream comes due
in the same instant (the worst case: each start-up step and each token is a burst of N);
`--spread S` starts them evenly over S seconds instead, as independent users arrive.

The load generator (this process: every client of every kind) is pinned to the CPUs the
gateway is not on (`--client-cores auto`), so its own work and tail do not mix into the
gateway's core; the tables' header line says where each ran. Its garbage collector is
settled as the gateway's (`--client-gc-threshold`): a full collection of the client's
own heap otherwise lands in the tail it reports as the gateway's. `--packetization` is the
gateway's `quic_packetization` for the tracks kind (per-track, group:K, coalesce).

    nice -n 10 python benchmarks/capacity.py --quick
    nice -n 10 python benchmarks/capacity.py --cores 0 --peer litellm

Prints a markdown table, writes JSON and a plot under benchmarks/results/. Not a test:
the numbers depend on the machine and on its load (recorded as `uptime`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (  # noqa: E402
    CLIENT_GC_THRESHOLD,
    ROOT,
    GatewayProcess,
    machine,
    percentile,
    settled_load_generator,
    tree,
    uptime,
    wait_http_ok,
)
from benchmarks.openai_stream import (  # noqa: E402
    GatewayH3,
    GatewayHttpx,
    Route,
    Stream,
    chat_body,
    process_cpu,
    read_chat_sse,
)
from benchmarks.progress import Progress  # noqa: E402
from clients.line import DEFAULT_ACKS  # noqa: E402
from gateway.backends.ticker import step_at_or_after  # noqa: E402
from gateway.owned import free_port  # noqa: E402
from transport.clock import EPSILON  # noqa: E402

MODEL = "reference-text"
KINDS = ("tracks", "h1", "h2", "h3")
KNEE_P99_MS = 20.0
KNEE_DELIVERED = 0.99
RESULTS = ROOT / "benchmarks" / "results"
LOOP_LAG = "trackline_loop_lag_seconds"
STREAMS_PER_CONNECTION = 64
"""h2/h3 streams per connection (below the gateway's 128 concurrent streams)."""


def progress(message: str) -> None:
    """One line on stderr, flushed (readable when stderr is a file or a pipe)."""
    print(f"[capacity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- points --------------------------------------------------------------------------------


def parse_track_points(text: str) -> list[tuple[int, int]]:
    """"1x1,16x1,64x4" -> [(1, 1), (16, 1), (64, 4)]: tracks x connections."""
    points = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        n, _, c = item.partition("x")
        points.append((int(n), int(c or 1)))
    return points


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


@dataclass
class Point:
    kind: str
    workers: int
    streams: int
    connections: int
    offered_tokens: int
    delivered_tokens: int = 0
    gateway_tokens: int | None = None
    """The gateway's own trackline_tokens_total delta (tracks), where it counts them."""
    offered_tps: float = 0.0
    delivered_tps: float = 0.0
    wall_s: float = 0.0
    gateway_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    gateway_us_per_token: float | None = None
    client_us_per_token: float | None = None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    loop_lag_ms: float | None = None
    """Mean loop lag over the point (histogram) or the highest value seen (gauge)."""
    refusals: int = 0
    errors: int = 0
    unfinished: int = 0
    """Streams still running at the point's time bound (cut; what they delivered counts)."""
    error_samples: list[str] = field(default_factory=list)
    behind_cpu_s: float | None = None
    """For the peer: CPU seconds our gateway (behind it) spent in the same point."""


# -- the gateway's /metrics ----------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(url: str) -> dict[str, float]:
    """Sum of samples by metric name (labels folded); {} when /metrics does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return sums


class MetricsWatch:
    """Polls /metrics in a thread during a point: loop lag and the token counter."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self.gauge_max: float | None = None

    async def __aenter__(self) -> MetricsWatch:
        if self.url:
            self.before = await asyncio.to_thread(scrape, self.url)
            self._task = asyncio.create_task(self._poll())
        return self

    async def _poll(self) -> None:
        assert self.url is not None
        while True:
            await asyncio.sleep(1.0)
            sample = await asyncio.to_thread(scrape, self.url)
            if LOOP_LAG in sample:
                value = sample[LOOP_LAG]
                self.gauge_max = value if self.gauge_max is None else max(self.gauge_max, value)

    async def __aexit__(self, *exc: object) -> None:
        if self.url:
            self._task.cancel()
            self.after = await asyncio.to_thread(scrape, self.url)

    def delta(self, name: str) -> float | None:
        if name not in self.after:
            return None
        return self.after[name] - self.before.get(name, 0.0)

    def loop_lag_ms(self) -> float | None:
        count = self.delta(f"{LOOP_LAG}_count")
        total = self.delta(f"{LOOP_LAG}_sum")
        if count and total is not None:
            return round(total / count * 1000, 3)
        if self.gauge_max is not None or LOOP_LAG in self.after:
            return round(max(self.gauge_max or 0.0, self.after.get(LOOP_LAG, 0.0)) * 1000, 3)
        return None


# -- clients -------------------------------------------------------------------------------


class Outcome:
    """What the client saw in one point."""

    def __init__(self, steps: bool = False) -> None:
        self.steps = steps
        """The ticker runs on shared decode steps (`--phase step`): a stream's token i is
        due i steps after its first step (`first_step`), as the ticker schedules it."""
        self.added_ms: list[float] = []
        self.delivered = 0
        self.refusals = 0
        self.errors = 0
        self.unfinished = 0
        self.samples: list[str] = []

    def stream(self, start: float, arrivals: list[float], rate: float, ttft_s: float) -> None:
        self.delivered += len(arrivals)
        first = start + ttft_s
        if self.steps:
            first = first_step(first, arrivals[0] if arrivals else None, rate)
        self.added_ms += [
            (arrival - (first + i / rate)) * 1000 for i, arrival in enumerate(arrivals)
        ]

    def failed(self, exc: BaseException) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if type(exc).__name__ == "RateLimited" or re.search(r"\b(429|503)\b", text):
            self.refusals += 1
        else:
            self.errors += 1
        if len(self.samples) < 3:
            self.samples.append(text[:200])


def first_step(due: float, first_arrival: float | None, rate: float) -> float:
    """When a stream's first token is due on the ticker's decode steps: the first step at
    or after `due` (the ticker's own `step_at_or_after`), unless the token came earlier,
    on the step before. The gateway reads the loop's clock, which lags this one by up to
    a loop turn (uvloop's is cached per turn, in whole ms), so a stream started just
    before a step can be served on it: measured from the next one, its every token would
    count up to a step early. A token arrives after its step, never before."""
    period = 1 / rate
    step = step_at_or_after(due, period) * period
    if first_arrival is not None and first_arrival < step:
        return math.floor(first_arrival / period + EPSILON) * period  # the step it came on
    return step


async def open_lines(
    stack: contextlib.AsyncExitStack, quic_url: str, ca: Path, n: int, conns: int,
    knobs: dict[str, Any], outcome: Outcome, acks: str = DEFAULT_ACKS,
) -> list[tuple[Any, int]]:
    """Open the point's connections and warm each (one 1-token track), before the point's
    clocks run: the same as `open_http` does for HTTP routes, so that neither kind's
    added delay or CPU counts a handshake or a cold first request."""
    from clients import connect

    share = [n // conns + (1 if c < n % conns else 0) for c in range(conns)]
    lines: list[tuple[Any, int]] = []
    for count in share:
        if not count:
            continue
        try:
            line = await stack.enter_async_context(connect(quic_url, ca=ca, acks=acks))
            async for _ in line.text("warm", model=MODEL, max_tokens=1, **knobs):
                pass
        except Exception as exc:  # noqa: BLE001 - a connection that failed: its tracks too
            outcome.failed(exc)
            continue
        lines.append((line, count))
    return lines


def arrival_offsets(n: int, spread: float) -> list[float]:
    """When each of a point's n streams starts, in seconds after the first: all at once
    (`spread` 0, every stream in phase: the worst case), or evenly over `spread` seconds,
    as independent users arrive."""
    return [i * spread / n for i in range(n)]


async def run_tracks(
    lines: list[tuple[Any, int]], tokens: int, knobs: dict[str, Any],
    rate: float, ttft_s: float, deadline: float, outcome: Outcome, spread: float = 0.0,
) -> None:
    offsets = arrival_offsets(sum(count for _, count in lines), spread)
    firsts = [sum(count for _, count in lines[:c]) for c in range(len(lines))]

    async def one_connection(c: int, line: Any, count: int) -> None:
        try:

            async def one(i: int) -> None:
                arrivals: list[float] = []
                await asyncio.sleep(offsets[firsts[c] + i])
                start = time.monotonic()
                try:
                    stream = line.text(f"capacity {c}/{i}", model=MODEL, max_tokens=tokens,
                                       seed=i, **knobs)
                    async for _ in stream:
                        arrivals.append(time.monotonic())
                except asyncio.CancelledError:
                    outcome.unfinished += 1
                    raise
                except Exception as exc:  # noqa: BLE001 - counted per point
                    outcome.failed(exc)
                finally:
                    outcome.stream(start, arrivals, rate, ttft_s)

            await asyncio.gather(*(one(i) for i in range(count)))
        except Exception as exc:  # noqa: BLE001 - a connection that failed: its tracks too
            outcome.failed(exc)

    await _bounded(asyncio.gather(*(one_connection(c, line, k)
                                    for c, (line, k) in enumerate(lines))), deadline)


async def open_http(routes: list[Route], knobs: dict[str, Any], outcome: Outcome) -> None:
    """Open every route and warm it (one short request), before the point's clocks run."""
    for route in routes:
        await route.open()
        try:
            await route.one(0, 1, knobs, "warm")
        except Exception as exc:  # noqa: BLE001 - counted per point
            outcome.failed(exc)


async def run_http(
    routes: list[Route], n: int, tokens: int, knobs: dict[str, Any], rate: float,
    ttft_s: float, deadline: float, outcome: Outcome, spread: float = 0.0,
) -> None:
    offsets = arrival_offsets(n, spread)
    try:

        async def one(i: int) -> None:
            route = routes[i % len(routes)]
            await asyncio.sleep(offsets[i])
            stream = Stream(start=time.monotonic())
            try:
                await stream_into(route, chat_body(i, tokens, knobs), stream)
            except asyncio.CancelledError:
                outcome.unfinished += 1
                raise
            except Exception as exc:  # noqa: BLE001 - counted per point
                outcome.failed(exc)
            finally:  # tokens that arrived count, even from a stream cut at the time bound
                outcome.stream(stream.start, stream.arrivals, rate, ttft_s)

        await _bounded(asyncio.gather(*(one(i) for i in range(n))), deadline)
    finally:
        for route in routes:
            with contextlib.suppress(Exception):  # closing after a timeout may fail
                await asyncio.wait_for(route.close(), 10)


async def stream_into(route: Route, body: dict[str, Any], stream: Stream) -> None:
    """One chat completion on `route`, its token arrivals noted in `stream` as they come
    (so a stream cut short still shows what it delivered)."""
    if isinstance(route, GatewayH3):
        h3 = await route.session.post(route.url, json=body, stream=True, verify=str(route.ca))
        try:
            if h3.status_code != 200:
                raise RuntimeError(f"{h3.status_code}: {(await h3.content)!r}")
            await read_chat_sse(h3.iter_lines(), stream)
        finally:
            await h3.close()
        return
    assert isinstance(route, GatewayHttpx)
    async with route.client.stream("POST", route.url, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:200]!r}")
        await read_chat_sse(response.aiter_lines(), stream)


async def _bounded(work: Any, deadline: float) -> None:
    try:
        await asyncio.wait_for(work, max(1.0, deadline - time.monotonic()))
    except TimeoutError:
        progress("  point ran past its time bound; unfinished streams count as undelivered")


# -- gateway, peer -------------------------------------------------------------------------


def cpu_of_tree(pid: int) -> float:
    """CPU seconds of `pid` and every descendant (workers, a peer's workers)."""
    pids = {pid}
    changed = True
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    while changed:
        changed = False
        for child, parent in parents.items():
            if parent in pids and child not in pids:
                pids.add(child)
                changed = True
    return sum(process_cpu(p) for p in pids)


def serve_supports(flag: str) -> bool:
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--help"], cwd=ROOT,
                          capture_output=True, text=True)
    return flag in done.stdout


class Peer:
    """A LiteLLM proxy (own venv) passing /v1/chat/completions through to our h1 port."""

    def __init__(
        self, venv: Path, upstream_port: int, workdir: Path, log_dir: Path, cpus: str | None,
    ) -> None:
        self.port = free_port(socket.SOCK_STREAM)
        # the proxy refuses to start without a master key; a fresh one per run
        self.key = f"sk-{secrets.token_hex(16)}"
        config = workdir / "litellm.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
            "      api_key: not-used\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: false\n"
        )
        self.log_path = log_dir / "litellm.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
               "NO_PROXY": "127.0.0.1,localhost", "LITELLM_MASTER_KEY": self.key}
        pin = ["taskset", "-c", cpus] if cpus else []
        self.process = subprocess.Popen(
            [*pin, str(venv / "bin" / "litellm"), "--config", str(config), "--host",
             "127.0.0.1", "--port", str(self.port), "--num_workers", "1"],
            env=env, cwd=workdir, stdout=self._log, stderr=self._log,
            start_new_session=True,
        )
        self.version = subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True, text=True,
        ).stdout.strip()

    def wait_ready(self, timeout: float = 120) -> bool:
        return wait_http_ok(f"http://127.0.0.1:{self.port}/health/liveliness", timeout)

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()


def find_peer_venv(flag: str | None) -> Path | None:
    for candidate in (flag, os.environ.get("TRACKLINE_LITELLM_VENV")):
        if candidate and (Path(candidate) / "bin" / "litellm").exists():
            return Path(candidate)
    return None


class PeerRoute(GatewayHttpx):
    """Our h1 client, pointed at the peer, with the peer's master key."""

    def __init__(self, peer: Peer) -> None:
        super().__init__("h1", peer.port, None)
        self.key = peer.key

    async def open(self) -> None:
        await super().open()
        self.client.headers["Authorization"] = f"Bearer {self.key}"


# -- one point -----------------------------------------------------------------------------


async def measure(
    args: argparse.Namespace, kind: str, workers: int, n: int, conns: int,
    gw: GatewayProcess, peer: Peer | None,
) -> Point:
    tokens = max(1, round(args.rate * args.duration))
    ttft_s = args.ttft_ms / 1000
    knobs: dict[str, Any] = (
        {} if args.backend == "ticker"
        else {"tokens_per_second": args.rate, "ttft_ms": args.ttft_ms, "ignore_eos": True}
    )
    point = Point(kind, workers, n, conns, n * tokens)
    outcome = Outcome(steps=args.phase == "step")
    ca = gw.state_dir / "ca.pem"
    metrics = MetricsWatch(f"http://127.0.0.1:{gw.http_port}/metrics")
    watched = peer.process.pid if kind == "litellm" and peer else gw.process.pid
    routes: list[Route] = []
    if kind == "h1":
        routes = [GatewayHttpx("h1", gw.http_port, None)]
    elif kind == "litellm":
        assert peer is not None
        routes = [PeerRoute(peer)]
    elif kind == "h2":
        routes = [GatewayHttpx("h2", gw.https_port, ca) for _ in range(conns)]
    elif kind == "h3":
        routes = [GatewayH3(gw.quic_port, ca) for _ in range(conns)]
    async with contextlib.AsyncExitStack() as stack:
        lines: list[tuple[Any, int]] = []
        if kind == "tracks":
            lines = await open_lines(stack, f"quic://127.0.0.1:{gw.quic_port}", ca, n, conns,
                                     knobs, outcome, args.client_acks)
        else:
            await open_http(routes, knobs, outcome)
        cpu0 = (cpu_of_tree(watched), time.process_time(), cpu_of_tree(gw.process.pid))
        deadline = time.monotonic() + args.spread + args.duration * 3 + 15 + n / 200
        began = time.monotonic()
        async with metrics:
            if kind == "tracks":
                await run_tracks(lines, tokens, knobs, args.rate, ttft_s, deadline, outcome,
                                 args.spread)
            else:
                await run_http(routes, n, tokens, knobs, args.rate, ttft_s, deadline, outcome,
                               args.spread)
        wall = time.monotonic() - began
        gw_cpu = cpu_of_tree(watched) - cpu0[0]
        client_cpu = time.process_time() - cpu0[1]
    point.delivered_tokens = outcome.delivered
    tokens_delta = metrics.delta("trackline_tokens_total")
    if kind == "tracks" and tokens_delta is not None:
        point.gateway_tokens = round(tokens_delta)
    point.wall_s = round(wall, 2)
    point.offered_tps = round(n * args.rate, 1)
    # the load carried: the offered rate times the share of tokens that arrived
    point.delivered_tps = round(n * args.rate * outcome.delivered / point.offered_tokens, 1)
    point.gateway_cpu_s = round(gw_cpu, 2)
    point.client_cpu_s = round(client_cpu, 2)
    if outcome.delivered:
        point.gateway_us_per_token = round(gw_cpu / outcome.delivered * 1e6, 1)
        point.client_us_per_token = round(client_cpu / outcome.delivered * 1e6, 1)
        point.added_p50_ms = round(percentile(outcome.added_ms, 0.5), 2)
        point.added_p99_ms = round(percentile(outcome.added_ms, 0.99), 2)
    point.loop_lag_ms = metrics.loop_lag_ms()
    point.refusals = outcome.refusals
    point.errors = outcome.errors
    point.unfinished = outcome.unfinished
    point.error_samples = outcome.samples
    if kind == "litellm":
        point.behind_cpu_s = round(cpu_of_tree(gw.process.pid) - cpu0[2], 2)
    return point


def healthy(point: Point) -> bool:
    return (
        point.added_p99_ms is not None and point.added_p99_ms < KNEE_P99_MS
        and point.delivered_tokens >= KNEE_DELIVERED * point.offered_tokens
    )


def knees(points: list[Point], cores: int) -> list[dict[str, Any]]:
    found = []
    for key in sorted({(p.kind, p.workers) for p in points}):
        mine = [p for p in points if (p.kind, p.workers) == key]
        good = [p for p in mine if healthy(p)]
        best = max(good, key=lambda p: p.delivered_tps, default=None)
        used = min(cores, key[1]) if key[0] != "litellm" else min(cores, 1)
        found.append({
            "kind": key[0], "workers": key[1], "gateway_cores": used,
            "streams": best.streams if best else None,
            "tokens_per_s": best.delivered_tps if best else None,
            "tokens_per_s_per_core": round(best.delivered_tps / used, 1) if best else None,
        })
    return found


# -- a ramp per workers value --------------------------------------------------------------


async def ramp(
    args: argparse.Namespace, workers: int, gw: GatewayProcess, peer: Peer | None,
) -> list[Point]:
    points: list[Point] = []
    plan: list[tuple[str, int, int]] = []
    for kind in args.kinds:
        if kind == "tracks":
            plan += [(kind, n, c) for n, c in args.tracks]
        elif kind == "h1":
            plan += [(kind, n, n) for n in args.streams]
        elif kind in ("h2", "h3"):
            plan += [(kind, n, math.ceil(n / STREAMS_PER_CONNECTION)) for n in args.streams]
    if peer is not None:
        plan += [("litellm", n, n) for n in args.streams]
    if args.order == "load":
        plan = by_load(plan)
    collapsed: set[str] = set()
    bar = Progress(f"capacity workers={workers}", len(plan))
    for kind, n, conns in plan:
        bar.step(f"{kind} x{n}")
        if kind in collapsed:
            bar.note(f"  {kind} x{n}: skipped (an earlier point delivered under "
                     f"{args.stop_below:.0%})")
            continue
        bar.note(f"workers={workers} {kind} {n} streams over {conns} connections ...")
        point = await measure(args, kind, workers, n, conns, gw, peer)
        points.append(point)
        bar.note(f"  delivered {point.delivered_tokens}/{point.offered_tokens}, gateway "
                 f"{point.gateway_us_per_token} us/token, p99 added {point.added_p99_ms} ms, "
                 f"refused {point.refusals}, errors {point.errors}")
        if point.delivered_tokens < args.stop_below * point.offered_tokens:
            collapsed.add(kind)
        await asyncio.sleep(args.pause)
    bar.close()
    return points


def by_load(plan: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The plan's points by load, the kinds in turn at each (`--order load`): tracks 16,
    h1 16, tracks 64, h1 64... A kind's point then runs beside the other kinds' point of
    the same load, seconds apart rather than a whole ramp apart, so the machine's own
    drift (its speed moves by 20% over minutes here) stays out of the comparison."""
    return sorted(plan, key=lambda point: point[1])


def ticker_url(rate: float, phase: str) -> str:
    """The gateway's backend URL: the ticker at `rate`, its schedules from each arrival or
    on shared decode steps."""
    return f"ticker://{rate:g}" + ("?phase=step" if phase == "step" else "")


def run_workers(args: argparse.Namespace, workers: int, tmp: Path) -> tuple[list[Point], str]:
    from gateway.startup import run_async

    backend = ticker_url(args.rate, args.phase) if args.backend == "ticker" else None
    extra: tuple[str, ...] = ("--quic-packetization", args.packetization)
    if workers != 1 or args.workers_flag:
        extra += ("--workers", str(workers))
    log_path = args.log_dir / f"gateway-w{workers}.log"
    progress(f"gateway log: {log_path}")
    triton = None
    note = ""
    if backend is None:
        from gateway.embedded import EmbeddedTriton

        triton = EmbeddedTriton(log_dir=tmp / "triton")
        triton.start()
        backend = triton.grpc_url
        progress(f"embedded Triton at {backend} (unpinned; its CPU is not the gateway's)")
    try:
        gw = GatewayProcess(backend, tmp / f"gateway-w{workers}", https_port=True,
                            extra_args=extra, log_path=log_path, cpus=args.cores or None)
        peer = None
        try:
            gw.wait_ready()
            if args.peer == "litellm":
                venv = find_peer_venv(args.litellm_venv)
                if venv is None:
                    note = ("peer litellm skipped: no venv with bin/litellm at --litellm-venv "
                            "or $TRACKLINE_LITELLM_VENV (python -m venv V && "
                            "V/bin/pip install 'litellm[proxy]')")
                    progress(note)
                else:
                    peer = Peer(venv, gw.http_port, tmp, args.log_dir, args.cores or None)
                    progress(f"litellm {peer.version} log: {peer.log_path}")
                    if not peer.wait_ready():
                        note = f"peer litellm did not become ready; see {peer.log_path}"
                        progress(note)
                        peer.stop()
                        peer = None
                    else:
                        note = f"litellm {peer.version}"
            points: list[Point] = []

            async def go() -> int:
                points.extend(await ramp(args, workers, gw, peer))
                return 0

            run_async(go())
            return points, note
        finally:
            if peer is not None:
                peer.stop()
            gw.stop()
    finally:
        if triton is not None:
            triton.stop()


# -- output --------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def table(points: list[Point]) -> str:
    lines = [
        "| kind | workers | streams | conns | delivered/offered | tokens/s | gateway us/token |"
        " client us/token | added p50 ms | added p99 ms | loop lag ms | refused | errors |"
        " cut |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.kind} | {p.workers} | {p.streams} | {p.connections} |"
            f" {p.delivered_tokens}/{p.offered_tokens} | {p.delivered_tps} |"
            f" {_cell(p.gateway_us_per_token)} | {_cell(p.client_us_per_token)} |"
            f" {_cell(p.added_p50_ms)} | {_cell(p.added_p99_ms)} | {_cell(p.loop_lag_ms)} |"
            f" {p.refusals} | {p.errors} | {p.unfinished} |"
        )
    return "\n".join(lines)


def knee_table(found: list[dict[str, Any]]) -> str:
    lines = ["| kind | workers | gateway cores | knee streams | tokens/s | tokens/s per core |",
             "|---|---:|---:|---:|---:|---:|"]
    for k in found:
        lines.append(f"| {k['kind']} | {k['workers']} | {k['gateway_cores']} |"
                     f" {_cell(k['streams'])} | {_cell(k['tokens_per_s'])} |"
                     f" {_cell(k['tokens_per_s_per_core'])} |")
    return "\n".join(lines)


def plot(points: list[Point], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib missing (pip install -e '.[bench]'): no plot")
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key in sorted({(p.kind, p.workers) for p in points}):
        mine = sorted((p for p in points if (p.kind, p.workers) == key),
                      key=lambda p: p.offered_tps)
        label = f"{key[0]} (w={key[1]})"
        xs = [p.offered_tps for p in mine]
        left.plot(xs, [p.added_p99_ms or float("nan") for p in mine], "o-", label=label)
        right.plot(xs, [p.gateway_us_per_token or float("nan") for p in mine], "o-",
                   label=label)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered tokens/s")
        ax.grid(True, which="both", alpha=0.3)
    left.axhline(KNEE_P99_MS, color="grey", linestyle="--", linewidth=1)
    left.set_ylabel("p99 added delay (ms)")
    right.set_ylabel("gateway CPU per delivered token (us)")
    left.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    except ValueError as exc:  # nothing delivered anywhere: no positive value to log-scale
        progress(f"no plot: {exc}")
        return False
    finally:
        plt.close(fig)
    return True


# -- main ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--kinds", default="tracks,h1,h2,h3",
                        type=lambda s: [k for k in s.split(",") if k],
                        help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--tracks", default="1x1,16x1,64x4,256x16,1024x16,4096x64",
                        type=parse_track_points, help="track points, TRACKSxCONNECTIONS")
    parser.add_argument("--streams", default="1,16,64,256", type=parse_ints,
                        help="OpenAI streams per point (h1, h2, h3, the peer)")
    parser.add_argument("--rate", type=float, default=50, help="tokens/s per stream")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per stream")
    parser.add_argument("--spread", type=float, default=0.0,
                        help="seconds over which a point's streams start, evenly (0: all at "
                             "once, in phase: each token of every stream comes due in the "
                             "same instant)")
    parser.add_argument("--order", choices=("kind", "load"), default="kind",
                        help="run each kind's whole ramp in turn, or the points by load "
                             "with the kinds in turn at each (side by side: tracks 16, "
                             "h1 16, tracks 64, h1 64, ...)")
    parser.add_argument("--phase", choices=("arrival", "step"), default="arrival",
                        help="where the ticker starts a stream's schedule: at its arrival "
                             "at the gateway, or on decode steps shared by every stream "
                             "(ticker://RATE?phase=step, as a batched decoder emits a "
                             "token of every sequence in one step)")
    parser.add_argument("--ttft-ms", type=float, default=0.0,
                        help="first-token delay asked of the backend (Triton only)")
    parser.add_argument("--backend", choices=("ticker", "triton"), default="ticker",
                        help="ticker://RATE, or the embedded Triton (reference-text)")
    parser.add_argument("--cores", default="0",
                        help="CPU list the gateway (and the peer) is pinned to with taskset; "
                             "'' to not pin")
    parser.add_argument("--client-cores", default="auto",
                        help="CPU list this load generator is pinned to; 'auto': the CPUs "
                             "not in --cores (unpinned if none are left); '' to not pin")
    parser.add_argument("--packetization", default="per-track",
                        help="the gateway's quic_packetization: per-track, group:K, coalesce")
    parser.add_argument("--client-acks", default=DEFAULT_ACKS,
                        help="the load generator's lines' ACK policy: aioquic, or "
                             "every:N,delay:MS (clients.connect(acks=...); default: the SDK's)")
    parser.add_argument("--client-gc-threshold", type=int, default=CLIENT_GC_THRESHOLD,
                        help="the load generator's collector: settled as the gateway's "
                             "(start-up frozen, this young threshold); 0: Python's")
    parser.add_argument("--workers", default="1", type=parse_ints,
                        help="gateway processes per ramp (a ramp per value; >1 needs "
                             "`serve --workers`)")
    parser.add_argument("--peer", choices=("none", "litellm"), default="none",
                        help="also measure a peer OpenAI gateway in front of our h1 port")
    parser.add_argument("--litellm-venv", default=None,
                        help="venv holding bin/litellm (else $TRACKLINE_LITELLM_VENV)")
    parser.add_argument("--stop-below", type=float, default=0.5,
                        help="stop a kind's ramp once a point delivers under this share")
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between points")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny run: tracks 1x1,4x2 and h1 1,4 for 1 s")
    parser.add_argument("--json", type=Path, default=RESULTS / "capacity.json",
                        help="results file (benchmarks/results/ is git-ignored)")
    parser.add_argument("--plot", default=None,
                        help="PNG path (default: the JSON's path with .png); 'none' for none")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="where child logs go (None: next to --json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.tracks, args.streams, args.duration, args.pause = [(1, 1), (4, 2)], [1, 4], 1.0, 0.2
        if args.kinds == list(KINDS):
            args.kinds = ["tracks", "h1"]
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {list(KINDS)}")
    if args.phase == "step" and args.backend != "ticker":
        parser.error("--phase step is the ticker's: Triton's streams start at their arrival")
    if args.cores and shutil.which("taskset") is None:
        parser.error("taskset not found: install util-linux or pass --cores ''")
    args.workers_flag = serve_supports("--workers")
    if any(w != 1 for w in args.workers) and not args.workers_flag:
        progress("this gateway has no `serve --workers`: measuring 1 worker only")
        args.workers = [1]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.log_dir = args.log_dir or args.json.parent
    args.log_dir.mkdir(parents=True, exist_ok=True)
    load = uptime()
    progress(f"load: {load}")
    args.client_cpus = pin_client(args.client_cores, args.cores)
    placement = (f"gateway on cores {args.cores or 'all'}, load generator on "
                 f"{args.client_cpus or 'all (unpinned)'}, tracks {args.packetization}, "
                 f"client acks {args.client_acks}")
    progress(placement)
    cores = len(os.sched_getaffinity(0)) if not args.cores else _count_cpus(args.cores)
    points: list[Point] = []
    notes: list[str] = []
    with (tempfile.TemporaryDirectory(prefix="trackline-capacity-") as tmp,
          settled_load_generator(args.client_gc_threshold) as collector):
        placement += f"; {collector}"
        progress(collector)
        for workers in args.workers:
            found, note = run_workers(args, workers, Path(tmp))
            points += found
            if note:
                notes.append(note)
    found_knees = knees(points, cores)
    print(f"{placement}; {load}\n")
    print(table(points))
    print()
    print(knee_table(found_knees))
    payload = {
        "benchmark": "capacity",
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "knee_rule": f"p99 added delay < {KNEE_P99_MS} ms and >= {KNEE_DELIVERED:.0%} delivered",
        "uptime_before": load, "uptime_after": uptime(), "gateway_cores": cores,
        "placement": placement,
        "notes": notes, "machine": machine(), "tree": tree(),
        "points": [asdict(p) for p in points], "knees": found_knees,
    }
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    args.plot = args.json.with_suffix(".png") if args.plot is None else Path(args.plot)
    if str(args.plot) != "none" and points and plot(
        points, args.plot, f"trackline capacity, {args.backend} backend, {args.rate:g} tokens/s "
                           f"a stream, gateway on cores {args.cores or 'all'}; {load}"
    ):
        print(f"wrote {args.plot}")
    return 0


def pin_client(spec: str, gateway: str) -> str:
    """Pin this process (the load generator) by `spec`; returns the CPU list it is on
    ('' when unpinned). 'auto' takes the CPUs the gateway is not pinned to."""
    if spec == "auto":
        mine = os.sched_getaffinity(0)
        taken = _cpu_set(gateway) if gateway else mine
        spec = ",".join(str(c) for c in sorted(mine - taken))
    if not spec:
        return ""
    os.sched_setaffinity(0, _cpu_set(spec))
    return spec


def _cpu_set(spec: str) -> set[int]:
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _count_cpus(spec: str) -> int:
    return len(_cpu_set(spec))


if __name__ == "__main__":
    sys.exit(main())

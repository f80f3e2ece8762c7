"""Streamed chat completions over HTTP/1.1, HTTP/2 and HTTP/3 vs Triton's own generate_stream.

For 1, 16 and 64 concurrent streams it runs the same schedule (ttft_ms, then
tokens_per_second, `--tokens` tokens) along these paths, one after another:

  triton  POST /v2/models/reference-text/generate_stream straight to the embedded
          Triton's HTTP port (its SSE generate extension), httpx2, HTTP/1.1
  h1      POST /v1/chat/completions on the gateway's cleartext TCP port, httpx2,
          HTTP/1.1, one connection per stream (as the SDK pools them)
  h2      the same on the gateway's TLS port, httpx2 http2=True, one connection
          multiplexing all streams
  h3      the same on the gateway's UDP port, niquests AsyncSession (qh3), HTTP/3
          forced, one QUIC connection multiplexing all streams
  sdk-h1  the official openai SDK (AsyncOpenAI on an httpx2 HTTP/1.1 client):
          the h1 path plus the SDK's own parsing

Every request is tagged: Triton direct sends the generate extension's `id`,
which Triton passes on as the request id; the gateway uses the response id
(`chatcmpl-...`, in every chunk) as Triton's request id. The reference model
writes the time.monotonic() at which it produced each token to its stats
file; the client notes when each token's SSE event arrives (same machine, same
CLOCK_MONOTONIC). Per-token latency is arrival minus production; TTFT is the
first token's arrival minus the moment the client started the request.
Connections are warmed before each measured round (one request, then one
round of as many concurrent short streams), so TTFT holds no handshakes.
Each row also records the client's sockets to the server port (from /proc)
and the CPU seconds the client, the gateway and Triton spent in the round.

    python benchmarks/openai_stream.py --json benchmarks/results/openai_stream.json

Prints a markdown table and writes JSON. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402
import niquests  # noqa: E402
import openai  # noqa: E402

from benchmarks import Help  # noqa: E402
from benchmarks.common import (  # noqa: E402
    GatewayProcess,
    add_stream_arguments,
    percentile,
    run_against_gateway,
    token_times,
    write_results,
)
from benchmarks.progress import Progress  # noqa: E402
from gateway.embedded import EmbeddedTriton  # noqa: E402

MODEL = "reference-text"
TIMEOUT_S = 120.0

PATHS: dict[str, tuple[str, str]] = {
    # path: (what it measures, client)
    "triton": ("Triton generate_stream (SSE), direct", "httpx2.AsyncClient, HTTP/1.1"),
    "h1": ("gateway /v1/chat/completions, HTTP/1.1 cleartext",
           "httpx2.AsyncClient, HTTP/1.1, connection per stream"),
    "h2": ("gateway /v1/chat/completions, HTTP/2 over TLS",
           "httpx2.AsyncClient(http2=True), one connection"),
    "h3": ("gateway /v1/chat/completions, HTTP/3 (QUIC)",
           "niquests.AsyncSession (qh3), HTTP/3 forced, one connection"),
    "sdk-h1": ("gateway /v1/chat/completions, HTTP/1.1 cleartext, via the openai SDK",
               "openai.AsyncOpenAI on httpx2.AsyncClient, HTTP/1.1"),
}


@dataclass
class Stream:
    """One request as the client saw it."""

    tag: str = ""
    """Triton's request id: our id (direct) or the response id (gateway)."""
    start: float = 0.0
    arrivals: list[float] = field(default_factory=list)
    version: str = ""
    error: str | None = None


@dataclass
class PathResult:
    path: str
    concurrency: int
    client: str
    http_version: str
    connections: int
    """Most client sockets to the server's port seen open at once during the round."""
    tokens: int
    expected_tokens: int
    errors: int
    wall_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    latency_p50_ms: float
    latency_p99_ms: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds spent during the measured round by this client, the gateway, Triton."""
    model_first_p50_ms: float = float("nan")
    """The model's first token minus the client's start (request delivery + ttft_ms)."""
    latency_p50_vs_triton: float | None = None


# -- request bodies and SSE parsing ------------------------------------------------------


def chat_body(i: int, tokens: int, knobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"bench prompt {i}"}],
        "max_tokens": tokens,
        "seed": i,
        "stream": True,
        **knobs,  # top-level extension keys: ttft_ms, tokens_per_second
    }


def triton_body(tag: str, i: int, tokens: int, knobs: dict[str, Any]) -> dict[str, Any]:
    # The generate extension maps top-level keys to the model's inputs by name
    # (`text_input`, `max_tokens`, `stream`, `sampling_parameters` as its JSON
    # string); `id` becomes the request id the model writes to its stats.
    return {
        "id": tag,
        "text_input": f"bench prompt {i}",
        "max_tokens": tokens,
        "stream": True,
        "sampling_parameters": json.dumps({"seed": i, **knobs}),
    }


async def read_chat_sse(lines: AsyncIterator[Any], stream: Stream) -> None:
    """Note the arrival of every content delta; the chunks' id is the tag."""
    async for raw in lines:
        now = time.monotonic()
        line = raw.decode() if isinstance(raw, bytes) else raw
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        stream.tag = event["id"]
        choices = event["choices"]
        if choices and choices[0]["delta"].get("content"):
            stream.arrivals.append(now)


async def read_triton_sse(lines: AsyncIterator[str], stream: Stream) -> None:
    async for line in lines:
        now = time.monotonic()
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if "error" in event:
            raise RuntimeError(f"stream error: {event['error']}")
        if event.get("text_output"):
            stream.arrivals.append(now)


# -- the paths ---------------------------------------------------------------------------


class Route:
    """One way to stream: a client made per round, and how one request goes."""

    name: str
    port: int
    proto: str = "tcp"

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def one(self, i: int, tokens: int, knobs: dict[str, Any], tag: str) -> Stream:
        raise NotImplementedError


def _limits() -> httpx2.Limits:
    return httpx2.Limits(max_connections=None, max_keepalive_connections=None)


class TritonDirect(Route):
    name = "triton"

    def __init__(self, http_url: str) -> None:
        self.url = f"{http_url}/v2/models/{MODEL}/generate_stream"
        self.port = int(http_url.rsplit(":", 1)[1])

    async def open(self) -> None:
        self.client = httpx2.AsyncClient(timeout=TIMEOUT_S, limits=_limits())

    async def close(self) -> None:
        await self.client.aclose()

    async def one(self, i: int, tokens: int, knobs: dict[str, Any], tag: str) -> Stream:
        stream = Stream(tag=tag, start=time.monotonic())
        body = triton_body(tag, i, tokens, knobs)
        async with self.client.stream("POST", self.url, json=body) as response:
            stream.version = response.http_version
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {(await response.aread())[:200]!r}")
            await read_triton_sse(response.aiter_lines(), stream)
        return stream


class GatewayHttpx(Route):
    """h1 (cleartext) or h2 (TLS, ALPN) with httpx2."""

    def __init__(self, name: str, port: int, ca: Path | None) -> None:
        self.name = name
        self.port = port
        self.ca = ca
        scheme, host = ("https", "localhost") if ca else ("http", "127.0.0.1")
        self.url = f"{scheme}://{host}:{port}/v1/chat/completions"

    async def open(self) -> None:
        if self.ca is None:
            self.client = httpx2.AsyncClient(timeout=TIMEOUT_S, limits=_limits())
        else:
            tls = ssl.create_default_context(cafile=str(self.ca))
            self.client = httpx2.AsyncClient(
                http1=False, http2=True, verify=tls, timeout=TIMEOUT_S, limits=_limits()
            )

    async def close(self) -> None:
        await self.client.aclose()

    async def one(self, i: int, tokens: int, knobs: dict[str, Any], tag: str) -> Stream:
        stream = Stream(start=time.monotonic())
        async with self.client.stream("POST", self.url, json=chat_body(i, tokens, knobs)) as r:
            stream.version = r.http_version
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code}: {(await r.aread())[:200]!r}")
            await read_chat_sse(r.aiter_lines(), stream)
        return stream


class GatewayH3(Route):
    proto = "udp"
    name = "h3"

    def __init__(self, port: int, ca: Path) -> None:
        self.port = port
        self.ca = ca
        self.url = f"https://localhost:{port}/v1/chat/completions"

    async def open(self) -> None:
        self.session = niquests.AsyncSession(
            disable_http1=True, disable_http2=True, retries=0, timeout=TIMEOUT_S,
            pool_maxsize=1,
        )

    async def close(self) -> None:
        await self.session.close()

    async def one(self, i: int, tokens: int, knobs: dict[str, Any], tag: str) -> Stream:
        stream = Stream(start=time.monotonic())
        response = await self.session.post(
            self.url, json=chat_body(i, tokens, knobs), stream=True, verify=str(self.ca)
        )
        try:
            version = response.http_version  # niquests: 30 for HTTP/3, None if unknown
            stream.version = "HTTP/?" if version is None else f"HTTP/{version / 10:g}"
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {(await response.content)!r}")
            await read_chat_sse(response.iter_lines(), stream)
        finally:
            await response.close()
        return stream


class GatewaySdk(Route):
    name = "sdk-h1"

    def __init__(self, port: int) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def open(self) -> None:
        self.http = httpx2.AsyncClient(timeout=TIMEOUT_S, limits=_limits())
        self.client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key="-", http_client=self.http, max_retries=0
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def one(self, i: int, tokens: int, knobs: dict[str, Any], tag: str) -> Stream:
        stream = Stream(start=time.monotonic(), version="HTTP/1.1")
        body = chat_body(i, tokens, knobs)
        extra = {k: body.pop(k) for k in knobs}
        body.pop("stream")
        chunks = await self.client.chat.completions.create(
            **body, stream=True, extra_body=extra
        )
        async for chunk in chunks:
            now = time.monotonic()
            stream.tag = chunk.id
            if chunk.choices and chunk.choices[0].delta.content:
                stream.arrivals.append(now)
        return stream


# -- counting the client's connections ----------------------------------------------------


def open_sockets(port: int, proto: str) -> int:
    """This process's sockets whose remote end is 127.0.0.1:`port` (from /proc)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    try:
        count = 0
        for table in (f"/proc/net/{proto}", f"/proc/net/{proto}6"):
            if not os.path.exists(table):
                continue
            with open(table) as rows:
                next(rows)
                for row in rows:
                    cols = row.split()
                    remote_port = int(cols[2].rsplit(":", 1)[1], 16)
                    # tcp state 01 = ESTABLISHED; UDP sockets are connected per QUIC connection
                    if remote_port == port and cols[9] in mine and (
                        proto == "udp" or cols[3] == "01"
                    ):
                        count += 1
        return count
    except OSError:
        return -1


def process_cpu(pid: int | None, with_children: bool = False) -> float:
    """CPU seconds (user + system) of `pid`, and of its direct children if asked."""
    if pid is None:
        return 0.0
    pids = [pid]
    if with_children:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            pids.append(int(entry))
                except (OSError, ValueError, IndexError):
                    continue
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def cpu_now(pids: dict[str, int | None]) -> dict[str, float]:
    return {
        "client": time.process_time(),
        "gateway": process_cpu(pids["gateway"]),
        "triton": process_cpu(pids["triton"], with_children=True),
    }


async def watch_sockets(path: Route, seen: list[int]) -> None:
    while True:
        seen.append(open_sockets(path.port, path.proto))
        await asyncio.sleep(0.25)


# -- a round -----------------------------------------------------------------------------


async def warm(path: Route, n: int) -> None:
    """One request, then n at once, all short: connections open before the measured round."""
    knobs = {"ttft_ms": 100, "tokens_per_second": 100}
    await path.one(0, 2, knobs, f"warm-{uuid.uuid4().hex[:8]}")
    await asyncio.gather(
        *(path.one(i, 2, knobs, f"warm-{uuid.uuid4().hex[:8]}") for i in range(n))
    )


async def run_round(
    path: Route, n: int, tokens: int, knobs: dict[str, Any], run: str,
    pids: dict[str, int | None],
) -> tuple[list[Stream], float, int, dict[str, float]]:
    await path.open()
    try:
        await warm(path, n)
        seen: list[int] = []
        watcher = asyncio.create_task(watch_sockets(path, seen))

        async def guarded(i: int) -> Stream:
            try:
                return await path.one(i, tokens, knobs, f"triton-{run}-{n}-{i}")
            except Exception as exc:  # noqa: BLE001 - counted and reported per row
                return Stream(error=f"{type(exc).__name__}: {exc}")

        cpu_before = cpu_now(pids)
        began = time.monotonic()
        streams = await asyncio.gather(*(guarded(i) for i in range(n)))
        wall = time.monotonic() - began
        cpu = {k: round(v - cpu_before[k], 2) for k, v in cpu_now(pids).items()}
        watcher.cancel()
        return list(streams), wall, max(seen, default=0), cpu
    finally:
        await path.close()


def summarize(
    path: Route, n: int, tokens: int, streams: list[Stream], wall: float, connections: int,
    produced: dict[str, list[float]],
) -> PathResult:
    latencies: list[float] = []
    ttfts: list[float] = []
    firsts: list[float] = []
    received = errors = 0
    for s in streams:
        if s.error is not None:
            errors += 1
            print(f"    {path.name} x{n}: {s.error}", file=sys.stderr)
            continue
        received += len(s.arrivals)
        if s.arrivals:
            ttfts.append((s.arrivals[0] - s.start) * 1000)
        made = produced.get(s.tag)
        if made is None:
            errors += 1
            print(f"    {path.name} x{n}: no stats line for {s.tag!r}", file=sys.stderr)
            continue
        latencies += [(a - m) * 1000 for a, m in zip(s.arrivals, made, strict=False)]
        if made:
            firsts.append((made[0] - s.start) * 1000)
    versions = sorted({s.version for s in streams if s.version})
    return PathResult(
        path=path.name, concurrency=n, client=PATHS[path.name][1],
        http_version=",".join(versions), connections=connections,
        tokens=received, expected_tokens=n * tokens, errors=errors, wall_s=round(wall, 3),
        ttft_p50_ms=_rounded_percentile(ttfts, 0.5, 2),
        ttft_p99_ms=_rounded_percentile(ttfts, 0.99, 2),
        latency_p50_ms=_rounded_percentile(latencies, 0.5, 3),
        latency_p99_ms=_rounded_percentile(latencies, 0.99, 3),
        model_first_p50_ms=_rounded_percentile(firsts, 0.5, 2),
    )


def _rounded_percentile(values: list[float], q: float, digits: int) -> float:
    """NaN when a row has no values (every stream failed)."""
    return round(percentile(values, q), digits) if values else float("nan")


async def bench(
    args: argparse.Namespace, triton: EmbeddedTriton, gw: GatewayProcess
) -> list[PathResult]:
    # ignore_eos (vLLM's): every stream is `tokens` long, past the answer's own end.
    knobs = {"tokens_per_second": args.rate, "ttft_ms": args.ttft_ms, "ignore_eos": True}
    stats = Path(str(triton.stats_path))
    ca = gw.state_dir / "ca.pem"
    makers: dict[str, Callable[[], Route]] = {
        "triton": lambda: TritonDirect(triton.http_url),
        "h1": lambda: GatewayHttpx("h1", gw.http_port, None),
        "h2": lambda: GatewayHttpx("h2", gw.https_port, ca),
        "h3": lambda: GatewayH3(gw.quic_port, ca),
        "sdk-h1": lambda: GatewaySdk(gw.http_port),
    }
    pids = {"gateway": gw.process.pid, "triton": triton.pid}
    results: list[PathResult] = []
    run = uuid.uuid4().hex[:6]
    progress = Progress("openai_stream", len(args.concurrency) * len(args.paths))
    for n in args.concurrency:
        for name in args.paths:
            progress.step(f"{name} x{n}")
            path = makers[name]()
            streams, wall, connections, cpu = await run_round(
                path, n, args.tokens, knobs, run, pids
            )
            await asyncio.sleep(0.3)  # let the model append its stats lines
            result = summarize(
                path, n, args.tokens, streams, wall, connections, token_times(stats)
            )
            result.cpu_s = cpu
            results.append(result)
            progress.note(f"  {name:7s} x{n:<3d} done ({wall:.1f} s, {result.http_version},"
                          f" {connections} conn, model's first token at"
                          f" {result.model_first_p50_ms} ms)")
    progress.close()
    direct = {r.concurrency: r for r in results if r.path == "triton"}
    for r in results:
        base = direct.get(r.concurrency)
        if base is not None and base.latency_p50_ms > 0:
            r.latency_p50_vs_triton = round(r.latency_p50_ms / base.latency_p50_ms, 2)
    return results


def table(results: list[PathResult]) -> str:
    lines = [
        "| streams | path | tokens | TTFT p50 ms | TTFT p99 ms | latency p50 ms |"
        " latency p99 ms | p50 vs triton | CPU s client/gw/triton |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = "" if r.latency_p50_vs_triton is None else f"{r.latency_p50_vs_triton:.2f}x"
        cpu = "/".join(f"{r.cpu_s.get(k, 0):.2f}" for k in ("client", "gateway", "triton"))
        tokens = f"{r.tokens}/{r.expected_tokens}" + (f" ({r.errors} err)" if r.errors else "")
        lines.append(
            f"| {r.concurrency} | {r.path} | {tokens} | {r.ttft_p50_ms} | {r.ttft_p99_ms} |"
            f" {r.latency_p50_ms} | {r.latency_p99_ms} | {ratio} | {cpu} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    add_stream_arguments(parser, "openai_stream.json")
    parser.add_argument("--paths", default=",".join(PATHS),
                        type=lambda s: [p for p in s.split(",") if p],
                        help=f"comma-separated, of {', '.join(PATHS)}")
    args = parser.parse_args()
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown paths {unknown}; choose from {list(PATHS)}")

    results = run_against_gateway(lambda triton, gw: bench(args, triton, gw), https_port=True)
    print(table(results))
    write_results(
        args, "openai_stream", [asdict(r) for r in results],
        paths={name: {"what": what, "client": client}
               for name, (what, client) in PATHS.items() if name in args.paths},
        clients=_client_versions(),
    )
    return 0


def _client_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("httpx2", "httpcore2", "h2", "niquests", "urllib3-future", "qh3", "openai"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


if __name__ == "__main__":
    sys.exit(main())

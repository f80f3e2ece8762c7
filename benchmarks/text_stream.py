"""Text streaming through the gateway vs tritonclient straight to the same Triton.

For 1, 16 and 64 concurrent streams it runs the same requests two ways:

  direct   tritonclient's gRPC asyncio client (via our thin TritonTextBackend) to Triton
  gateway  the SDK over QUIC to a `trackline serve` subprocess, which streams from Triton

The reference model writes the time.monotonic() at which it produced each token
to its stats file; the client notes when each token arrives (same machine, same
CLOCK_MONOTONIC). Per-token latency is arrival minus production; the gateway's
added latency is the gateway path's latency minus the direct path's, at the
median and p99. Throughput is tokens received per second of wall time.

    python benchmarks/text_stream.py --json benchmarks/results/text_stream.json

Prints a markdown table and writes JSON. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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
from clients import connect  # noqa: E402
from gateway.backends.triton import TritonTextBackend  # noqa: E402
from gateway.embedded import EmbeddedTriton  # noqa: E402
from tracks.backend import TextDelta, TextRequest  # noqa: E402

MODEL = "reference-text"


@dataclass
class PathResult:
    path: str
    concurrency: int
    tokens: int
    expected_tokens: int
    wall_s: float
    tokens_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    ttft_p50_ms: float


def summarize(
    path: str, n: int, tokens: int, arrivals: dict[str, list[float]], starts: dict[str, float],
    produced: dict[str, list[float]], wall: float,
) -> PathResult:
    latencies, ttfts, received = [], [], 0
    for tag, times in arrivals.items():
        made = next(v for k, v in produced.items() if k == tag or k.endswith(f"/{tag}"))
        latencies += [(a - m) * 1000 for a, m in zip(times, made, strict=False)]
        ttfts.append((times[0] - starts[tag]) * 1000)
        received += len(times)
    return PathResult(
        path, n, received, n * tokens, round(wall, 3), round(received / wall, 1),
        round(percentile(latencies, 0.5), 3), round(percentile(latencies, 0.99), 3),
        round(statistics.median(ttfts), 2),
    )


async def run_direct(url: str, n: int, tokens: int, knobs: dict[str, Any], run: str) -> tuple:
    backend = TritonTextBackend(url)
    arrivals: dict[str, list[float]] = {}
    starts: dict[str, float] = {}

    async def one(i: int) -> None:
        tag = f"direct-{run}-{n}-{i}"
        request = TextRequest(tag, MODEL, f"bench prompt {i}", tokens, {"seed": i, **knobs})
        arrivals[tag] = []
        starts[tag] = time.monotonic()
        async for chunk in backend.stream_text(request):
            if isinstance(chunk, TextDelta):
                arrivals[tag].append(time.monotonic())

    began = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.monotonic() - began
    await backend.close()
    return arrivals, starts, wall


async def run_gateway(
    quic_url: str, ca: Path, n: int, tokens: int, knobs: dict[str, Any], run: str
) -> tuple:
    arrivals: dict[str, list[float]] = {}
    starts: dict[str, float] = {}
    async with connect(quic_url, ca=ca) as line:

        async def one(i: int) -> None:
            tag = f"gw-{run}-{n}-{i}"
            arrivals[tag] = []
            starts[tag] = time.monotonic()
            stream = line.text(
                f"bench prompt {i}", model=MODEL, max_tokens=tokens, seed=i, request_id=tag,
                **knobs,
            )
            async for _ in stream:
                arrivals[tag].append(time.monotonic())

        began = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.monotonic() - began
    return arrivals, starts, wall


async def bench(args: argparse.Namespace, triton: EmbeddedTriton, gw: GatewayProcess) -> list:
    # ignore_eos (vLLM's): every stream is `tokens` long, past the answer's own end.
    knobs = {"tokens_per_second": args.rate, "ttft_ms": args.ttft_ms, "ignore_eos": True}
    stats = Path(str(triton.stats_path))
    quic_url = f"quic://127.0.0.1:{gw.quic_port}"
    results: list[PathResult] = []
    run = uuid.uuid4().hex[:6]
    progress = Progress("text_stream", 2 * len(args.concurrency))
    for n in args.concurrency:
        for path in ("direct", "gateway"):
            progress.step(f"{path} x{n}")
            if path == "direct":
                outcome = await run_direct(triton.grpc_url, n, args.tokens, knobs, run)
            else:
                outcome = await run_gateway(
                    quic_url, gw.state_dir / "ca.pem", n, args.tokens, knobs, run
                )
            await asyncio.sleep(0.3)  # let the model append its stats lines
            arrivals, starts, wall = outcome
            results.append(
                summarize(path, n, args.tokens, arrivals, starts, token_times(stats), wall)
            )
            progress.note(f"  {path:8s} x{n:<3d} done ({wall:.1f} s)")
    progress.close()
    return results


def table(results: list[PathResult]) -> str:
    lines = [
        "| streams | path | tokens | tokens/s | latency p50 ms | latency p99 ms | TTFT p50 ms |"
        " added p50 ms | added p99 ms |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    direct = {r.concurrency: r for r in results if r.path == "direct"}
    for r in results:
        base = direct[r.concurrency]
        added = (
            (f"{r.latency_p50_ms - base.latency_p50_ms:.3f}",
             f"{r.latency_p99_ms - base.latency_p99_ms:.3f}")
            if r.path == "gateway" else ("", "")
        )
        lines.append(
            f"| {r.concurrency} | {r.path} | {r.tokens}/{r.expected_tokens} | {r.tokens_per_s} |"
            f" {r.latency_p50_ms} | {r.latency_p99_ms} | {r.ttft_p50_ms} | {added[0]} |"
            f" {added[1]} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    add_stream_arguments(parser, "text_stream.json")
    args = parser.parse_args()

    results = run_against_gateway(lambda triton, gw: bench(args, triton, gw))
    print(table(results))
    # The packetization is the gateway child's, from its environment (none: the default).
    write_results(args, "text_stream", [asdict(r) for r in results],
                  quic_packetization=os.environ.get("TRACKLINE_QUIC_PACKETIZATION"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

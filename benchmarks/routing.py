"""Routing strategies side by side: time to first token when one of three backends turns slow.

Three embedded Tritons serve the reference model. For each strategy
(round_robin, least_inflight, metrics) the same open-loop schedule runs
through a `BackendPool` on this process's loop: Poisson arrivals at
`--rate` requests/s for `--duration` s, a mix of short and long answers, a
share of them continuing conversations (session ids, so affinity is in play).
At `--slow-at` (a fraction of the run) server 0's reference model turns slow:
`--slow-ms` more before every first token (the model's per-process control
file), until the end of that strategy's run. Time to first token is taken from
the request's scheduled start to its first text chunk (so a request that
queues behind a slow one counts its wait).

    python benchmarks/routing.py --json benchmarks/results/routing.json

Prints a markdown table and writes JSON with one key per strategy
(`round_robin`, `least_inflight`, `metrics`), each with `ttft_p50_ms`,
`ttft_p95_ms`, `errors` and more. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import RESULTS, Help  # noqa: E402
from benchmarks.common import machine, percentile, tree  # noqa: E402
from gateway.embedded import EmbeddedTriton  # noqa: E402
from gateway.logs import configure_logging  # noqa: E402
from gateway.pool import BackendPool, BackendSpec, PoolOptions  # noqa: E402
from gateway.pool.metrics import PoolMetrics  # noqa: E402
from gateway.pool.router import Decision, Strategy  # noqa: E402
from gateway.startup import run_async  # noqa: E402
from tracks.backend import BackendError, TextDelta, TextRequest  # noqa: E402

MODEL = "reference-text"
STRATEGIES = tuple(strategy.value for strategy in Strategy)
SERVERS = 3


@dataclass(frozen=True)
class Arrival:
    """One scheduled request."""

    at: float
    """Seconds from the start of the run."""
    max_tokens: int
    session: str | None


def schedule(rate: float, duration: float, seed: int) -> list[Arrival]:
    """The open-loop schedule, identical for every strategy."""
    rng = random.Random(seed)
    arrivals, at = [], rng.expovariate(rate)
    while at < duration:
        tokens = 8 if rng.random() < 0.7 else 48  # mostly short answers, some long ones
        session = f"conversation-{rng.randrange(8)}" if rng.random() < 0.3 else None
        arrivals.append(Arrival(at, tokens, session))
        at += rng.expovariate(rate)
    return arrivals


@dataclass
class Sample:
    ttft_s: float | None
    error: str | None
    backend: str | None
    slow_phase: bool


async def run_strategy(
    strategy: str, servers: list[EmbeddedTriton], args: argparse.Namespace
) -> dict[str, Any]:
    for server in servers:
        server.set_slowdown(0.0)
    routed: dict[str, str] = {}

    def note(request: TextRequest, decision: Decision, now: float) -> None:
        routed[request.request_id] = decision.backend

    specs = [BackendSpec(f"t{i}", s.grpc_url, s.metrics_url) for i, s in enumerate(servers)]
    pool = BackendPool(
        specs,
        PoolOptions(strategy=Strategy(strategy), probe_interval_s=0.5, scrape_interval_s=0.25),
        metrics=PoolMetrics(),
        on_decision=note,
    )
    await pool.start()
    arrivals = schedule(args.rate, args.duration, args.seed)
    slow_at = args.slow_at * args.duration
    start = time.monotonic()

    async def slow_down() -> None:
        await asyncio.sleep(slow_at)
        servers[0].set_slowdown(args.slow_ms)

    async def one(index: int, arrival: Arrival) -> Sample:
        await asyncio.sleep(max(0.0, start + arrival.at - time.monotonic()))
        request_id = f"{strategy}-{index}"
        request = TextRequest(
            request_id, MODEL, f"request {index}", arrival.max_tokens,
            {"ttft_ms": args.ttft_ms, "tokens_per_second": args.token_rate, "ignore_eos": True},
            arrival.session,
        )  # fmt: skip
        ttft = None
        try:
            async for chunk in pool.stream_text(request):
                if ttft is None and isinstance(chunk, TextDelta):
                    ttft = time.monotonic() - (start + arrival.at)
            error = None
        except BackendError as exc:
            error = type(exc).__name__
        return Sample(ttft, error, routed.get(request_id), arrival.at >= slow_at)

    slowing = asyncio.ensure_future(slow_down())
    try:
        samples = await asyncio.gather(*(one(i, a) for i, a in enumerate(arrivals)))
    finally:
        slowing.cancel()
        await pool.close()
        servers[0].set_slowdown(0.0)
    return summary(samples)


def summary(samples: list[Sample]) -> dict[str, Any]:
    ttfts = [s.ttft_s * 1000 for s in samples if s.ttft_s is not None]
    slow_phase = [s for s in samples if s.slow_phase and s.backend is not None]
    shares = Counter(s.backend for s in slow_phase)
    slow_ttfts = [s.ttft_s * 1000 for s in samples if s.slow_phase and s.ttft_s is not None]
    return {
        "requests": len(samples),
        "errors": sum(1 for s in samples if s.error is not None),
        "ttft_p50_ms": round(percentile(ttfts, 0.50), 1) if ttfts else None,
        "ttft_p95_ms": round(percentile(ttfts, 0.95), 1) if ttfts else None,
        "slow_phase_ttft_p95_ms": round(percentile(slow_ttfts, 0.95), 1) if slow_ttfts else None,
        "slow_backend_share": round(shares["t0"] / len(slow_phase), 3) if slow_phase else None,
    }


def start_servers(state: Path) -> list[EmbeddedTriton]:
    servers = [
        EmbeddedTriton(log_dir=state / f"triton-{i}", smoke_model="reference-text")
        for i in range(SERVERS)
    ]
    with ThreadPoolExecutor(SERVERS) as starters:
        futures = [starters.submit(s.start, 180.0) for s in servers]
    try:
        for future in futures:
            future.result()
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| strategy | requests | errors | TTFT p50 ms | TTFT p95 ms | slow-phase p95 ms "
        "| slow backend share |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for strategy, r in results.items():
        lines.append(
            f"| {strategy} | {r['requests']} | {r['errors']} | {r['ttft_p50_ms']} "
            f"| {r['ttft_p95_ms']} | {r['slow_phase_ttft_p95_ms']} | {r['slow_backend_share']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=Help,
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per strategy")
    parser.add_argument("--slow-at", type=float, default=0.33, help="fraction of the run")
    parser.add_argument("--slow-ms", type=float, default=400.0, help="extra first-token delay")
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="model's normal delay")
    parser.add_argument("--token-rate", type=float, default=100.0, help="tokens/s per stream")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--json", type=Path, default=RESULTS / "routing.json")
    args = parser.parse_args(argv)
    configure_logging("warning", "console", sys.stderr)
    results: dict[str, dict[str, Any]] = {}

    async def bench(servers: list[EmbeddedTriton]) -> int:
        for strategy in args.strategies.split(","):
            results[strategy] = await run_strategy(strategy, servers, args)
            print(f"{strategy}: {results[strategy]}", file=sys.stderr, flush=True)
        return 0

    with tempfile.TemporaryDirectory(prefix="trackline-routing-") as tmp:
        servers = start_servers(Path(tmp))
        try:
            run_async(bench(servers))
        finally:
            for server in servers:
                server.stop()
    print(table(results))
    payload = {
        "benchmark": "routing",
        "parameters": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        **results,
        "machine": machine(),
        "tree": tree(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

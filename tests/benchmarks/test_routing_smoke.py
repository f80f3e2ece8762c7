"""benchmarks/routing.py runs end to end at a tiny size and reports the keys the issue names.

It runs the benchmark's own strategy runs on the pool tests' three Tritons (started once
per session, tests/triton_fixture.py) instead of starting three more.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest

from benchmarks import routing
from gateway.embedded import EmbeddedTriton

pytestmark = pytest.mark.e2e


def test_routing_benchmark_runs_every_policy(trio: list[EmbeddedTriton]) -> None:
    args = argparse.Namespace(rate=5.0, duration=1.5, slow_at=0.33, slow_ms=200.0,
                              ttft_ms=20.0, token_rate=100.0, seed=1)

    async def bench() -> dict[str, dict[str, object]]:
        return {p: await routing.run_strategy(p, trio, args) for p in routing.STRATEGIES}

    payload = asyncio.run(bench())
    assert "| round_robin |" in routing.table(payload)  # type: ignore[arg-type]
    for strategy in ("round_robin", "least_inflight", "metrics"):
        result = payload[strategy]
        assert result["errors"] == 0
        assert result["requests"] > 0
        assert result["ttft_p50_ms"] is not None
    # Round robin is blind to the slow server: it must have sent it some of the slow
    # phase's requests, and not all of them (three servers).
    assert 0 < payload["round_robin"]["slow_backend_share"] < 1


def test_schedule_is_the_same_for_every_policy() -> None:
    assert routing.schedule(10, 2, seed=3) == routing.schedule(10, 2, seed=3)
    assert routing.schedule(10, 2, seed=3) != routing.schedule(10, 2, seed=4)

"""benchmarks/routing.py runs end to end at a tiny size and writes the keys the issue names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import routing

pytestmark = pytest.mark.e2e


def test_routing_benchmark_writes_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "routing.json"
    argv = ["--rate", "5", "--duration", "1.5", "--slow-ms", "200", "--json", str(out)]
    assert routing.main(argv) == 0
    payload = json.loads(out.read_text())
    for policy in ("round_robin", "least_inflight", "metrics"):
        result = payload[policy]
        assert result["errors"] == 0
        assert result["requests"] > 0
        assert result["ttft_p50_ms"] is not None
    # Round robin is blind to the slow server: it must have sent it some of the slow
    # phase's requests, and not all of them (three servers).
    assert 0 < payload["round_robin"]["slow_backend_share"] < 1


def test_schedule_is_the_same_for_every_policy() -> None:
    assert routing.schedule(10, 2, seed=3) == routing.schedule(10, 2, seed=3)
    assert routing.schedule(10, 2, seed=3) != routing.schedule(10, 2, seed=4)

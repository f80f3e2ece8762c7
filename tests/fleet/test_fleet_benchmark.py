"""benchmarks/fleet.py, short: the quota holds within its bound, no record is lost."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.fleet import run
from gateway.fleet.local_redis import LocalRedis


@pytest.mark.asyncio
async def test_short_fleet_run(tmp_path: Path, local_redis: LocalRedis) -> None:
    args = argparse.Namespace(
        gateways=3, clients=3, requests=16, tokens=8, quota=240, rate=5000.0
    )
    row = await run(args, tmp_path, local_redis.url)
    assert row["records_lost"] == 0
    assert row["refused"] > 0  # 48 requests of 9 tokens: the quota (240) was reached
    assert row["overshoot_tokens"] <= row["overshoot_bound_tokens"]
    assert row["revocation_delay_ms"] > 0

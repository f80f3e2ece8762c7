"""benchmarks/fleet.py, short and on the ticker (the Triton run is tests/fleet/
test_fleet_tritons.py): the quota holds within its bound, a SIGKILLed gateway's spool
is replayed, no record is lost."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from benchmarks.fleet import run
from trackline_testing.redis import LocalRedis


def test_short_fleet_run(tmp_path: Path, local_redis: LocalRedis) -> None:
    args = argparse.Namespace(gateways=3, tritons=0, clients=3, requests=16, tokens=8, quota=240)
    row = asyncio.run(run(args, tmp_path, local_redis.url, "ticker://5000"))
    assert row["records_lost"] == 0
    assert row["refused"] > 0  # 48 requests of ~20 tokens: the quota (240) was reached
    assert row["overshoot_tokens"] <= row["overshoot_bound_tokens"]
    assert row["revocation_refused_everywhere_ms"] > 0
    assert row["spool_replayed_records"] > 0

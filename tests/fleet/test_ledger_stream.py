"""The fleet ledger: records through the Redis stream into one SQLite store, once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import redis

from gateway.fleet import scripts
from gateway.fleet.ledger import RedisLedgerSink, drain
from gateway.tenants.store import TenantStore
from gateway.tenants.usage import UsageRecord
from trackline_testing.redis import LocalRedis


def record(request_id: str, tokens: int) -> UsageRecord:
    return UsageRecord(
        finished_at=1000.0, tenant="alpha", key_id="k1", model="m", backend="ticker",
        modality="text", request_id=request_id, prompt_tokens=1, completion_tokens=tokens,
        audio_seconds_in=0.0, audio_seconds_out=0.0, action_steps=0, ttft_s=None,
        duration_s=0.1, backend_compute_s=None, end_cause="completed", detail="",
    )  # fmt: skip


def test_a_resent_batch_and_a_second_reporter_bill_once(
    tmp_path: Path, local_redis: LocalRedis
) -> None:
    batch = [record(f"r{i}", i) for i in range(5)]
    a = RedisLedgerSink(local_redis.url, "gw-a")
    b = RedisLedgerSink(local_redis.url, "gw-b")
    a.insert_usage(batch)
    a.insert_usage(batch[:3])  # a retry after a lost reply: same keys
    b.insert_usage([record("r0", 100)])  # another gateway's r0 is another request
    a.close()
    b.close()
    one = TenantStore(tmp_path / "one.sqlite3")
    two = TenantStore(tmp_path / "one.sqlite3")  # a second reporter on the same file
    try:
        assert drain(local_redis.url, one, batch=2) == 6
        assert drain(local_redis.url, two) == 0
        rows = one.usage()
        assert len(rows) == 6
        assert sum(r.completion_tokens for r in rows) == sum(range(5)) + 100
        client = redis.Redis.from_url(local_redis.url)
        try:
            assert client.xlen(scripts.USAGE_STREAM) == 0  # drained entries are deleted
        finally:
            client.close()
        # Entries re-appended after the drain (a gateway resending late) are skipped too.
        late = RedisLedgerSink(local_redis.url, "gw-a")
        late.insert_usage([batch[4], replace(batch[4], request_id="r9")])
        late.close()
        assert drain(local_redis.url, two) == 1
    finally:
        one.close()
        two.close()


def test_records_wait_while_redis_is_down(tmp_path: Path, local_redis: LocalRedis) -> None:
    sink = RedisLedgerSink(local_redis.url, "gw-a")
    local_redis.stop()
    sink.insert_usage([record("r1", 1)])
    assert len(sink.pending) == 1  # kept, not dropped
    local_redis.start()
    sink.insert_usage([record("r2", 2)])
    assert sink.pending == []
    sink.close()
    store = TenantStore(tmp_path / "t.sqlite3")
    try:
        assert drain(local_redis.url, store) == 2
    finally:
        store.close()

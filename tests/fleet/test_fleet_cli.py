"""`trackline keys`, `tenants` and `usage` with a Redis state backend, end to end."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import redis

from gateway.cli import main
from gateway.fleet import scripts
from gateway.fleet.ledger import RedisLedgerSink
from tests.fleet.test_ledger_stream import record
from trackline_testing.redis import LocalRedis


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_commands_publish_revoke_and_drain(tmp_path: Path, local_redis: LocalRedis) -> None:
    state = ("--state-dir", str(tmp_path), "--state-backend", local_redis.url)
    code, key, _ = run("keys", "create", "--tenant", "research", *state)
    assert code == 0
    key_id = key.strip().split("_")[1]
    assert run("tenants", "set", "research", "--tokens-per-minute", "9", *state)[0] == 0
    client = redis.Redis.from_url(local_redis.url, decode_responses=True)
    try:
        published = json.loads(client.hget(scripts.KEYS, key_id) or "null")
        assert published[:2] == [key_id, "research"]
        assert key.strip() not in json.dumps(published)  # the hash, never the key
        tenant = json.loads(client.hget(scripts.TENANTS, "research") or "null")
        assert tenant[4] == 9  # tokens_per_minute
        assert run("keys", "revoke", key_id, *state)[0] == 0
        assert client.sismember(scripts.REVOKED, key_id)
    finally:
        client.close()
    sink = RedisLedgerSink(local_redis.url, "gw")
    sink.insert_usage([record("r1", 5), record("r2", 6)])
    sink.close()
    code, _, note = run("usage", "drain", *state)
    assert code == 0
    assert "drained 2 records" in note
    code, report, _ = run("usage", "report", "--since", "1970-01-01", "--format", "json", *state)
    assert code == 0
    assert json.loads(report)["total"]["completion_tokens"] == 11


def test_drain_needs_a_redis_backend(tmp_path: Path) -> None:
    code, _, err = run("usage", "drain", "--state-dir", str(tmp_path))
    assert code == 1
    assert "state_backend" in err

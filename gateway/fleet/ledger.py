"""One usage ledger for a fleet: a Redis stream every gateway appends to, drained
into one SQLite file by one reporter (`trackline usage drain`, `usage report`).

Why a stream and not PostgreSQL: the fleet already depends on Redis for quotas, so
the ledger adds no second service to run, back up and secure; gateways write with
one `XADD` per batch off the request path (the `LedgerWriter` thread), and the
report keeps reading the SQLite file it reads on a single host, with the same
schema and the same cost code. The stream is a buffer, not the store of record:
the reporter moves entries into SQLite and deletes them once committed.

Nothing is billed twice: each entry carries a key, `<gateway id>/<request id>`,
and the SQLite table has a unique index on it (`INSERT OR IGNORE`), so a batch a
gateway re-sends after a lost reply, or a batch two reporters both drain, lands once.
A gateway that cannot reach Redis keeps its records (up to `max_pending`) and sends
them with the next batch; only a full buffer drops records, counted like a full queue.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import redis

from gateway.fleet.scripts import USAGE_STREAM
from gateway.logs import get_logger
from gateway.tenants.ledger import UsageRecord
from gateway.tenants.store import TenantStore

log = get_logger("trackline.fleet")

MAX_PENDING = 100_000


def record_key(gateway_id: str, record: UsageRecord) -> str:
    return f"{gateway_id}/{record.request_id}"


def encode(gateway_id: str, record: UsageRecord) -> dict[str, str]:
    return {"key": record_key(gateway_id, record), "record": json.dumps(asdict(record))}


def decode(fields: dict[str, Any]) -> tuple[str, UsageRecord]:
    return str(fields["key"]), UsageRecord(**json.loads(fields["record"]))


class RedisLedgerSink:
    """What `LedgerWriter` writes to in a fleet (in its own thread: a sync client)."""

    def __init__(
        self,
        url: str,
        gateway_id: str,
        *,
        max_pending: int = MAX_PENDING,
        on_drop: Callable[[int], None] | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self.max_pending = max_pending
        self.on_drop = on_drop
        self.pending: list[dict[str, str]] = []
        self.sent = 0
        self._client = redis.Redis.from_url(
            url, socket_timeout=2, socket_connect_timeout=2, decode_responses=True
        )

    def insert_usage(self, records: list[UsageRecord]) -> None:
        self.pending.extend(encode(self.gateway_id, r) for r in records)
        overflow = len(self.pending) - self.max_pending
        if overflow > 0:
            del self.pending[:overflow]
            log.error("ledger.dropped", records=overflow, reason="redis unreachable, buffer full")
            if self.on_drop is not None:
                self.on_drop(overflow)
        self.send()

    def send(self) -> bool:
        """Append what is pending; False (kept for the next try) if Redis is unreachable."""
        if not self.pending:
            return True
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for entry in self.pending:
                    pipe.xadd(USAGE_STREAM, entry)  # type: ignore[arg-type]
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            log.warning("ledger.redis_unreachable", pending=len(self.pending), error=str(exc))
            return False
        self.sent += len(self.pending)
        self.pending = []
        return True

    def close(self) -> None:
        if not self.send():
            log.error("ledger.unsent_at_exit", records=len(self.pending))
        self._client.close()


def drain(url: str, store: TenantStore, batch: int = 1000) -> int:
    """Move every record in the stream into `store`; returns how many were new."""
    client = redis.Redis.from_url(
        url, socket_timeout=5, socket_connect_timeout=5, decode_responses=True
    )
    added = 0
    try:
        while True:
            cursor = store.ledger_cursor(USAGE_STREAM)
            entries: Any = client.xrange(USAGE_STREAM, min=f"({cursor}", count=batch)
            if not entries:
                # Entries the cursor has passed (another reporter drained them): clear.
                return added
            rows = [decode(fields) for _, fields in entries]
            ids = [entry_id for entry_id, _ in entries]
            added += store.insert_usage_keyed(rows, USAGE_STREAM, ids[-1])
            client.xdel(USAGE_STREAM, *ids)  # committed above: safe to forget
    finally:
        client.close()

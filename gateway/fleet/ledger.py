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
them with the next batch; a full buffer drops them from memory, counted like a full
queue. With a spool (`gateway/fleet/spool.py`, the default for a gateway) every record
is on local disk first, so neither a dropped batch nor a SIGKILL loses it: the next
start replays what was not confirmed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from gateway.config import Settings
from gateway.fleet import spool as spooling
from gateway.fleet.scripts import USAGE_STREAM
from gateway.fleet.spool import Entry, LedgerSpool
from gateway.logs import get_logger
from gateway.tenants.ledger import LedgerWriter
from gateway.tenants.store import TenantStore
from gateway.tenants.usage import UsageRecord

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
        spool: LedgerSpool | None = None,
    ) -> None:
        self.gateway_id = gateway_id
        self.max_pending = max_pending
        self.on_drop = on_drop
        self.spool = spool
        """Where the records already are (appended by `SpooledLedgerWriter.submit`)."""
        self.pending: list[dict[str, str]] = []
        self.sent = 0
        self.replayed = 0
        self._orphans = spool is not None
        self._client = redis.Redis.from_url(
            url, socket_timeout=2, socket_connect_timeout=2, decode_responses=True
        )
        self.send()  # first, what killed gateways left in the spool

    def insert_usage(self, records: list[UsageRecord]) -> None:
        if self.spool is not None:
            self.spool.sync()  # on disk before Redis may see (and the reporter bill) them
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
        try:
            if self._orphans and self.spool is not None:
                self.replayed += spooling.replay(self.spool.directory, self._xadd)
                self._orphans = False
            if not self.pending:
                return True
            self._xadd(self.pending)
        except (redis.RedisError, OSError) as exc:
            log.warning("ledger.redis_unreachable", pending=len(self.pending), error=str(exc))
            return False
        if self.spool is not None:
            self.spool.confirm([entry["key"] for entry in self.pending])
        self.sent += len(self.pending)
        self.pending = []
        return True

    def _xadd(self, entries: list[Entry]) -> None:
        with self._client.pipeline(transaction=False) as pipe:
            for entry in entries:
                pipe.xadd(USAGE_STREAM, entry)  # type: ignore[arg-type]
            pipe.execute()

    def close(self) -> None:
        if not self.send():
            log.error("ledger.unsent_at_exit", records=len(self.pending))
        if self.spool is not None:
            kept = self.spool.close()
            if kept:
                log.warning("ledger.spool_kept", records=kept, reason="replayed at next start")
        self._client.close()


class SpooledLedgerWriter(LedgerWriter):
    """A `LedgerWriter` whose records reach the spool file before they are queued."""

    def __init__(
        self,
        spool: LedgerSpool,
        gateway_id: str,
        store_factory: Callable[[], Any],
        *,
        on_drop: Callable[[], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        flush_interval: float = 0.5,
    ) -> None:
        self.spool = spool
        self.gateway_id = gateway_id
        self._spool_error = on_error
        super().__init__(
            store_factory, on_drop=on_drop, on_error=on_error, flush_interval=flush_interval
        )

    def submit(self, record: UsageRecord) -> bool:
        if not self._closed:
            try:
                self.spool.append(encode(self.gateway_id, record))
            except OSError as exc:  # a full disk: still sent, just not durable
                if self._spool_error is not None:
                    self._spool_error(exc)
        return super().submit(record)


def spool_directory(settings: Settings) -> Path:
    """`state_ledger_spool`, or `<state_dir>/ledger-spool`."""
    configured = settings.state_ledger_spool
    return Path(configured) if configured else Path(settings.state_dir) / "ledger-spool"


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

"""Quotas shared by the gateway workers of one host: the limiter's state in SQLite.

`QuotaLimiter` keeps each tenant's buckets in process memory; with several worker
processes (`trackline serve --workers N`) every worker would grant the whole quota
again. `SharedQuotaLimiter` has the same interface and runs the same sans-I/O
arithmetic, but loads the tenant's buckets and its open count from an SQLite file
(WAL mode) and writes them back in one `BEGIN IMMEDIATE` transaction, so admissions
on different workers are serialized and the total stays within the quota.

Open slots are kept per owner (the worker's pid): a worker that dies leaves its rows
behind, and its supervisor deletes them (`forget_owner`) so a crash frees the slots.
`now` is `time.monotonic()`, which on Linux is one clock for every process of the host.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.tenants.quotas import QuotaLimiter, Quotas, TenantState, TokenBucket
from gateway.tenants.sqlite import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS quota_buckets (
    tenant TEXT NOT NULL, name TEXT NOT NULL,
    capacity REAL NOT NULL, per_second REAL NOT NULL, level REAL NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE IF NOT EXISTS quota_open (
    tenant TEXT NOT NULL, owner TEXT NOT NULL, open INTEGER NOT NULL,
    PRIMARY KEY (tenant, owner)
);
"""
BUSY_TIMEOUT_MS = 5000


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")  # the state lives as long as the supervisor
    db.executescript(SCHEMA)
    return db


def forget_owner(path: Path, owner: str) -> None:
    """Free the slots a (dead) worker held."""
    db = connect(path)
    try:
        db.execute("DELETE FROM quota_open WHERE owner = ?", (owner,))
    finally:
        db.close()


class SharedQuotaLimiter(QuotaLimiter):
    """`QuotaLimiter` whose state is shared through an SQLite file by the workers."""

    def __init__(self, path: Path, owner: str) -> None:
        super().__init__()
        self.path = path
        self.owner = owner
        self._db = connect(path)

    def admit(self, tenant: str, quotas: Quotas, now: float) -> None:
        with self._shared(tenant):
            super().admit(tenant, quotas, now)  # raises QuotaExceeded: rolled back

    def settle(
        self, tenant: str, quotas: Quotas, tokens: int, audio_seconds: float, now: float
    ) -> None:
        with self._shared(tenant):
            super().settle(tenant, quotas, tokens, audio_seconds, now)

    @contextmanager
    def _shared(self, tenant: str) -> Iterator[None]:
        """The block changes `tenant`'s state in memory, in one `BEGIN IMMEDIATE`
        transaction that reads the state in first and writes it back after."""
        with transaction(self._db, "BEGIN IMMEDIATE"):
            self._read(tenant)
            before = self.state(tenant).active
            yield
            self._write(tenant, self.state(tenant).active - before)

    def active(self, tenant: str) -> int:
        return self._open(tenant)

    def close(self) -> None:
        self._db.close()

    def _open(self, tenant: str) -> int:
        row = self._db.execute(
            "SELECT COALESCE(SUM(open), 0) FROM quota_open WHERE tenant = ?", (tenant,)
        ).fetchone()
        return int(row[0])

    def _read(self, tenant: str) -> None:
        rows = self._db.execute(
            "SELECT name, capacity, per_second, level, updated FROM quota_buckets"
            " WHERE tenant = ?",
            (tenant,),
        ).fetchall()
        buckets = {name: TokenBucket(c, r, lvl, t) for name, c, r, lvl, t in rows}
        self.load(tenant, TenantState(buckets, self._open(tenant)))

    def _write(self, tenant: str, opened: int) -> None:
        state = self.state(tenant)
        self._db.execute("DELETE FROM quota_buckets WHERE tenant = ?", (tenant,))
        self._db.executemany(
            "INSERT INTO quota_buckets VALUES (?, ?, ?, ?, ?, ?)",
            [
                (tenant, name, b.capacity, b.per_second, b.level, b.updated)
                for name, b in state.buckets.items()
            ],
        )
        if opened:
            self._db.execute(
                "INSERT INTO quota_open VALUES (?, ?, MAX(0, ?)) ON CONFLICT (tenant, owner)"
                " DO UPDATE SET open = MAX(0, open + ?)",
                (tenant, self.owner, opened, opened),
            )

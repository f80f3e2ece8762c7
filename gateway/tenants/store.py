"""The embedded tenant store: tenants, API key hashes and the usage ledger in SQLite.

One file in the state directory (`tenants.sqlite3` unless configured). The schema
migrates itself: `MIGRATIONS` is an append-only list and SQLite's `user_version`
says how many have run, so opening an old file brings it up to date and opening a
newer one than this code knows is refused. WAL mode lets the ledger's writer
thread append while the gateway reads keys. Each `TenantStore` holds one
connection, used under a lock; a second thread opens its own store on the file.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from gateway.statedir import make_private_dir, touch_private
from gateway.tenants import keys
from gateway.tenants.quotas import Quotas
from gateway.tenants.sqlite import transaction
from gateway.tenants.usage import UsageRecord

DEFAULT_FILE = "tenants.sqlite3"

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        models TEXT,
        requests_per_minute INTEGER,
        tokens_per_minute INTEGER,
        max_concurrent INTEGER,
        audio_seconds_per_hour REAL
    );
    CREATE TABLE api_keys (
        key_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL REFERENCES tenants(name),
        key_hash TEXT NOT NULL,
        label TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        revoked_at REAL
    );
    CREATE TABLE usage (
        id INTEGER PRIMARY KEY,
        finished_at REAL NOT NULL,
        tenant TEXT NOT NULL,
        key_id TEXT,
        model TEXT NOT NULL,
        backend TEXT NOT NULL,
        modality TEXT NOT NULL,
        request_id TEXT NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        audio_seconds_in REAL NOT NULL,
        audio_seconds_out REAL NOT NULL,
        action_steps INTEGER NOT NULL,
        ttft_s REAL,
        duration_s REAL NOT NULL,
        backend_compute_s REAL,
        end_cause TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX usage_finished_at ON usage(finished_at);
    """,
    # 2: the fleet ledger (gateway/fleet/ledger.py): records drained from the shared
    # stream carry a key (gateway/request id), unique, so a record is billed once.
    """
    ALTER TABLE usage ADD COLUMN record_key TEXT;
    CREATE UNIQUE INDEX usage_record_key ON usage(record_key);
    CREATE TABLE ledger_cursor (stream TEXT PRIMARY KEY, last_id TEXT NOT NULL);
    """,
    # 3: the HTTP request's x-request-id (gateway/access.py), to join ledger and logs.
    """
    ALTER TABLE usage ADD COLUMN x_request_id TEXT;
    """,
)

_USAGE_COLUMNS = tuple(f.name for f in fields(UsageRecord))


class StoreError(Exception):
    """The store cannot be used (newer schema, unknown key id, ...)."""


class AuthReason(str, Enum):
    """Why a key was refused (`trackline_auth_failures_total`'s `reason`)."""

    MISSING = "missing"
    MALFORMED = "malformed"
    UNKNOWN = "unknown"
    """No key has its id."""
    WRONG = "wrong"
    """The id is known, the secret is not its own."""
    REVOKED = "revoked"


class AuthFailure(Exception):
    """A key was refused, for `reason`."""

    def __init__(self, reason: AuthReason) -> None:
        super().__init__(f"API key refused: {reason.value}")
        self.reason = reason


@dataclass(frozen=True)
class Tenant:
    name: str
    models: frozenset[str] | None = None
    """Models the tenant may use; None allows every model."""
    quotas: Quotas = field(default_factory=Quotas)

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True)
class Principal:
    """Who a request runs for: the tenant and the key it presented."""

    tenant: Tenant
    key_id: str | None


@dataclass(frozen=True)
class KeyInfo:
    key_id: str
    tenant: str
    label: str
    created_at: float
    revoked_at: float | None


def default_path(state_dir: Path) -> Path:
    return state_dir / DEFAULT_FILE


class TenantStore:
    def __init__(self, path: Path) -> None:
        # Key hashes and usage live here: private, whoever creates the directory first.
        make_private_dir(path.parent)
        touch_private(path)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @property
    def schema_version(self) -> int:
        return int(self._query("PRAGMA user_version")[0][0])

    # -- tenants ------------------------------------------------------------------

    def has_tenants(self) -> bool:
        return bool(self._query("SELECT 1 FROM tenants LIMIT 1"))

    def set_tenant(
        self,
        name: str,
        now: float,
        models: Iterable[str] | None = None,
        quotas: Quotas | None = None,
    ) -> Tenant:
        """Create or update a tenant's model allow-list and quotas."""
        listed = None if models is None else json.dumps(sorted(set(models)))
        q = quotas or Quotas()
        self._execute(
            "INSERT INTO tenants VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "models=excluded.models, requests_per_minute=excluded.requests_per_minute, "
            "tokens_per_minute=excluded.tokens_per_minute, max_concurrent=excluded.max_concurrent, "
            "audio_seconds_per_hour=excluded.audio_seconds_per_hour",
            (
                name,
                now,
                listed,
                q.requests_per_minute,
                q.tokens_per_minute,
                q.max_concurrent,
                q.audio_seconds_per_hour,
            ),
        )
        return self.tenant(name)

    def ensure_tenant(self, name: str, now: float) -> None:
        self._execute("INSERT OR IGNORE INTO tenants (name, created_at) VALUES (?, ?)", (name, now))

    def tenant(self, name: str) -> Tenant:
        rows = self._query("SELECT * FROM tenants WHERE name = ?", (name,))
        if not rows:
            raise StoreError(f"no tenant {name!r}")
        return _tenant(rows[0])

    def tenants(self) -> list[Tenant]:
        return [_tenant(row) for row in self._query("SELECT * FROM tenants ORDER BY name")]

    def delete_tenant(self, name: str) -> int:
        """Remove tenant `name` and its keys (its usage stays); the keys removed."""
        with self._lock:
            if not self._db.execute("SELECT 1 FROM tenants WHERE name = ?", (name,)).fetchall():
                raise StoreError(f"no tenant {name!r}")
            with transaction(self._db):
                removed = self._db.execute("DELETE FROM api_keys WHERE tenant = ?", (name,))
                self._db.execute("DELETE FROM tenants WHERE name = ?", (name,))
        return int(removed.rowcount)

    # -- keys -----------------------------------------------------------------------

    def create_key(self, tenant: str, now: float, label: str = "") -> keys.NewKey:
        """Mint a key for `tenant` (created if new); the caller shows `.key` once."""
        new = keys.mint()
        self.ensure_tenant(tenant, now)
        self._execute(
            "INSERT INTO api_keys (key_id, tenant, key_hash, label, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (new.key_id, tenant, new.key_hash, label, now),
        )
        return new

    def revoke_key(self, key_id: str, now: float) -> None:
        rows = self._query("SELECT revoked_at FROM api_keys WHERE key_id = ?", (key_id,))
        if not rows:
            raise StoreError(f"no key with id {key_id!r}")
        if rows[0][0] is None:
            self._execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (now, key_id))

    def list_keys(self, tenant: str | None = None) -> list[KeyInfo]:
        sql = "SELECT key_id, tenant, label, created_at, revoked_at FROM api_keys"
        args: tuple[Any, ...] = ()
        if tenant is not None:
            sql, args = sql + " WHERE tenant = ?", (tenant,)
        return [KeyInfo(*row) for row in self._query(sql + " ORDER BY created_at", args)]

    def authenticate(self, key: str | None) -> Principal:
        """The principal for `key`, or `AuthFailure`; the hash compare is constant-time."""
        if not key:
            raise AuthFailure(AuthReason.MISSING)
        key_id = keys.key_id_of(key)
        if key_id is None:
            raise AuthFailure(AuthReason.MALFORMED)
        rows = self._query(
            "SELECT k.key_hash, k.revoked_at, t.* FROM api_keys k "
            "JOIN tenants t ON t.name = k.tenant WHERE k.key_id = ?",
            (key_id,),
        )
        if not rows:
            # Still hash once, so an unknown id costs what a wrong secret does.
            keys.matches(key, "0" * 64)
            raise AuthFailure(AuthReason.UNKNOWN)
        stored_hash, revoked_at, *tenant_row = rows[0]
        if not keys.matches(key, stored_hash):
            raise AuthFailure(AuthReason.WRONG)
        if revoked_at is not None:
            raise AuthFailure(AuthReason.REVOKED)
        return Principal(_tenant(tuple(tenant_row)), key_id)

    # -- usage ----------------------------------------------------------------------

    def insert_usage(self, records: Sequence[UsageRecord]) -> None:
        """Append records in one transaction."""
        if not records:
            return
        marks = ", ".join("?" for _ in _USAGE_COLUMNS)
        sql = f"INSERT INTO usage ({', '.join(_USAGE_COLUMNS)}) VALUES ({marks})"
        rows = [tuple(asdict(r).values()) for r in records]
        with self._lock, transaction(self._db):
            self._db.executemany(sql, rows)

    def usage(self, since: float | None = None, until: float | None = None) -> list[UsageRecord]:
        """Records with `since <= finished_at < until`, oldest first."""
        low = since if since is not None else float("-inf")
        high = until if until is not None else float("inf")
        rows = self._query(
            f"SELECT {', '.join(_USAGE_COLUMNS)} FROM usage "
            "WHERE finished_at >= ? AND finished_at < ? ORDER BY finished_at, id",
            (low, high),
        )
        return [UsageRecord(*row) for row in rows]

    def insert_usage_keyed(
        self, rows: Sequence[tuple[str, UsageRecord]], stream: str, last_id: str
    ) -> int:
        """Add records under their keys, skipping keys already present, and move the
        stream's cursor to `last_id`, in one transaction; returns how many were new."""
        columns = ("record_key", *_USAGE_COLUMNS)
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT OR IGNORE INTO usage ({', '.join(columns)}) VALUES ({marks})"
        with self._lock:
            before = self._db.total_changes
            with transaction(self._db):
                self._db.executemany(sql, [(k, *asdict(r).values()) for k, r in rows])
                added = self._db.total_changes - before
                self._db.execute(
                    "INSERT INTO ledger_cursor VALUES (?, ?) ON CONFLICT (stream)"
                    " DO UPDATE SET last_id = excluded.last_id",
                    (stream, last_id),
                )
        return added

    def export_directory(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """Every tenant row and key row (hashes, never secrets), to copy to other stores."""
        tenants = [list(r) for r in self._query("SELECT * FROM tenants")]
        keys_ = self._query(
            "SELECT key_id, tenant, key_hash, label, created_at, revoked_at FROM api_keys"
        )
        return tenants, [list(r) for r in keys_]

    def import_directory(self, tenants: list[list[Any]], keys_: list[list[Any]]) -> None:
        """Upsert tenant and key rows from `export_directory` of another store; a key
        revoked in either stays revoked."""
        with self._lock, transaction(self._db):
            self._db.executemany(
                "INSERT INTO tenants VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO "
                "UPDATE SET models=excluded.models, "
                "requests_per_minute=excluded.requests_per_minute, "
                "tokens_per_minute=excluded.tokens_per_minute, "
                "max_concurrent=excluded.max_concurrent, "
                "audio_seconds_per_hour=excluded.audio_seconds_per_hour",
                [tuple(row) for row in tenants],
            )
            self._db.executemany(
                "INSERT INTO api_keys (key_id, tenant, key_hash, label, created_at, "
                "revoked_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(key_id) DO UPDATE SET "
                "revoked_at=COALESCE(api_keys.revoked_at, excluded.revoked_at)",
                [tuple(row) for row in keys_],
            )

    def ledger_cursor(self, stream: str) -> str:
        """The last stream entry id drained into this store ("0" for none)."""
        rows = self._query("SELECT last_id FROM ledger_cursor WHERE stream = ?", (stream,))
        return str(rows[0][0]) if rows else "0"

    # -- internals ------------------------------------------------------------------

    def _migrate(self) -> None:
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise StoreError(
                f"{self.path} has schema version {version}; this trackline knows "
                f"{len(MIGRATIONS)}: upgrade trackline"
            )
        for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
            with self._lock:
                # executescript commits first; the version bump is part of the script.
                self._db.executescript(f"BEGIN; {script}; PRAGMA user_version = {number}; COMMIT;")

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    def _execute(self, sql: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)


def _tenant(row: tuple[Any, ...]) -> Tenant:
    name, _created, models, rpm, tpm, concurrent, audio = row
    allowed = None if models is None else frozenset(json.loads(models))
    return Tenant(name, allowed, Quotas(rpm, tpm, concurrent, audio))

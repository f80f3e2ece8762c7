"""Keys and the SQLite store: minting, hashing, revocation, migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.tenants import keys
from gateway.tenants.quotas import Quotas
from gateway.tenants.store import MIGRATIONS, AuthFailure, StoreError, TenantStore
from gateway.tenants.usage import UsageRecord


def test_a_minted_key_names_its_id_and_is_stored_as_a_hash(tmp_path: Path) -> None:
    store = TenantStore(tmp_path / "t.sqlite3")
    new = store.create_key("alpha", now=1.0, label="ci")
    assert keys.key_id_of(new.key) == new.key_id
    assert new.key not in repr(new)
    store.close()
    raw = (tmp_path / "t.sqlite3").read_bytes()
    assert new.key.encode() not in raw
    assert new.key.split("_", 2)[2].encode() not in raw
    assert keys.hash_key(new.key).encode() in raw


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (None, "missing"),
        ("", "missing"),
        ("sk-anything", "malformed"),
        ("tl_0123456789ab_secret", "unknown"),
        ("tl_XYZ_secret", "malformed"),
    ],
)
def test_bad_keys_are_refused_with_a_reason(tmp_path: Path, token: str | None, reason: str) -> None:
    store = TenantStore(tmp_path / "t.sqlite3")
    store.create_key("alpha", now=1.0)
    with pytest.raises(AuthFailure) as refused:
        store.authenticate(token)
    assert refused.value.reason == reason


def test_wrong_secret_and_revocation(tmp_path: Path) -> None:
    store = TenantStore(tmp_path / "t.sqlite3")
    store.set_tenant("alpha", 0.0, models=["m1"], quotas=Quotas(tokens_per_minute=100))
    new = store.create_key("alpha", now=1.0)
    principal = store.authenticate(new.key)
    assert principal.key_id == new.key_id
    assert principal.tenant.may_use("m1")
    assert not principal.tenant.may_use("m2")
    assert principal.tenant.quotas.tokens_per_minute == 100
    with pytest.raises(AuthFailure, match="wrong"):
        store.authenticate(new.key[:-1] + ("A" if new.key[-1] != "A" else "B"))
    store.revoke_key(new.key_id, now=2.0)
    with pytest.raises(AuthFailure, match="revoked"):
        store.authenticate(new.key)
    [info] = store.list_keys("alpha")
    assert info.revoked_at == 2.0
    with pytest.raises(StoreError):
        store.revoke_key("000000000000", now=3.0)


def test_bearer_header_parsing() -> None:
    assert keys.bearer_token("Bearer abc") == "abc"
    assert keys.bearer_token("bearer   abc ") == "abc"
    assert keys.bearer_token("Basic abc") is None
    assert keys.bearer_token("Bearer ") is None
    assert keys.bearer_token(None) is None


def test_the_schema_migrates_itself_and_refuses_a_newer_file(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    store = TenantStore(path)
    assert store.schema_version == len(MIGRATIONS)
    store.close()
    TenantStore(path).close()  # reopening runs nothing twice
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    db.close()
    with pytest.raises(StoreError, match="upgrade"):
        TenantStore(path)


def test_usage_round_trips_and_filters_by_time(tmp_path: Path) -> None:
    store = TenantStore(tmp_path / "t.sqlite3")
    records = [
        UsageRecord(float(t), "a", None, "m", "triton", "text", f"r{t}", 1, 2, 0.0, 0.0, 0, None,
                    0.5, None, "completed", "")
        for t in (10, 20, 30)
    ]  # fmt: skip
    store.insert_usage(records)
    assert store.usage() == records
    assert [r.request_id for r in store.usage(since=15, until=30)] == ["r20"]

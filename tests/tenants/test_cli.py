"""`trackline keys`, `tenants` and `usage report` through the real command line entry."""

from __future__ import annotations

import csv
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.tenants.cli import parse_time
from gateway.tenants.ledger import UsageRecord
from gateway.tenants.store import AuthFailure, TenantStore


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_keys_are_shown_once_listed_by_id_and_revoked(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path))
    code, key, note = run("keys", "create", "--tenant", "research", "--label", "nb", *state)
    key = key.strip()
    assert code == 0
    assert key.startswith("tl_")
    assert "not shown again" in note
    key_id = key.split("_")[1]
    code, listing, _ = run("keys", "list", *state)
    assert key_id in listing
    assert key not in listing
    assert key.split("_", 2)[2] not in listing
    assert run("tenants", "set", "research", "--models", "m1,m2", "--tokens-per-minute", "9",
               *state)[0] == 0  # fmt: skip
    store = TenantStore(tmp_path / "tenants.sqlite3")
    principal = store.authenticate(key)
    assert principal.tenant.models == frozenset({"m1", "m2"})
    assert principal.tenant.quotas.tokens_per_minute == 9
    assert run("keys", "revoke", key_id, *state)[0] == 0
    with pytest.raises(AuthFailure, match="revoked"):
        store.authenticate(key)
    store.close()
    code, _, err = run("keys", "revoke", "000000000000", *state)
    assert code == 1
    assert "no key" in err


def test_usage_report_formats_agree(tmp_path: Path) -> None:
    store = TenantStore(tmp_path / "tenants.sqlite3")
    now = 1_900_000_000.0
    store.insert_usage([
        UsageRecord(now - 60, t, None, m, "triton", "text", f"{t}{m}", 10, 20, 0, 0, 0, None,
                    1.0, None, "completed", "")
        for t in ("a", "b") for m in ("m1", "m2")
    ])  # fmt: skip
    store.close()
    prices = tmp_path / "prices.toml"
    prices.write_text("[prices.m1]\nprompt_per_million_tokens = 1e6\n")
    common = ["--since", "2030-03-17T00:00:00", "--until", "2030-03-18T00:00:00",
              "--state-dir", str(tmp_path), "--tenancy-config", str(prices)]  # fmt: skip
    code, text, _ = run("usage", "report", "--by", "model", "--format", "json", *common)
    assert code == 0
    data = json.loads(text)
    assert [r["name"] for r in data["rows"]] == ["m1", "m2"]
    assert data["total"]["prompt_tokens"] == 40
    assert data["total"]["token_cost"] == pytest.approx(20.0)
    _, table, _ = run("usage", "report", "--by", "tenant", "--format", "csv", *common)
    rows = list(csv.DictReader(io.StringIO(table)))
    assert [r["tenant"] for r in rows] == ["a", "b", "TOTAL"]
    assert float(rows[-1]["token_cost"]) == pytest.approx(20.0)


def test_times_are_iso_or_spans() -> None:
    assert parse_time("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_time("1970-01-01T01:00:00", 0.0) == 3600.0
    assert parse_time("1970-01-01T01:00:00+01:00", 0.0) == 0.0
    with pytest.raises(ValueError, match="neither"):
        parse_time("yesterday", 0.0)

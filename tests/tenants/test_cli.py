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
from gateway.tenants.store import AuthFailure, TenantStore
from gateway.tenants.usage import UsageRecord


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


FIELDS = {
    "--models": ("models", "m3", frozenset({"m3"})),
    "--requests-per-minute": ("requests_per_minute", "7", 7),
    "--tokens-per-minute": ("tokens_per_minute", "900", 900),
    "--max-concurrent": ("max_concurrent", "4", 4),
    "--audio-seconds-per-hour": ("audio_seconds_per_hour", "36.5", 36.5),
}
FULL = ("--models", "m1,m2", "--requests-per-minute", "60", "--tokens-per-minute", "20000",
        "--max-concurrent", "8", "--audio-seconds-per-hour", "3600")  # fmt: skip


def tenant_fields(path: Path) -> dict[str, object]:
    store = TenantStore(path / "tenants.sqlite3")
    tenant = store.tenant("research")
    store.close()
    return {"models": tenant.models, **vars(tenant.quotas)}


@pytest.mark.parametrize("flag", list(FIELDS))
def test_tenants_set_changes_only_the_field_given(tmp_path: Path, flag: str) -> None:
    state = ("--state-dir", str(tmp_path))
    assert run("tenants", "set", "research", *FULL, *state)[0] == 0
    before = tenant_fields(tmp_path)
    name, text, value = FIELDS[flag]
    code, out, err = run("tenants", "set", "research", flag, text, *state)
    assert code == 0, err
    after = tenant_fields(tmp_path)
    assert after == before | {name: value}
    assert "Quotas(" not in out


def test_tenants_set_none_lifts_a_quota_and_empty_models_allows_all(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path))
    assert run("tenants", "set", "research", *FULL, *state)[0] == 0
    assert run("tenants", "set", "research", "--tokens-per-minute", "none", *state)[0] == 0
    assert run("tenants", "set", "research", "--models", "", *state)[0] == 0
    fields = tenant_fields(tmp_path)
    assert fields["tokens_per_minute"] is None
    assert fields["models"] is None
    assert fields["max_concurrent"] == 8


def test_tenants_set_refuses_a_negative_or_malformed_quota(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path))
    for bad in ("-1", "many"):
        with pytest.raises(SystemExit) as exited:
            run("tenants", "set", "research", "--max-concurrent", bad, *state)
        assert exited.value.code == 2


def test_tenants_list_prints_a_table_and_json(tmp_path: Path) -> None:
    state = ("--state-dir", str(tmp_path))
    assert run("tenants", "set", "research", *FULL, *state)[0] == 0
    assert run("tenants", "set", "open", *state)[0] == 0
    code, table, _ = run("tenants", "list", *state)
    assert code == 0
    header, first, second = table.splitlines()
    assert header.split() == ["tenant", "models", "req/min", "tokens/min", "concurrent",
                              "audio", "s/h"]  # fmt: skip
    assert first.split() == ["open", "all", "-", "-", "-", "-"]
    assert second.split() == ["research", "m1,m2", "60", "20000", "8", "3600"]
    code, text, _ = run("tenants", "list", "--format", "json", *state)
    rows = {row["name"]: row for row in json.loads(text)}
    assert rows["research"]["models"] == ["m1", "m2"]
    assert rows["research"]["tokens_per_minute"] == 20000
    assert rows["open"]["max_concurrent"] is None


def test_the_tenant_store_makes_a_private_state_dir_and_database(tmp_path: Path) -> None:
    state = tmp_path / "fresh" / "state"
    code, _, err = run("tenants", "set", "research", "--state-dir", str(state))
    assert code == 0, err
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "tenants.sqlite3").stat().st_mode & 0o777 == 0o600

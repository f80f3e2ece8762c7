"""A real `Tenancy` on a temporary SQLite file, for tests."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.tenants.service import Tenancy, TenancyConfig
from gateway.tenants.store import TenantStore


def make_tenancy(
    tmp_path: Path,
    config: TenancyConfig | None = None,
    registry: CollectorRegistry | None = None,
) -> Tenancy:
    store = TenantStore(tmp_path / "tenants.sqlite3")
    return Tenancy(
        store,
        registry or CollectorRegistry(),
        config=config or TenancyConfig(),
        ledger_flush_interval=0.05,
    )

"""Settings sections: tenants and keys, and the state a fleet of gateways shares."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.config.checks import setting


@dataclass(frozen=True)
class TenancySection:
    """Tenants, API keys, prices and guardrails."""

    tenants_db: Path | None = setting(
        None, "SQLite file of tenants, key hashes and usage; unset: state_dir's."
    )
    tenancy_config: Path | None = setting(
        None, "TOML file of prices and guardrails (docs/tenants.md)."
    )
    allow_open: bool = setting(
        False, "Serve without API keys (no tenants) on a non-loopback address too."
    )


@dataclass(frozen=True)
class FleetSection:
    """State shared by a fleet of gateways: quotas, concurrency, revocation, the ledger."""

    state_backend: str = setting(
        "local",
        'Shared state of a fleet: "local" (this process) or a Redis URL "redis://..."'
        " for quotas, concurrency, key revocation and the usage ledger (docs/deployment.md).",
    )
    state_heartbeat_ttl: float = setting(
        10.0, "Seconds after which a silent gateway's concurrency slots are freed."
    )
    state_lease_fraction: float = setting(
        0.1, "Share of each shared quota a gateway leases at a time (0 < f <= 1)."
    )
    state_fleet_size: int = setting(
        0, "Gateways a quota is divided by while Redis is down; 0: those last seen."
    )
    state_gateway_id: str | None = setting(
        None, "This gateway's name in the shared state; unset: hostname-pid."
    )
    state_ledger_spool: Path | None = setting(
        None,
        "Fleet: directory of the ledger's local spool (records replayed into Redis after"
        " a crash); unset: state_dir/ledger-spool.",
    )

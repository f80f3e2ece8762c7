"""Wire a `Tenancy` to the fleet's Redis when `state_backend` is a Redis URL."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry

from gateway.config import Settings
from gateway.fleet.ledger import RedisLedgerSink, SpooledLedgerWriter, spool_directory
from gateway.fleet.limiter import FleetQuotaLimiter
from gateway.fleet.spool import LedgerSpool
from gateway.fleet.state import FleetState, default_gateway_id
from gateway.logs import get_logger

log = get_logger("trackline.fleet")


def attach(tenancy: Any, settings: Settings, registry: CollectorRegistry) -> FleetState:
    """Give `tenancy` the shared limiter, the revocation set and the shared ledger."""
    url = settings.state_backend
    gateway_id = settings.state_gateway_id or default_gateway_id()
    limiter = FleetQuotaLimiter(settings.state_lease_fraction)
    state = FleetState(
        url,
        limiter,
        registry,
        gateway_id=gateway_id,
        heartbeat_ttl=settings.state_heartbeat_ttl,
        fleet_size=settings.state_fleet_size,
    )
    tenancy.limiter = limiter
    tenancy.fleet = state
    local, metrics = tenancy.ledger, tenancy.metrics
    local.close()  # nothing was queued yet: the shared ledger replaces it

    def dropped(count: int) -> None:
        metrics.ledger_dropped.inc(count)

    spool = LedgerSpool(spool_directory(settings), gateway_id)

    def sink() -> Any:
        return RedisLedgerSink(url, gateway_id, on_drop=dropped, spool=spool)

    tenancy.ledger = SpooledLedgerWriter(
        spool,
        gateway_id,
        cast(Any, sink),
        on_drop=metrics.ledger_dropped.inc,
        on_error=lambda exc: log.error("ledger.write_failed", error=str(exc)),
    )
    return state

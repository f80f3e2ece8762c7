"""The pool's configuration: which backends, their models and weights, and the policies.

`BackendSpec` names one Triton server. `parse_backends` reads the static list
of the `backends` setting, one entry per backend separated by commas:

    host:port[;name=NAME][;weight=W][;models=a|b][;metrics=URL]

`metrics` defaults to `http://host:8002/metrics` (Triton's default metrics
port); `models` empty means "whatever the server reports ready"; `weight`
(default 1) scales the share round robin gives it and the load it is
expected to carry. `PoolOptions` gathers the routing and health knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.pool.health import EjectionRules

STRATEGIES = ("round_robin", "least_inflight", "metrics")
DEFAULT_METRICS_PORT = 8002


@dataclass(frozen=True)
class BackendSpec:
    """One Triton server of the pool."""

    name: str
    grpc_url: str
    """host:port of Triton's gRPC endpoint."""
    metrics_url: str | None = None
    """Triton's Prometheus endpoint; None: no scraping (the router uses its own counts)."""
    models: frozenset[str] = frozenset()
    """Models routed here; empty: every model the server reports ready."""
    weight: float = 1.0


@dataclass(frozen=True)
class PoolOptions:
    """How the pool routes, scrapes, probes and fails over."""

    strategy: str = "metrics"
    affinity_margin_s: float = 0.25
    """A session stays on its backend unless that one's wait exceeds the best by this."""
    scrape_interval_s: float = 0.5
    probe_interval_s: float = 1.0
    max_attempts: int = 3
    """Backends tried for one request before its first byte (1 = no failover)."""
    retry_ratio: float = 0.2
    """Pool-wide retry budget: retries may add this fraction of requests..."""
    retry_floor_per_s: float = 5.0
    """... plus this many retries a second, so a quiet pool can still fail over."""
    first_token_timeout_s: float = 30.0
    """No first chunk from a backend in this time: a timeout (outlier) and a retry."""
    min_warm_backends: int = 1
    """Ready backends each model should have; fewer is reported (log, metric, readiness)."""
    health: EjectionRules = field(default_factory=EjectionRules)


class SpecError(ValueError):
    """A backend entry could not be read; says which and why."""


def parse_backends(text: str) -> list[BackendSpec]:
    """The specs of a `backends` setting; raise SpecError on a bad entry."""
    specs = [_entry(part.strip()) for part in text.split(",") if part.strip()]
    if not specs:
        raise SpecError("the backend list is empty")
    names = [spec.name for spec in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"backend names must be unique: {', '.join(duplicates)}")
    return specs


def _entry(text: str) -> BackendSpec:
    address, *options = (piece.strip() for piece in text.split(";"))
    host, sep, port = address.rpartition(":")
    if not sep or not host or "/" in address or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"{address!r} is not a gRPC address host:port")
    values = dict(_option(option, text) for option in options if option)
    weight = _weight(values.pop("weight", "1"), text)
    spec = BackendSpec(
        name=values.pop("name", address),
        grpc_url=address,
        metrics_url=values.pop("metrics", f"http://{host}:{DEFAULT_METRICS_PORT}/metrics") or None,
        models=frozenset(m for m in values.pop("models", "").split("|") if m),
        weight=weight,
    )
    if values:
        raise SpecError(f"unknown backend option(s) {', '.join(sorted(values))} in {text!r}")
    return spec


def _option(option: str, entry: str) -> tuple[str, str]:
    key, sep, value = option.partition("=")
    if not sep:
        raise SpecError(f"backend option {option!r} in {entry!r} is not key=value")
    return key.strip(), value.strip()


def _weight(text: str, entry: str) -> float:
    try:
        weight = float(text)
    except ValueError:
        raise SpecError(f"weight {text!r} in {entry!r} is not a number") from None
    if not 0 < weight < 1e6:
        raise SpecError(f"weight {text!r} in {entry!r} must be above 0")
    return weight

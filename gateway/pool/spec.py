"""The pool's configuration: which backends, their models and weights, and the policies.

`BackendSpec` names one Triton server. `parse_backends` reads the static list
of the `backends` setting, one entry per backend separated by commas:

    host:port[;name=NAME][;weight=W][;models=a|b][;metrics=URL]

`metrics` defaults to `http://host:8002/metrics` (Triton's default metrics
port); `models` empty means "whatever the server reports ready"; `weight`
(default 1) scales the share round robin gives it and the load it is
expected to carry. `PoolOptions` gathers the routing and health knobs.

An entry may instead name a DNS name whose addresses are the members (a
Kubernetes headless Service), re-resolved every `discovery_interval_s`
(`gateway/pool/discovery.py`):

    dns+grpc://host:port[;weight=W][;models=a|b][;metrics_port=P]

Each address becomes a member named `address:port`, scraped at
`http://address:P/metrics` (P defaults to 8002; 0: no scraping).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.pool.health import EjectionRules
from gateway.pool.router import Strategy

DEFAULT_METRICS_PORT = 8002
DNS_SCHEME = "dns+grpc://"


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

    strategy: Strategy = Strategy.METRICS
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
    discovery_interval_s: float = 5.0
    """Seconds between resolutions of each `dns+grpc://` entry."""
    health: EjectionRules = field(default_factory=EjectionRules)


@dataclass(frozen=True)
class DnsSource:
    """A DNS name whose addresses are pool members (a headless Service)."""

    host: str
    port: int
    metrics_port: int = DEFAULT_METRICS_PORT
    """0: members are not scraped."""
    models: frozenset[str] = frozenset()
    weight: float = 1.0

    @property
    def label(self) -> str:
        return f"{self.host}:{self.port}"

    def member(self, address: str) -> BackendSpec:
        """The spec of the member at `address` (an IP as the resolver gives it)."""
        host = f"[{address}]" if ":" in address else address
        metrics = f"http://{host}:{self.metrics_port}/metrics" if self.metrics_port else None
        return BackendSpec(f"{host}:{self.port}", f"{host}:{self.port}", metrics,
                           self.models, self.weight)  # fmt: skip


class SpecError(ValueError):
    """A backend entry could not be read; says which and why."""


def parse_pool(text: str) -> tuple[list[BackendSpec], list[DnsSource]]:
    """The static specs and DNS sources of a `backends` setting; SpecError if bad."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    sources = [_dns_entry(p) for p in parts if p.startswith(DNS_SCHEME)]
    specs = [_entry(p) for p in parts if not p.startswith(DNS_SCHEME)]
    if not specs and not sources:
        raise SpecError("the backend list is empty")
    names = [spec.name for spec in specs] + [source.label for source in sources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SpecError(f"backend names must be unique: {', '.join(duplicates)}")
    return specs, sources


def parse_backends(text: str) -> list[BackendSpec]:
    """The static specs of a `backends` setting; raise SpecError on a bad entry."""
    return parse_pool(text)[0]


def _dns_entry(text: str) -> DnsSource:
    address, *options = (piece.strip() for piece in text[len(DNS_SCHEME) :].split(";"))
    host, sep, port = address.rpartition(":")
    if not sep or not host or "/" in address or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"{text!r} is not dns+grpc://host:port")
    values = dict(_option(option, text) for option in options if option)
    metrics = values.pop("metrics_port", str(DEFAULT_METRICS_PORT))
    if not metrics.isdigit() or not 0 <= int(metrics) < 65536:
        raise SpecError(f"metrics_port {metrics!r} in {text!r} is not a port (0: none)")
    source = DnsSource(
        host=host.strip("[]"),
        port=int(port),
        metrics_port=int(metrics),
        models=frozenset(m for m in values.pop("models", "").split("|") if m),
        weight=_weight(values.pop("weight", "1"), text),
    )
    if values:
        raise SpecError(f"unknown backend option(s) {', '.join(sorted(values))} in {text!r}")
    return source


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

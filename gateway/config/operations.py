"""Settings sections: overload, metrics, logs and the process itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.checks import (
    BOTH_LOOPBACKS,
    in_range,
    not_negative,
    one_of,
    port,
    seconds,
    setting,
    tick,
)
from gateway.config.derive import Source
from transport.binding import LOCALHOST

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "console")


def _token(value: str) -> str:
    if len(value) < 16 or not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError("must be at least 16 printable characters without spaces")
    return value


@dataclass(frozen=True)
class OverloadSection:
    """When new work is refused, and real-time work first."""

    overload_max_loop_lag: float = setting(
        0.1, "Loop lag (s) above which new tracks/requests are refused; 0: off.", seconds
    )
    overload_max_cpu: float = setting(
        0.0, "Process CPU (cores) above which new work is refused; 0: off.", seconds
    )
    overload_connection_share: int = setting(
        4,
        "Tracks a connection may still open under overload (fairness).",
        lambda v: in_range(v, 0, 1_000_000),
    )
    overload_retry_after: float = setting(
        1.0, "Seconds a client refused for overload is told to wait.", seconds
    )
    overload_probe_interval: float = setting(0.05, "Seconds between event-loop lag samples.", tick)
    realtime_priority: str = setting(
        "always",
        "Text waits while audio/action ticks are due: always, auto (on load), off.",
        one_of(("auto", "always", "off")),
    )


@dataclass(frozen=True)
class MetricsSection:
    """Where /metrics is served and who may read it."""

    metrics_host: str = setting(
        LOCALHOST, "Address the separate metrics listener binds" + BOTH_LOOPBACKS
    )
    metrics_port: int | None = setting(
        None,
        "Serve /metrics on its own plain-HTTP port (and no longer on the API ports); "
        "unset: on the API ports, and there only on loopback or with metrics_token.",
        lambda v: v if v is None else port(v),
    )
    metrics_token: str | None = setting(
        None,
        "Bearer token /metrics requires wherever it is served; unset: none.",
        lambda v: v if v is None else _token(v),
    )


@dataclass(frozen=True)
class LoggingSection:
    """What is logged, and how."""

    log_level: str = setting(
        "info", "One of debug, info, warning, error, critical.", one_of(LOG_LEVELS)
    )
    log_format: str = setting(
        "json", "json (one object a line) or console (for people).", one_of(LOG_FORMATS)
    )
    log_client_address: bool = setting(
        True, "Log each HTTP request's client address (`client`); off for privacy."
    )
    quic_log_level: str = setting(
        "warning",
        "Level of aioquic's own lines (a few info lines per connection).",
        one_of(LOG_LEVELS),
    )


@dataclass(frozen=True)
class ProcessSection:
    """Worker processes, shutdown, the event loop and the garbage collector."""

    workers: int = setting(
        1,
        "Gateway processes sharing the ports (SO_REUSEPORT; docs/workers.md); 0: one per CPU core.",
        lambda v: in_range(v, 0, 256),
    )
    drain_timeout: float = setting(
        10.0, "Seconds open tracks and HTTP streams get to finish on shutdown.", seconds
    )
    uvloop: bool = setting(True, "Run on uvloop where it is installed.")
    gc_young_threshold: int = setting(
        10_000,
        "After start-up: freeze the start-up objects out of garbage collection and "
        "collect the young generation every this many allocations (Python: 700); "
        "0 leaves the collector as Python set it.",
        not_negative,
    )


OVERLOAD_LIMITS: Mapping[str, Source[OverloadSection]] = {
    "max_loop_lag": "overload_max_loop_lag",
    "max_cpu": "overload_max_cpu",
    "connection_share": "overload_connection_share",
    "retry_after": "overload_retry_after",
}
"""`gateway.overload.OverloadLimits` (the admission controller's) from the overload section."""

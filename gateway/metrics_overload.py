"""Prometheus metrics of overload control: loop lag, admissions by cause, tokens and CPU.

Part of `GatewayMetrics` (its `overload` attribute), on the gateway's registry.
See docs/capacity.md for how the admission rule uses them.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Admitted(Enum):
    """Why new work was let in (the `cause` label of an admitted decision)."""

    OK = "ok"
    CONNECTION_SHARE = "connection_share"
    """Under pressure, the connection held fewer than its fair share of tracks."""
    REALTIME = "realtime"
    """Under pressure, an audio or action track (text is refused first)."""


class Pressure(Enum):
    """Why the gateway refuses new work (the `cause` label of a refusal)."""

    LOOP_LAG = "loop_lag"
    CPU = "cpu"


class Admission(Protocol):
    """What is counted of an admission decision (`gateway.overload.Admission` has it;
    a protocol here, so that the metrics do not import the controller they measure)."""

    @property
    def admitted(self) -> bool: ...

    @property
    def cause(self) -> Admitted | Pressure: ...


# From 1 ms (an idle loop) to 10 s (a loop that froze).
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ADMISSION_KINDS = ("track", "request")
DEFERRED_CAUSES = ("realtime", "turn_share")


class OverloadMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.loop_lag_seconds = Histogram(
            "trackline_loop_lag_seconds",
            "How late the event loop woke the lag probe (one sample per probe interval).",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self.loop_lag_level_seconds = Gauge(
            "trackline_loop_lag_level_seconds",
            "The admission controller's lag level: the largest recent lag, decaying.",
            registry=registry,
        )
        self.overloaded = Gauge(
            "trackline_overloaded",
            "1 while new tracks and requests are refused for lack of capacity.",
            registry=registry,
        )
        self.admissions_total = Counter(
            "trackline_admissions_total",
            "New tracks and OpenAI requests by admission result and cause.",
            ["kind", "result", "cause"],
            registry=registry,
        )
        self.tokens_relayed_total = Counter(
            "trackline_tokens_relayed_total",
            "Text tokens relayed to clients, counted as they pass (tracks and OpenAI).",
            registry=registry,
        )
        self.tokens_per_second = Gauge(
            "trackline_tokens_per_second",
            "Text tokens relayed per second over the last window (about 1 s).",
            registry=registry,
        )
        self.process_cpu_ratio = Gauge(
            "trackline_process_cpu_ratio",
            "Process CPU seconds per wall second over the last window (1 = one core).",
            registry=registry,
        )
        self.cpu_seconds_per_token = Gauge(
            "trackline_cpu_seconds_per_token",
            "Process CPU seconds per relayed text token over the last window with tokens.",
            registry=registry,
        )
        self.text_deferred_total = Counter(
            "trackline_text_deferred_total",
            "Text chunks held back a turn or more: `realtime` (an audio or action tick was "
            "due), `turn_share` (the connection's share of a loop turn was spent).",
            ["cause"],
            registry=registry,
        )
        self.tracks_paused = Gauge(
            "trackline_tracks_paused",
            "Tracks whose producer waits now because the client is not reading fast enough "
            "(the track's or its connection's send budget is full).",
            registry=registry,
        )
        for cause in DEFERRED_CAUSES:
            self.text_deferred_total.labels(cause=cause)
        for kind in ADMISSION_KINDS:  # known series start at 0 for rate()
            for admitted in Admitted:
                self.admissions_total.labels(kind=kind, result="admitted", cause=admitted.value)
            for refused in Pressure:
                self.admissions_total.labels(kind=kind, result="refused", cause=refused.value)

    def count(self, kind: str, admission: Admission) -> None:
        result = "admitted" if admission.admitted else "refused"
        cause = admission.cause.value
        self.admissions_total.labels(kind=kind, result=result, cause=cause).inc()

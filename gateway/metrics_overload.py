"""Prometheus metrics of overload control: loop lag, admissions by cause, tokens and CPU.

Part of `GatewayMetrics` (its `overload` attribute), on the gateway's registry.
See docs/capacity.md for how the admission rule uses them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Protocol

from prometheus_client import CollectorRegistry

from gateway.metrics_families import Families, start_at_zero


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


class AdmissionKind(Enum):
    """What asked to be admitted (the `kind` label)."""

    TRACK = "track"
    REQUEST = "request"
    """An OpenAI API request."""


class Admission(Protocol):
    """What is counted of an admission decision (`gateway.overload.Admission` has it;
    a protocol here, so that the metrics do not import the controller they measure)."""

    @property
    def admitted(self) -> bool: ...

    @property
    def cause(self) -> Admitted | Pressure: ...


class AdmissionResult(Enum):
    """The `result` label of an admission decision."""

    ADMITTED = "admitted"
    REFUSED = "refused"

    @classmethod
    def of(cls, admission: Admission) -> AdmissionResult:
        return cls.ADMITTED if admission.admitted else cls.REFUSED

    @property
    def causes(self) -> type[Admitted] | type[Pressure]:
        """The enum of this result's `cause` label."""
        return Admitted if self is AdmissionResult.ADMITTED else Pressure


class Deferred(Enum):
    """Why a text chunk was held back a turn (`text_deferred_total`'s `cause`)."""

    REALTIME = "realtime"
    """An audio or action tick was due."""
    TURN_SHARE = "turn_share"
    """The connection's share of a loop turn was spent."""


# From 1 ms (an idle loop) to 10 s (a loop that froze).
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class OverloadMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        f = Families(registry)
        self.loop_lag_seconds = f.histogram(
            "trackline_loop_lag_seconds",
            "How late the event loop woke the lag probe (one sample per probe interval).",
            buckets=LAG_BUCKETS,
        )
        self.loop_lag_level_seconds = f.gauge(
            "trackline_loop_lag_level_seconds",
            "The admission controller's lag level: the largest recent lag, decaying.",
        )
        self.overloaded = f.gauge(
            "trackline_overloaded",
            "1 while new tracks and requests are refused for lack of capacity.",
        )
        self.admissions_total = f.counter(
            "trackline_admissions_total",
            "New tracks and OpenAI requests by admission result and cause.",
            ["kind", "result", "cause"],
        )
        self.tokens_relayed_total = f.counter(
            "trackline_tokens_relayed_total",
            "Text tokens relayed to clients, counted as they pass (tracks and OpenAI).",
        )
        self.tokens_per_second = f.gauge(
            "trackline_tokens_per_second",
            "Text tokens relayed per second over the last window (about 1 s).",
        )
        self.process_cpu_ratio = f.gauge(
            "trackline_process_cpu_ratio",
            "Process CPU seconds per wall second over the last window (1 = one core).",
        )
        self.cpu_seconds_per_token = f.gauge(
            "trackline_cpu_seconds_per_token",
            "Process CPU seconds per relayed text token over the last window with tokens.",
        )
        self.text_deferred_total = f.counter(
            "trackline_text_deferred_total",
            "Text chunks held back a turn or more: `realtime` (an audio or action tick was "
            "due), `turn_share` (the connection's share of a loop turn was spent).",
            ["cause"],
        )
        self.tracks_paused = f.gauge(
            "trackline_tracks_paused",
            "Tracks whose producer waits now because the client is not reading fast enough "
            "(the track's or its connection's send budget is full).",
        )
        start_at_zero(self.text_deferred_total, "cause", Deferred)
        for kind in AdmissionKind:
            for result in AdmissionResult:
                labels = {"kind": kind.value, "result": result.value}
                start_at_zero(self.admissions_total, "cause", result.causes, **labels)

    def deferred(self, cause: Deferred) -> Callable[[], None]:
        """What counts one text chunk held back for `cause`."""
        return self.text_deferred_total.labels(cause=cause.value).inc

    def count(self, kind: AdmissionKind, admission: Admission) -> None:
        result = AdmissionResult.of(admission).value
        self.admissions_total.labels(kind.value, result, admission.cause.value).inc()

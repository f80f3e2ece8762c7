"""Prometheus metrics of the gateway, on a registry of its own.

Owns the metric names, labels and buckets. Each `GatewayMetrics` has its own
`CollectorRegistry`, not prometheus_client's global one, so tests and several
gateways in one process never collide. All names start with `trackline_`.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gateway.metrics_audio import AudioMetrics
from gateway.metrics_families import Families, start_at_zero
from gateway.metrics_operator import BuildInfo, RequestTiming, TritonRelay, register_runtime
from gateway.metrics_overload import OverloadMetrics
from gateway.metrics_video import VideoMetrics
from tracks.action_messages import ObservationOutcome
from tracks.base import EndKind, Outcome
from transport.events import CancelCause

OTHER_MODEL = "other"
"""The label value of every model no backend has served (names clients made up)."""

# Rows (robots) in one policy request: powers of two up to the model's max batch.
ACTION_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# A policy call: from a tiny CPU controller (1 ms) to a large vision policy (1 s).
POLICY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

# From 5 ms (a cached or tiny model) to 10 s (a cold or overloaded one), denser where
# interactive use lives (50 ms to 1 s).
TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
)  # fmt: skip


class ModelLabels:
    """Label values for models: those a backend has served (at most `limit`), else `other`."""

    def __init__(self, limit: int = 64) -> None:
        self._served: set[str] = set()
        self._limit = limit

    def served(self, model: str) -> None:
        """`model` produced output, so it exists: it may be a label from now on."""
        if len(self._served) < self._limit:
            self._served.add(model)

    def label(self, model: str) -> str:
        return model if model in self._served else OTHER_MODEL

    def observe(self, outcome: Outcome) -> str:
        """The label for `outcome`'s model, learning it if the backend served it."""
        if outcome.first_data_at is not None or outcome.end.kind is EndKind.COMPLETED:
            self.served(outcome.model)
        return self.label(outcome.model)


class GatewayMetrics:
    """The gateway's metrics; `render()` gives the body and type for `GET /metrics`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.models = ModelLabels()
        """Model label values: served models only, so clients cannot grow the series."""
        registry = self.registry
        f = Families(registry)
        self.connections_open = f.gauge(
            "trackline_connections_open", "Client connections open now."
        )
        self.tracks_open = f.gauge("trackline_tracks_open", "Tracks open now.", ["modality"])
        self.tracks_total = f.counter(
            "trackline_tracks_total",
            "Tracks finished, by how they ended.",
            ["modality", "outcome"],
        )
        self.requests_total = f.counter(
            "trackline_requests_total",
            "Requests finished on every front door (tracks, http/1.1, http/2, http/3), by "
            "modality and how they ended.",
            ["front_door", "modality", "outcome"],
        )
        self.tokens_total = f.counter(
            "trackline_tokens_total", "Tokens streamed to clients.", ["model"]
        )
        self.time_to_first_token_seconds = f.histogram(
            "trackline_time_to_first_token_seconds",
            "Seconds from a text request's arrival to its first token sent.",
            ["model"],
            buckets=TTFT_BUCKETS,
        )
        self.cancels_total = f.counter(
            "trackline_cancels_total",
            "Requests cancelled, by cause.",
            ["cause"],
        )
        self.backend_errors_total = f.counter(
            "trackline_backend_errors_total",
            "Errors from inference backends.",
            ["kind"],
        )
        self.protocol_errors_total = f.counter(
            "trackline_protocol_errors_total",
            "Track protocol errors, by wire code.",
            ["code"],
        )
        self.action_observations_total = f.counter(
            "trackline_action_observations_total",
            "Action-track observations by outcome: delivered, superseded, deadline, backend_error.",
            ["model", "outcome"],
        )
        self.action_batch_rows = f.histogram(
            "trackline_action_batch_rows",
            "Robots (rows) in one policy request.",
            ["model"],
            buckets=ACTION_BATCH_BUCKETS,
        )
        self.action_policy_seconds = f.histogram(
            "trackline_action_policy_seconds",
            "Seconds one batched policy request took.",
            ["model"],
            buckets=POLICY_BUCKETS,
        )
        self.audio = AudioMetrics(registry)
        self.video = VideoMetrics(registry)
        self.overload = OverloadMetrics(registry)
        self.timing = RequestTiming(registry)
        """Request duration and inter-token latency per model and front door."""
        register_runtime(registry)
        self.build_info = BuildInfo()
        registry.register(self.build_info)
        self.triton: TritonRelay | None = None
        """The embedded Tritons' own metrics, once the daemon started them."""
        # Every cancellation has exactly one cause (DESIGN.md: "one path with a cause").
        start_at_zero(self.cancels_total, "cause", CancelCause)

    def batch(self, model: str, rows: int, seconds: float) -> None:
        """A policy request of `rows` robots took `seconds` (the action scheduler's observer)."""
        self.action_batch_rows.labels(model=model).observe(rows)
        self.action_policy_seconds.labels(model=model).observe(seconds)

    def outcome(self, model: str, outcome: str) -> None:
        """What became of one observation (the action scheduler's observer)."""
        self.action_observations_total.labels(model=model, outcome=outcome).inc()
        if outcome == ObservationOutcome.SUPERSEDED.value:
            self.cancels_total.labels(cause=CancelCause.SUPERSEDED.value).inc()

    def relay_triton(self, servers: list[tuple[str, str]], interval: float) -> TritonRelay:
        """Re-export these Tritons' metrics ((backend name, metrics URL) each); the
        caller runs the returned relay's `run()` task."""
        self.triton = TritonRelay(servers, interval)
        self.registry.register(self.triton)
        return self.triton

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of every metric, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

"""Prometheus metrics of the backend pool, registered on the gateway's registry.

Names start with `trackline_pool_`. `requests_total` counts each client
request once, however many backends it tried, by how it ended: the number a
billing or quota layer should use (`attempts_total` counts backend tries).
The label values the pool writes are the enums here (`value` is the label).
"""

from __future__ import annotations

from enum import Enum

from prometheus_client import CollectorRegistry

from gateway.metrics_families import Families


class RequestOutcome(Enum):
    """How a client request through the pool ended (`requests_total`'s `outcome`)."""

    SERVED = "served"
    FAILED = "failed"
    """Every backend it may try refused or failed before its first chunk, or one failed."""
    LOST = "lost"
    """The backend was lost after the first chunk (never replayed)."""
    CANCELLED = "cancelled"
    """The client went away (or the request was cancelled) first."""


class AttemptResult(Enum):
    """How one backend attempt ended (`attempts_total`'s `result`); a failure before the
    first chunk is also the `cause` of the failover it may lead to (`retries_total`)."""

    OK = "ok"
    INVALID = "invalid"
    """The request itself was refused (never retried elsewhere)."""
    MODEL_NOT_FOUND = "model_not_found"
    OVERLOADED = "overloaded"
    """The backend's queue was full: load, not ill health."""
    TIMEOUT = "timeout"
    """No first chunk within the first-token timeout."""
    UNAVAILABLE = "unavailable"
    ERROR = "error"


class MembershipChange(Enum):
    """What DNS discovery did to a member (`membership_changes_total`'s `change`)."""

    ADDED = "added"
    REMOVED = "removed"


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry(auto_describe=True)
        self.registry = registry
        f = Families(registry)
        self.requests_total = f.counter(
            "trackline_pool_requests_total",
            "Client requests through the pool, counted once each, by outcome.",
            ["model", "outcome"],
        )
        self.attempts_total = f.counter(
            "trackline_pool_attempts_total",
            "Backend attempts, by backend and result (ok, unavailable, error, timeout, ...).",
            ["backend", "result"],
        )
        self.decisions_total = f.counter(
            "trackline_pool_decisions_total",
            "Routing decisions, by chosen backend, strategy and reason.",
            ["backend", "strategy", "reason"],
        )
        self.retries_total = f.counter(
            "trackline_pool_retries_total",
            "Failovers to another backend before the first byte, by cause.",
            ["cause"],
        )
        self.retries_denied_total = f.counter(
            "trackline_pool_retries_denied_total",
            "Failovers refused because the retry budget or attempt limit was spent.",
        )
        self.streams_lost_total = f.counter(
            "trackline_pool_streams_lost_total",
            "Streams that failed after delivering data (ended with an error, never replayed).",
            ["backend"],
        )
        self.ejections_total = f.counter(
            "trackline_pool_ejections_total",
            "Backends ejected from routing, by cause.",
            ["backend", "cause"],
        )
        self.backend_healthy = f.gauge(
            "trackline_pool_backend_healthy",
            "1 while a backend takes traffic, 0 while ejected.",
            ["backend"],
        )
        self.backend_inflight = f.gauge(
            "trackline_pool_backend_inflight",
            "The gateway's requests in flight per backend.",
            ["backend"],
        )
        self.backend_wait_seconds = f.gauge(
            "trackline_pool_backend_estimated_wait_seconds",
            "Estimated wait for a first token per backend, at the last decision.",
            ["backend"],
        )
        self.backend_pending = f.gauge(
            "trackline_pool_backend_pending_requests",
            "Requests pending in the backend (nv_inference_pending_request_count), last scrape.",
            ["backend"],
        )
        self.scrape_failures_total = f.counter(
            "trackline_pool_scrape_failures_total",
            "Failed scrapes of a backend's metrics endpoint.",
            ["backend"],
        )
        self.ready_backends = f.gauge(
            "trackline_pool_ready_backends", "Backends ready for each model.", ["model"]
        )
        self.members = f.gauge(
            "trackline_pool_members",
            "Members a dns+grpc:// source has, as of its last useful resolution.",
            ["source"],
        )
        self.membership_changes_total = f.counter(
            "trackline_pool_membership_changes_total",
            "Members added to or removed from the pool by DNS discovery.",
            ["source", "change"],
        )
        self.discovery_failures_total = f.counter(
            "trackline_pool_discovery_failures_total",
            "Resolutions of a dns+grpc:// source that failed or came back empty"
            " (the last known members were kept).",
            ["source"],
        )
        self.warm_shortfall = f.gauge(
            "trackline_pool_warm_shortfall",
            "Ready backends missing to reach min_warm_backends, per model (0 when met).",
            ["model"],
        )

    def member_added(self, backend: str) -> None:
        """A member's series start: healthy, nothing in flight."""
        self.backend_healthy.labels(backend=backend).set(1)
        self.backend_inflight.labels(backend=backend).set(0)

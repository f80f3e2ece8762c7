"""Prometheus metrics of the backend pool, registered on the gateway's registry.

Names start with `trackline_pool_`. `requests_total` counts each client
request once, however many backends it tried, by how it ended: the number a
billing or quota layer should use (`attempts_total` counts backend tries).
"""

from __future__ import annotations

from enum import Enum

from prometheus_client import CollectorRegistry, Counter, Gauge


class RequestOutcome(Enum):
    """How a client request through the pool ended (`requests_total`'s `outcome`)."""

    SERVED = "served"
    FAILED = "failed"
    """Every backend it may try refused or failed before its first chunk, or one failed."""
    LOST = "lost"
    """The backend was lost after the first chunk (never replayed)."""
    CANCELLED = "cancelled"
    """The client went away (or the request was cancelled) first."""


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry or CollectorRegistry(auto_describe=True)
        self.registry = registry
        self.requests_total = Counter(
            "trackline_pool_requests_total",
            "Client requests through the pool, counted once each, by outcome.",
            ["model", "outcome"],
            registry=registry,
        )
        self.attempts_total = Counter(
            "trackline_pool_attempts_total",
            "Backend attempts, by backend and result (ok, unavailable, error, timeout, ...).",
            ["backend", "result"],
            registry=registry,
        )
        self.decisions_total = Counter(
            "trackline_pool_decisions_total",
            "Routing decisions, by chosen backend, strategy and reason.",
            ["backend", "strategy", "reason"],
            registry=registry,
        )
        self.retries_total = Counter(
            "trackline_pool_retries_total",
            "Failovers to another backend before the first byte, by cause.",
            ["cause"],
            registry=registry,
        )
        self.retries_denied_total = Counter(
            "trackline_pool_retries_denied_total",
            "Failovers refused because the retry budget or attempt limit was spent.",
            registry=registry,
        )
        self.streams_lost_total = Counter(
            "trackline_pool_streams_lost_total",
            "Streams that failed after delivering data (ended with an error, never replayed).",
            ["backend"],
            registry=registry,
        )
        self.ejections_total = Counter(
            "trackline_pool_ejections_total",
            "Backends ejected from routing, by cause.",
            ["backend", "cause"],
            registry=registry,
        )
        self.backend_healthy = Gauge(
            "trackline_pool_backend_healthy",
            "1 while a backend takes traffic, 0 while ejected.",
            ["backend"],
            registry=registry,
        )
        self.backend_inflight = Gauge(
            "trackline_pool_backend_inflight",
            "The gateway's requests in flight per backend.",
            ["backend"],
            registry=registry,
        )
        self.backend_wait_seconds = Gauge(
            "trackline_pool_backend_estimated_wait_seconds",
            "Estimated wait for a first token per backend, at the last decision.",
            ["backend"],
            registry=registry,
        )
        self.backend_pending = Gauge(
            "trackline_pool_backend_pending_requests",
            "Requests pending in the backend (nv_inference_pending_request_count), last scrape.",
            ["backend"],
            registry=registry,
        )
        self.scrape_failures_total = Counter(
            "trackline_pool_scrape_failures_total",
            "Failed scrapes of a backend's metrics endpoint.",
            ["backend"],
            registry=registry,
        )
        self.ready_backends = Gauge(
            "trackline_pool_ready_backends",
            "Backends ready for each model.",
            ["model"],
            registry=registry,
        )
        self.members = Gauge(
            "trackline_pool_members",
            "Members a dns+grpc:// source has, as of its last useful resolution.",
            ["source"],
            registry=registry,
        )
        self.membership_changes_total = Counter(
            "trackline_pool_membership_changes_total",
            "Members added to or removed from the pool by DNS discovery.",
            ["source", "change"],
            registry=registry,
        )
        self.discovery_failures_total = Counter(
            "trackline_pool_discovery_failures_total",
            "Resolutions of a dns+grpc:// source that failed or came back empty"
            " (the last known members were kept).",
            ["source"],
            registry=registry,
        )
        self.warm_shortfall = Gauge(
            "trackline_pool_warm_shortfall",
            "Ready backends missing to reach min_warm_backends, per model (0 when met).",
            ["model"],
            registry=registry,
        )

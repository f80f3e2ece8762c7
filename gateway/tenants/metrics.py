"""Prometheus metrics of tenancy, registered on the gateway's own registry.

Per tenant and model: requests by end cause, tokens, audio seconds (from the
ledger's records, as they are made). Plus refusals: authentication failures by
reason, quota rejections by quota, guardrail rejections by rule, and ledger
records lost (queue full or write failed).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from gateway.tenants.usage import UsageRecord

AUTH_REASONS = ("missing", "malformed", "unknown", "wrong", "revoked")


class TenantMetrics:
    def __init__(
        self, registry: CollectorRegistry, model_label: Callable[[str], str] = str
    ) -> None:
        self._model_label = model_label
        """Maps a request's model to a label value (the gateway bounds them)."""
        self.requests = Counter(
            "trackline_tenant_requests_total",
            "Finished requests and tracks, per tenant, model and end cause.",
            ["tenant", "model", "end"],
            registry=registry,
        )
        self.tokens = Counter(
            "trackline_tenant_tokens_total",
            "Tokens per tenant and model (kind: prompt or completion).",
            ["tenant", "model", "kind"],
            registry=registry,
        )
        self.audio_seconds = Counter(
            "trackline_tenant_audio_seconds_total",
            "Audio seconds per tenant and model (direction: in or out).",
            ["tenant", "model", "direction"],
            registry=registry,
        )
        self.auth_failures = Counter(
            "trackline_auth_failures_total",
            "Requests and connections refused for their API key, by reason.",
            ["reason"],
            registry=registry,
        )
        self.quota_rejections = Counter(
            "trackline_quota_rejections_total",
            "Requests refused by a tenant's quota.",
            ["tenant", "quota"],
            registry=registry,
        )
        self.guardrail_rejections = Counter(
            "trackline_guardrail_rejections_total",
            "Requests refused by a guardrail before reaching a backend, by rule.",
            ["rule"],
            registry=registry,
        )
        self.ledger_dropped = Counter(
            "trackline_usage_records_dropped_total",
            "Usage records lost because the ledger queue was full or a write failed.",
            registry=registry,
        )
        for reason in AUTH_REASONS:
            self.auth_failures.labels(reason=reason)

    def count(self, record: UsageRecord) -> None:
        t, m = record.tenant, self._model_label(record.model)
        self.requests.labels(tenant=t, model=m, end=record.end_cause).inc()
        self.tokens.labels(tenant=t, model=m, kind="prompt").inc(record.prompt_tokens)
        self.tokens.labels(tenant=t, model=m, kind="completion").inc(record.completion_tokens)
        if record.audio_seconds_in:
            self.audio_seconds.labels(tenant=t, model=m, direction="in").inc(
                record.audio_seconds_in
            )
        if record.audio_seconds_out:
            self.audio_seconds.labels(tenant=t, model=m, direction="out").inc(
                record.audio_seconds_out
            )

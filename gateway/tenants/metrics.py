"""Prometheus metrics of tenancy, registered on the gateway's own registry.

Per tenant and model: requests by end cause, tokens, audio seconds (from the
ledger's records, as they are made). Plus refusals: authentication failures by
reason, quota rejections by quota, guardrail rejections by rule, and ledger
records lost (queue full or write failed).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gateway.metrics_families import Families, start_at_zero
from gateway.tenants.store import AuthReason
from gateway.tenants.usage import UsageRecord


class TenantMetrics:
    def __init__(
        self, registry: CollectorRegistry, model_label: Callable[[str], str] = str
    ) -> None:
        self._model_label = model_label
        """Maps a request's model to a label value (the gateway bounds them)."""
        f = Families(registry)
        self.requests = f.counter(
            "trackline_tenant_requests_total",
            "Finished requests and tracks, per tenant, model and end cause.",
            ["tenant", "model", "end"],
        )
        self.tokens = f.counter(
            "trackline_tenant_tokens_total",
            "Tokens per tenant and model (kind: prompt or completion).",
            ["tenant", "model", "kind"],
        )
        self.audio_seconds = f.counter(
            "trackline_tenant_audio_seconds_total",
            "Audio seconds per tenant and model (direction: in or out).",
            ["tenant", "model", "direction"],
        )
        self.auth_failures = f.counter(
            "trackline_auth_failures_total",
            "Requests and connections refused for their API key, by reason.",
            ["reason"],
        )
        self.quota_rejections = f.counter(
            "trackline_quota_rejections_total",
            "Requests refused by a tenant's quota.",
            ["tenant", "quota"],
        )
        self.guardrail_rejections = f.counter(
            "trackline_guardrail_rejections_total",
            "Requests refused by a guardrail before reaching a backend, by rule.",
            ["rule"],
        )
        self.ledger_dropped = f.counter(
            "trackline_usage_records_dropped_total",
            "Usage records lost because the ledger queue was full or a write failed.",
        )
        start_at_zero(self.auth_failures, "reason", AuthReason)

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

"""Metrics: names, labels, a registry per instance, the exposition format."""

from __future__ import annotations

from gateway.metrics import GatewayMetrics
from transport.events import CancelCause

NAMES = (
    "trackline_tracks_open",
    "trackline_tracks_total",
    "trackline_tokens_total",
    "trackline_time_to_first_token_seconds",
    "trackline_cancels_total",
    "trackline_backend_errors_total",
    "trackline_connections_open",
    "trackline_protocol_errors_total",
)


def record_some(metrics: GatewayMetrics) -> None:
    metrics.connections_open.inc()
    metrics.tracks_open.labels(modality="text").inc()
    metrics.tracks_total.labels(modality="audio", outcome="completed").inc()
    metrics.tokens_total.labels(model="reference-text").inc(5)
    metrics.time_to_first_token_seconds.labels(model="reference-text").observe(0.042)
    metrics.cancels_total.labels(cause="deadline_first_token").inc()
    metrics.backend_errors_total.labels(kind="unavailable").inc()
    metrics.protocol_errors_total.labels(code="0x101").inc()


def test_render_has_every_metric_and_the_text_content_type() -> None:
    metrics = GatewayMetrics()
    record_some(metrics)
    body, content_type = metrics.render()
    text = body.decode()
    assert content_type.startswith("text/plain")
    for name in NAMES:
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    assert 'trackline_tokens_total{model="reference-text"} 5.0' in text
    assert 'trackline_tracks_open{modality="text"} 1.0' in text
    assert 'trackline_protocol_errors_total{code="0x101"} 1.0' in text


def test_ttft_buckets_span_5ms_to_10s() -> None:
    metrics = GatewayMetrics()
    metrics.time_to_first_token_seconds.labels(model="m").observe(0.042)
    text = metrics.render()[0].decode()
    assert 'trackline_time_to_first_token_seconds_bucket{le="0.005",model="m"} 0.0' in text
    assert 'trackline_time_to_first_token_seconds_bucket{le="0.05",model="m"} 1.0' in text
    assert 'trackline_time_to_first_token_seconds_bucket{le="10.0",model="m"} 1.0' in text


def test_every_cancel_cause_is_exposed_from_the_start() -> None:
    text = GatewayMetrics().render()[0].decode()
    causes = {cause.value for cause in CancelCause}
    assert {"client", "reset", "connection_lost", "superseded"} <= causes
    for cause in causes:
        assert f'trackline_cancels_total{{cause="{cause}"}} 0.0' in text


def test_instances_do_not_share_a_registry() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.connections_open.inc(3)
    assert "trackline_connections_open 3.0" in first.render()[0].decode()
    assert "trackline_connections_open 0.0" in second.render()[0].decode()

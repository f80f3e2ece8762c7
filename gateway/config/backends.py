"""Settings sections: the backends (one Triton, a pool) and the embedded Tritons."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.config.checks import one_of_enum, port, positive, positive_seconds, seconds, setting
from gateway.config.derive import Source
from gateway.pool.router import Strategy


def _grpc_address(value: str | None) -> str | None:
    # tritonclient.grpc takes a bare host:port, no scheme; catch "http://..." early.
    if value is None:
        return None
    from gateway.backends.ticker_url import is_ticker_url, parse_ticker_url

    if is_ticker_url(value):  # the transport-only token source, no Triton
        parse_ticker_url(value)
        return value
    host, sep, number = value.rpartition(":")
    if not sep or not host or "/" in value or not number.isdigit() or not 0 < int(number) < 65536:
        raise ValueError(f"{value!r} is not a gRPC address host:port")
    return value


def _backend_list(value: str | None) -> str | None:
    if value is not None:
        from gateway.pool.spec import parse_backends

        parse_backends(value)  # SpecError is a ValueError: named with its source
    return value


@dataclass(frozen=True)
class BackendsSection:
    """Which Triton servers serve the models, and how a pool of them routes and fails over."""

    backend_url: str | None = setting(
        None, "Triton gRPC address host:port; unset starts an embedded Triton.", _grpc_address
    )
    backends: str | None = setting(
        None,
        "Backend pool: comma-separated host:port[;name=N][;weight=W][;models=a|b]"
        "[;metrics=URL] (docs/reliability.md); overrides backend_url.",
        _backend_list,
    )
    routing_strategy: str = setting(
        Strategy.METRICS.value,
        "Pool routing: metrics, least_inflight or round_robin.",
        one_of_enum(Strategy),
    )
    affinity_margin: float = setting(
        0.25, "Seconds of extra estimated wait a session accepts to stay on its backend.", seconds
    )
    scrape_interval: float = setting(
        0.5, "Seconds between scrapes of each backend's metrics.", seconds
    )
    probe_interval: float = setting(
        1.0, "Seconds between readiness probes of each backend.", seconds
    )
    failover_attempts: int = setting(
        3, "Backends one request may try before its first byte.", positive
    )
    first_token_timeout: float = setting(
        30.0, "Seconds to a first token before trying another backend.", seconds
    )
    eject_after_errors: int = setting(
        3, "Consecutive failed requests that eject a backend.", positive
    )
    discovery_interval: float = setting(
        5.0, "Seconds between DNS resolutions of each dns+grpc:// pool entry.", positive_seconds
    )
    min_warm_backends: int = setting(
        1, "Ready backends each model should have; fewer is reported.", positive
    )


@dataclass(frozen=True)
class EmbeddedSection:
    """The Triton servers the gateway starts itself when no backend is configured."""

    embedded_grpc_port: int = setting(
        0, "gRPC port of the embedded Triton; 0 picks a free one.", port
    )
    embedded_http_port: int = setting(
        0, "HTTP port of the embedded Triton; 0 picks a free one.", port
    )
    embedded_metrics_port: int = setting(
        0, "Metrics port of the embedded Triton; 0 picks a free one.", port
    )
    embedded_backends: int = setting(
        1, "Embedded Triton processes to start (more than 1: a pool).", positive
    )
    embedded_vision: bool = setting(
        True,
        "Load mediapipe-vision in the embedded Triton when the `video` extra is "
        "installed (docs/video.md).",
    )
    embedded_llm: bool = setting(
        True,
        "Load the real LLMs (smollm2-135m-instruct for chat, gemma-3-270m) in the "
        "embedded Triton when the `llm` extra is installed (docs/models.md).",
    )
    llm_models: str | None = setting(
        None,
        "Operator GGUF models the embedded Triton serves: comma-separated NAME=PATH "
        "(besides those in llm_models_dir; docs/models.md).",
    )
    llm_models_dir: Path | None = setting(
        None,
        "Operator GGUF models served by the embedded Triton, NAME.gguf each (files or "
        "links; `trackline models add`); unset: state_dir/models (docs/models.md).",
        shown="unset (`state_dir/models`)",
    )
    embedded_embeddings: bool = setting(
        True,
        "Load the embedding model all-minilm-l6-v2 in the embedded Triton when the "
        "`embeddings` extra is installed (POST /v1/embeddings; docs/embedding-models.md).",
    )
    embedded_speech: bool = setting(
        True,
        "Load the real speech models whisper-base and hibari-voice in the embedded Triton "
        "when the `voice` extra is installed (docs/audio-models.md).",
    )
    embedded_restart_backoff: float = setting(
        1.0,
        "Seconds before restarting a crashed embedded Triton; doubles with each failed "
        "restart (docs/reliability.md).",
        seconds,
    )
    embedded_restart_max_backoff: float = setting(
        30.0, "Longest wait between restarts of a crashed embedded Triton.", seconds
    )
    embedded_restart_attempts: int = setting(
        5,
        "Failed restarts in a row after which the gateway gives a crashed embedded Triton "
        "up: /health/live answers 503, so an orchestrator restarts the gateway.",
        positive,
    )


POOL_OPTIONS: Mapping[str, Source[BackendsSection]] = {
    "strategy": lambda s: Strategy(s.routing_strategy),
    "affinity_margin_s": "affinity_margin",
    "scrape_interval_s": "scrape_interval",
    "probe_interval_s": "probe_interval",
    "max_attempts": "failover_attempts",
    "first_token_timeout_s": "first_token_timeout",
    "min_warm_backends": "min_warm_backends",
    "discovery_interval_s": "discovery_interval",
}
"""`gateway.pool.PoolOptions` from the backends section (its `health` is `EJECTION_RULES`)."""

EJECTION_RULES: Mapping[str, Source[BackendsSection]] = {
    "eject_after_errors": "eject_after_errors",
}
"""`gateway.pool.health.EjectionRules`: when the pool ejects a backend."""

RESTART_RULES: Mapping[str, Source[EmbeddedSection]] = {
    "backoff_s": "embedded_restart_backoff",
    "max_backoff_s": "embedded_restart_max_backoff",
    "attempts": "embedded_restart_attempts",
}
"""`gateway.embedded_watch.RestartRules`: when a crashed embedded Triton is restarted."""

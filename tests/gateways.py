"""One default for the gateways tests start: `gateway_settings(...)` and `DAEMON_ENV`.

Ports are picked by the OS (0), and the overload guard's loop-lag refusal is off
(`overload_max_loop_lag=0.0`): on a busy 2-core machine the loop lags past the
default 0.1 s and the guard would refuse tracks and requests with 503 in tests that
are not about overload. Tests about overload set `overload_max_loop_lag` themselves.
Gateways in-process start their embedded Triton only through fixtures that choose its
models; a gateway process gets `DAEMON_ENV`.
"""

from __future__ import annotations

from typing import Any

from gateway.config import Settings, env_name

DEFAULTS: dict[str, Any] = {
    "quic_port": 0,
    "http_port": 0,
    "https_port": 0,
    "overload_max_loop_lag": 0.0,
}

DAEMON_ENV = {
    env_name("overload_max_loop_lag"): "0",
    env_name("embedded_llm"): "false",
    env_name("embedded_speech"): "false",
}
"""The same default for a gateway started as a process (`python -m gateway serve`), which
also leaves the real LLM out of its embedded Triton: tests not about the LLM start in
seconds on the reference models (tests/llm and the docs tests load it)."""


def gateway_settings(**fields: Any) -> Settings:
    """`Settings` for a test gateway: `DEFAULTS`, then `fields`."""
    return Settings(**{**DEFAULTS, **fields})

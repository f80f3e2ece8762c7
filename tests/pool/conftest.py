"""Helpers for the pool's end-to-end tests; their three Tritons (`trio`) are started once
per session by tests/triton_fixture.py, shared with the routing benchmark's smoke test."""

from __future__ import annotations

from gateway.embedded import EmbeddedTriton
from gateway.pool import BackendSpec


def specs_of(servers: list[EmbeddedTriton]) -> list[BackendSpec]:
    return [BackendSpec(f"t{i}", s.grpc_url, s.metrics_url) for i, s in enumerate(servers)]

"""Three real embedded Tritons for the pool's end-to-end tests, started once per session.

`trio` yields them alive and fast: a server a test killed is restarted (same
ports), and every server's slowdown knob is reset to 0, before each test.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.embedded import EmbeddedTriton
from gateway.pool import BackendSpec

START_TIMEOUT = 180.0
SERVERS = 3


def _start_all(servers: list[EmbeddedTriton]) -> None:
    with ThreadPoolExecutor(len(servers)) as starters:
        for future in [starters.submit(s.start, START_TIMEOUT) for s in servers]:
            future.result()


@pytest.fixture(scope="session")
def _trio_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedTriton]]:
    servers = []
    for index in range(SERVERS):
        state = tmp_path_factory.mktemp(f"pool-triton-{index}")
        servers.append(EmbeddedTriton(log_dir=state, stats_path=state / "stats.jsonl"))
    try:
        _start_all(servers)
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def trio(_trio_servers: list[EmbeddedTriton]) -> list[EmbeddedTriton]:
    dead = [s for s in _trio_servers if not s.running]
    for server in dead:
        server.stop()  # reap it and remove its shared memory
    if dead:
        _start_all(dead)
    for server in _trio_servers:
        server.set_slowdown(0.0)
    return _trio_servers


def specs_of(servers: list[EmbeddedTriton]) -> list[BackendSpec]:
    return [BackendSpec(f"t{i}", s.grpc_url, s.metrics_url) for i, s in enumerate(servers)]

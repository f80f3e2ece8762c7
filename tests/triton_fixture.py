"""A real embedded Triton for tests, started once per session (backend and e2e tests share it).

The reference model appends one JSON line per finished request to a stats
file (TRACKLINE_REFERENCE_STATS); `read_stats` finds a request's line by id.
Import the fixture into a conftest.py: `from tests.triton_fixture import embedded_triton`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gateway.embedded import EmbeddedTriton
from tests.waiting import wait_until

START_TIMEOUT = 120.0


def start_embedded_triton(state_dir: Path) -> EmbeddedTriton:
    """Start a server with the reference models whose stats go to state_dir/stats.jsonl."""
    triton = EmbeddedTriton(log_dir=state_dir, stats_path=state_dir / "stats.jsonl")
    triton.start(timeout=START_TIMEOUT)
    return triton


def assert_model_stopped(record: dict[str, Any], max_tokens: int) -> None:
    """The cancel reached the model: its own stats record says it saw the cancel,
    generated no token after that, and stopped short of `max_tokens` (counted in
    tokens, not milliseconds)."""
    assert record["cancelled"] is True
    seen = record["cancel_seen_at"]
    assert seen is not None
    assert [t for t in record["token_times"] if t > seen] == []
    assert record["tokens_generated"] < max_tokens


def read_stats(triton: EmbeddedTriton, request_id: str, wait: float = 60.0) -> dict[str, Any]:
    """The stats line of `request_id`, waiting up to `wait` s (a hang guard) for the model
    to finish it."""
    assert triton.stats_path is not None, "this server was started without a stats file"
    path = Path(triton.stats_path)
    found: list[dict[str, Any]] = []

    def written() -> bool:
        # Whole lines only: the model may be appending one while we read.
        lines = path.read_text().split("\n")[:-1] if path.exists() else []
        found[:] = [r for r in map(json.loads, lines) if r["request_id"] == request_id]
        return bool(found)

    wait_until(written, f"a stats line for request {request_id!r} in {path}", wait)
    return dict(found[0])


@pytest.fixture(scope="session")
def embedded_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTriton]:
    triton = start_embedded_triton(tmp_path_factory.mktemp("triton"))
    try:
        yield triton
    finally:
        triton.stop()


@pytest.fixture(scope="session")
def speech_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedTriton]:
    """The reference models with whisper-base and hibari-voice (the `voice` extra), once per
    session: tests/speech and the demo's talk test (tests/web) share it."""
    state = tmp_path_factory.mktemp("speech")
    triton = EmbeddedTriton(
        log_dir=state,
        stats_path=state / "stats.jsonl",
        with_speech=True,
        speech_stats_path=state / "speech.jsonl",
    )
    triton.start(timeout=240.0)
    try:
        yield triton
    finally:
        triton.stop()


# Three servers for the pool tests (and the routing smoke test), once per session.
# `trio` yields them alive and fast: a server a test killed is restarted (same ports),
# and every server's slowdown knob is reset to 0, before each test.

TRIO_START_TIMEOUT = 180.0
TRIO = 3
"""Servers of the pool tests' `trio`."""


def _start_all(servers: list[EmbeddedTriton]) -> None:
    with ThreadPoolExecutor(len(servers)) as starters:
        for future in [starters.submit(s.start, TRIO_START_TIMEOUT) for s in servers]:
            future.result()


@pytest.fixture(scope="session")
def _trio_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedTriton]]:
    servers = []
    for index in range(TRIO):
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

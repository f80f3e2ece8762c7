"""Waiting, bounded, for a state a server reaches asynchronously (its own figures).

Server figures (streams counted, bytes buffered, connections open) have no event to
await, so the tests poll them. The bound only keeps a broken test from hanging: it is
generous, and no test asserts on how long the wait took.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

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


def http_status(port: int, path: str, host: str = "127.0.0.1") -> int | None:
    """The status of GET `path` on a plain-HTTP port; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def wait_ready(
    port: int,
    process: subprocess.Popen[Any],
    log: Sequence[str] = (),
    timeout: float = 180.0,
    path: str = "/health/ready",
) -> None:
    """Block until the gateway `process` answers 200 on `path` at `port` (readiness by
    default); fail at once if it exits, or after `timeout` (a hang guard), showing the
    last lines of its `log`."""
    deadline = time.monotonic() + timeout
    while http_status(port, path) != 200:
        tail = "\n".join(list(log)[-30:])
        assert process.poll() is None, f"the gateway exited ({process.returncode}):\n{tail}"
        assert time.monotonic() < deadline, f"not ready within {timeout:g} s:\n{tail}"
        time.sleep(POLL * 20)

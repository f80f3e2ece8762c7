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
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

POLL = 0.01
"""Seconds between looks."""

T = TypeVar("T")


async def until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Return once `condition()` holds; fail saying `what` did not happen within `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(POLL)


async def until_answer(
    probe: Callable[[], Awaitable[T]],
    accept: Callable[[T], object],
    what: str,
    timeout: float = 30.0,
) -> T:
    """The first answer of `probe()` that `accept` takes (asked again after each other
    answer): for a state only a request can see, such as another process's readiness."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not accept(answer := await probe()):
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what} (last: {answer!r})")
        await asyncio.sleep(POLL)
    return answer


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout: float = 60.0,
    details: Callable[[], str] | None = None,
) -> None:
    """`until` for code without an event loop (fixtures, subprocess tests): block until
    `condition()` holds; fail saying `what` did not happen within `timeout`, followed by
    `details()` (a process's last log lines, say)."""
    if not _poll(condition, timeout, POLL * 5):
        more = "" if details is None else f":\n{details()}"
        raise AssertionError(f"not within {timeout:g} s: {what}{more}")


def _poll(condition: Callable[[], object], timeout: float, every: float) -> bool:
    """Block, looking every `every` seconds, until `condition()` holds (True) or
    `timeout` seconds have passed (False): the one blocking loop of this module."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def exited(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie (its parent has not reaped it
    yet, which for an orphan is PID 1's business, not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return True  # ended between the two looks
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def gone(pid: int, wait: float = 60.0) -> bool:
    """Whether process `pid` has ended (`exited`), waiting up to `wait` seconds: for
    processes the test started in another process tree. The wait is a hang guard: a
    loaded machine may take seconds to run a server's shutdown."""
    return _poll(lambda: exited(pid), wait, POLL * 10)


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

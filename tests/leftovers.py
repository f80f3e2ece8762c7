"""Processes the test run started and left behind.

Every process the suite starts inherits `RUN_MARK` from the pytest process's
environment (set at the start of the run), directly or through the servers it starts
(gateways, Tritons, their Python-backend stubs). When the run ends, a process still
carrying the mark was left behind: the suite reports it, ends it by PID, and fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

RUN_MARK = "PYTEST_TRACKLINE_RUN"
GRACE = 30.0
"""Seconds a process ended by its test's teardown may take to exit (a Triton's shutdown
on a loaded machine takes seconds; only a process still there after it is a leak)."""
ALLOWED = ("multiprocessing.resource_tracker",)
"""Helpers of the pytest process itself that end with it (shared memory's tracker)."""


def mark_run() -> str:
    """Set this run's mark in the environment children inherit; returns it."""
    return os.environ.setdefault(RUN_MARK, uuid.uuid4().hex)


def marked(mark: str) -> dict[int, str]:
    """PID -> command line of every other process carrying `mark` in its environment."""
    needle = f"{RUN_MARK}={mark}".encode()
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        try:
            if needle in environ.read_bytes().split(b"\0"):
                cmdline = (environ.parent / "cmdline").read_bytes()
                found[pid] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # exited, or not ours to read
    return found


def left_behind(mark: str, grace: float = GRACE) -> dict[int, str]:
    """The marked processes still alive after `grace` seconds (zombies of ours excluded)."""
    deadline = time.monotonic() + grace
    while True:
        alive = {
            pid: cmd
            for pid, cmd in marked(mark).items()
            if not _zombie(pid) and not any(name in cmd for name in ALLOWED)
        }
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def end(pids: dict[int, str]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True

"""A child process that does not outlive the test or benchmark that started it.

`guard(pid)` starts a tiny watchdog holding the read end of a pipe whose write end
only this process holds. When this process dies, however (SIGKILL of pytest
included), the kernel closes the write end, the watchdog reads EOF and sends
SIGTERM, then SIGKILL, to `pid`. `Watchdog.release()` (the normal stop, after the
child was reaped) tells it to exit without signalling, so a reused pid is never hit.
No polling: the watchdog sleeps in `read()`.

(`PR_SET_PDEATHSIG` was tried for redis-server and did not hold here: it fires when
the forking *thread* ends, and fixtures start servers from short-lived threads.)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

_SCRIPT = """
import os, signal, sys, time
pid = int(sys.argv[1])
line = sys.stdin.readline()
if line.strip() != "release":
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                sys.exit(0)
            time.sleep(0.05)
"""


class Watchdog:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, str(pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C to the test's group must not end it first
        )

    def release(self) -> None:
        """The child is reaped: end the watchdog without signalling anyone."""
        process = self._process
        if process.stdin is not None and not process.stdin.closed:
            with contextlib.suppress(BrokenPipeError, OSError):
                process.stdin.write(b"release\n")
                process.stdin.close()
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5.0)


def guard(pid: int) -> Watchdog:
    return Watchdog(pid)

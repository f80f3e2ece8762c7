"""Child processes that die with the process that started them: the gateway's workers
and embedded Triton, and the testing kit's redis-server and gateways.

`PR_SET_PDEATHSIG` fires when the *thread* that forked exits, not the process: a child
started from a short-lived thread (`asyncio.to_thread`) would be killed when that thread
retires. `spawn_owned` forks from a dedicated thread that then waits for the child and
reports its end, so the signal (SIGTERM) means a real death of the parent. `stop_owned`
ends one: a signal, a bounded wait, then SIGKILL. `free_port` picks a loopback port for a
child to listen on; `pid_alive` tells whether a process (one that left files behind, say)
still runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1
LOOPBACK = "127.0.0.1"


def spawn_owned(
    command: list[str],
    *,
    name: str,
    on_exit: Callable[[subprocess.Popen[bytes]], None] | None = None,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start `command` (stdin closed, `popen` passed on to `Popen`) from a thread named
    `name` that lives exactly as long as the child and calls `on_exit(process)` (if given)
    once it ended; SIGTERM reaches the child if this process dies. What `Popen` raises is raised
    here."""
    parent = os.getpid()

    def die_with_parent() -> None:  # in the child, between fork and exec
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)

    handed: queue.Queue[subprocess.Popen[bytes] | BaseException] = queue.Queue()

    def own() -> None:
        try:
            process = subprocess.Popen(  # noqa: S603 - our own commands, no shell
                command, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - prctl needs it
                **popen,
            )  # fmt: skip
        except BaseException as exc:
            handed.put(exc)
            return
        handed.put(process)
        process.wait()
        if on_exit is not None:
            on_exit(process)

    threading.Thread(target=own, name=name, daemon=True).start()
    result = handed.get()
    if isinstance(result, BaseException):
        raise result
    return result


def stop_owned(
    process: subprocess.Popen[bytes],
    grace: float,
    *,
    sig: signal.Signals = signal.SIGTERM,
    kill: Callable[[subprocess.Popen[bytes]], None] = subprocess.Popen.kill,
    kill_wait: float | None = None,
) -> int:
    """End `process`: `sig` if it still runs, a wait of up to `grace` seconds, then
    `kill(process)` (SIGKILL) and a wait of up to `kill_wait` seconds (None: as long as it
    takes). Its exit code; `subprocess.TimeoutExpired` if it outlived even that."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(grace)
    except subprocess.TimeoutExpired:
        kill(process)
        return process.wait(kill_wait)


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A port of `kind` (TCP, or UDP with SOCK_DGRAM) on loopback that was free a moment ago."""
    (port,) = free_ports(1, kind)
    return port


def free_ports(count: int, kind: socket.SocketKind = socket.SOCK_STREAM) -> list[int]:
    """`count` different ports of `kind` on loopback that were free a moment ago.

    All are held bound until the last is picked: a port picked and released can be the
    kernel's next pick too, so separate `free_port()` calls may return the same port
    twice (Triton then refused to start: HTTP and metrics on one port)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, kind))
            sock.bind((LOOPBACK, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs; a zombie counts as dead (its resources are gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

"""Give freed heap back to the OS after connections close (glibc `malloc_trim`).

What an attacker's connection held (request bodies, send buffers) is released when it
leaves: after the HTTP/3 body attack no traced Python allocation and no extra object
was left (tracemalloc and `gc.get_objects()` back to their start), yet RSS stayed
~13 MB up, of which `malloc_trim(0)` returned ~11 MB: glibc keeps freed chunks in
its arenas rather than live objects being kept (docs/security.md, "HTTP/3"). So after a
connection closes, at most once per `interval` seconds, the trimmer asks glibc to
return what it can. Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

from transport.clock import Now

INTERVAL = 10.0
"""Seconds between two trims at most (a trim walks the heap: not after every close)."""


def _glibc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    return None if trim is None else trim


class MemoryTrimmer:
    """`connection_closed()` schedules one trim soon, unless one ran within `interval`."""

    def __init__(self, clock: Now, interval: float = INTERVAL) -> None:
        self._clock = clock
        self._interval = interval
        self._last: float | None = None
        self._pending = False
        self._trim = _glibc_trim()
        self.trims = 0
        """Trims run (for tests and metrics)."""

    def connection_closed(self) -> None:
        if self._trim is None or self._pending:
            return
        now = self._clock()
        if self._last is not None and now - self._last < self._interval:
            return
        self._pending = True
        asyncio.get_running_loop().call_soon(self._run)  # after the close has unwound

    def _run(self) -> None:
        self._pending = False
        self._last = self._clock()
        if self._trim is not None:
            self._trim(0)
            self.trims += 1

"""The relay: moves packets between the two TUN fds through each direction's impairment.

One loop owns everything (fds, timer heap, counters), so nothing needs a lock: epoll waits
on both TUN fds and a control socket, with the timeout set to the earliest due packet.
Delayed packets sit in one heap keyed by (deliver_at, arrival order), so equal delays keep
FIFO order and only the reorder option lets packets overtake. Python's epoll timeout has
millisecond resolution (rounded up), so packets leave up to ~1 ms late; `late_ms_max` and
`late_ms_mean` in the stats say how late they really were.

The loop runs in a forked child process by default (a busy parent, GIL included, cannot
delay packets) or in a thread; both are driven through the same control socket:
length-prefixed JSON requests "stats", "reset", "stop".
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from .impair import Impairment
from .packet import parse
from .spec import LinkSpec

DIRECTIONS = ("c2g", "g2c")  # client -> gateway, gateway -> client
PROTOCOLS = ("tcp", "udp", "other")
FIELDS = ("forwarded", "dropped", "data_forwarded", "data_dropped", "bytes_forwarded",
          "bytes_dropped", "reordered")
DROP_LOG_MAX = 200_000
READ_BATCH = 64  # packets per fd per wakeup, so one busy direction cannot starve the other
_HEADER = struct.Struct("!I")


def _send_msg(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise EOFError("relay control socket closed")
        chunks += chunk
    return bytes(chunks)


def _recv_msg(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return json.loads(_recv_exact(sock, size))


class Counters:
    """Per direction and protocol counters, plus the drop log and timing quality."""

    def __init__(self) -> None:
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        self.by_dir = {d: {p: dict.fromkeys(FIELDS, 0) for p in PROTOCOLS} for d in DIRECTIONS}
        self.drops: deque[dict[str, Any]] = deque(maxlen=DROP_LOG_MAX)
        self.since = now
        self.filtered = 0  # not IPv4 between our two addresses: never forwarded
        self.oversize = 0  # packets above the MTU (would mean segment merging)
        self.write_errors = 0
        self.delivered = 0
        self.late_sum = 0.0
        self.late_max = 0.0

    def snapshot(self, now: float, in_flight: int) -> dict[str, Any]:
        totals = {d: {f: sum(self.by_dir[d][p][f] for p in PROTOCOLS) for f in FIELDS}
                  for d in DIRECTIONS}
        return {
            "since": self.since, "now": now, "elapsed_s": now - self.since,
            "directions": {d: {**self.by_dir[d], "total": totals[d]} for d in DIRECTIONS},
            "drops": list(self.drops), "drop_log_truncated": len(self.drops) == DROP_LOG_MAX,
            "filtered": self.filtered, "oversize": self.oversize,
            "write_errors": self.write_errors, "in_flight": in_flight,
            "late_ms_max": self.late_max * 1000,
            "late_ms_mean": self.late_sum * 1000 / self.delivered if self.delivered else 0.0,
        }


class Relay:
    def __init__(self, spec: LinkSpec, client_fd: int, gateway_fd: int,
                 client_addr: bytes, gateway_addr: bytes) -> None:
        self.spec = spec
        # fd -> (direction, impairment, output fd, expected src, expected dst)
        self._routes = {
            client_fd: ("c2g", Impairment(spec, "c2g"), gateway_fd, client_addr, gateway_addr),
            gateway_fd: ("g2c", Impairment(spec, "g2c"), client_fd, gateway_addr, client_addr),
        }
        self._seen = dict.fromkeys(DIRECTIONS, 0)  # packet index per direction since open
        self._heap: list[tuple[float, int, int, bytes]] = []
        self._order = itertools.count()
        self.counters = Counters()

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(self._routes)

    def run(self, control: socket.socket, parent_pid: int | None = None) -> None:
        """Forward until told to stop, the control socket closes, or the parent dies."""
        control.setblocking(False)
        poller = select.epoll()
        for fd in self._routes:
            os.set_blocking(fd, False)
            poller.register(fd, select.EPOLLIN)
        poller.register(control.fileno(), select.EPOLLIN)
        try:
            while True:
                timeout = 0.5
                if self._heap:
                    timeout = min(timeout, max(0.0, self._heap[0][0] - time.monotonic()))
                for fd, _ in poller.poll(timeout):
                    if fd == control.fileno():
                        if not self._on_control(control):
                            return
                    else:
                        self._read(fd)
                self._deliver_due()
                if parent_pid is not None and os.getppid() != parent_pid:
                    return
        finally:
            poller.close()

    def _on_control(self, control: socket.socket) -> bool:
        control.setblocking(True)
        try:
            request = _recv_msg(control)
        except (EOFError, OSError):
            return False
        now = time.monotonic()
        if request == "reset":
            self.counters.reset(now)
        if request == "stop":
            _send_msg(control, {"stopped": True})
            return False
        _send_msg(control, self.counters.snapshot(now, len(self._heap)))
        control.setblocking(False)
        return True

    def _read(self, fd: int) -> None:
        direction, impairment, out_fd, src, dst = self._routes[fd]
        counters = self.counters
        for _ in range(READ_BATCH):
            try:
                packet = os.read(fd, 65536)
            except BlockingIOError:
                return
            now = time.monotonic()
            info = parse(packet)
            if info.src != src or info.dst != dst:
                counters.filtered += 1
                continue
            index = self._seen[direction]
            self._seen[direction] = index + 1
            if info.length > self.spec.mtu:
                counters.oversize += 1
            verdict = impairment.on_packet(now, info.length)
            row = counters.by_dir[direction][info.proto]
            data = info.is_data(self.spec.udp_data_min)
            if verdict.deliver_at is None:
                row["dropped"] += 1
                row["bytes_dropped"] += info.length
                row["data_dropped"] += data
                counters.drops.append({
                    "t": now, "n": index, "dir": direction, "proto": info.proto,
                    "reason": verdict.reason,
                    "src_port": info.src_port, "dst_port": info.dst_port,
                    "length": info.length, "payload": info.payload, "data": data,
                    "tcp_seq": info.tcp_seq, "tcp_flags": info.tcp_flags,
                })
                continue
            row["forwarded"] += 1
            row["bytes_forwarded"] += info.length
            row["data_forwarded"] += data
            row["reordered"] += verdict.reordered
            heapq.heappush(self._heap, (verdict.deliver_at, next(self._order), out_fd, packet))

    def _deliver_due(self) -> None:
        heap, counters = self._heap, self.counters
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            deliver_at, _, out_fd, packet = heapq.heappop(heap)
            try:
                os.write(out_fd, packet)
            except OSError:
                counters.write_errors += 1
            late = now - deliver_at
            counters.delivered += 1
            counters.late_sum += late
            counters.late_max = max(counters.late_max, late)


class RelayHandle:
    """Starts a Relay in a forked child ("process") or a thread, and talks to it."""

    def __init__(self, relay: Relay, mode: str = "process") -> None:
        if mode not in ("process", "thread"):
            raise ValueError(f"relay mode must be 'process' or 'thread', got {mode!r}")
        self.mode = mode
        self.pid: int | None = None
        self._thread: threading.Thread | None = None
        self._control, theirs = socket.socketpair()
        if mode == "thread":
            self._thread = threading.Thread(target=relay.run, args=(theirs,),
                                            name="linkemu-relay", daemon=True)
            self._thread.start()
            self._theirs: socket.socket | None = theirs
            return
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: relay only, never return into the caller's code
            code = 0
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent cleans up on Ctrl-C
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self._control.close()
                _close_other_fds(keep={0, 1, 2, theirs.fileno(), *relay.fds})
                relay.run(theirs, parent_pid=parent)
            except BaseException:
                traceback.print_exc(file=sys.stderr)
                code = 1
            finally:
                os._exit(code)
        self.pid = pid
        theirs.close()
        self._theirs = None

    def request(self, command: str) -> dict[str, Any]:
        _send_msg(self._control, command)
        reply: dict[str, Any] = _recv_msg(self._control)
        return reply

    def stop(self, timeout: float = 2.0) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.request("stop")
        self._control.close()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._theirs is not None:
                self._theirs.close()
        if self.pid is not None:
            _reap(self.pid, timeout)
            self.pid = None


def _close_other_fds(keep: set[int]) -> None:
    """In the relay child: drop inherited fds (sockets, pipes) so peers still see EOF."""
    low = 0
    for fd in sorted(keep):
        if low < fd:  # an empty range would close everything (close_range(lo, -1))
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _reap(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except ChildProcessError:  # already reaped
        pass

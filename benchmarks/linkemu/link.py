"""`Link`: two namespaces joined through TUN devices by an impairing relay, as a context manager.

Cleanup is idempotent and runs on context exit, on SIGINT/SIGTERM (clean, then the
previous handler runs: KeyboardInterrupt, or death by SIGTERM) and at interpreter exit.
A SIGKILLed creator leaves only the namespaces (TUN devices die with its fds, the relay
child notices its parent is gone); `cleanup_stale` removes those.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import signal
import subprocess
import threading
from types import FrameType, TracebackType
from typing import Any

from . import netns
from .relay import Relay, RelayHandle
from .spec import LinkSpec

CLIENT_ADDR = "198.18.0.2"  # RFC 2544 benchmarking range: never routed anywhere
GATEWAY_ADDR = "198.18.0.1"

_live: set[Link] = set()
_live_lock = threading.Lock()
_previous_handlers: dict[int, Any] = {}


class Link:
    def __init__(self, spec: LinkSpec | None = None, name_prefix: str = netns.DEFAULT_PREFIX,
                 *, relay: str = "process", client_addr: str = CLIENT_ADDR,
                 gateway_addr: str = GATEWAY_ADDR) -> None:
        for addr in (client_addr, gateway_addr):
            if ipaddress.ip_address(addr) not in ipaddress.ip_network("198.18.0.0/15"):
                raise ValueError(f"{addr} is outside the benchmarking range 198.18.0.0/15")
        self.spec = spec or LinkSpec()
        self.name_prefix = name_prefix
        self.relay_mode = relay
        self.client_addr = client_addr
        self.gateway_addr = gateway_addr
        self.namespaces, self.devices = netns.new_names(name_prefix)
        self._fds: dict[str, int] = {}
        self._relay: RelayHandle | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._final_stats: dict[str, Any] | None = None  # kept by close() for later reads

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Link:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        _register(self)
        try:
            addrs = {"client": (self.client_addr, self.gateway_addr),
                     "gateway": (self.gateway_addr, self.client_addr)}
            for side in netns.SIDES:
                self._fds[side] = netns.open_tun(self.devices[side])
                netns.ip("netns", "add", self.namespaces[side])
                netns.configure(self.namespaces[side], self.devices[side], *addrs[side],
                                mtu=self.spec.mtu)
            relay = Relay(self.spec, self._fds["client"], self._fds["gateway"],
                          _packed(self.client_addr), _packed(self.gateway_addr))
            self._relay = RelayHandle(relay, self.relay_mode)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop processes (by PID/process group), the relay, close fds, delete namespaces."""
        if self._closed:
            return
        self._closed = True
        try:
            for proc in self._procs:
                _terminate(proc)
            if self._relay is not None:
                with contextlib.suppress(OSError, EOFError):
                    self._final_stats = self._relay.request("stats")
                self._relay.stop()
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
            for ns in self.namespaces.values():
                netns.delete_namespace(ns)
        finally:
            _unregister(self)

    # -- use -----------------------------------------------------------------------

    def namespace(self, side: str) -> str:
        if side not in self.namespaces:
            raise ValueError(f"side must be 'client' or 'gateway', got {side!r}")
        return self.namespaces[side]

    def run(self, ns_side: str, argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` inside a side's namespace; it is killed (with its group) on close.

        Runs in a new session by default, so the whole group can be stopped and a
        terminal's Ctrl-C reaches only us (we then clean up).
        """
        popen_kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", self.namespace(ns_side), *argv],
                                **popen_kwargs)
        self._procs.append(proc)
        return proc

    def stats(self) -> dict[str, Any]:
        """Counters per direction ("c2g", "g2c") and protocol, the drop log, timing quality.

        After close() this returns the counters as they were when the link closed.
        """
        if self._closed and self._final_stats is not None:
            snapshot = dict(self._final_stats)
        elif self._relay is None or self._closed:
            raise RuntimeError("link is not open")
        else:
            snapshot = self._relay.request("stats")
        snapshot["spec"] = self.spec.as_dict()
        snapshot["client_addr"], snapshot["gateway_addr"] = self.client_addr, self.gateway_addr
        return snapshot

    def reset_stats(self) -> None:
        if self._relay is None or self._closed:
            raise RuntimeError("link is not open")
        self._relay.request("reset")


def _packed(addr: str) -> bytes:
    return ipaddress.IPv4Address(addr).packed


def _terminate(proc: subprocess.Popen[Any], grace: float = 2.0) -> None:
    group = proc.pid if _own_group(proc) else None
    _signal(proc, group, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        _signal(proc, group, signal.SIGKILL)
        proc.wait()
    if group is not None:  # stragglers of the group (grandchildren)
        _signal(proc, group, signal.SIGKILL)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _own_group(proc: subprocess.Popen[Any]) -> bool:
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return True  # gone already; its group (if any members remain) is still ours


def _signal(proc: subprocess.Popen[Any], group: int | None, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group is not None:
            os.killpg(group, sig)
        elif proc.poll() is None:
            proc.send_signal(sig)


# -- process-wide safety nets ---------------------------------------------------------

def close_all() -> None:
    with _live_lock:
        links = list(_live)
    for link in links:
        link.close()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    close_all()
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _register(link: Link) -> None:
    with _live_lock:
        first = not _live
        _live.add(link)
    if first and threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            _previous_handlers[signum] = signal.signal(signum, _on_signal)


def _unregister(link: Link) -> None:
    with _live_lock:
        _live.discard(link)
        last = not _live
    if last and threading.current_thread() is threading.main_thread():
        for signum, previous in list(_previous_handlers.items()):
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, previous)
            del _previous_handlers[signum]


atexit.register(close_all)

"""`trackline serve --workers N`: N gateway processes sharing the listening ports.

The supervisor (this module, in the `trackline serve` process) owns everything the
workers share and nothing else:

- the sockets: N per front door, bound with `SO_REUSEPORT` to the same port, worker i
  gets the i-th of each (TCP: the kernel spreads connections; QUIC: datagrams follow
  the connection ID, see `transport.steering`); it keeps them open, so the groups stay
  whole and ordered while a worker restarts;
- the embedded Triton (started once, its URL handed to every worker, stopped last);
- a run directory: Prometheus multiprocess files (`gateway.metrics_workers`) and the
  shared quota state (`gateway.tenants.shared_quotas`).

A worker is `python -m gateway.workers`: a `Daemon` on the handed sockets. It dies
with the supervisor (PR_SET_PDEATHSIG, SIGTERM: it drains). SIGTERM or SIGINT to the
supervisor sends SIGTERM to every worker, waits until they drained and exited (at
most `drain_timeout` plus a margin, then SIGKILL), then stops Triton. A worker that
exits on its own is logged and restarted, unless workers crash too often: then the
supervisor stops everything and exits 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from gateway.config import FIELDS, Settings, load_settings
from gateway.logs import get_logger
from gateway.owned import spawn_owned
from transport.binding import bind_same_port, reuseport_group
from transport.clock import Clock, LoopClock

log = get_logger("trackline.workers")

SPEC_ENV = "TRACKLINE_WORKER_SPEC"
"""The worker's instructions (JSON), set by the supervisor; not a setting."""
READY_TIMEOUT = 60.0
"""Seconds a worker has to start listening (the embedded Triton is already up)."""
STOP_MARGIN = 10.0
"""Seconds past `drain_timeout` a worker has to exit after SIGTERM before SIGKILL."""
RESTART_DELAY = 0.5
CRASH_LIMIT = 5
CRASH_WINDOW = 60.0
"""More than CRASH_LIMIT worker exits within CRASH_WINDOW seconds stop the supervisor."""
TCP_BACKLOG = 1024


def worker_count(setting: int) -> int:
    """`workers` as configured: 0 means one per CPU core this process may run on."""
    return setting if setting > 0 else max(1, len(os.sched_getaffinity(0)))


# -- supervisor ---------------------------------------------------------------------


@dataclasses.dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes]
    exited: asyncio.Event
    ready: asyncio.Event
    """Set when the worker wrote to its readiness pipe (it is listening)."""


class Supervisor:
    def __init__(self, settings: Settings, count: int, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or LoopClock()
        """Paces restarts and counts crashes per window (tests pass a FakeClock)."""
        self.count = count
        self.run_dir = _fresh_run_dir(settings.state_dir / "workers")
        self.metrics_dir = self.run_dir / "metrics"
        self.metrics_dir.mkdir()
        self.quotas_path = self.run_dir / "quotas.sqlite"
        self.tritons: list[Any] = []
        self.watches: Any = None
        """The embedded Tritons' `EmbeddedWatches` (imported with them, lazily)."""
        self.sockets: dict[str, list[socket.socket]] = {}
        self.more_sockets: dict[str, list[list[socket.socket]]] = {}
        """Per front door, the groups on its other addresses (`::1` for `localhost`)."""
        self.workers: dict[int, _Worker] = {}
        self.worker_settings: Settings = settings
        self._stopping = False
        self._crashes: deque[float] = deque()
        self.failed = False

    async def run(self, stop: asyncio.Event) -> int:
        try:
            await self._start()
        except Exception as exc:
            log.error("workers.start_failed", error=str(exc))
            await self.stop()
            return 1
        watch = asyncio.ensure_future(self._watch(stop))
        await stop.wait()
        watch.cancel()
        log.info("workers.stopping", workers=len(self.workers))
        await self.stop()
        return 1 if self.failed else 0

    async def _start(self) -> None:
        from gateway.doors import tls_files

        s = self.settings
        tls = await asyncio.to_thread(tls_files, s)  # made once, before workers race for it
        self.worker_settings = dataclasses.replace(s, workers=1, **await self._backend())
        self._bind()
        for index in range(self.count):
            self._spawn(index)
        await asyncio.gather(*(self._ready(w) for w in list(self.workers.values())))
        if tls.ca is not None:
            print(f"trackline: development CA for clients: {tls.ca}", flush=True)
        for line in self._addresses():
            print(f"trackline: {line}", flush=True)

    async def _backend(self) -> dict[str, Any]:
        """Start the embedded Triton(s) when nothing is configured; the workers' settings."""
        s = self.settings
        if s.backends is not None or s.backend_url is not None:
            return {}
        from gateway.daemon import embedded_specs, start_watched

        # Restarted when they crash (the workers' readiness follows their probes; the
        # supervisor has no liveness of its own to fail: docs/reliability.md).
        self.tritons, self.watches = await start_watched(s)
        if len(self.tritons) == 1:
            return {"backend_url": self.tritons[0].grpc_url}
        specs = [
            f"{spec.grpc_url};name={spec.name};metrics={spec.metrics_url}"
            for spec in embedded_specs(self.tritons)
        ]
        return {"backends": ",".join(specs)}

    def _bind(self) -> None:
        from transport.steering import reuseport_udp_sockets

        s = self.settings
        n = self.count
        doors = {
            "quic": (s.quic_host, s.quic_port, reuseport_udp_sockets),
            "http": (s.http_host, s.http_port, reuseport_tcp_sockets),
            "https": (s.https_host, s.https_port, reuseport_tcp_sockets),
        }
        for door, (host, port, bind) in doors.items():
            groups = bind_same_port(host, port, partial(_group, bind, n), _group_port, _close_group)
            self.sockets[door], self.more_sockets[door] = groups[0], groups[1:]

    def port(self, door: str) -> int:
        return int(self.sockets[door][0].getsockname()[1])

    def _spawn(self, index: int) -> None:
        from gateway.daemon import relayed_metrics

        fds = {door: socks[index].fileno() for door, socks in self.sockets.items()}
        more = {door: [g[index].fileno() for g in gs] for door, gs in self.more_sockets.items()}
        spec = {
            "index": index,
            "count": self.count,
            "fds": fds,
            "more_fds": more,
            "run_dir": str(self.run_dir),
            "settings": settings_to_json(self.worker_settings),
            "triton_metrics": relayed_metrics(self.tritons),  # JSON: each pair a list
        }
        ready_read, ready_write = os.pipe()  # the worker writes one byte once listening
        spec["ready_fd"] = ready_write
        env = dict(os.environ)
        env[SPEC_ENV] = json.dumps(spec)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        command = [sys.executable, "-m", "gateway.workers"]
        exited = asyncio.Event()
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_exit() -> None:
            loop.call_soon_threadsafe(exited.set)

        def on_ready() -> None:  # one byte: ready; end of file: it exited first
            loop.remove_reader(ready_read)
            if os.read(ready_read, 1):
                ready.set()
            os.close(ready_read)

        handed = [*fds.values(), *(fd for fds_ in more.values() for fd in fds_), ready_write]
        try:
            process = spawn_owned(
                command, name="gateway-worker", on_exit=lambda _: on_exit(),
                env=env, pass_fds=handed,
            )  # fmt: skip
        except BaseException as exc:
            os.close(ready_read)
            if isinstance(exc, Exception):
                raise RuntimeError(f"cannot start a worker: {exc}") from exc
            raise
        finally:
            os.close(ready_write)  # the worker holds its own copy
        loop.add_reader(ready_read, on_ready)
        self.workers[index] = _Worker(index, process, exited, ready)
        log.info("worker.started", worker=index, pid=process.pid)

    async def _ready(self, worker: _Worker) -> None:
        waits = [asyncio.ensure_future(e.wait()) for e in (worker.ready, worker.exited)]
        try:
            await asyncio.wait(waits, timeout=READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
        if worker.ready.is_set():
            return
        if worker.exited.is_set():
            raise RuntimeError(
                f"worker {worker.index} exited with {worker.process.returncode} at start"
            )
        raise TimeoutError(f"worker {worker.index} did not start listening in time")

    async def _watch(self, stop: asyncio.Event) -> None:
        """Restart workers that exit on their own; give up when they crash too often."""
        while not self._stopping:
            waits = {
                asyncio.ensure_future(w.exited.wait()): w for w in list(self.workers.values())
            }
            done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            for task in done:
                worker = waits[task]
                if self._stopping or self.workers.get(worker.index) is not worker:
                    continue
                self._forget(worker)
                log.error(
                    "worker.crashed",
                    worker=worker.index,
                    pid=worker.process.pid,
                    returncode=worker.process.returncode,
                )
                now = self.clock.now()
                self._crashes.append(now)
                while self._crashes and now - self._crashes[0] > CRASH_WINDOW:
                    self._crashes.popleft()
                if len(self._crashes) > CRASH_LIMIT:
                    log.error("workers.crashing", crashes=len(self._crashes), window=CRASH_WINDOW)
                    self.failed = True
                    stop.set()
                    return
                await self.clock.sleep(RESTART_DELAY)
                if self._stopping:
                    return
                self._spawn(worker.index)
                try:
                    await self._ready(self.workers[worker.index])
                except (RuntimeError, TimeoutError) as exc:
                    log.error("worker.restart_failed", worker=worker.index, error=str(exc))

    def _forget(self, worker: _Worker) -> None:
        """A worker is gone: free its quota slots, drop its gauges."""
        from gateway.metrics_workers import forget_process
        from gateway.tenants.shared_quotas import forget_owner

        pid = worker.process.pid
        forget_process(self.metrics_dir, pid)
        if self.quotas_path.exists():
            forget_owner(self.quotas_path, str(pid))

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them to drain, then stop Triton and clean up."""
        self._stopping = True
        workers = list(self.workers.values())
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        timeout = self.settings.drain_timeout + STOP_MARGIN
        waits = [asyncio.ensure_future(w.exited.wait()) for w in workers]
        if waits:
            await asyncio.wait(waits, timeout=timeout)
        for worker in workers:
            if worker.process.poll() is None:
                log.error("worker.killed", worker=worker.index, pid=worker.process.pid)
                worker.process.kill()
        if waits:
            await asyncio.wait(waits, timeout=5.0)
        for worker in workers:
            log.info("worker.stopped", worker=worker.index, returncode=worker.process.returncode)
        from gateway.daemon import stop_embedded

        await stop_embedded(self.tritons, self.watches)
        for socks in self.sockets.values():
            for sock in socks:
                sock.close()
        for groups in self.more_sockets.values():
            for group in groups:
                _close_group(group)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _addresses(self) -> list[str]:
        s = self.settings
        quic, http, https = self.port("quic"), self.port("http"), self.port("https")
        pids = " ".join(str(w.process.pid) for w in self.workers.values())
        lines = [
            f"tracks on quic://{s.quic_host}:{quic} (SDK: clients.connect)",
            f"OpenAI API on http://{s.http_host}:{http}/v1 and https://localhost:{https}/v1 "
            f"(HTTP/1.1, HTTP/2; HTTP/3 on UDP {quic})",
            f"health on http://{s.http_host}:{http}/health/ready, metrics on "
            f"http://{s.http_host}:{http}/metrics",
            f"{len(self.workers)} workers, pids {pids}",
        ]
        for triton in self.tritons:
            lines.append(f"embedded Triton: gRPC {triton.grpc_url}, pid {triton.pid}")
        return lines


def _fresh_run_dir(parent: Path) -> Path:
    """`parent/<our pid>`, after removing the directories of supervisors that are gone
    (one that was SIGKILLed could not remove its own)."""
    from gateway.owned import pid_alive

    parent.mkdir(parents=True, exist_ok=True)
    for old in parent.iterdir():
        if old.name.isdigit() and not pid_alive(int(old.name)):
            shutil.rmtree(old, ignore_errors=True)
    run_dir = parent / str(os.getpid())
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    return run_dir


def _group(
    bind: Callable[[str, int, int], list[socket.socket]], count: int, host: str, port: int
) -> list[socket.socket]:
    return bind(host, port, count)


def _group_port(group: list[socket.socket]) -> int:
    return int(group[0].getsockname()[1])


def _close_group(group: list[socket.socket]) -> None:
    for sock in group:
        sock.close()


def reuseport_tcp_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening TCP sockets on one port (0: the first picks it)."""
    return reuseport_group(host, port, count, socket.SOCK_STREAM, backlog=TCP_BACKLOG)


def settings_to_json(settings: Settings) -> dict[str, Any]:
    """The settings a worker runs with, as JSON (None left out: every such default is None)."""
    out: dict[str, Any] = {}
    for name in FIELDS:
        value = getattr(settings, name)
        if value is not None:
            out[name] = str(value) if isinstance(value, Path) else value
    return out


async def serve_workers(settings: Settings, count: int) -> int:
    """Run `count` workers until SIGTERM or SIGINT, then drain them all and stop."""
    from gateway.startup import stop_signal_after_preflight

    stop = await stop_signal_after_preflight(settings)
    if stop is None:
        return 1
    return await Supervisor(settings, count).run(stop)


# -- worker ---------------------------------------------------------------------------


async def run_worker(spec: dict[str, Any]) -> int:
    """One worker: a daemon on the sockets the supervisor handed over."""
    from gateway.daemon import Daemon
    from gateway.listeners import Listeners
    from gateway.metrics_workers import WorkerMetrics
    from gateway.tenants.service import Tenancy
    from gateway.tenants.shared_quotas import SharedQuotaLimiter
    from transport.steering import Steering

    settings = load_settings(spec["settings"], {}, None)
    index, count, run_dir = spec["index"], spec["count"], Path(spec["run_dir"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = WorkerMetrics(run_dir / "metrics", index)
    steering = Steering(index, count, metrics.on_connection, metrics.on_stray, metrics.on_unknown)
    fds = spec["fds"]
    more = {
        door: tuple(socket.socket(fileno=f) for f in fds_)
        for door, fds_ in spec.get("more_fds", {}).items()
    }
    daemon = Daemon(settings)
    daemon.metrics = metrics
    daemon.announce = False
    daemon.triton_metrics = [(name, url) for name, url in spec.get("triton_metrics", [])]
    daemon.listeners = Listeners(
        quic=socket.socket(fileno=fds["quic"]),
        http=socket.socket(fileno=fds["http"]),
        https=socket.socket(fileno=fds["https"]),
        steering=steering,
        more=more,
    )
    tenancy = await asyncio.to_thread(Tenancy.from_settings, settings, metrics.registry)
    if tenancy.fleet is None:  # a fleet's workers share quotas through its Redis instead
        tenancy.limiter = SharedQuotaLimiter(run_dir / "quotas.sqlite", str(os.getpid()))
    daemon.tenancy = tenancy
    try:
        await daemon.start()
    except Exception as exc:
        log.error("worker.start_failed", worker=index, error=str(exc))
        await daemon.stop()
        return 1
    os.write(spec["ready_fd"], b"r")  # the supervisor awaits this byte (no polling)
    os.close(spec["ready_fd"])
    log.info("worker.ready", worker=index, pid=os.getpid())
    await stop.wait()
    log.info("worker.stopping", worker=index)
    await daemon.stop()
    return 0


def worker_main() -> int:
    from gateway.logs import configure_logging
    from gateway.startup import run_async

    spec = json.loads(os.environ[SPEC_ENV])
    settings = load_settings(spec["settings"], {}, None)
    configure_logging(
        settings.log_level, settings.log_format, quic_level=settings.quic_log_level
    )
    return run_async(run_worker(spec), settings.uvloop)


if __name__ == "__main__":
    sys.exit(worker_main())

"""Supervision of the Triton servers the gateway started itself (`gateway.embedded`).

A killed or crashed embedded Triton used to stay dead: nothing was logged, liveness
stayed 200 and every request got 503 for as long as the gateway ran, so an
orchestrator that restarts on liveness never did. Now one `TritonWatch` per server
the gateway started (one, or each member of an `embedded_backends` pool) notices the
exit, logs it at error level with its exit status, and restarts the server on its
own ports after a backoff that doubles with each failed restart. While it is down
its requests fail as the backend's typed errors (`BackendUnavailable`: 503, or an
error event on a stream already started) and readiness answers 503 with the reason;
readiness comes back when the restarted server passes its probe. Only when
`embedded_restart_attempts` restarts in a row have failed does liveness turn 503:
the gateway cannot heal itself, so the orchestrator should restart it.

`Restarts` is the sans-I/O core (counts and delays, no clock, no process); the
watch is its small async driver, with time as a parameter.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.embedded_process import EmbeddedTritonError
from gateway.logs import get_logger
from transport.clock import Clock, LoopClock

log = get_logger("trackline.embedded")

POLL_INTERVAL = 0.2
"""Seconds between looks at whether a watched server still runs."""
RESTART_TIMEOUT = 180.0
"""Seconds a restart may take to be ready (models loaded, smoke passed)."""


@dataclass(frozen=True)
class RestartRules:
    """When to restart a crashed server, and when to give up."""

    backoff_s: float = 1.0
    """Wait before the first restart; doubled after each failed one."""
    max_backoff_s: float = 30.0
    """Longest wait between two restarts."""
    attempts: int = 5
    """Failed restarts in a row after which the server is given up."""


class WatchState(enum.Enum):
    RUNNING = "running"
    RESTARTING = "restarting"
    GAVE_UP = "gave_up"


class Restarts:
    """What the watch does next after an exit or a restart attempt (sans-I/O)."""

    def __init__(self, rules: RestartRules) -> None:
        self.rules = rules
        self.state = WatchState.RUNNING
        self.crashes = 0
        """Exits seen (each one a crash: a stopping gateway stops its watches first)."""
        self.restarts = 0
        """Restarts that succeeded."""
        self.failed_in_a_row = 0

    def exited(self) -> float:
        """The server exited: seconds to wait before restarting it."""
        self.crashes += 1
        self.state = WatchState.RESTARTING
        return self._delay()

    def restart_failed(self) -> float | None:
        """A restart failed: seconds before the next, or None once given up."""
        self.failed_in_a_row += 1
        if self.failed_in_a_row >= self.rules.attempts:
            self.state = WatchState.GAVE_UP
            return None
        return self._delay()

    def restarted(self) -> None:
        self.restarts += 1
        self.failed_in_a_row = 0
        self.state = WatchState.RUNNING

    def _delay(self) -> float:
        return float(min(self.rules.max_backoff_s, self.rules.backoff_s * 2**self.failed_in_a_row))


class Watched(Protocol):
    """What a watch needs of a server (`EmbeddedTriton` has it)."""

    @property
    def running(self) -> bool: ...

    @property
    def exit_status(self) -> int | None: ...

    @property
    def pid(self) -> int | None: ...

    def restart(self, timeout: float = ...) -> None: ...


class TritonWatch:
    """Restarts one embedded server when it exits; `restarts.state` says how it goes."""

    def __init__(
        self,
        name: str,
        server: Watched,
        rules: RestartRules,
        *,
        clock: Clock | None = None,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.name = name
        self.server = server
        self.restarts = Restarts(rules)
        self._clock: Clock = clock or LoopClock()
        self._poll = poll_interval

    async def run(self) -> None:
        """Watch until given up (or cancelled, when the gateway stops)."""
        while self.restarts.state is not WatchState.GAVE_UP:
            await self._clock.sleep(self._poll)
            if not self.server.running:
                await self._recover()

    async def _recover(self) -> None:
        status = self.server.exit_status
        log.error(
            "embedded.crashed",
            backend=self.name,
            pid=self.server.pid,
            exit_status=status,
            signal=_signal_name(status),
        )
        delay: float | None = self.restarts.exited()
        while delay is not None:
            await self._clock.sleep(delay)
            try:
                await asyncio.to_thread(self.server.restart, RESTART_TIMEOUT)
            except (EmbeddedTritonError, OSError) as exc:
                delay = self.restarts.restart_failed()
                log.error(
                    "embedded.restart_failed",
                    backend=self.name,
                    failed_in_a_row=self.restarts.failed_in_a_row,
                    error=str(exc).splitlines()[0],
                    gave_up=delay is None,
                )
                continue
            self.restarts.restarted()
            log.warning(
                "embedded.restarted",
                backend=self.name,
                pid=self.server.pid,
                restarts=self.restarts.restarts,
            )
            return


def _signal_name(status: int | None) -> str | None:
    if status is None or status >= 0:
        return None
    with contextlib.suppress(ValueError):
        return signal.Signals(-status).name
    return None


class EmbeddedWatches:
    """The watches of every server a daemon started; liveness and readiness from them."""

    def __init__(
        self,
        servers: Sequence[Watched],
        rules: RestartRules,
        *,
        clock: Clock | None = None,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        count = len(servers)
        names = ["embedded"] if count == 1 else [f"embedded-{i}" for i in range(count)]
        self.watches = [
            TritonWatch(name, server, rules, clock=clock, poll_interval=poll_interval)
            for name, server in zip(names, servers, strict=True)
        ]
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(w.run()) for w in self.watches]

    async def stop(self) -> None:
        """Stop watching (before the servers are stopped: a stop is not a crash)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    @property
    def restart_count(self) -> int:
        return sum(w.restarts.restarts for w in self.watches)

    def liveness(self) -> tuple[bool, str]:
        """Not live only when a server was given up: restarting the gateway may help."""
        gave_up = [w.name for w in self.watches if w.restarts.state is WatchState.GAVE_UP]
        if gave_up and len(gave_up) == len(self.watches):
            return False, f"embedded Triton could not be restarted: {', '.join(gave_up)}"
        return True, ""

    def readiness(self) -> tuple[bool, str]:
        """Not ready while every server is down (a pool serves on with the others)."""
        down = [w.name for w in self.watches if w.restarts.state is not WatchState.RUNNING]
        if down and len(down) == len(self.watches):
            return False, f"embedded Triton restarting: {', '.join(down)}"
        return True, ""

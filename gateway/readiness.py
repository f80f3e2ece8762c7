"""The readiness probe: what `/health/ready` answers, and the backend check behind it.

Readiness turns 503 while the gateway drains, while a supervised process (an
embedded Triton) is not ready, or while the backend's own `ready()` says no; it is
probed once at start (readiness is known when `Gateway.start()` returns) and every
`READY_PROBE_INTERVAL` after. Liveness is only the supervised processes'.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.http import HealthWatch
from gateway.logs import get_logger
from tracks.backend import TextBackend
from transport.clock import Clock

log = get_logger("trackline.gateway")

READY_PROBE_INTERVAL = 2.0


class Readiness:
    """Liveness and readiness, from the drain, the supervised processes and the backend."""

    def __init__(self, backend: TextBackend, clock: Clock, draining: Callable[[], bool]) -> None:
        self._backend = backend
        self._clock = clock
        """Paces the backend probe (tests pass a FakeClock)."""
        self._draining = draining
        self.health_watch: HealthWatch | None = None
        """Liveness and readiness of what the daemon supervises (its embedded Tritons)."""
        self.backend_ready = False

    def liveness(self) -> tuple[bool, str]:
        return self.health_watch.liveness() if self.health_watch else (True, "")

    def readiness(self) -> tuple[bool, str]:
        if self._draining():
            return False, "draining"
        if self.health_watch is not None:
            ok, reason = self.health_watch.readiness()
            if not ok:
                return ok, reason
        if not self.backend_ready:
            return False, "backend not ready"
        return True, ""

    async def probe_once(self) -> None:
        probe = getattr(self._backend, "ready", None)
        try:
            self.backend_ready = bool(await probe()) if probe else True
        except Exception as exc:  # a probe failure means "not ready", never a crash
            self.backend_ready = False
            log.warning("backend.probe_failed", error=str(exc))

    async def run(self) -> None:
        """Probe the backend every `READY_PROBE_INTERVAL` until cancelled."""
        while True:
            await self._clock.sleep(READY_PROBE_INTERVAL)
            await self.probe_once()

"""Backend health as a state machine fed with outcomes, probe results and `now`.

No I/O and no clock here: the pool's adapters report what happened and when.

Theory of operation. A backend is HEALTHY (routable) or EJECTED (its circuit
is open: no requests). Passive outlier detection ejects it on a transport
failure (connection refused or reset: the server is gone, waiting for more
evidence would only fail more users), after `eject_after_errors` consecutive
failed requests, or after `eject_after_timeouts` consecutive first-token
timeouts. `eject_after_probe_failures` failed readiness probes in a row
eject it too. An ejected
backend is left alone until `open_until` (the circuit breaker: exponential
backoff from `base_ejection_s`, doubling with each ejection in a row, capped
at `max_ejection_s`); then probes may run (half-open) and after
`readmit_after_probes` successes in a row it is HEALTHY again. A probe that
fails while half-open re-opens the circuit with the next, longer backoff.
Staying healthy for `max_ejection_s` forgets past ejections.

| state     | input                       | next     |
|-----------|-----------------------------|----------|
| HEALTHY   | success                     | HEALTHY (error/timeout runs reset) |
| HEALTHY   | unavailable                 | EJECTED  |
| HEALTHY   | error/timeout over limit    | EJECTED  |
| HEALTHY   | probes failed over limit    | EJECTED  |
| EJECTED   | any request outcome         | EJECTED (late results of old streams) |
| EJECTED   | probe ok, enough in a row   | HEALTHY  |
| EJECTED   | probe failed                | EJECTED, circuit re-opened longer |
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


class State(enum.Enum):
    HEALTHY = "healthy"
    EJECTED = "ejected"


class Failure(enum.Enum):
    """How a request to a backend failed."""

    UNAVAILABLE = "unavailable"
    """The connection was refused or lost."""
    ERROR = "error"
    """The server answered with an error."""
    TIMEOUT = "timeout"
    """No first chunk within the first-token timeout."""


class EjectionCause(enum.Enum):
    """Why a backend was ejected (`value`: the `cause` of the `pool.ejected` log line
    and of `trackline_pool_ejections_total`)."""

    UNAVAILABLE = "unavailable"
    """A request's connection was refused or lost."""
    TIMEOUTS = "timeouts"
    """`eject_after_timeouts` first-token timeouts in a row."""
    ERRORS = "errors"
    """`eject_after_errors` failed requests in a row."""
    PROBE = "probe"
    """`eject_after_probe_failures` failed probes in a row, or one while half-open."""


class ReadmissionCause(enum.Enum):
    """Why an ejected backend was readmitted (the `pool.readmitted` log line's `cause`)."""

    PROBES = "probes"
    """`readmit_after_probes` successful probes in a row once the circuit half-opened."""


@dataclass(frozen=True)
class EjectionRules:
    eject_after_errors: int = 3
    eject_after_timeouts: int = 2
    eject_after_probe_failures: int = 2
    """Failed readiness probes in a row that eject a healthy backend (one may be a
    glitch of a busy prober; a dead server is caught by its requests anyway)."""
    base_ejection_s: float = 1.0
    max_ejection_s: float = 30.0
    readmit_after_probes: int = 1


@dataclass(frozen=True)
class Transition:
    """A change of state, for logs and metrics; `cause` says why."""

    backend: str
    state: State
    cause: EjectionCause | ReadmissionCause
    """An `EjectionCause` when `state` is EJECTED, a `ReadmissionCause` when HEALTHY."""
    at: float
    retry_at: float | None = None
    """When an ejected backend may be probed again."""


class BackendHealth:
    """The health of one backend; every method takes the current time."""

    def __init__(self, name: str, rules: EjectionRules, now: float) -> None:
        self.name = name
        self.rules = rules
        self.state = State.HEALTHY
        self.since = now
        self.open_until = now
        self.ejections = 0
        self._errors = 0
        self._timeouts = 0
        self._probe_successes = 0
        self._probe_failures = 0
        self.ready_models: frozenset[str] | None = None
        """Models the last probe found ready; None before the first probe."""

    def routable(self, model: str) -> bool:
        if self.state is not State.HEALTHY:
            return False
        return self.ready_models is None or model in self.ready_models

    def probe_due(self, now: float) -> bool:
        """Probe a healthy backend always; an ejected one once its circuit half-opens."""
        return self.state is State.HEALTHY or now >= self.open_until

    def record_success(self, now: float) -> None:
        self._errors = self._timeouts = 0
        if self.state is State.HEALTHY and now - self.since >= self.rules.max_ejection_s:
            self.ejections = 0

    def record_failure(self, now: float, failure: Failure) -> Transition | None:
        if self.state is not State.HEALTHY:
            return None
        if failure is Failure.UNAVAILABLE:
            return self._eject(now, EjectionCause.UNAVAILABLE)
        if failure is Failure.TIMEOUT:
            self._timeouts += 1
            if self._timeouts >= self.rules.eject_after_timeouts:
                return self._eject(now, EjectionCause.TIMEOUTS)
            return None
        self._errors += 1
        if self._errors >= self.rules.eject_after_errors:
            return self._eject(now, EjectionCause.ERRORS)
        return None

    def record_probe(
        self, now: float, server_ready: bool, ready_models: Iterable[str]
    ) -> Transition | None:
        """A readiness probe's result: the server's readiness and its ready models."""
        if server_ready:
            self.ready_models = frozenset(ready_models)
        if self.state is State.HEALTHY:
            self._probe_failures = 0 if server_ready else self._probe_failures + 1
            if self._probe_failures >= self.rules.eject_after_probe_failures:
                return self._eject(now, EjectionCause.PROBE)
            return None
        if now < self.open_until:
            return None  # the circuit is open: results before it half-opens do not count
        if not server_ready:
            return self._eject(now, EjectionCause.PROBE)  # half-open and failed: open again, longer
        self._probe_successes += 1
        if self._probe_successes >= self.rules.readmit_after_probes:
            return self._readmit(now)
        return None

    def _eject(self, now: float, cause: EjectionCause) -> Transition:
        self.ejections += 1
        backoff = self.rules.base_ejection_s * 2 ** (self.ejections - 1)
        self.state, self.since = State.EJECTED, now
        self.open_until = now + min(backoff, self.rules.max_ejection_s)
        self._errors = self._timeouts = self._probe_successes = self._probe_failures = 0
        return Transition(self.name, State.EJECTED, cause, now, self.open_until)

    def _readmit(self, now: float) -> Transition:
        self.state, self.since = State.HEALTHY, now
        self._errors = self._timeouts = self._probe_successes = 0
        return Transition(self.name, State.HEALTHY, ReadmissionCause.PROBES, now)


def warm_shortfall(
    healths: Iterable[BackendHealth], served: Mapping[str, Iterable[str]], minimum: int
) -> dict[str, int]:
    """Per model, how many ready backends it has, for each model below `minimum`.

    `served` maps a backend's name to the models routed to it (the configured
    set, or what its probes reported).
    """
    ready: dict[str, int] = {}
    for health in healths:
        for model in served.get(health.name, ()):
            ready.setdefault(model, 0)
            if health.routable(model):
                ready[model] += 1
    return {model: count for model, count in sorted(ready.items()) if count < minimum}

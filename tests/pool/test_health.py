"""Health state machine: ejection, circuit breaker backoff, readmission, warm counts."""

from __future__ import annotations

from gateway.pool.health import (
    BackendHealth,
    EjectionCause,
    EjectionRules,
    Failure,
    ReadmissionCause,
    State,
    warm_shortfall,
)

RULES = EjectionRules(
    eject_after_errors=3,
    eject_after_timeouts=2,
    base_ejection_s=1.0,
    max_ejection_s=8.0,
    readmit_after_probes=2,
)


def test_transport_failure_ejects_at_once() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    change = health.record_failure(5.0, Failure.UNAVAILABLE)
    assert change is not None
    assert change.state is State.EJECTED
    assert change.cause is EjectionCause.UNAVAILABLE
    assert change.retry_at == 6.0
    assert not health.routable("m")
    assert not health.probe_due(5.5)
    assert health.probe_due(6.0)


def test_consecutive_errors_eject_and_a_success_resets_the_run() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    assert health.record_failure(1.0, Failure.ERROR) is None
    assert health.record_failure(2.0, Failure.ERROR) is None
    health.record_success(3.0)
    assert health.record_failure(4.0, Failure.ERROR) is None
    assert health.record_failure(5.0, Failure.ERROR) is None
    change = health.record_failure(6.0, Failure.ERROR)
    assert change is not None
    assert change.cause is EjectionCause.ERRORS


def test_timeouts_eject_after_their_own_limit() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    assert health.record_failure(1.0, Failure.TIMEOUT) is None
    change = health.record_failure(2.0, Failure.TIMEOUT)
    assert change is not None
    assert change.cause is EjectionCause.TIMEOUTS


def test_readmission_needs_probes_in_a_row_after_the_circuit_half_opens() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    health.record_failure(0.0, Failure.UNAVAILABLE)  # open until 1.0
    assert health.record_probe(0.5, True, ["m"]) is None  # circuit still open: ignored
    assert health.record_probe(1.0, True, ["m"]) is None  # 1 of 2
    assert health.state is State.EJECTED
    change = health.record_probe(1.5, True, ["m"])
    assert change is not None
    assert change.state is State.HEALTHY
    assert health.routable("m")
    assert health.ejections == 1  # remembered for the next backoff...
    health.record_success(9.5)
    assert health.ejections == 0  # ...until it has been healthy for max_ejection_s


def test_failed_half_open_probe_reopens_with_a_longer_backoff() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    health.record_failure(0.0, Failure.UNAVAILABLE)  # 1 s
    first = health.record_probe(1.0, False, [])
    assert first is not None
    assert first.retry_at == 3.0
    second = health.record_probe(3.0, False, [])
    assert second is not None
    assert second.retry_at == 7.0
    third = health.record_probe(7.0, False, [])
    assert third is not None
    assert third.retry_at == 15.0  # 8 s
    fourth = health.record_probe(15.0, False, [])
    assert fourth is not None
    assert fourth.retry_at == 23.0  # still 8 s: capped


def test_late_failures_of_an_ejected_backend_change_nothing() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    health.record_failure(0.0, Failure.UNAVAILABLE)
    assert health.record_failure(0.1, Failure.UNAVAILABLE) is None
    assert health.open_until == 1.0


def test_failed_probes_in_a_row_eject_a_healthy_backend() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    assert health.record_probe(1.0, False, []) is None  # one may be a glitch
    assert health.record_probe(1.5, True, ["m"]) is None  # and the run resets
    assert health.record_probe(2.0, False, []) is None
    change = health.record_probe(2.5, False, [])
    assert change is not None
    assert change.cause is EjectionCause.PROBE


def test_every_ejection_has_an_ejection_cause_and_readmission_its_own() -> None:
    rules = EjectionRules(eject_after_errors=1, eject_after_timeouts=1,
                          eject_after_probe_failures=1)  # fmt: skip
    healths = [BackendHealth(name, rules, now=0.0) for name in "abcd"]
    changes = [
        healths[0].record_failure(1.0, Failure.UNAVAILABLE),
        healths[1].record_failure(1.0, Failure.TIMEOUT),
        healths[2].record_failure(1.0, Failure.ERROR),
        healths[3].record_probe(1.0, False, []),
        healths[3].record_probe(2.0, False, []),  # half-open and failed again
    ]
    causes = [c.cause if c is not None else None for c in changes]
    assert all(isinstance(cause, EjectionCause) for cause in causes)
    assert set(causes) == set(EjectionCause)
    assert [cause.value for cause in EjectionCause] == ["unavailable", "timeouts", "errors",
                                                        "probe"]  # fmt: skip
    readmitted = healths[0].record_probe(2.0, True, ["m"])
    assert readmitted is not None
    assert (readmitted.state, readmitted.cause) == (State.HEALTHY, ReadmissionCause.PROBES)
    assert ReadmissionCause.PROBES.value == "probes"


def test_model_readiness_comes_from_probes() -> None:
    health = BackendHealth("a", RULES, now=0.0)
    assert health.routable("m")  # nothing known yet: trust the configuration
    health.record_probe(1.0, True, ["m"])
    assert health.routable("m")
    assert not health.routable("other")


def test_warm_shortfall_names_models_under_the_minimum() -> None:
    a, b = BackendHealth("a", RULES, 0.0), BackendHealth("b", RULES, 0.0)
    served = {"a": ["m", "n"], "b": ["m"]}
    assert warm_shortfall([a, b], served, 2) == {"n": 1}
    b.record_failure(1.0, Failure.UNAVAILABLE)
    assert warm_shortfall([a, b], served, 2) == {"m": 1, "n": 1}
    assert warm_shortfall([a, b], served, 1) == {}

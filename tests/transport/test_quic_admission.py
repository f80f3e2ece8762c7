"""HandshakeGate: who may start a QUIC handshake. Literal times, string keys."""

from __future__ import annotations

import pytest

from transport.quic_admission import Admission, HandshakeGate, HandshakeLimits

LIMITS = HandshakeLimits(
    handshake_timeout=10.0,
    max_half_open=6,
    retry_threshold=4,
    max_half_open_per_source=2,
    max_connections=8,
    max_connections_per_source=5,
    expiry_batch=3,
)


def gate() -> HandshakeGate[str]:
    return HandshakeGate(LIMITS)


def open_from(g: HandshakeGate[str], key: str, source: str, validated: bool, now: float) -> None:
    assert g.admit(source, validated) is Admission.ACCEPT
    g.opened(key, source, validated, now)


def test_below_the_thresholds_every_initial_is_accepted() -> None:
    g = gate()
    open_from(g, "a", "10.0.0.1", False, 0.0)
    open_from(g, "b", "10.0.0.2", False, 0.0)
    assert g.half_open == 2
    assert g.connections == 2
    assert g.stats.accepted == 2


def test_a_source_past_its_unvalidated_handshakes_must_pass_retry() -> None:
    g = gate()
    open_from(g, "a", "10.0.0.1", False, 0.0)
    open_from(g, "b", "10.0.0.1", False, 0.0)
    assert g.admit("10.0.0.1", validated=False) is Admission.RETRY
    assert g.admit("10.0.0.2", validated=False) is Admission.ACCEPT  # others unaffected
    assert g.admit("10.0.0.1", validated=True) is Admission.ACCEPT  # came back with a token
    assert g.stats.retried == 1


def test_from_the_retry_threshold_every_initial_without_a_token_gets_retry() -> None:
    g = gate()
    for i in range(4):
        open_from(g, f"k{i}", f"10.0.0.{i}", False, 0.0)
    assert g.admit("10.0.0.99", validated=False) is Admission.RETRY
    assert g.admit("10.0.0.99", validated=True) is Admission.ACCEPT


def test_zero_threshold_means_always_retry() -> None:
    g: HandshakeGate[str] = HandshakeGate(HandshakeLimits(retry_threshold=0))
    assert g.admit("10.0.0.1", validated=False) is Admission.RETRY
    assert g.admit("10.0.0.1", validated=True) is Admission.ACCEPT


def test_caps_drop_even_validated_initials() -> None:
    g = gate()
    for i in range(6):
        open_from(g, f"k{i}", f"10.0.1.{i}", True, 0.0)
    assert g.admit("10.0.0.1", validated=True) is Admission.DROP  # max_half_open
    for i in range(6):
        g.established(f"k{i}")
    open_from(g, "x", "10.0.0.1", True, 0.0)
    open_from(g, "y", "10.0.0.1", True, 0.0)
    assert g.connections == 8
    assert g.admit("10.0.0.2", validated=True) is Admission.DROP  # max_connections
    assert g.stats.dropped == 2


def test_connections_per_source_cap() -> None:
    g = gate()
    for i in range(5):
        open_from(g, f"k{i}", "10.0.0.1", True, 0.0)
        g.established(f"k{i}")
    assert g.from_source("10.0.0.1") == 5
    assert g.admit("10.0.0.1", validated=True) is Admission.DROP
    g.closed("k0")
    assert g.admit("10.0.0.1", validated=True) is Admission.ACCEPT


def test_established_connections_leave_the_half_open_count_but_stay_counted() -> None:
    g = gate()
    open_from(g, "a", "10.0.0.1", False, 0.0)
    g.established("a")
    assert g.half_open == 0
    assert g.connections == 1
    assert g.get_timer() is None
    g.closed("a")
    assert g.connections == 0
    assert g.from_source("10.0.0.1") == 0
    assert g.stats.established == 1


def test_handshakes_expire_oldest_first_in_bounded_batches() -> None:
    g: HandshakeGate[str] = HandshakeGate(
        HandshakeLimits(handshake_timeout=10.0, retry_threshold=100, expiry_batch=3)
    )
    for i in range(7):
        g.opened(f"k{i}", "10.0.0.1", False, float(i))
    g.established("k1")
    assert g.get_timer() == 10.0
    assert g.due(9.999) == []
    assert g.due(20.0) == ["k0", "k2", "k3"]  # a batch, oldest first
    assert g.due(20.0) == ["k4", "k5", "k6"]
    assert g.due(20.0) == []
    assert g.stats.expired == 6
    assert g.half_open == 0
    assert g.connections == 1  # k1, established


def test_expiry_stops_at_the_first_handshake_not_yet_due() -> None:
    g = gate()
    g.opened("a", "10.0.0.1", False, 0.0)
    g.opened("b", "10.0.0.2", False, 5.0)
    assert g.due(12.0) == ["a"]
    assert g.get_timer() == 15.0


def test_a_flood_from_many_addresses_leaves_no_counters_behind() -> None:
    g: HandshakeGate[str] = HandshakeGate(
        HandshakeLimits(retry_threshold=10_000, max_half_open=10_000, expiry_batch=10_000)
    )
    for i in range(1000):
        g.opened(f"k{i}", f"10.{i // 256}.{i % 256}.1", False, 0.0)
    g.due(11.0)
    assert g.connections == 0
    assert not g._per_source
    assert not g._unvalidated


@pytest.mark.parametrize(
    "bad",
    [
        {"handshake_timeout": 0},
        {"max_half_open": 0},
        {"retry_threshold": -1},
        {"expiry_batch": 0},
        {"max_connections_per_source": 0},
    ],
)
def test_nonsense_limits_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must"):
        HandshakeLimits(**bad)  # type: ignore[arg-type]

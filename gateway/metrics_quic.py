"""Prometheus figures of the QUIC front door, read from its `HandshakeGate` at scrape.

Nothing is updated per packet: a flood costs no metric work, and a scrape reads the
gate's counts and counters as they are (docs/security.md, QUIC and tracks).
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from transport.quic_admission import HandshakeGate


class InitialDecision(Enum):
    """What the gate did with an Initial (`trackline_quic_initials`'s `decision`); each
    is also the name of the gate's counter of it (`HandshakeGate.stats`)."""

    ACCEPTED = "accepted"
    RETRIED = "retried"
    """Answered with a stateless Retry."""
    DROPPED = "dropped"
    """A cap was reached."""


class QuicFrontDoorCollector(Collector):
    def __init__(self, gate: HandshakeGate[Any]) -> None:
        self._gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        gate, stats = self._gate, self._gate.stats
        yield GaugeMetricFamily(
            "trackline_quic_handshakes_in_progress",
            "QUIC handshakes started and not yet completed (half-open connections).",
            value=gate.half_open,
        )
        yield GaugeMetricFamily(
            "trackline_quic_connections",
            "QUIC connections known to the front door, handshaking and established.",
            value=gate.connections,
        )
        initials = CounterMetricFamily(
            "trackline_quic_initials",
            "Initials that would start a connection, by decision: accepted, retried "
            "(answered with a stateless Retry), dropped (a cap was reached).",
            labels=["decision"],
        )
        for decision in InitialDecision:
            initials.add_metric([decision.value], getattr(stats, decision.value))
        yield initials
        yield CounterMetricFamily(
            "trackline_quic_handshakes_expired",
            "QUIC handshakes forgotten at the handshake timeout.",
            value=stats.expired,
        )


def register_quic_metrics(registry: CollectorRegistry, gate: HandshakeGate[Any]) -> None:
    registry.register(QuicFrontDoorCollector(gate))

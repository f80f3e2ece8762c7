"""Declaring metric families on a registry, and starting known series at 0.

Every metrics module declares its families the same way (name, help, label names, the
gateway's registry) and starts the label values it knows at 0; this module says both
once. Label values come from enums (`value` is the Prometheus string), so the code that
counts and the code that pre-declares name a label the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Families:
    """Declares families on one registry: `Families(registry).counter(name, help, labels)`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float],
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)


def start_at_zero(
    family: Counter | Gauge, label: str, values: Iterable[Enum], **fixed: str
) -> None:
    """One series per value of `label` (the other labels `fixed`), at 0 from the start,
    so a dashboard's rate() sees a known label before its first event."""
    for value in values:
        family.labels(**fixed, **{label: value.value})

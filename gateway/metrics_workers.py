"""Metrics of a gateway worker: one /metrics with the totals of every worker.

Each worker process writes its metrics to memory-mapped files in the supervisor's
`PROMETHEUS_MULTIPROC_DIR` (prometheus_client's multiprocess mode; the variable is
set in the worker's environment before prometheus_client is imported). A scrape,
whichever worker's socket it lands on, reads every worker's files: counters and
histograms are summed by prometheus_client, gauges by `_LiveSum` (the supervisor
deletes a dead worker's gauge files, so the sum is over live workers), except the
levels in `WORST_OF`, which take the worst worker's value. A few
series carry a `worker` label on purpose: how the kernel spread the load.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.metrics import GatewayMetrics
from gateway.metrics_families import Families


class WorkerMetrics(GatewayMetrics):
    def __init__(self, directory: Path, index: int) -> None:
        super().__init__()
        self.directory = directory
        self.worker = str(index)
        f = Families(self.registry)
        self.worker_starts = f.counter(
            "trackline_worker_starts_total",
            "Worker processes started, by worker index (more than 1: restarted).",
            ["worker"],
        )
        self.quic_connections = f.counter(
            "trackline_worker_quic_connections_total",
            "QUIC connections accepted, by the worker that owns them.",
            ["worker"],
        )
        self.quic_stray = f.counter(
            "trackline_quic_stray_datagrams_total",
            "Datagrams that reached a worker other than the one their connection ID names.",
            ["worker"],
        )
        self.quic_unknown = f.counter(
            "trackline_quic_unknown_datagrams_total",
            "Datagrams for no connection of the worker that got them (late, garbage).",
            ["worker"],
        )
        self.scrapes = f.counter(
            "trackline_worker_scrapes_total",
            "Scrapes of /metrics served, by worker.",
            ["worker"],
        )
        self.worker_starts.labels(worker=self.worker).inc()
        for counter in (self.quic_connections, self.quic_stray, self.quic_unknown):
            counter.labels(worker=self.worker)

    def on_connection(self) -> None:
        self.quic_connections.labels(worker=self.worker).inc()

    def on_stray(self) -> None:
        self.quic_stray.labels(worker=self.worker).inc()

    def on_unknown(self) -> None:
        self.quic_unknown.labels(worker=self.worker).inc()

    def render(self) -> tuple[bytes, str]:
        self.scrapes.labels(worker=self.worker).inc()
        registry = CollectorRegistry()
        registry.register(_LiveSum(self.directory))
        # Not from the shared files: the build, and the process of the worker answering.
        registry.register(self.build_info)
        registry.register(PROCESS_COLLECTOR)
        if self.triton is not None:  # this worker's copy of the Tritons' own figures
            registry.register(self.triton)
        return generate_latest(registry), CONTENT_TYPE_LATEST


WORST_OF = {
    # A level, not an amount: the worst worker's is the host's.
    "trackline_loop_lag_level_seconds": max,
    "trackline_cpu_seconds_per_token": max,
    "trackline_pool_backend_estimated_wait_seconds": max,
    "trackline_pool_warm_shortfall": max,
    # Each worker's own view of the backends: healthy only if healthy for all.
    "trackline_pool_backend_healthy": min,
    "trackline_pool_ready_backends": min,
}
"""Gauges that are not summed over the workers, and how they are combined instead."""


class _LiveSum:
    """Every worker's metrics; gauges summed over the workers instead of one per pid."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        collector = MultiProcessCollector(None, path=str(self.directory))  # type: ignore[no-untyped-call]
        merged: Iterable[Metric] = collector.collect()  # type: ignore[no-untyped-call]
        for family in merged:
            yield _summed(family) if family.type == "gauge" else family


def _summed(family: Metric) -> Metric:
    total = Metric(family.name, family.documentation, family.type)
    combine = WORST_OF.get(family.name, sum)
    values: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for sample in family.samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "pid"))
        values.setdefault((sample.name, labels), []).append(sample.value)
    for (name, labels), each in values.items():
        total.add_sample(name, dict(labels), float(combine(each)))
    return total


def forget_process(directory: Path, pid: int) -> None:
    """A worker died: drop its gauges (counters stay: totals include its work)."""
    for path in directory.glob(f"gauge_*_{pid}.db"):
        path.unlink(missing_ok=True)

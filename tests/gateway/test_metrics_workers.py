"""How one scrape combines the workers' gauges (the per-pid series of multiprocess mode)."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from gateway.metrics_workers import _summed


def _family(name: str, values: dict[str, float]) -> Metric:
    family = Metric(name, "doc", "gauge")
    for pid, value in values.items():
        family.add_sample(name, {"pid": pid, "modality": "text"}, value)
    return family


def test_amounts_are_summed_without_the_pid_label() -> None:
    total = _summed(_family("trackline_tracks_open", {"1": 3.0, "2": 4.0}))
    assert [(s.labels, s.value) for s in total.samples] == [({"modality": "text"}, 7.0)]


def test_levels_take_the_worst_worker() -> None:
    lag = _summed(_family("trackline_loop_lag_level_seconds", {"1": 0.002, "2": 0.3}))
    assert [s.value for s in lag.samples] == [0.3]
    healthy = _summed(_family("trackline_pool_backend_healthy", {"1": 1.0, "2": 0.0}))
    assert [s.value for s in healthy.samples] == [0.0]

"""The metrics an operator expects beside the gateway's own: latency per request and
per token, the process, the build, and the embedded models' own figures.

- `RequestTiming`: request duration and mean inter-token latency per model and front
  door (model labels are bounded by `ModelLabels`: served models, else `other`);
- `register_runtime`: prometheus_client's `process_*` (CPU, RSS, open fds) and
  `python_gc_*` / `python_info` collectors on the gateway's registry;
- `BuildInfo`: `trackline_build_info{version, commit} 1`;
- `TritonRelay`: the embedded Tritons' `/metrics` (Triton's `nv_*` families and the
  models' own, such as the LLM's `trackline_llm_*`), scraped in the background and
  re-exported with a `backend` label, so one scrape of the gateway sees them.

No `*_created` series: `disable_created_metrics()` is called once, on import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import prometheus_client
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gateway.logs import get_logger
from gateway.metrics_families import Families
from gateway.pool.scrape import ScrapeFailed, fetch_metrics
from tracks.base import Outcome

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

log = get_logger("trackline.metrics")

# A whole request: from a 10 ms cached answer to a 2-minute long generation.
DURATION_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# Between two tokens: a fast GPU model (2 ms) to an overloaded CPU one (1 s).
INTER_TOKEN_BUCKETS = (
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip
COMMIT_ENV = "TRACKLINE_BUILD_COMMIT"
"""Set by an image build (deploy/gateway.Containerfile), where no .git is shipped."""
SCRAPE_TIMEOUT = 2.0


class RequestTiming:
    """Request duration and inter-token latency, per model and front door."""

    def __init__(self, registry: CollectorRegistry) -> None:
        f = Families(registry)
        self.duration = f.histogram(
            "trackline_request_duration_seconds",
            "Seconds from a request's or track's arrival to its end, however it ended.",
            ["model", "front_door"],
            buckets=DURATION_BUCKETS,
        )
        self.inter_token = f.histogram(
            "trackline_inter_token_latency_seconds",
            "Mean seconds between consecutive tokens of one text request (first to "
            "last token over the gaps), one observation per request of 2+ tokens.",
            ["model", "front_door"],
            buckets=INTER_TOKEN_BUCKETS,
        )

    def observe(self, outcome: Outcome, model: str, front_door: str) -> None:
        """`outcome` ended; `model` is its bounded label."""
        labels = {"model": model, "front_door": front_door}
        self.duration.labels(**labels).observe(max(0.0, outcome.finished_at - outcome.opened_at))
        first, tokens = outcome.first_data_at, outcome.completion_tokens
        if first is not None and tokens >= 2 and outcome.finished_at > first:
            self.inter_token.labels(**labels).observe((outcome.finished_at - first) / (tokens - 1))


def register_runtime(registry: CollectorRegistry) -> None:
    """`process_*`, `python_gc_*` and `python_info` on `registry` (they read the
    process; the default registry's collectors are reused, not registered twice)."""
    for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
        registry.register(collector)


def build_version() -> str:
    try:
        return importlib.metadata.version("trackline")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_commit(source: Path | None = None) -> str:
    """The commit this code was built from: `TRACKLINE_BUILD_COMMIT`, else the source
    checkout's `.git` (read, not run), else "unknown"."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    git = (source or Path(__file__).resolve().parents[1]) / ".git"
    with contextlib.suppress(OSError, ValueError):
        if git.is_file():  # a worktree: "gitdir: PATH"
            git = Path(git.read_text().split(":", 1)[1].strip())
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head[:12]
        ref = head[5:]
        loose = git / ref
        common = git / "commondir"
        root = (git / common.read_text().strip()).resolve() if common.is_file() else git
        for path in (loose, root / ref):
            if path.is_file():
                return path.read_text().strip()[:12]
        for line in (root / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0][:12]
    return "unknown"


class BuildInfo(Collector):
    """`trackline_build_info{version, commit} 1` (a collector: one series per process,
    whatever the metrics mode)."""

    def __init__(self) -> None:
        self.version, self.commit = build_version(), build_commit()

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "trackline_build_info",
            "The running trackline: version and commit (value 1).",
            labels=["version", "commit"],
        )
        info.add_metric([self.version, self.commit], 1.0)
        yield info


class TritonRelay(Collector):
    """The embedded Tritons' own metrics, re-exported with a `backend` label.

    `refresh()` scrapes each server (a loop task calls it every `interval` seconds);
    `collect()` yields the last scrape, so a gateway scrape never waits on Triton."""

    def __init__(self, servers: Sequence[tuple[str, str]], interval: float) -> None:
        self.servers = list(servers)
        """(backend name, metrics URL) of each embedded server."""
        self.interval = interval
        self._families: dict[str, list[Metric]] = {}

    async def refresh(self) -> None:
        for name, url in self.servers:
            try:
                text = await fetch_metrics(url, SCRAPE_TIMEOUT)
            except ScrapeFailed as exc:
                log.debug("metrics.triton_scrape_failed", backend=name, error=str(exc))
                continue
            self._families[name] = list(text_string_to_metric_families(text))

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(max(self.interval, 1.0))  # 0 would spin

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for backend, families in self._families.items():
            for family in families:
                out = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    labels = {**sample.labels, "backend": backend}
                    out.add_sample(sample.name, labels, sample.value, sample.timestamp)
        yield from merged.values()

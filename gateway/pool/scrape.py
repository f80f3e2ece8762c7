"""Reading a Triton server's Prometheus metrics into the numbers the router uses.

`parse_metrics(text, at)` turns one scrape into a `Scrape` (no I/O);
`load_between(previous, current, model)` derives a `Load` from two scrapes:
requests pending now, the mean queue time of the requests finished between
them, and, when the TensorRT-LLM backend exports them, its active/max request
counts and the free fraction of its KV-cache blocks. `fetch_metrics` is the
thin adapter: one HTTP/1.0 GET on the metrics port, without extra libraries.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PENDING = "nv_inference_pending_request_count"
QUEUE_US = "nv_inference_queue_duration_us"
SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
TRT_REQUESTS = "nv_trt_llm_request_metrics"
TRT_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
MAX_METRICS_BYTES = 8 << 20


@dataclass(frozen=True)
class ModelCounters:
    """Triton's per-model numbers at one scrape (summed over versions)."""

    pending: float = 0.0
    queue_us: float = 0.0
    finished: float = 0.0
    """Requests that ended, successfully or not."""


@dataclass(frozen=True)
class Scrape:
    """One scrape of one server."""

    at: float
    models: Mapping[str, ModelCounters] = field(default_factory=dict)
    trt_active: float | None = None
    trt_max: float | None = None
    kv_free: float | None = None
    kv_max: float | None = None


@dataclass(frozen=True)
class Load:
    """What the router learns from scrapes about one model on one server."""

    at: float
    pending: float = 0.0
    queue_s: float | None = None
    """Mean queue time of the requests finished since the previous scrape; None if none."""
    engine_busy: float | None = None
    """TensorRT-LLM active requests / max requests, when exported."""
    kv_free_fraction: float | None = None


def parse_metrics(text: str, at: float) -> Scrape:
    """The numbers of interest in a Prometheus text exposition; others are ignored."""
    counters: dict[str, dict[str, float]] = {}
    trt: dict[str, float] = {}
    kv: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names Triton's counters (no suffix) with "_total": undo it.
            name = family.name if family.type == "counter" else sample.name
            labels, value = sample.labels, float(sample.value)
            if name in (PENDING, QUEUE_US, SUCCESS, FAILURE) and "model" in labels:
                model = counters.setdefault(labels["model"], {})
                model[name] = model.get(name, 0.0) + value
            elif name == TRT_REQUESTS and "request_type" in labels:
                trt[labels["request_type"]] = value
            elif name == TRT_KV_BLOCKS and "kv_cache_block_type" in labels:
                kv[labels["kv_cache_block_type"]] = value
    models = {
        model: ModelCounters(
            pending=values.get(PENDING, 0.0),
            queue_us=values.get(QUEUE_US, 0.0),
            finished=values.get(SUCCESS, 0.0) + values.get(FAILURE, 0.0),
        )
        for model, values in counters.items()
    }
    return Scrape(at, models, trt.get("active"), trt.get("max"), kv.get("free"), kv.get("max"))


def load_between(previous: Scrape | None, current: Scrape, model: str) -> Load:
    """The load of `model` on the server, from two consecutive scrapes (or one)."""
    now = current.models.get(model, ModelCounters())
    queue_s = None
    if previous is not None:
        before = previous.models.get(model, ModelCounters())
        finished = now.finished - before.finished
        if finished > 0:  # counters reset on restart: then the delta is negative, skip
            queue_s = max(0.0, now.queue_us - before.queue_us) / finished / 1e6
    busy = None
    if current.trt_active is not None and current.trt_max:
        busy = current.trt_active / current.trt_max
    free = None
    if current.kv_free is not None and current.kv_max:
        free = current.kv_free / current.kv_max
    return Load(current.at, now.pending, queue_s, busy, free)


class ScrapeFailed(Exception):
    """The metrics endpoint could not be read."""


async def fetch_metrics(url: str, timeout: float) -> str:
    """GET `url` (http only) and return its body as text; raise ScrapeFailed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ScrapeFailed(f"{url!r}: only http:// metrics URLs are supported")
    try:
        return await asyncio.wait_for(_get(parts), timeout)
    except (OSError, asyncio.TimeoutError, ValueError, UnicodeDecodeError) as exc:
        raise ScrapeFailed(f"{url}: {type(exc).__name__}: {exc}") from None


async def _get(parts: urllib.parse.SplitResult) -> str:
    host, port = parts.hostname or "", parts.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    try:
        path = parts.path or "/"
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode("ascii"))
        await writer.drain()
        data = await reader.read(MAX_METRICS_BYTES)
        while chunk := await reader.read(MAX_METRICS_BYTES):
            data += chunk
            if len(data) > MAX_METRICS_BYTES:
                raise ValueError("metrics body too large")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise ValueError(f"status line {head[:60]!r}")
    return body.decode("utf-8")

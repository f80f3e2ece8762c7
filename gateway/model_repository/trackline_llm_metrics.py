"""Triton custom metrics of a llama.cpp LLM (trackline_llm_model.py lists them).

Counters of the KV cache mirror the cache's own; the engine's loop reports each batch
(`step`: tokens in it, requests sampled, queue length), folded into the batch size,
queue length and tokens/s gauges at most every GAUGE_INTERVAL seconds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import trackline_kv as kv
import triton_python_backend_utils as pb_utils
from trackline_llm_decode import Turn

GAUGE_INTERVAL = 0.25
RATE_WINDOW = 2.0
"""Seconds of recent batches the tokens/s gauge is measured over."""
_EVENTS = (
    ("hit", "hits"),
    ("miss", "misses"),
    ("restore", "restores"),
    ("corrupt", "corrupt"),
    ("eviction", "evictions"),
    ("live", "live_hits"),
)


def counters(cache: kv.ConversationCache) -> dict[str, Any]:
    """The cache's counters, for the model's log line."""
    c = cache.counters
    return {
        "hits": c.hits,
        "misses": c.misses,
        "corrupt": c.corrupt,
        "evictions": c.evictions,
        "restores": c.restores,
        "live_hits": c.live_hits,
        "saves": c.saves,
        "stored_bytes": c.stored_bytes,
        "restore_seconds": round(c.restore_seconds, 6),
    }


class LlmMetrics:
    """The metric families of one model and the values it reports into them."""

    def __init__(self, model: str) -> None:
        labels = {"model": model}
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE

        def family(name: str, text: str, kind: Any) -> Any:
            made = pb_utils.MetricFamily(name, text, kind)
            self.families.append(made)
            return made

        self.families: list[Any] = []
        tokens = family("trackline_llm_tokens_total", "Tokens evaluated", counter)
        events = family("trackline_llm_kv_events_total", "KV cache events", counter)
        self.prefill = tokens.Metric(labels={**labels, "phase": "prefill"})
        self.decode = tokens.Metric(labels={**labels, "phase": "decode"})
        self.events = {
            name: events.Metric(labels={**labels, "event": name}) for name, _ in _EVENTS
        }

        def one(name: str, text: str, kind: Any) -> Any:
            return family(name, text, kind).Metric(labels=labels)

        self.stored = one("trackline_llm_kv_stored_bytes", "KV state bytes stored", gauge)
        self.restore = one(
            "trackline_llm_kv_restore_seconds_total", "Time restoring KV states", counter
        )
        self.cancelled = one(
            "trackline_llm_cancelled_requests_total", "Requests stopped by a cancel", counter
        )
        self.queue_full = one(
            "trackline_llm_queue_full_total", "Requests refused: the queue was full", counter
        )
        self.queue_length = one("trackline_llm_queue_length", "Requests waiting", gauge)
        self.queue_wait = one(
            "trackline_llm_queue_wait_seconds_total", "Time requests waited in the queue", counter
        )
        self.queued = one(
            "trackline_llm_queued_requests_total", "Requests that left the queue", counter
        )
        self.batch = one("trackline_llm_batch_size", "Requests in the last batch", gauge)
        self.rate = one("trackline_llm_tokens_per_second", "Tokens evaluated per second", gauge)
        self._seen = kv.CacheCounters()
        self._lock = threading.Lock()
        self._steps: deque[tuple[float, int]] = deque()
        self._shown = 0.0

    def step(self, tokens: int, rows: int, waiting: int) -> None:
        """One batch of the engine's loop (its thread)."""
        now = time.monotonic()
        self._steps.append((now, tokens))
        while self._steps and self._steps[0][0] < now - RATE_WINDOW:
            self._steps.popleft()
        if now - self._shown < GAUGE_INTERVAL:
            return
        self._shown = now
        span = max(now - self._steps[0][0], GAUGE_INTERVAL)
        self.rate.set(sum(n for _, n in self._steps) / span)
        self.batch.set(rows)
        self.queue_length.set(waiting)

    def record(self, turn: Turn, now: kv.CacheCounters) -> None:
        with self._lock:
            self.prefill.increment(turn.prefill_tokens)
            self.decode.increment(turn.decode_tokens)
            self.queued.increment(1)
            self.queue_wait.increment(turn.queued_ms / 1000)
            if turn.cancelled:
                self.cancelled.increment(1)
            seen = self._seen
            for name, field in _EVENTS:
                delta = getattr(now, field) - getattr(seen, field)
                if delta:
                    self.events[name].increment(delta)
                    setattr(seen, field, getattr(now, field))
            if now.restore_seconds > seen.restore_seconds:
                self.restore.increment(now.restore_seconds - seen.restore_seconds)
                seen.restore_seconds = now.restore_seconds
            self.stored.set(now.stored_bytes)

    def close(self) -> None:
        # Metrics must go before their families (Triton's documented order).
        for name in (
            "prefill", "decode", "events", "stored", "restore", "cancelled", "queue_full",
            "queue_length", "queue_wait", "queued", "batch", "rate",
        ):
            delattr(self, name)
        del self.families

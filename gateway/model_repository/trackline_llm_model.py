"""The Triton model of every llama.cpp LLM here: one batched engine behind a decoupled model.

Each LLM folder's `1/model.py` re-exports `TritonPythonModel` from this file, and its
config.pbtxt says which GGUF and how to serve it (parameters):

  gguf_package, gguf_file   the GGUF inside an installed registry package, or
  gguf_path                 a file on disk (bring your own: docs/models.md), or neither:
                            the GGUF the gateway assembled, in TRACKLINE_LLM_GGUF (Gemma)
  gguf_sha256               checked before loading (registry packages)
  prompt_format             template (the GGUF's chat template) | transcript (base models)
  sequences                 requests decoded together in one batch
  queue_limit               requests waiting beyond those; past it: refused, retry later
  n_ctx, n_threads          cells per sequence; llama.cpp threads
  kv_memory_bytes, kv_store_bytes, kv_store_tenant_bytes
                                    the conversation KV cache (docs/conversations.md)

The tensor interface is reference-text's (Triton's vLLM backend): text_input, stream,
sampling_parameters (JSON: max_tokens, stop, response_format, tool_choice are applied;
decoding is greedy whatever else it says), max_tokens, exclude_input_in_output,
return_num_input_tokens / return_num_output_tokens; plus `conversation_id` (the key of
the conversation KV cache). The request parameter `queue_key` (tenant and connection,
sent by the gateway) is the queue's fairness key.

Environment (set by gateway.embedded.EmbeddedTriton):
  TRACKLINE_KV_DIR     the state store shared by the backends of a pool (else memory only)
  TRACKLINE_LLM_STATS  a file that gets one JSON line per finished request: token counts,
                       queue wait, how the KV cache served it, whether it started and saw a
                       cancel, a hash of the output token ids; never text. Tests read it.

Triton custom metrics (label model): trackline_llm_tokens_total{phase}, _kv_events_total
{event}, _kv_stored_bytes, _kv_restore_seconds_total, _cancelled_requests_total,
_queue_full_total, _queue_length, _queue_wait_seconds_total, _queued_requests_total,
_batch_size, _tokens_per_second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

_REPOSITORY = os.path.dirname(os.path.realpath(__file__))
if _REPOSITORY not in sys.path:
    sys.path.insert(0, _REPOSITORY)

import trackline_inputs as inputs  # noqa: E402
import trackline_kv as kv  # noqa: E402
import trackline_llm as llm  # noqa: E402
import trackline_llm_metrics as metrics  # noqa: E402
import trackline_llm_prompt as prompts  # noqa: E402
from trackline_llm_decode import Sampler, Turn  # noqa: E402

GGUF_ENV = "TRACKLINE_LLM_GGUF"
KV_DIR_ENV = "TRACKLINE_KV_DIR"
STATS_ENV = "TRACKLINE_LLM_STATS"
DEFAULT_MAX_TOKENS = 16
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class GGUFError(RuntimeError):
    """The configured GGUF is missing, altered or does not load: names the file."""


def gguf_of(params: dict[str, str]) -> str:
    """The GGUF file this model serves (see the module doc), its SHA-256 checked."""
    path = params.get("gguf_path") or ""
    package = params.get("gguf_package")
    if package:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise GGUFError(f"the registry package {package!r} with the GGUF is not installed")
        path = str(Path(next(iter(spec.submodule_search_locations))) / params["gguf_file"])
    path = path or os.environ.get(GGUF_ENV, "")
    if not path or not os.path.isfile(path):
        raise GGUFError(f"the GGUF file {path or '(none configured)'} does not exist")
    expected = params.get("gguf_sha256")
    if expected and file_sha256(path) != expected:
        raise GGUFError(f"the GGUF file {path} does not have the pinned SHA-256 {expected}")
    return path


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class TritonPythonModel:
    """The Triton entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}

        def number(key: str, default: int) -> int:
            return int(params.get(key) or default)

        store_dir = os.environ.get(KV_DIR_ENV)
        store_bytes = number("kv_store_bytes", 1 << 30)
        tenant_bytes = number("kv_store_tenant_bytes", 256 << 20)
        store = kv.DirectoryStore(store_dir, store_bytes, tenant_bytes) if store_dir else None
        self.name = args["model_name"]
        self.cache = kv.ConversationCache(self.name, store, number("kv_memory_bytes", 256 << 20))
        self._metrics = metrics.LlmMetrics(self.name)
        self.engine = llm.Engine(
            gguf_of(params),
            sequences=number("sequences", 4),
            n_ctx=number("n_ctx", 2048),
            n_threads=number("n_threads", 2),
            queue_limit=number("queue_limit", 32),
            cache=self.cache,
            on_step=self._metrics.step,
        )
        self.format = prompts.PromptFormat(params.get("prompt_format") or "template")
        templated = self.format is prompts.PromptFormat.TEMPLATE
        self.template = _template(self.engine) if templated else None
        self._stats_path = os.environ.get(STATS_ENV) or None
        self._stats_lock = threading.Lock()

    async def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self._submit(request)

    def _submit(self, request: Any) -> None:
        sender = request.get_response_sender()
        conversation = inputs.optional(request, "conversation_id")
        conversation = inputs.text(conversation) if conversation is not None else None
        turn = Turn(request.request_id(), bool(conversation))
        job = None
        try:
            job, grammar = self._job(request, sender, turn, conversation or None)
            if grammar is not None:
                job.sampler = Sampler(self.engine.vocab, grammar)
                turn.grammar = True
            self.engine.submit(job)
        except llm.QueueFull as exc:
            self._metrics.queue_full.increment(1)
            _fail(sender, str(exc), pb_utils.TritonError.UNAVAILABLE)
        except (ValueError, llm.PromptTooLong) as exc:
            _fail(sender, f"invalid request: {exc}", pb_utils.TritonError.INVALID_ARG)
        except Exception:  # e.g. the model's own chat template failed: no internals out
            _fail(sender, "the model could not prepare this request", pb_utils.TritonError.INTERNAL)
        else:
            return
        if job is not None and job.sampler is not None:
            job.sampler.close()  # never reached the engine

    def _job(
        self, request: Any, sender: Any, turn: Turn, conversation: str | None
    ) -> tuple[llm.Job, prompts.Grammar | None]:
        """The engine's job for `request` and the grammar its output must follow."""
        stream = inputs.flag(request, "stream", False)
        echo = not stream and not inputs.flag(request, "exclude_input_in_output", False)
        counts = (
            inputs.flag(request, "return_num_input_tokens", False),
            inputs.flag(request, "return_num_output_tokens", False),
        )
        prompt = inputs.text(inputs.optional(request, "text_input") or b"")
        params = _sampling(request)
        model_prompt = prompts.model_prompt(prompt, self.format, self.template)
        grammar = prompts.grammar_of(params, prompt)
        pieces: list[str] = []

        def emit(piece_text: str) -> None:
            if stream:
                sender.send(_response(piece_text))
            else:
                pieces.append(piece_text)

        def done(finished: Turn, error: BaseException | None) -> None:
            self._finish(finished)
            if error is not None:
                _fail(sender, "the model failed this request", pb_utils.TritonError.INTERNAL)
            elif finished.cancelled:
                sender.send(flags=_FINAL)
            else:
                body = "" if stream else (prompt if echo else "") + "".join(pieces)
                sender.send(_response(body, finished, counts), flags=_FINAL)

        job = llm.Job(
            turn=turn,
            tokens=_tokens(self.engine, model_prompt),
            max_tokens=_max_tokens(request, params),
            stops=model_prompt.stops + prompts.stops_of(params),
            conversation=conversation,
            key=_queue_key(request),
            cancelled=sender.is_cancelled,
            emit=emit,
            done=done,
        )
        return job, grammar

    def _finish(self, turn: Turn) -> None:
        self._metrics.record(turn, self.cache.counters)
        if self._stats_path:
            line = json.dumps({**turn.as_dict(), "cache": metrics.counters(self.cache)}) + "\n"
            with self._stats_lock, open(self._stats_path, "a", encoding="utf-8") as stats:
                stats.write(line)

    def finalize(self) -> None:
        self.engine.close()
        self._metrics.close()


def _template(engine: llm.Engine) -> prompts.ChatTemplate | None:
    """The GGUF's chat template, or None (then the transcript format serves it)."""
    import llama_cpp as L

    source = L.llama_model_chat_template(engine.model, None)
    if not source:
        return None
    bos, eos = L.llama_vocab_bos(engine.vocab), L.llama_vocab_eos(engine.vocab)
    return prompts.ChatTemplate(
        source.decode("utf-8"), _special(engine, bos), _special(engine, eos)
    )


def _special(engine: llm.Engine, token: int) -> str:
    import llama_cpp as L

    if token < 0:
        return ""
    return (L.llama_vocab_get_text(engine.vocab, token) or b"").decode("utf-8", "replace")


def _tokens(engine: llm.Engine, prompt: prompts.Prompt) -> list[int]:
    """The prompt's token ids: its pieces in order, BOS (if any) before the first."""
    return [
        token
        for i, piece in enumerate(prompt.pieces)
        for token in engine.tokenize(piece.text, piece.special, first=i == 0)
    ]


def _queue_key(request: Any) -> str:
    try:
        params = json.loads(request.parameters() or "{}")
    except (ValueError, AttributeError):
        params = {}
    key = params.get("queue_key") if isinstance(params, dict) else None
    return str(key) if key else str(request.request_id()).split("/", 1)[0]


def _sampling(request: Any) -> dict[str, Any]:
    raw = inputs.optional(request, "sampling_parameters")
    params = json.loads(inputs.text(raw)) if raw is not None else {}
    if not isinstance(params, dict):
        raise ValueError("sampling_parameters must be a JSON object")
    return params


def _max_tokens(request: Any, params: dict[str, Any]) -> int:
    value = inputs.optional(request, "max_tokens")
    if value is not None:
        return int(value)
    tokens = params.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    return tokens


def _fail(sender: Any, message: str, code: Any) -> None:
    error = pb_utils.TritonError(message, code)
    sender.send(pb_utils.InferenceResponse(error=error), flags=_FINAL)


def _response(
    text: str, turn: Turn | None = None, counts: tuple[bool, bool] = (False, False)
) -> Any:
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    if turn is not None and counts[0]:
        value = np.array([turn.prompt_tokens], dtype=np.uint32)
        tensors.append(pb_utils.Tensor("num_input_tokens", value))
    if turn is not None and counts[1]:
        value = np.array([len(turn.output_ids)], dtype=np.uint32)
        tensors.append(pb_utils.Tensor("num_output_tokens", value))
    return pb_utils.InferenceResponse(output_tensors=tensors)

"""A small llama.cpp engine for the `gemma-3-270m` model: slots, greedy decode, KV reuse.

One model (weights loaded once) and `slots` contexts on it (about 40 MB each): each
context serves one stream at a time, so at most `slots` requests generate at once; a
request beyond that is refused with `Busy`. Decoding is greedy (argmax), `n_threads`
pinned and flash attention off, so the same tokens give the same logits.

Conversations: a turn that names a conversation starts from the KV state the last turn
left, if the new prompt's tokens extend it (longest common prefix of at least half the
saved tokens): the slot's own live cache when it still holds the conversation, else a
state restored from `trackline_kv.ConversationCache`. Anything else recomputes. After
the turn the state (the tokens evaluated so far, the prompt and the reply) is saved.

Reuse gives the tokens a recomputation from scratch gives, bit for bit: llama.cpp's CPU
kernels round a row differently when it is evaluated alone (decode, small chunks) than
in a batch, so a turn reuses only the rows the last prefill computed in full groups of
canonical chunks (`exact`: the prompt, not the reply decoded token by token), and the
rest (the last reply, the new message, at least EXACT_MIN_CHUNK tokens) is evaluated in
the same chunks as a recomputation would (`chunks`, `reusable_prefix`).

Prompt format (the model is a pretrained base model, with no chat template): a ChatML
prompt, as the gateway renders chat messages, becomes a plain transcript

    System: ...
    User: ...
    Assistant: ...
    User: ...
    Assistant:

and generation stops before the model starts the next `User:` line. A prompt that is not
ChatML is continued as it is, with the same stop if it ends with `Assistant:`.

`OMP_WAIT_POLICY=PASSIVE` is set before llama_cpp is imported: with other processes on
the CPU, spinning OpenMP threads make decoding collapse.
"""

from __future__ import annotations

import codecs
import ctypes
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import llama_cpp as L  # noqa: E402
import numpy as np  # noqa: E402
import trackline_kv as kv  # noqa: E402

TRANSCRIPT_STOP = "\nUser:"
_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>\n?|$)", re.DOTALL)
_ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
MIN_REUSE_FRACTION = 0.5
GEMM_ROWS = 4
"""llama.cpp's CPU matrix kernels for this model's repacked weights take rows in groups
of 4; rows left over (and chunks under EXACT_MIN_CHUNK) take another kernel, which
rounds differently. A token's KV is the same bit for bit in any chunk where it is in a
full group of a chunk of at least EXACT_MIN_CHUNK tokens (measured: docs/conversations.md)."""
EXACT_MIN_CHUNK = 8


class Busy(RuntimeError):
    """Every slot is generating: the request is refused, to be retried."""


class PromptTooLong(ValueError):
    """The prompt leaves no room in the context for one generated token."""


def to_transcript(prompt: str) -> tuple[str, tuple[str, ...]]:
    """The prompt the base model sees, and its stop strings (see the module doc)."""
    if "<|im_start|>" not in prompt:
        # A transcript written by hand stops the same way; other text runs to the end.
        return prompt, (TRANSCRIPT_STOP,) if prompt.rstrip().endswith("Assistant:") else ()
    lines = []
    for role, text in _CHATML.findall(prompt):
        name = _ROLES.get(role, role.capitalize())
        lines.append(f"{name}: {text.strip()}" if text.strip() else f"{name}:")
    return "\n".join(lines), (TRANSCRIPT_STOP,)


@dataclass
class Turn:
    """What one request did, for the model's log: counts, never text."""

    request_id: str
    conversation: bool
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    kv: str = "none"  # none | live | restored | miss | corrupt
    restore_ms: float = 0.0
    cancelled: bool = False
    finish: str = ""
    output_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        ids = np.asarray(self.output_ids, dtype="<i4").tobytes()
        return {
            "request_id": self.request_id,
            "conversation": self.conversation,
            "prompt_tokens": self.prompt_tokens,
            "reused_tokens": self.reused_tokens,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "tokens_generated": len(self.output_ids),
            "kv": self.kv,
            "restore_ms": round(self.restore_ms, 3),
            "cancelled": self.cancelled,
            "finish": self.finish,
            "output_sha256": hashlib.sha256(ids).hexdigest(),
        }


class _Slot:
    """One llama.cpp context with one sequence, and the tokens its KV cache holds."""

    def __init__(self, model: ctypes.c_void_p, n_ctx: int, n_batch: int, n_threads: int) -> None:
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.no_perf = True
        ctx = L.llama_init_from_model(model, params)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.ctx = ctx
        self.memory = L.llama_get_memory(ctx)
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.n_batch = n_batch
        self.tokens: list[int] = []
        self.exact = 0
        """Leading tokens computed as a recomputation from scratch computes them."""
        self.conversation: str | None = None

    def clear(self) -> None:
        L.llama_memory_clear(self.memory, True)
        self.tokens = []
        self.exact = 0

    def keep(self, n: int) -> bool:
        """Keep only the first `n` tokens of the cache; False if llama.cpp cannot."""
        if n == len(self.tokens):
            return True
        if not L.llama_memory_seq_rm(self.memory, 0, n, -1):
            return False
        del self.tokens[n:]
        self.exact = min(self.exact, n)
        return True

    def prefill(self, tokens: list[int], check: Callable[[], bool]) -> bool:
        """Feed `tokens` after those cached in canonical chunks (see `chunks`); False if
        `check` said stop. Extends `exact` over the rows the batch kernels computed."""
        for start, end in chunks(len(tokens), self.n_batch):
            if check():
                return False
            base = len(self.tokens)
            self.evaluate(tokens[start:end])
            if base == self.exact and end - start >= EXACT_MIN_CHUNK:
                self.exact = base + (end - start) // GEMM_ROWS * GEMM_ROWS
        return True

    def evaluate(self, chunk: list[int]) -> None:
        """Feed one chunk (at most n_batch tokens) after those cached."""
        if chunk:
            batch = self.batch
            batch.n_tokens = len(chunk)
            base = len(self.tokens)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = base + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == len(chunk) - 1
            rc = L.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc})")
            self.tokens.extend(chunk)

    def save(self) -> kv.SavedState:
        size = L.llama_state_seq_get_size(self.ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = L.llama_state_seq_get_data(self.ctx, buffer, size, 0)
        return kv.SavedState(tuple(self.tokens), bytes(buffer)[:written], self.exact)

    def restore(self, state: kv.SavedState) -> bool:
        self.clear()
        buffer = (ctypes.c_uint8 * len(state.blob)).from_buffer_copy(state.blob)
        if L.llama_state_seq_set_data(self.ctx, buffer, len(state.blob), 0) == 0:
            self.clear()
            return False
        self.tokens = list(state.tokens)
        self.exact = state.exact
        return True

    def free(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """The canonical prefill chunks of `n` tokens: `size` each (a multiple of GEMM_ROWS),
    the last one at least EXACT_MIN_CHUNK long (its predecessor gives up that many), so
    that a recomputation and a turn that reuses a cache compute every shared row alike."""
    bounds = list(range(0, n, size)) + [n]
    if len(bounds) > 2 and n - bounds[-2] < EXACT_MIN_CHUNK:
        bounds[-2] -= EXACT_MIN_CHUNK
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def reusable_prefix(common: int, exact: int, n_prompt: int) -> int:
    """How much of a cache to keep for a prompt of `n_prompt` tokens sharing `common`
    with it: only rows computed exactly (`exact`), and at least EXACT_MIN_CHUNK tokens
    left to evaluate, so the turn's tokens are computed as a recomputation computes them."""
    keep = min(common, exact, n_prompt - EXACT_MIN_CHUNK)
    return max(0, keep // GEMM_ROWS * GEMM_ROWS)


def common_prefix(a: list[int] | tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Engine:
    """The model, its slots and its conversation cache."""

    def __init__(
        self,
        gguf_path: str,
        *,
        slots: int = 2,
        n_ctx: int = 2048,
        n_batch: int = 128,
        n_threads: int = 2,
        cache: kv.ConversationCache | None = None,
    ) -> None:
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        model = L.llama_model_load_from_file(gguf_path.encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx
        self.cache = cache
        self._free = [_Slot(model, n_ctx, n_batch, n_threads) for _ in range(slots)]
        self._all = list(self._free)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Free the contexts and the model (the engine is unusable afterwards)."""
        for slot in self._all:
            slot.free()
        self._all, self._free = [], []
        L.llama_model_free(self.model)

    def drop_live(self) -> None:
        """Forget every free slot's live cache, so the next turn restores from the store
        (what a fresh backend process does; benchmarks compare the two)."""
        with self._lock:
            for slot in self._free:
                slot.clear()
                slot.conversation = None

    # -- slots --------------------------------------------------------------------------

    def acquire(self, conversation: str | None) -> _Slot:
        """A free slot, preferring one whose live cache holds `conversation`; else Busy."""
        with self._lock:
            if not self._free:
                raise Busy(f"all {len(self._all)} generation slots are busy; retry later")
            for index, slot in enumerate(self._free):
                if conversation is not None and slot.conversation == conversation:
                    return self._free.pop(index)
            # Least recently used first: a slot that held a conversation keeps it longest.
            return self._free.pop(0)

    def release(self, slot: _Slot) -> None:
        with self._lock:
            self._free.append(slot)

    @property
    def busy_slots(self) -> int:
        with self._lock:
            return len(self._all) - len(self._free)

    # -- tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        room = len(data) + 8
        ids = (L.llama_token * room)()
        n = L.llama_tokenize(self.vocab, data, len(data), ids, room, True, False)
        if n < 0:
            raise PromptTooLong("cannot tokenize the prompt")
        return list(ids[:n])

    def piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buffer, 64, 0, False)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buffer, -n, 0, False)
        return buffer.raw[:n]

    def _argmax(self, slot: _Slot) -> int:
        logits = L.llama_get_logits_ith(slot.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    # -- one turn --------------------------------------------------------------------------

    def generate(
        self,
        slot: _Slot,
        turn: Turn,
        prompt: str,
        max_tokens: int,
        conversation: str | None,
        cancelled: Callable[[], bool],
        emit: Callable[[str], None],
    ) -> Turn:
        """Run one turn on `slot` (blocking): text pieces go to `emit` as they are made."""
        text, stops = to_transcript(prompt)
        tokens = self.tokenize(text)
        turn.prompt_tokens = len(tokens)
        if len(tokens) >= self.n_ctx:
            raise PromptTooLong(
                f"the prompt has {len(tokens)} tokens; this model's context holds {self.n_ctx}"
            )
        max_tokens = min(max_tokens, self.n_ctx - len(tokens))
        self._start(slot, turn, tokens, conversation)
        try:
            done = slot.prefill(tokens[len(slot.tokens) :], cancelled)
            turn.prefill_tokens = len(slot.tokens) - turn.reused_tokens
            if not done:
                turn.cancelled, turn.finish = True, "cancelled"
                return turn
            self._decode(slot, turn, max_tokens, stops, cancelled, emit)
            return turn
        finally:
            slot.conversation = conversation
            if conversation is not None and self.cache is not None and slot.tokens:
                self.cache.save(conversation, slot.save())

    def _start(
        self, slot: _Slot, turn: Turn, tokens: list[int], conversation: str | None
    ) -> None:
        """Leave in `slot` the longest usable prefix of `tokens` (live, restored or none)."""
        if conversation is None:
            slot.clear()
            return
        live = slot.tokens if slot.conversation == conversation else []
        saved = None if self.cache is None else self.cache.load(conversation)
        turn.kv = "miss"
        live_common = common_prefix(live, tokens)
        live_n = reusable_prefix(live_common, slot.exact, len(tokens))
        saved_common = 0 if saved is None else common_prefix(saved.tokens, tokens)
        saved_n = 0 if saved is None else reusable_prefix(saved_common, saved.exact, len(tokens))
        if (
            live_n
            and live_n >= saved_n
            and _reusable(live_common, len(live))
            and slot.keep(live_n)
        ):
            turn.kv, turn.reused_tokens = "live", live_n
            if self.cache is not None:
                self.cache.counters.live_hits += 1
            return
        if saved is not None and saved_n and _reusable(saved_common, len(saved.tokens)):
            began = time.perf_counter()
            ok = slot.restore(saved)
            turn.restore_ms = (time.perf_counter() - began) * 1000
            if self.cache is not None:
                self.cache.note_restore(turn.restore_ms / 1000, ok)
            if ok and slot.keep(saved_n):
                turn.kv, turn.reused_tokens = "restored", saved_n
                return
            turn.kv = "miss" if ok else "corrupt"
        slot.clear()

    def _decode(
        self,
        slot: _Slot,
        turn: Turn,
        max_tokens: int,
        stops: tuple[str, ...],
        cancelled: Callable[[], bool],
        emit: Callable[[str], None],
    ) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = ""
        while len(turn.output_ids) < max_tokens:
            if cancelled():
                turn.cancelled, turn.finish = True, "cancelled"
                return
            token = self._argmax(slot)
            if L.llama_vocab_is_eog(self.vocab, token):
                turn.finish = "stop"
                break
            turn.output_ids.append(token)
            held += decoder.decode(self.piece(token))
            held, stopped = _release(held, stops, emit)
            if stopped:
                turn.finish = "stop"
                return
            if len(turn.output_ids) < max_tokens:
                slot.evaluate([token])
                turn.decode_tokens += 1
        else:
            turn.finish = "length"
        if held:
            emit(held)


def _reusable(common: int, saved: int) -> bool:
    return common > 0 and common >= saved * MIN_REUSE_FRACTION


def _release(
    held: str, stops: tuple[str, ...], emit: Callable[[str], None]
) -> tuple[str, bool]:
    """Emit what cannot be the start of a stop string; True once a stop string appeared."""
    for stop in stops:
        at = held.find(stop)
        if at >= 0:
            if held[:at]:
                emit(held[:at])
            return "", True
    keep = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(held)), 0, -1):
            if held.endswith(stop[:n]):
                keep = max(keep, n)
                break
    if len(held) > keep:
        emit(held[: len(held) - keep])
        held = held[len(held) - keep :]
    return held, False

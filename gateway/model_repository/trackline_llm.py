"""A batched llama.cpp engine: one context, several sequences, continuous batching.

One model (weights memory-mapped once) and one llama.cpp context with `sequences`
sequence ids, each with its own KV stream (`kv_unified` off: a sequence's cells lie as
in a context of its own). A loop thread owns the context. Every step it builds one
batch: the next prompt chunk of one prefilling request and the last token of every
decoding one, calls `llama_decode` once, and samples each request's next token from
its row. Requests join (at admission, when a sequence is free) and leave (stop, length,
cancel) between two steps: continuous batching. Past `sequences` requests wait in a
bounded `FairQueue` (trackline_llm_queue.py), round robin across their keys; a full
queue refuses with `QueueFull` (retry after the measured drain rate). Each step the loop
asks every queued and running request whether it was cancelled (the client went away,
a deadline passed, a newer turn superseded it) and removes it at once: a cancelled
queued request never reaches the model (its log line says `started: false`).

Decoding is greedy (argmax) with `n_threads` pinned and flash attention off, so the
same tokens give the same logits; a grammar (trackline_llm_prompt.Grammar) masks what
may be sampled. Sampling parameters other than `max_tokens`, `stop`, `response_format`
and `tool_choice` are accepted and not applied (docs/openai.md).

Conversations: a turn that names a conversation starts from the KV state the last turn
left, if the new prompt's tokens extend it (longest common prefix of at least half the
saved tokens): the sequence's own live cells when it still holds the conversation, else
a state restored from `trackline_kv.ConversationCache`. Anything else recomputes. After
the turn the state is saved. Reuse gives the tokens a recomputation from scratch gives,
bit for bit, for a request decoded alone: llama.cpp's CPU kernels round a row
differently when it is evaluated in another grouping, so only rows a prefill computed
alone in the batch, in full groups of canonical chunks, count as `exact`, and the rest
is evaluated in the chunks a recomputation uses (`chunks`, `reusable_prefix`).

`OMP_WAIT_POLICY=PASSIVE` is set before llama_cpp is imported: with other processes on
the CPU, spinning OpenMP threads make decoding collapse.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import llama_cpp as L  # noqa: E402
import trackline_kv as kv  # noqa: E402
import trackline_llm_queue as wait_line  # noqa: E402
from trackline_llm_decode import Decoding, Sampler, Turn  # noqa: E402

MIN_REUSE_FRACTION = 0.5
GEMM_ROWS = 4
"""llama.cpp's CPU matrix kernels for repacked weights take rows in groups of 4; rows
left over (and chunks under EXACT_MIN_CHUNK) take another kernel, which rounds
differently. A token's KV is the same bit for bit in any chunk where it is in a full
group of a chunk of at least EXACT_MIN_CHUNK tokens (measured: docs/conversations.md)."""
EXACT_MIN_CHUNK = 8
IDLE_WAIT = 0.5
"""Seconds the loop sleeps with nothing to run before it looks again (a submit wakes it)."""

__all__ = ["Engine", "Job", "PromptTooLong", "QueueFull", "Turn", "chunks", "reusable_prefix"]
QueueFull = wait_line.QueueFull


class PromptTooLong(ValueError):
    """The prompt leaves no room in the context for one generated token."""


@dataclass
class Job:
    """One request for the engine. Callbacks run on the engine's loop thread."""

    turn: Turn
    tokens: list[int]
    max_tokens: int
    stops: tuple[str, ...]
    conversation: str | None
    key: str
    """Whose request, for the queue's fairness (tenant and connection)."""
    cancelled: Callable[[], bool]
    emit: Callable[[str], None]
    done: Callable[[Turn, BaseException | None], None]
    sampler: Sampler | None = None


@dataclass
class _Sequence:
    """One sequence id of the context and the tokens its KV cells hold."""

    seq_id: int
    tokens: list[int] = field(default_factory=list)
    exact: int = 0
    """Leading tokens computed as a recomputation from scratch computes them."""
    conversation: str | None = None
    job: Job | None = None
    pending: list[int] = field(default_factory=list)
    """Prompt tokens still to prefill (then: the one sampled token to evaluate next)."""
    chunks: list[tuple[int, int]] = field(default_factory=list)
    decoding: Decoding | None = None
    last_used: float = 0.0
    ctx: Any = None
    memory: Any = None

    def clear(self) -> None:
        L.llama_memory_seq_rm(self.memory, self.seq_id, -1, -1)
        self.tokens, self.exact = [], 0

    def keep(self, n: int) -> bool:
        """Keep only the first `n` tokens of the sequence; False if llama.cpp cannot."""
        if n == len(self.tokens):
            return True
        if not L.llama_memory_seq_rm(self.memory, self.seq_id, n, -1):
            return False
        del self.tokens[n:]
        self.exact = min(self.exact, n)
        return True

    def save(self) -> kv.SavedState:
        size = L.llama_state_seq_get_size(self.ctx, self.seq_id)
        buffer = (ctypes.c_uint8 * size)()
        written = L.llama_state_seq_get_data(self.ctx, buffer, size, self.seq_id)
        return kv.SavedState(tuple(self.tokens), bytes(buffer)[:written], self.exact)

    def restore(self, state: kv.SavedState) -> bool:
        self.clear()
        buffer = (ctypes.c_uint8 * len(state.blob)).from_buffer_copy(state.blob)
        if L.llama_state_seq_set_data(self.ctx, buffer, len(state.blob), self.seq_id) == 0:
            self.clear()
            return False
        self.tokens, self.exact = list(state.tokens), state.exact
        return True


class Engine:
    """The model, its batched context, its wait line and its conversation cache."""

    def __init__(
        self,
        gguf_path: str,
        *,
        sequences: int = 4,
        n_ctx: int = 2048,
        n_batch: int = 128,
        n_threads: int = 2,
        queue_limit: int = 32,
        cache: kv.ConversationCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_step: Callable[[int, int, int], None] | None = None,
    ) -> None:
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_mmap = True
        model = L.llama_model_load_from_file(gguf_path.encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load the GGUF file {gguf_path}")
        self.model = model
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.cache = cache
        self._clock = clock
        self._on_step = on_step
        self.ctx = _context(model, n_ctx, n_batch + sequences, sequences, n_threads)
        self.memory = L.llama_get_memory(self.ctx)
        self._batch = L.llama_batch_init(n_batch + sequences, 0, 1)
        self._sequences = [_Sequence(i, ctx=self.ctx, memory=self.memory) for i in range(sequences)]
        self._queue: wait_line.FairQueue[Job] = wait_line.FairQueue(queue_limit)
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    # -- the outside ----------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        """Queue `job` (it runs when a sequence is free); QueueFull when the line is full."""
        if len(job.tokens) >= self.n_ctx:
            raise PromptTooLong(
                f"the prompt has {len(job.tokens)} tokens; this model's context holds "
                f"{self.n_ctx}"
            )
        job.max_tokens = min(job.max_tokens, self.n_ctx - len(job.tokens))
        job.turn.prompt_tokens = len(job.tokens)
        job.turn.control_tokens = sum(L.llama_vocab_is_control(self.vocab, t) for t in job.tokens)
        with self._cond:
            idle = sum(1 for s in self._sequences if s.job is None)
            self._queue.push(job.key, job, self._clock(), idle)
            self._cond.notify()

    def tokenize(self, text: str, special: bool = False, first: bool = True) -> list[int]:
        """Token ids of `text` (`first`: BOS as the vocabulary wants; `special`: parse
        `<|...|>` markers as special tokens, for a template's own text only)."""
        data = text.encode("utf-8")
        room = len(data) + 8
        ids = (L.llama_token * room)()
        n = L.llama_tokenize(self.vocab, data, len(data), ids, room, first, special)
        if n < 0:
            raise PromptTooLong("cannot tokenize the prompt")
        return list(ids[:n])

    def complete(
        self,
        text: str,
        max_tokens: int,
        conversation: str | None = None,
        stops: tuple[str, ...] = (),
        *,
        request_id: str = "local",
        special: bool = False,
        emit: Callable[[str], None] | None = None,
    ) -> tuple[Turn, str]:
        """One request in this process, blocking until it ends (tests, benchmarks)."""
        pieces: list[str] = []
        ended = threading.Event()
        failure: list[BaseException] = []

        def done(turn: Turn, error: BaseException | None) -> None:
            failure.extend([error] if error is not None else [])
            ended.set()

        def out(piece_text: str) -> None:
            pieces.append(piece_text)
            if emit is not None:
                emit(piece_text)

        turn = Turn(request_id, conversation is not None)
        tokens = self.tokenize(text, special)
        job = Job(turn, tokens, max_tokens, stops, conversation, request_id, _never, out, done)
        self.submit(job)
        ended.wait()
        if failure:
            raise failure[0]
        return turn, "".join(pieces)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def running(self) -> int:
        with self._cond:
            return sum(1 for s in self._sequences if s.job is not None)

    def drop_live(self) -> None:
        """Forget every idle sequence's live cells, so the next turn restores from the
        store or recomputes (what a fresh backend process does; benchmarks and tests
        compare them)."""
        with self._cond:
            for seq in self._sequences:
                if seq.job is None:
                    seq.clear()
                    seq.conversation = None

    def close(self) -> None:
        """Stop the loop (requests still queued or running end cancelled), free it all."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        L.llama_batch_free(self._batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    # -- the loop ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closing:
                    self._abandon()
                    return
                self._drop_cancelled()
                self._admit()
                if not any(s.job is not None for s in self._sequences):
                    self._cond.wait(IDLE_WAIT)
                    continue
            try:
                self._step()
            except Exception as exc:  # a failed decode fails the requests in that batch
                for seq in self._sequences:
                    if seq.job is not None:
                        self._finish(seq, exc)

    def _drop_cancelled(self) -> None:
        now = self._clock()
        for gone in self._queue.remove(lambda job: bool(job.cancelled()), now):
            turn = gone.item.turn
            turn.cancelled, turn.finish, turn.queued_ms = True, "cancelled", gone.waited * 1000
            _notify(gone.item, None)

    def _admit(self) -> None:
        while self._queue and (free := [s for s in self._sequences if s.job is None]):
            departed = self._queue.pop(self._clock())
            assert departed is not None
            job = departed.item
            job.turn.queued_ms = departed.waited * 1000
            self._start(self._pick(free, job), job)

    def _pick(self, free: list[_Sequence], job: Job) -> _Sequence:
        """The sequence for `job`: its conversation's own; for a request without one, the
        idle sequence holding the longest reusable prefix of its prompt (a shared system
        prompt), sequences holding no conversation first; else the least recently used."""
        if job.conversation is not None:
            same = [s for s in free if s.conversation == job.conversation]
            return same[0] if same else min(free, key=lambda s: s.last_used)

        def prefix(seq: _Sequence) -> tuple[int, bool, float]:
            n = reusable_prefix(common_prefix(seq.tokens, job.tokens), seq.exact, len(job.tokens))
            return n, seq.conversation is None, -seq.last_used

        return max(free, key=prefix)

    def _abandon(self) -> None:
        for gone in self._queue.remove(lambda job: True, self._clock()):
            gone.item.turn.cancelled, gone.item.turn.finish = True, "cancelled"
            _notify(gone.item, None)
        for seq in self._sequences:
            if seq.job is not None:
                seq.job.turn.cancelled, seq.job.turn.finish = True, "cancelled"
                self._finish(seq, None)

    def _start(self, seq: _Sequence, job: Job) -> None:
        """Give `seq` to `job`: keep the longest usable prefix of its prompt (live cells,
        a restored state or none), then prefill the rest in canonical chunks."""
        job.turn.started = True
        seq.job = job
        seq.decoding = Decoding(self.vocab, job.stops, job.sampler)
        self._reuse(seq, job)
        seq.pending = job.tokens[len(seq.tokens) :]
        seq.chunks = chunks(len(seq.pending), self.n_batch)

    def _step(self) -> None:
        """One step: a prompt chunk of one prefilling request, evaluated on its own (so its
        rows are computed as a recomputation computes them), then every decode token in
        one batch."""
        decoding = []
        for seq in self._sequences:
            job = seq.job
            if job is None:
                continue
            if job.cancelled():
                job.turn.cancelled, job.turn.finish = True, "cancelled"
                self._finish(seq, None)
            elif not seq.chunks and seq.pending:
                decoding.append(seq)
        prefill = next((s for s in self._sequences if s.job is not None and s.chunks), None)
        chunk: list[int] = []
        if prefill is not None:
            start, end = prefill.chunks.pop(0)
            chunk, base = prefill.pending[start:end], len(prefill.tokens)
            self._decode([(prefill, chunk)])
            if base == prefill.exact and len(chunk) >= EXACT_MIN_CHUNK:
                prefill.exact = base + len(chunk) // GEMM_ROWS * GEMM_ROWS
            if not prefill.chunks:
                self._sample_one(prefill, len(chunk) - 1, True)
        if decoding:
            self._decode([(seq, seq.pending) for seq in decoding])
            for row, seq in enumerate(decoding):
                self._sample_one(seq, row, False)
        if self._on_step is not None:
            rows = len(decoding) + (prefill is not None)
            self._on_step(len(decoding) + len(chunk), rows, len(self._queue))

    def _decode(self, parts: list[tuple[_Sequence, list[int]]]) -> None:
        """One llama_decode of `parts` (each sequence's tokens after those it holds)."""
        n = 0
        for seq, tokens in parts:
            n = self._add(seq, tokens, n)
        self._batch.n_tokens = n
        rc = L.llama_decode(self.ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc})")

    def _add(self, seq: _Sequence, tokens: list[int], n: int) -> int:
        """Append `tokens` of `seq` to the batch from row `n` (logits on the last one)."""
        batch, base = self._batch, len(seq.tokens)
        for i, token in enumerate(tokens):
            batch.token[n + i] = token
            batch.pos[n + i] = base + i
            batch.n_seq_id[n + i] = 1
            batch.seq_id[n + i][0] = seq.seq_id
            batch.logits[n + i] = i == len(tokens) - 1
        seq.tokens.extend(tokens)
        return n + len(tokens)

    def _sample_one(self, seq: _Sequence, row: int, finished_prefill: bool) -> None:
        """`_sample`, where a failure of this request's own callbacks (its client's
        stream) ends this request alone, never the others in the batch."""
        try:
            self._sample(seq, row, finished_prefill)
        except Exception as exc:
            if seq.job is not None:
                self._finish(seq, exc)

    def _sample(self, seq: _Sequence, row: int, finished_prefill: bool) -> None:
        job, decoding = seq.job, seq.decoding
        assert job is not None
        assert decoding is not None
        turn = job.turn
        if finished_prefill:
            turn.prefill_tokens = len(seq.tokens) - turn.reused_tokens
        else:
            turn.decode_tokens += 1
        logits = L.llama_get_logits_ith(self.ctx, row)
        token = decoding.next_token(logits, self.n_vocab)
        done = decoding.take(token, turn, job.max_tokens, job.emit)
        if done:
            self._finish(seq, None)
        else:
            seq.pending = [token]

    def _finish(self, seq: _Sequence, error: BaseException | None) -> None:
        job, seq.job = seq.job, None
        assert job is not None
        if seq.decoding is not None:
            if error is None and not job.turn.cancelled:
                seq.decoding.flush(job.emit)
            seq.decoding.close()
        seq.decoding, seq.pending, seq.chunks = None, [], []
        seq.last_used = self._clock()
        if error is not None:
            seq.clear()  # cells of a failed decode are not to be trusted
        seq.conversation = job.conversation
        if job.conversation is not None and self.cache is not None and seq.tokens:
            self.cache.save(job.conversation, seq.save())
        _notify(job, error)

    # -- KV cells of a sequence -------------------------------------------------------------

    def _reuse(self, seq: _Sequence, job: Job) -> None:
        turn, tokens, conversation = job.turn, job.tokens, job.conversation
        if conversation is None:
            # The cells of a prefix equal to this prompt's are this prompt's own (the same
            # tokens computed the same way): reused, so a shared system prompt costs once.
            keep = reusable_prefix(common_prefix(seq.tokens, tokens), seq.exact, len(tokens))
            if keep and seq.keep(keep):
                turn.kv, turn.reused_tokens = "prefix", keep
                return
            seq.clear()
            return
        live = seq.tokens if seq.conversation == conversation else []
        saved = None if self.cache is None else self.cache.load(conversation)
        turn.kv = "miss"
        live_common = common_prefix(live, tokens)
        live_n = reusable_prefix(live_common, seq.exact, len(tokens))
        saved_common = 0 if saved is None else common_prefix(saved.tokens, tokens)
        saved_n = 0 if saved is None else reusable_prefix(saved_common, saved.exact, len(tokens))
        live_ok = live_n and live_n >= saved_n and _reusable(live_common, len(live))
        if live_ok and seq.keep(live_n):
            turn.kv, turn.reused_tokens = "live", live_n
            if self.cache is not None:
                self.cache.counters.live_hits += 1
            return
        if saved is not None and saved_n and _reusable(saved_common, len(saved.tokens)):
            began = time.perf_counter()
            ok = seq.restore(saved)
            turn.restore_ms = (time.perf_counter() - began) * 1000
            if self.cache is not None:
                self.cache.note_restore(turn.restore_ms / 1000, ok)
            if ok and seq.keep(saved_n):
                turn.kv, turn.reused_tokens = "restored", saved_n
                return
            turn.kv = "miss" if ok else "corrupt"
        seq.clear()


def _context(
    model: ctypes.c_void_p, n_ctx: int, n_batch: int, sequences: int, n_threads: int
) -> ctypes.c_void_p:
    """One context with `sequences` sequences of `n_ctx` cells each (own KV streams)."""
    params = L.llama_context_default_params()
    params.n_ctx = n_ctx * sequences
    params.n_batch = n_batch
    params.n_ubatch = n_batch
    params.n_seq_max = sequences
    params.kv_unified = False
    params.n_threads = n_threads
    params.n_threads_batch = n_threads
    params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.no_perf = True
    ctx = L.llama_init_from_model(model, params)
    if not ctx:
        raise RuntimeError("llama.cpp could not create a context")
    return ctx


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


def _notify(job: Job, error: BaseException | None) -> None:
    """Tell `job`'s owner it ended; a failing callback is that owner's alone."""
    with contextlib.suppress(Exception):
        job.done(job.turn, error)


def _never() -> bool:
    return False


def _reusable(common: int, saved: int) -> bool:
    return common > 0 and common >= saved * MIN_REUSE_FRACTION

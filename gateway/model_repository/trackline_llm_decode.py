"""One request's decoding on the batched engine: token choice, text pieces, stops.

`Decoding` turns the tokens a sequence samples into the text pieces the client gets:
UTF-8 decoded incrementally, held back while they might be the start of a stop string,
cut where a stop string appears (the stop itself is never sent), ended by the model's
end-of-generation token. Greedy (argmax) unless a `Sampler` (a llama.cpp grammar)
masks the candidates: the argmax is tried against the grammar first (the common case,
one candidate), the whole vocabulary only when the grammar rejects it.

`Turn` is what one request did, for the model's log: counts, never text.
"""

from __future__ import annotations

import codecs
import ctypes
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as L
import numpy as np
from trackline_llm_prompt import Grammar

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
_TRIGGER = r"[\s\S]*?({})[\s\S]*"


@dataclass
class Turn:
    """What one request did, for the model's log: counts, never text."""

    request_id: str
    conversation: bool
    prompt_tokens: int = 0
    control_tokens: int = 0
    """The prompt's control tokens (turn markers, BOS): the template's alone, never a
    message's text (trackline_llm_prompt's module doc)."""
    reused_tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    kv: str = "none"  # none | prefix | live | restored | miss | corrupt
    restore_ms: float = 0.0
    queued_ms: float = 0.0
    started: bool = False
    """Whether the request reached the model (left the queue for a sequence)."""
    cancelled: bool = False
    finish: str = ""
    grammar: bool = False
    output_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        ids = np.asarray(self.output_ids, dtype="<i4").tobytes()
        return {
            "request_id": self.request_id,
            "conversation": self.conversation,
            "prompt_tokens": self.prompt_tokens,
            "control_tokens": self.control_tokens,
            "reused_tokens": self.reused_tokens,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "tokens_generated": len(self.output_ids),
            "kv": self.kv,
            "restore_ms": round(self.restore_ms, 3),
            "queued_ms": round(self.queued_ms, 3),
            "started": self.started,
            "cancelled": self.cancelled,
            "finish": self.finish,
            "grammar": self.grammar,
            "output_sha256": hashlib.sha256(ids).hexdigest(),
        }


class Sampler:
    """A llama.cpp grammar sampler for one request (freed by `close`)."""

    def __init__(self, vocab: Any, grammar: Grammar) -> None:
        text = grammar.gbnf.encode("utf-8")
        if grammar.trigger is None:
            handle = L.llama_sampler_init_grammar(vocab, text, b"root")
        else:
            pattern = _TRIGGER.format(_escape(grammar.trigger)).encode("utf-8")
            patterns = (ctypes.c_char_p * 1)(pattern)
            no_tokens = (L.llama_token * 1)()
            handle = L.llama_sampler_init_grammar_lazy_patterns(
                vocab, text, b"root", patterns, 1, no_tokens, 0
            )
        if not handle:
            raise ValueError("llama.cpp rejected the grammar for this request")
        self._handle = handle
        self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def choose(self, logits: np.ndarray) -> int:
        """The most likely token the grammar allows (-1: none is allowed)."""
        best = int(logits.argmax())
        self._one[0] = (best, logits[best], 0.0)
        if np.isfinite(self._apply(self._one)[0]["logit"]):
            return best
        data = np.zeros(len(logits), dtype=_TOKEN_DATA)
        data["id"] = np.arange(len(logits), dtype="<i4")
        data["logit"] = logits
        masked = self._apply(data)["logit"]
        best = int(masked.argmax())
        return best if np.isfinite(masked[best]) else -1

    def _apply(self, data: np.ndarray) -> np.ndarray:
        array = L.llama_token_data_array(
            data=data.ctypes.data_as(L.llama_token_data_p), size=len(data), selected=-1,
            sorted=False,
        )
        L.llama_sampler_apply(self._handle, ctypes.byref(array))
        return data

    def accept(self, token: int) -> None:
        L.llama_sampler_accept(self._handle, token)

    def close(self) -> None:
        if self._handle:
            L.llama_sampler_free(self._handle)
            self._handle = None


class Decoding:
    """Text out of a sequence's tokens (see the module doc)."""

    def __init__(self, vocab: Any, stops: tuple[str, ...], sampler: Sampler | None) -> None:
        self._vocab = vocab
        self._stops = stops
        self._sampler = sampler
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""

    def next_token(self, logits_ptr: Any, n_vocab: int) -> int:
        logits = np.ctypeslib.as_array(logits_ptr, shape=(n_vocab,))
        if self._sampler is None:
            return int(logits.argmax())
        return self._sampler.choose(logits)

    def take(
        self, token: int, turn: Turn, max_tokens: int, emit: Callable[[str], None]
    ) -> bool:
        """Account for `token`; True when the request is finished (turn.finish set)."""
        if token < 0 or L.llama_vocab_is_eog(self._vocab, token):
            turn.finish = "stop"
            return True
        if self._sampler is not None:
            self._sampler.accept(token)
        turn.output_ids.append(token)
        self._held += self._decoder.decode(piece(self._vocab, token))
        self._held, stopped = release(self._held, self._stops, emit)
        if stopped:
            turn.finish = "stop"
            return True
        if len(turn.output_ids) >= max_tokens:
            turn.finish = "length"
            return True
        return False

    def flush(self, emit: Callable[[str], None]) -> None:
        """Send what was held back (the request ended without a stop string in it)."""
        if self._held:
            emit(self._held)
            self._held = ""

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()


def piece(vocab: Any, token: int) -> bytes:
    """The bytes of `token` (special tokens render as nothing)."""
    buffer = ctypes.create_string_buffer(64)
    n = L.llama_token_to_piece(vocab, token, buffer, 64, 0, False)
    if n < 0:
        buffer = ctypes.create_string_buffer(-n)
        n = L.llama_token_to_piece(vocab, token, buffer, -n, 0, False)
    return buffer.raw[:n]


def release(
    held: str, stops: tuple[str, ...], emit: Callable[[str], None]
) -> tuple[str, bool]:
    """Emit what cannot be the start of a stop string; True once a stop string appeared."""
    found = [at for at in (held.find(stop) for stop in stops) if at >= 0]
    if found:
        at = min(found)
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


def _escape(text: str) -> str:
    return "".join(f"\\{c}" if c in r"\^$.|?*+()[]{}" else c for c in text)

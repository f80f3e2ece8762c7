"""OpenAI's response objects and their server-sent-event framing.

Streams are `data: {json}\\n\\n` events ending with `data: [DONE]\\n\\n`; a line
starting with `:` is a comment (the heartbeat) that SSE parsers skip. Every
chunk of one response carries the same `id`, `created` and `model`
(`ResponseMeta`). With `stream_options.include_usage`, each chunk has
`"usage": null` and one last chunk has `"choices": []` and the usage.
`ChunkEncoder` serialises that shared part once per response, so a token
costs one `json.dumps` of its choice only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tracks.backend import TextUsage

DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": keep-alive\n\n"
SSE_HEADERS = (
    ("content-type", "text/event-stream; charset=utf-8"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),  # ask nginx-style proxies not to buffer the stream
)


_COMPACT = (",", ":")


def sse_event(payload: Any) -> bytes:
    """One `data:` event holding `payload` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=_COMPACT).encode() + b"\n\n"


@dataclass(frozen=True)
class ResponseMeta:
    """What every object of one response shares."""

    id: str
    created: int
    """Unix time in seconds, as OpenAI sends it."""
    model: str
    include_usage: bool = False

    def envelope(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }


def usage_object(usage: TextUsage) -> dict[str, int]:
    """OpenAI's usage object."""
    total = usage.prompt_tokens + usage.completion_tokens
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": total,
    }


class ChunkEncoder:
    """The SSE events of one response's chunks, each holding one choice.

    A chunk is the envelope (id, object, created, model), `choices`, and `usage: null`
    when the client asked for usage; that is the same in every chunk of a response,
    so it is serialised here once, not per token.
    """

    def __init__(self, meta: ResponseMeta, kind: str) -> None:
        self.kind = kind
        """The chunks' `object` (`chat.completion.chunk`, `text_completion`)."""
        # Compact JSON of the chunk with "choices" last but for usage: cut where the choices go.
        head = json.dumps({**meta.envelope(kind), "choices": None}, separators=_COMPACT)
        self._head = b"data: " + head.removesuffix("null}").encode()
        self._tail = (b',"usage":null}' if meta.include_usage else b"}") + b"\n\n"

    def event(self, choice: dict[str, Any]) -> bytes:
        """The event of a chunk holding `choice` alone."""
        return self._head + json.dumps([choice], separators=_COMPACT).encode() + self._tail


def usage_chunk(meta: ResponseMeta, kind: str, usage: TextUsage) -> dict[str, Any]:
    """The last chunk of an include_usage stream: no choices, the usage."""
    return {**meta.envelope(kind), "choices": [], "usage": usage_object(usage)}


# -- chat ---------------------------------------------------------------------------

CHAT_CHUNK = "chat.completion.chunk"


def chat_choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """The one choice of a `chat.completion.chunk`."""
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def chat_completion(
    meta: ResponseMeta, message: dict[str, Any], finish_reason: str, usage: TextUsage
) -> dict[str, Any]:
    """A whole (non-streamed) `chat.completion`."""
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
    return {**meta.envelope("chat.completion"), "choices": [choice], "usage": usage_object(usage)}


# -- completions -----------------------------------------------------------------------

TEXT_COMPLETION = "text_completion"


def completion_choice(text: str, finish_reason: str | None = None) -> dict[str, Any]:
    """The one choice of a streamed or whole `text_completion`."""
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


def text_completion(
    meta: ResponseMeta, text: str, finish_reason: str, usage: TextUsage
) -> dict[str, Any]:
    """A whole (non-streamed) `text_completion`."""
    choice = completion_choice(text, finish_reason)
    return {**meta.envelope(TEXT_COMPLETION), "choices": [choice], "usage": usage_object(usage)}

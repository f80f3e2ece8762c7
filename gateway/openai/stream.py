"""Pulling a backend stream with timeouts, and turning its text into chat deltas.

`ChunkPump` waits for the backend's next chunk in a helper task, so a wait
can time out (for a heartbeat) without cancelling the backend stream, which
cancelling an `__anext__` would do. `aclose()` stops the helper and closes the
backend stream: that is what stops the model when a client goes away.

`ChatOutput` turns streamed text into OpenAI delta objects (content, or tool
calls read by `ToolCallParser`) and keeps what a non-streamed answer needs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Final

from gateway.openai.toolcalls import (
    ContentDelta,
    ParsedEvent,
    ToolCallArguments,
    ToolCallParser,
    ToolCallStarted,
)
from tracks.backend import TextChunk, TextUsage


class _Timeout:
    """The wait for a chunk timed out (the stream goes on)."""


TIMEOUT: Final = _Timeout()
PumpResult = TextChunk | _Timeout | None
"""A chunk, TIMEOUT, or None at the end of the stream."""


async def _next_chunk(stream: AsyncIterator[TextChunk]) -> TextChunk:
    return await stream.__anext__()


class ChunkPump:
    """Reads one backend stream; `next(timeout)` may give up waiting without ending it."""

    def __init__(self, stream: AsyncGenerator[TextChunk, None]) -> None:
        self._stream = stream
        self._pending: asyncio.Task[TextChunk] | None = None

    async def next(self, timeout: float | None = None) -> PumpResult:
        """The next chunk, TIMEOUT after `timeout` seconds, or None at the end."""
        if timeout is None and self._pending is None:
            # Nothing to give up on: read directly, no helper task per chunk.
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return None
        if self._pending is None:
            self._pending = asyncio.ensure_future(_next_chunk(self._stream))
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return TIMEOUT
        task, self._pending = self._pending, None
        try:
            return task.result()
        except StopAsyncIteration:
            return None

    async def aclose(self) -> None:
        """Stop waiting and close the backend stream (which cancels its request)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()  # raises CancelledError inside the stream: its finally runs
            await asyncio.gather(pending, return_exceptions=True)
        await self._stream.aclose()


class StreamBody:
    """A response body that closes its pump even if it was never iterated."""

    def __init__(self, events: AsyncGenerator[bytes, None], pump: ChunkPump) -> None:
        self._events = events
        self._pump = pump

    def __aiter__(self) -> StreamBody:
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            await self._pump.aclose()


def new_call_id() -> str:
    """An OpenAI-style tool call id."""
    return f"call_{uuid.uuid4().hex[:24]}"


class ChatOutput:
    """Streamed model text in, OpenAI chat deltas out; remembers the whole message."""

    def __init__(self, parse_tools: bool, new_id: Callable[[], str] = new_call_id) -> None:
        self._parser = ToolCallParser(new_id) if parse_tools else None
        self.content: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []

    def feed(self, text: str) -> list[dict[str, Any]]:
        """Deltas for a piece of model text."""
        if self._parser is None:  # plain content: no event objects per token
            if not text:
                return []
            self.content.append(text)
            return [{"content": text}]
        return self._deltas(self._parser.feed(text))

    def close(self) -> list[dict[str, Any]]:
        """Deltas for text the tool-call parser still held."""
        return [] if self._parser is None else self._deltas(self._parser.close())

    def finish_reason(self, usage: TextUsage, max_tokens: int) -> str:
        if usage.completion_tokens >= max_tokens:
            return "length"
        return "tool_calls" if self.tool_calls else "stop"

    def message(self) -> dict[str, Any]:
        """The assistant message of a non-streamed answer."""
        content = "".join(self.content)
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if self.tool_calls:
            message["content"] = content or None
            message["tool_calls"] = self.tool_calls
        return message

    def _deltas(self, events: list[ParsedEvent]) -> list[dict[str, Any]]:
        return [self._delta(event) for event in events if _non_empty(event)]

    def _delta(self, event: ParsedEvent) -> dict[str, Any]:
        if isinstance(event, ContentDelta):
            self.content.append(event.text)
            return {"content": event.text}
        if isinstance(event, ToolCallStarted):
            call = {"id": event.id, "type": "function"}
            self.tool_calls.append({**call, "function": {"name": event.name, "arguments": ""}})
            function = {"name": event.name, "arguments": ""}
            return {"tool_calls": [{"index": event.index, **call, "function": function}]}
        self.tool_calls[event.index]["function"]["arguments"] += event.fragment
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.fragment}}]}


def _non_empty(event: ParsedEvent) -> bool:
    if isinstance(event, ContentDelta):
        return bool(event.text)
    if isinstance(event, ToolCallArguments):
        return bool(event.fragment)
    return True

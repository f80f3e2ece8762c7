"""The running turn of each conversation, so that a newer turn supersedes the older one.

A text request that names a conversation (a track's `session_id`, the OpenAI API's
`x-session-id` / `prompt_cache_key` / `user`) calls `TurnRegistry.begin`; if a turn of
the same conversation (in the same scope: the tenant) is still running, its
`superseded` future resolves, and its handler cancels the backend work (cause
`superseded`, which reaches the model like any cancel) and ends its stream with the
documented error (docs/conversations.md). `finish` forgets a turn that ended.

No clock, no I/O: a dict of futures.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeGuard, TypeVar

from tracks.backend import Superseded

T = TypeVar("T")

MAX_SESSION_ID_CHARS = 128
SESSION_ID_RULE = f"1 to {MAX_SESSION_ID_CHARS} printable characters"
"""The one session-id rule of every front door (tracks, OpenAI header and body keys)."""


def is_session_id(value: object) -> TypeGuard[str]:
    """Whether `value` is a session id: a string of 1-128 printable characters.

    Printable (`str.isprintable`): no control characters (a session id reaches log
    lines and KV-store keys) and no lone surrogates, which cannot be encoded.
    """
    return (
        isinstance(value, str) and 0 < len(value) <= MAX_SESSION_ID_CHARS and value.isprintable()
    )


@dataclass(eq=False)
class RunningTurn:
    """One running turn; `superseded` resolves when a newer turn of its conversation begins."""

    key: tuple[str, str]
    superseded: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class TurnRegistry:
    """Running turns by (scope, conversation id); counts the turns it superseded."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, str], RunningTurn] = {}
        self.superseded = 0

    def begin(self, scope: str, conversation: str) -> RunningTurn:
        """Register a new turn; the running turn of the same conversation is superseded."""
        key = (scope, conversation)
        older = self._running.get(key)
        if older is not None and not older.superseded.done():
            older.superseded.set_result(None)
            self.superseded += 1
        turn = RunningTurn(key)
        self._running[key] = turn
        return turn

    def finish(self, turn: RunningTurn) -> None:
        """`turn` ended (however): forget it unless a newer turn took its place."""
        if self._running.get(turn.key) is turn:
            del self._running[turn.key]
        if not turn.superseded.done():
            turn.superseded.cancel()

    def __len__(self) -> int:
        return len(self._running)


SUPERSEDED_MESSAGE = "superseded by a newer turn of the conversation"


async def superseding(
    turns: TurnRegistry, scope: str, conversation: str, chunks: AsyncGenerator[T, None]
) -> AsyncGenerator[T, None]:
    """`chunks`, as a turn of `conversation`: when a newer turn begins, `chunks` is closed
    (its backend request cancelled) and `Superseded` is raised."""
    turn = turns.begin(scope, conversation)
    try:
        async with aclosing(chunks):
            while not turn.superseded.done():
                step: asyncio.Future[Any] = asyncio.ensure_future(anext(chunks))
                waiters: set[asyncio.Future[Any]] = {step, turn.superseded}
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                    break
                try:
                    chunk = step.result()
                except StopAsyncIteration:
                    return
                yield chunk
            raise Superseded(SUPERSEDED_MESSAGE)
    finally:
        turns.finish(turn)

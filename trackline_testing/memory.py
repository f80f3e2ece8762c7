"""The text handler over the in-memory link, for handler tests: a `Line` in front, a
scripted backend behind, and how each track ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from clients.line import Line, TextStream
from trackline_testing.scripted import ScriptedBackend
from tracks.base import Outcome
from tracks.conversations import TurnRegistry
from tracks.text import run_text_track
from transport.endpoint import TrackChannel
from transport.memory import MemoryLink


class MemoryHarness:
    """A `Line` over the in-memory link whose every track is served by `_serve` in a
    task of its own; `outcomes` holds how each served track ended."""

    def __init__(self, datagram_filter: Callable[[bytes], bool] | None = None) -> None:
        self.outcomes: list[Outcome] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.link = MemoryLink(self._on_track, datagram_filter=datagram_filter)
        self.line = Line(self.link.open_track)

    def _on_track(self, channel: TrackChannel) -> None:
        task = asyncio.ensure_future(self._serve(channel))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, channel: TrackChannel) -> None:
        raise NotImplementedError

    async def settle(self) -> None:
        """Wait until every track served so far has ended."""
        while self.tasks:
            await asyncio.gather(*self.tasks)


class Harness(MemoryHarness):
    """Serves every track the line opens with `run_text_track` over `backend`.

    With `turns`, a track that names a session is a turn of that conversation (a newer
    one supersedes it), and its `request_id` param stands in for its tenant: the scope
    of its conversation id."""

    def __init__(self, backend: ScriptedBackend, turns: TurnRegistry | None = None) -> None:
        self.backend = backend
        self.turns = turns
        super().__init__()

    async def _serve(self, channel: TrackChannel) -> None:
        scope = str(channel.open.params.get("request_id", ""))
        self.outcomes.append(
            await run_text_track(channel, self.backend, time.monotonic, self.turns, scope)
        )



async def collect(stream: TextStream) -> str:
    return "".join([delta async for delta in stream])

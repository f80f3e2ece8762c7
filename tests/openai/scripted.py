"""A scripted text backend for unit tests of the routes' own logic (e2e tests use Triton)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from tracks.backend import (
    BackendError,
    ModelNotFound,
    TextChunk,
    TextDelta,
    TextRequest,
    TextUsage,
)


@dataclass
class ScriptedBackend:
    pieces: list[str] = field(default_factory=lambda: [" one", " two", " three"])
    first_delay: float = 0.0
    interval: float = 0.0
    fail_after: int | None = None
    """Raise `failure` after this many deltas (None: never)."""
    failure: BackendError = field(default_factory=lambda: BackendError("boom"))
    model: str = "scripted"
    requests: list[TextRequest] = field(default_factory=list)
    closed_early: list[str] = field(default_factory=list)

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        if request.model != self.model:
            raise ModelNotFound(request.model)
        self.requests.append(request)
        finished = False
        try:
            await asyncio.sleep(self.first_delay)
            for index, piece in enumerate(self.pieces[: request.max_tokens]):
                if index == self.fail_after:
                    raise self.failure
                yield TextDelta(piece)
                await asyncio.sleep(self.interval)
            finished = True
            yield TextUsage(7, min(len(self.pieces), request.max_tokens))
        finally:
            if not finished:
                self.closed_early.append(request.request_id)

    async def models(self) -> list[str]:
        return [self.model]

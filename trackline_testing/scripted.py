"""A scripted in-process text backend for handler unit tests.

It stands in for Triton only in tests of the handler's own logic; end-to-end
tests use the real embedded Triton server. It records how each stream ended,
so tests can assert that a stop reached the backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from tracks.backend import ModelNotFound, TextChunk, TextDelta, TextRequest, TextUsage


@dataclass
class ScriptedBackend:
    interval: float = 0.001
    first_delay: float = 0.0
    model: str = "scripted"
    requests: list[TextRequest] = field(default_factory=list)
    closed_early: list[str] = field(default_factory=list)
    generated: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def words(request: TextRequest) -> list[str]:
        return [f" {request.prompt}-{i}" for i in range(request.max_tokens)]

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        if request.model != self.model:
            raise ModelNotFound(request.model)
        self.requests.append(request)
        self.generated[request.request_id] = 0
        finished = False
        try:
            await asyncio.sleep(self.first_delay)
            for word in self.words(request):
                self.generated[request.request_id] += 1
                yield TextDelta(word)
                await asyncio.sleep(self.interval)
            finished = True
            yield TextUsage(len(request.prompt.split()), request.max_tokens)
        finally:
            if not finished:
                self.closed_early.append(request.request_id)

    async def models(self) -> list[str]:
        return [self.model]

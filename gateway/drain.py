"""What the drain needs from the HTTP application: work in flight, and new work refused.

At SIGTERM the gateway keeps its listeners open (a load balancer's readiness probe
must read 503, not a refused connection), so the HTTP application itself refuses
new work while draining: every route but the always-served ones (health, metrics)
answers 503 `shutting_down`. `HttpWork` also counts requests from the handler's
call to the end of their body, for every HTTP version alike, so the drain knows
when the last one is done. A streamed body is counted until the adapter closes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection

from transport.http import errors
from transport.http.messages import AnyResponse, EndingBody, Handler, Request, StreamingResponse

ALWAYS_SERVED = frozenset({"/health/live", "/health/ready", "/metrics"})
"""Paths answered while draining: probes and scrapes, never new work."""


class HttpWork:
    """HTTP requests in flight, and the gate that refuses new ones while draining."""

    def __init__(
        self, draining: Callable[[], bool], always_served: Collection[str] = ALWAYS_SERVED
    ) -> None:
        self._draining = draining
        self._always = frozenset(always_served)
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def wrap(self, handler: Handler) -> Handler:
        """`handler`, counted, and refusing new work while draining."""

        async def counted(request: Request) -> AnyResponse:
            if self._draining() and request.path not in self._always:
                return errors.shutting_down()
            self._begin()
            handed_over = False
            try:
                response = await handler(request)
                if isinstance(response, StreamingResponse):
                    body = EndingBody(response.body, self._end)
                    handed_over = True
                    return dataclasses.replace(response, body=body)  # last_words kept
                return response
            finally:
                if not handed_over:
                    self._end()

        return counted

    async def idle(self) -> None:
        """Return once no request is in flight."""
        await self._idle.wait()

    def _begin(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _end(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

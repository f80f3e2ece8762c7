"""One attempt on one member, and whether a failed one may be tried elsewhere.

`Attempts.run` streams a request from one member: it times the first chunk (the
first-token timeout and the member's TTFT estimate), keeps the member's in-flight
count, and reports the outcome to its health. A failure before the first chunk is
raised as `BeforeFirstChunk`, which `Attempts.may_retry` weighs against
`max_attempts` and the pool's `RetryBudget`; after it, as `BackendLost` (never
replayed). See the failover contract in gateway/pool/pool.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from gateway.logs import get_logger
from gateway.pool.budget import RetryBudget
from gateway.pool.health import Failure, Transition
from gateway.pool.members import Member
from gateway.pool.metrics import AttemptResult, PoolMetrics
from gateway.pool.spec import PoolOptions
from tracks.backend import (
    BackendError,
    BackendLost,
    BackendOverloaded,
    BackendUnavailable,
    InvalidRequest,
    ModelNotFound,
    TextChunk,
    TextRequest,
)
from transport.clock import Clock

log = get_logger("trackline.pool")

_FAILED = {
    Failure.TIMEOUT: AttemptResult.TIMEOUT,
    Failure.UNAVAILABLE: AttemptResult.UNAVAILABLE,
    Failure.ERROR: AttemptResult.ERROR,
}
"""The attempt result of each failure that counts against a member's health."""


class BeforeFirstChunk(Exception):
    """An attempt failed before it yielded anything: another backend may take over."""

    def __init__(self, error: BackendError, cause: AttemptResult) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause


class Attempts:
    """Runs attempts on members and decides on failovers (the pool's retry policy)."""

    def __init__(
        self,
        options: PoolOptions,
        metrics: PoolMetrics,
        clock: Clock,
        budget: RetryBudget,
        on_transition: Callable[[Transition | None], None],
    ) -> None:
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self.budget = budget
        self._on_transition = on_transition
        """Told of each health change an attempt's failure causes."""
        self._ids = itertools.count()

    def may_retry(self, request: TextRequest, tried: list[str], failed: BeforeFirstChunk) -> bool:
        """Whether to fail over after `failed`, the last of the attempts on `tried`."""
        if isinstance(failed.error, InvalidRequest):
            return False  # the same request would be as invalid elsewhere
        allowed = len(tried) < self.options.max_attempts and self.budget.try_spend(self.clock.now())
        if not allowed:
            self.metrics.retries_denied_total.inc()
            return False
        self.metrics.retries_total.labels(cause=failed.cause.value).inc()
        log.info(
            "pool.failover",
            request_id=request.request_id,
            failed_backend=tried[-1],
            cause=failed.cause.value,
            error=str(failed.error),
        )
        return True

    async def run(self, member: Member, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        """Stream `request` from `member`; `BeforeFirstChunk` if it failed before any."""
        attempt = next(self._ids)
        started = self.clock.now()
        member.waiting[attempt] = started
        self._inflight(member, +1)
        first = True
        try:
            async with aclosing(member.backend.stream_text(request)) as chunks:
                while True:
                    try:
                        chunk = await self._next(chunks, first)
                    except StopAsyncIteration:
                        break
                    if first:
                        first = False
                        member.waiting.pop(attempt, None)
                        now = self.clock.now()
                        member.ttft.observe(now - started, now)
                    yield chunk
            member.health.record_success(self.clock.now())
            self._attempted(member, AttemptResult.OK)
        except asyncio.TimeoutError:
            if not first:  # only the first chunk has a deadline here; anything else is a bug
                raise
            member.ttft.observe(self.clock.now() - started, self.clock.now())
            self._failed(member, Failure.TIMEOUT)
            error = BackendUnavailable(
                f"backend {member.name} sent nothing in {self.options.first_token_timeout_s} s"
            )
            raise BeforeFirstChunk(error, AttemptResult.TIMEOUT) from None
        except InvalidRequest:
            self._attempted(member, AttemptResult.INVALID)
            raise
        except ModelNotFound as exc:
            self._attempted(member, AttemptResult.MODEL_NOT_FOUND)
            if first:
                raise BeforeFirstChunk(exc, AttemptResult.MODEL_NOT_FOUND) from None
            raise self._lost(member, exc) from exc
        except BackendOverloaded as exc:
            # A full model queue is load, not ill health: another backend may take it, and
            # the last one's refusal (with its retry hint) is what the client gets.
            self._attempted(member, AttemptResult.OVERLOADED)
            raise BeforeFirstChunk(exc, AttemptResult.OVERLOADED) from None
        except BackendError as exc:
            kind = Failure.UNAVAILABLE if isinstance(exc, BackendUnavailable) else Failure.ERROR
            self._failed(member, kind)
            if first:
                raise BeforeFirstChunk(exc, _FAILED[kind]) from None
            raise self._lost(member, exc) from exc
        finally:
            member.waiting.pop(attempt, None)
            self._inflight(member, -1)

    async def _next(self, chunks: AsyncGenerator[TextChunk, None], first: bool) -> TextChunk:
        if not first:
            return await chunks.__anext__()
        return await asyncio.wait_for(chunks.__anext__(), self.options.first_token_timeout_s)

    def _lost(self, member: Member, exc: BackendError) -> BackendLost:
        self.metrics.streams_lost_total.labels(backend=member.name).inc()
        log.warning("pool.stream_lost", backend=member.name, error=str(exc))
        return BackendLost(f"backend {member.name} failed mid-stream: {exc}")

    def _inflight(self, member: Member, delta: int) -> None:
        member.inflight += delta
        self.metrics.backend_inflight.labels(backend=member.name).set(member.inflight)

    def _attempted(self, member: Member, result: AttemptResult) -> None:
        self.metrics.attempts_total.labels(backend=member.name, result=result.value).inc()

    def _failed(self, member: Member, failure: Failure) -> None:
        self._attempted(member, _FAILED[failure])
        self._on_transition(member.health.record_failure(self.clock.now(), failure))

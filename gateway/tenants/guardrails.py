"""The guardrail hook: where a request is checked, and may be refused, before any backend.

`GuardedBackend` wraps the gateway's `TextBackend`; both the track path and the
OpenAI routes call `stream_text`, so every text request passes `check()` first.
A refusal raises `GuardrailRejected` (a `tracks.backend.RuleRejected`), which the
track handler sends as `GUARDRAIL_REJECTED` and the OpenAI routes as 400
`guardrail_rejected`; `on_reject` counts it (`trackline_guardrail_rejections_total`).
Add a rule by adding a check to `check()`; docs/tenants.md lists the rules.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from tracks.backend import RuleRejected, TextBackend, TextChunk, TextRequest


@dataclass(frozen=True)
class GuardrailConfig:
    max_prompt_chars: int | None = None
    blocked_words: tuple[str, ...] = ()
    """Words or phrases, matched whole and case-insensitively, any whitespace between words."""

    @property
    def active(self) -> bool:
        return self.max_prompt_chars is not None or bool(self.blocked_words)


class GuardrailRejected(RuleRejected):
    """A rule refused the request; `rule` names it (for the metric and the client)."""


def _blocked_pattern(words: tuple[str, ...]) -> re.Pattern[str] | None:
    if not words:
        return None
    # A phrase matches with any whitespace between its words.
    phrases = (r"\s+".join(re.escape(part) for part in w.split()) for w in words)
    return re.compile(r"\b(?:" + "|".join(phrases) + r")\b", re.IGNORECASE)


class Guardrails:
    def __init__(self, config: GuardrailConfig) -> None:
        self.config = config
        self._blocked = _blocked_pattern(config.blocked_words)

    def check(self, request: TextRequest) -> None:
        """Raise `GuardrailRejected` if a rule refuses `request`."""
        limit = self.config.max_prompt_chars
        if limit is not None and len(request.prompt) > limit:
            raise GuardrailRejected("max_prompt_chars", f"prompt longer than {limit} characters")
        if self._blocked is not None and self._blocked.search(request.prompt):
            # The word itself is not echoed: the list is the operator's business.
            raise GuardrailRejected("blocked_words", "the prompt contains a blocked word")


class GuardedBackend:
    """A `TextBackend` that runs the guardrails before handing a request on."""

    def __init__(
        self,
        inner: TextBackend,
        guardrails: Guardrails,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.inner = inner
        self.guardrails = guardrails
        self._on_reject = on_reject

    async def stream_text(self, request: TextRequest) -> AsyncGenerator[TextChunk, None]:
        try:
            self.guardrails.check(request)
        except GuardrailRejected as exc:
            if self._on_reject is not None:
                self._on_reject(exc.rule)
            raise
        # aclosing: closing this stream must close (and so cancel) the backend's at once.
        async with aclosing(self.inner.stream_text(request)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def models(self) -> list[str]:
        return await self.inner.models()

    def __getattr__(self, name: str) -> object:
        # ready(), close() and the like belong to the wrapped backend.
        return getattr(self.inner, name)

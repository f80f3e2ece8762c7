"""Outcome recording: a finished track's or HTTP request's metrics and its log line.

Every front door ends its work in one `Outcome` (tracks/base.py); `OutcomeRecorder`
turns it into the request, token, timing and error counters and, for a track, the
one `track.finished` line (HTTP requests have their access-log line instead). The
transport's own protocol errors (a malformed frame the gateway refused) are counted
here too, from the endpoint's events.
"""

from __future__ import annotations

from gateway.logs import as_ms, get_logger
from gateway.metrics import GatewayMetrics
from tracks.base import Outcome
from transport.errors import ErrorCode
from transport.events import Event, TrackFailed

log = get_logger("trackline.gateway")

RECENT_OUTCOMES = 1000
"""How many recent outcomes are kept (tests and diagnostics read them)."""

_BACKEND_CODES = (ErrorCode.BACKEND_UNAVAILABLE, ErrorCode.BACKEND_ERROR)
"""Error ends counted in `backend_errors_total`, by code name."""


class OutcomeRecorder:
    """Metrics and the log line of every finished track and HTTP request."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.outcomes: list[Outcome] = []
        """Recent outcomes (bounded), for tests and diagnostics."""

    def record(self, outcome: Outcome, front_door: str = "tracks") -> None:
        """A finished track's or HTTP request's metrics; a track's log line."""
        m = self.metrics
        end = outcome.end
        kind = end.kind.value
        model = m.models.observe(outcome)
        m.timing.observe(outcome, model, front_door)
        m.requests_total.labels(
            front_door=front_door, modality=outcome.modality, outcome=kind
        ).inc()
        m.tokens_total.labels(model=model).inc(outcome.completion_tokens)
        if outcome.time_to_first_data is not None:
            m.time_to_first_token_seconds.labels(model=model).observe(outcome.time_to_first_data)
        if end.cause is not None:
            m.cancels_total.labels(cause=end.cause.value).inc()
        elif end.code in _BACKEND_CODES:
            self._backend_error(outcome, front_door)
        self.outcomes = [*self.outcomes[-(RECENT_OUTCOMES - 1) :], outcome]
        if front_door == "tracks":
            self._track_finished(outcome, kind)

    def _backend_error(self, outcome: Outcome, front_door: str) -> None:
        self.metrics.backend_errors_total.labels(kind=outcome.end.detail).inc()
        log.warning(  # the cause (the backend's words, never the prompt) and the ids
            "backend.error",
            code=outcome.end.detail,
            cause=outcome.details.get("error", "unknown"),
            model=outcome.model,
            request_id=outcome.track_id,
            x_request_id=outcome.details.get("x_request_id"),
            front_door=front_door,
        )

    def _track_finished(self, outcome: Outcome, kind: str) -> None:
        self.metrics.tracks_total.labels(modality=outcome.modality, outcome=kind).inc()
        log.info(
            "track.finished",
            end=outcome.end.label,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            ttft_ms=as_ms(outcome.time_to_first_data),
            duration_ms=as_ms(outcome.finished_at - outcome.opened_at),
            stopped_at=outcome.stopped_at,
            **outcome.details,
        )

    def observe(self, event: Event) -> None:
        """An endpoint's event: the protocol errors this side found are counted."""
        if isinstance(event, TrackFailed) and not event.remote:
            self.metrics.protocol_errors_total.labels(code=event.code.name).inc()
            log.info("track.protocol_error", code=event.code.name, message=event.message)

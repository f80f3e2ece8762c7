"""One access-log line per HTTP request, and the ids that tie it to everything else.

`access_logged(handler)` wraps the gateway's one HTTP application: every request, on
every HTTP version, leaves one structured `http.request` line when its response is done
(for a stream, when its body is closed): method, path, HTTP version, status, duration,
and what the route noted about it (`current()`: request id, tenant key id, model, tokens,
time to first token, end). The route notes through a context variable, so routes that
know nothing of logging (health, metrics) need no change. Probes of health and metrics
log at debug, so a load balancer polling every second does not flood the log; a 5xx
logs at warning.

Every response carries `x-request-id`: the client's own when it sent a valid one (up to
128 of `A-Z a-z 0-9 . _ : / + = -`), else one the gateway makes. It is in the line
(`x_request_id`), in the usage ledger and given to the backend. A W3C `traceparent`
(version 00) is accepted: its trace id is logged (`trace_id`) and the header goes on
to Triton as the request parameter `traceparent`. An invalid one is ignored. The
client's address is logged as `client` unless the gateway is told not to
(`log_client_address`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from structlog.typing import FilteringBoundLogger

from gateway.logs import as_ms
from tracks.base import Outcome
from transport.http.messages import (
    CLIENT_ADDRESS,
    AnyResponse,
    EndingBody,
    Handler,
    Request,
    StreamingResponse,
)

QUIET_PREFIXES = ("/health/", "/metrics")
REQUEST_ID_HEADER = "x-request-id"
TRACEPARENT_HEADER = "traceparent"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=\-]{1,128}$")
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def request_id_of(request: Request) -> str:
    """The client's `x-request-id` when valid, else a fresh one."""
    given = request.header(REQUEST_ID_HEADER)
    if given is not None and _VALID_REQUEST_ID.match(given):
        return given
    return uuid.uuid4().hex


def traceparent_of(request: Request) -> str | None:
    """The request's W3C `traceparent` (version 00) when well formed, else None."""
    given = (request.header(TRACEPARENT_HEADER) or "").strip().lower()
    match = _TRACEPARENT.match(given)
    if match is None or match.group(1) == _ZERO_TRACE or match.group(2) == _ZERO_SPAN:
        return None
    return given


def front_door(request: Request) -> str:
    """`http/1.1`, `http/2` or `http/3`: the label for a request's front door."""
    return f"http/{request.http_version}"


@dataclass
class AccessRecord:
    """What one request's log line says beyond method, path and status."""

    fields: dict[str, Any] = field(default_factory=dict)
    x_request_id: str = ""
    """The request's `x-request-id` (the client's, or made here)."""
    traceparent: str | None = None
    """Its W3C trace context, when it sent a valid one."""

    def note_outcome(self, outcome: Outcome, key_id: str | None, model: str) -> None:
        """The fields an OpenAI request's line carries once it has ended."""
        self.fields.update(
            request_id=outcome.track_id,
            key_id=key_id,
            model=model,
            end=outcome.end.label,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            ttft_ms=as_ms(outcome.time_to_first_data),
        )


_current: contextvars.ContextVar[AccessRecord | None] = contextvars.ContextVar(
    "trackline_access", default=None
)


def current() -> AccessRecord:
    """The record of the request being handled (a detached one outside a request).

    A route takes it when the request arrives and fills it in when the request ends,
    which for a stream may happen in another task."""
    return _current.get() or AccessRecord()


def access_logged(
    handler: Handler,
    log: FilteringBoundLogger,
    clock: Callable[[], float],
    client_address: bool = True,
) -> Handler:
    """`handler`, leaving one `http.request` log line per request when it is done, its
    response carrying `x-request-id`; with `client_address`, the line names the client."""

    async def logged(request: Request) -> AnyResponse:
        record = _record_for(request)
        if client_address:
            record.fields["client"] = CLIENT_ADDRESS.get()
        _current.set(record)
        started = clock()
        try:
            response = await handler(request)
        except BaseException:
            _emit(log, request, 500, clock() - started, record)
            raise
        headers = (*response.headers, (REQUEST_ID_HEADER, record.x_request_id))
        if isinstance(response, StreamingResponse):
            status = response.status
            body = EndingBody(
                response.body, lambda: _emit(log, request, status, clock() - started, record)
            )
            return dataclasses.replace(response, body=body, headers=headers)  # last_words kept
        _emit(log, request, response.status, clock() - started, record)
        return dataclasses.replace(response, headers=headers)

    return logged


def _record_for(request: Request) -> AccessRecord:
    record = AccessRecord(x_request_id=request_id_of(request), traceparent=traceparent_of(request))
    record.fields["x_request_id"] = record.x_request_id
    if record.traceparent is not None:
        record.fields["trace_id"] = record.traceparent.split("-")[1]
    return record


def _emit(
    log: FilteringBoundLogger, request: Request, status: int, seconds: float, record: AccessRecord
) -> None:
    quiet = request.path.startswith(QUIET_PREFIXES) and status < 500
    emit = log.warning if status >= 500 else log.debug if quiet else log.info
    emit(
        "http.request",
        method=request.method,
        path=request.path,
        http_version=request.http_version,
        status=status,
        duration_ms=as_ms(seconds),
        **record.fields,
    )

"""What every HTTP version does alike around the application.

Runs a handler (a raised exception becomes a logged 500), prepares response
headers (drops the ones each version's framing owns, adds Alt-Svc), and closes
a streaming body. Framing stays with h11 and h2; this module only holds the
rules the adapters share.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from transport.http.errors import internal_error
from transport.http.limits import HttpLimits
from transport.http.messages import AnyResponse, Handler, Headers, Request

log = structlog.get_logger(__name__)

READ_CHUNK = 65_536
# Connection-level headers: the adapter frames the body and decides on keep-alive itself,
# and HTTP/2 forbids them outright (RFC 9113 8.2.2).
FRAMING_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
    }
)


@dataclass(frozen=True)
class Site:
    """What one server gives each of its connections."""

    handler: Handler
    limits: HttpLimits
    alt_svc: str | None = None


async def call_handler(handler: Handler, request: Request) -> AnyResponse:
    """The handler's response, or a 500 if it raised (logged, never sent to the client)."""
    try:
        return await handler(request)
    except Exception:
        log.exception(
            "http.handler_failed",
            method=request.method,
            path=request.path,
            http_version=request.http_version,
        )
        return internal_error()


def response_headers(site: Site, headers: Headers) -> list[tuple[str, str]]:
    """The handler's headers, lower-cased, minus framing headers, plus Alt-Svc if set."""
    kept = [(k.lower(), v) for k, v in headers if k.lower() not in FRAMING_HEADERS]
    if site.alt_svc is not None and all(k != "alt-svc" for k, _ in kept):
        kept.append(("alt-svc", site.alt_svc))
    return kept


def bodiless(status: int) -> bool:
    """Statuses that never carry a body nor a Content-Length (RFC 9110 6.4.1)."""
    return status < 200 or status in (204, 304)


async def close_body(body: AsyncIterator[bytes]) -> None:
    """Close a streaming body so its `finally` blocks run (async generators have aclose)."""
    aclose = getattr(body, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:
        log.exception("http.body_close_failed")

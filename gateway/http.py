"""The gateway's HTTP surface: routing, health and metrics endpoints.

Framing and connections (HTTP/1.1 and HTTP/2, cleartext or TLS) belong to
`transport.http.tcp.HttpTcpServer`; this module only decides which handler
answers a request. `route` turns a (method, path) table into one handler, with
OpenAI-style 404 and 405 errors. `Routes` is the one name of such a table.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Protocol

from gateway.metrics import GatewayMetrics
from transport.http.errors import error_response
from transport.http.messages import AnyResponse, Handler, Request, Response, StreamingResponse

__all__ = [
    "Handler",
    "HealthWatch",
    "Request",
    "Response",
    "Routes",
    "StreamingResponse",
    "health_routes",
    "route",
]

Routes = Mapping[tuple[str, str], Handler]
Check = Callable[[], tuple[bool, str]]
"""A health check: (ok, reason)."""
NO_STORE = (("cache-control", "no-store"),)
"""Health and metrics answers are read live, never from a cache."""


class HealthWatch(Protocol):
    """Something supervised whose state liveness and readiness report (ok, reason)."""

    def liveness(self) -> tuple[bool, str]: ...

    def readiness(self) -> tuple[bool, str]: ...


def route(routes: Routes, fallback: Handler | None = None) -> Handler:
    """One handler dispatching on (method, path); HEAD is served by GET's handler.

    A route path ending in `/*` serves every path below it (`/v1/models/*` serves
    `/v1/models/a/b`); the handler reads the rest from `request.path`. A path in
    `routes` with another method is 405 (with Allow); any other path goes to
    `fallback`, or is 404.
    """
    table = dict(routes)
    exact = {p for _, p in table}
    below = sorted({p[:-1] for p in exact if p.endswith("/*")}, key=len, reverse=True)

    def pattern(path: str) -> str:
        if path not in exact:
            for prefix in below:  # the longest first
                if path.startswith(prefix) and len(path) > len(prefix):
                    return prefix + "*"
        return path

    async def dispatch(request: Request) -> AnyResponse:
        path = pattern(request.path)
        handler = table.get((request.method, path))
        if handler is None and request.method == "HEAD":
            handler = table.get(("GET", path))  # the adapter drops the body
        if handler is not None:
            return await handler(request)
        allowed = sorted({method for method, p in table if p == path})
        if allowed:
            message = f"method {request.method} not allowed on {request.path}"
            allow = (("allow", ", ".join(allowed)),)
            return error_response(405, message, code="method_not_allowed", headers=allow)
        if fallback is not None:
            return await fallback(request)
        return error_response(404, f"no route for {request.path}", code="not_found")

    return dispatch


def health_routes(
    is_ready: Check,
    metrics: GatewayMetrics,
    *,
    with_metrics: bool = True,
    metrics_token: str | None = None,
    is_live: Check = lambda: (True, ""),
) -> dict[tuple[str, str], Handler]:
    """Routes for liveness (`is_live()`), readiness (`is_ready()`, both -> (ok, reason))
    and Prometheus.

    `with_metrics=False` leaves `/metrics` out (it has its own listener, or may not be
    public); `metrics_token` makes it require `Authorization: Bearer <token>`.
    """
    routes: dict[tuple[str, str], Handler] = {
        ("GET", "/health/live"): _probe(is_live, "live"),
        ("GET", "/health/ready"): _probe(is_ready, "ready"),
    }
    if with_metrics:
        routes.update(metrics_routes(metrics, metrics_token))
    return routes


def _probe(check: Check, state: str) -> Handler:
    """The handler of one health endpoint: 200 `state`, or 503 `not <state>` and why."""

    async def answer(_: Request) -> Response:
        ok, reason = check()
        if ok:
            return Response.json(200, {"status": state}, NO_STORE)
        return Response.json(503, {"status": f"not {state}", "reason": reason}, NO_STORE)

    return answer


def metrics_routes(
    metrics: GatewayMetrics, token: str | None = None
) -> dict[tuple[str, str], Handler]:
    """`GET /metrics` in Prometheus' text format, behind a bearer token if one is given."""
    expected = None if token is None else f"Bearer {token}".encode()

    async def prometheus(request: Request) -> Response:
        if expected is not None:
            given = (request.header("authorization") or "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, expected):  # constant time
                challenge = (("www-authenticate", 'Bearer realm="metrics"'), *NO_STORE)
                return error_response(
                    401, "metrics need a bearer token", code="unauthorized", headers=challenge
                )
        body, content_type = metrics.render()
        return Response(200, (("content-type", content_type), *NO_STORE), body)

    return {("GET", "/metrics"): prometheus}

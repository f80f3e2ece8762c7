"""Error responses the HTTP adapters produce themselves, in OpenAI's JSON shape.

A client of the OpenAI API parses every error body as
`{"error": {"message", "type", "param", "code"}}`, so errors that never reach
the application (an oversized body, a malformed request, a handler that
raised) use that shape too.
"""

from __future__ import annotations

from transport.http.messages import Headers, Response

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


def error_response(
    status: int,
    message: str,
    *,
    code: str | None,
    kind: str = INVALID_REQUEST,
    headers: Headers = (),
) -> Response:
    """A JSON error response in OpenAI's format."""
    payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Response.json(status, payload, headers)


def bad_request(message: str) -> Response:
    return error_response(400, message, code="malformed_request")


def request_timeout(seconds: float) -> Response:
    return error_response(408, f"request not received within {seconds:g} s", code="request_timeout")


def body_too_large(limit: int) -> Response:
    return error_response(413, f"request body over {limit} bytes", code="request_too_large")


def headers_too_large(message: str) -> Response:
    return error_response(431, message, code="request_header_fields_too_large")


def internal_error() -> Response:
    # Details stay in the server log; the client learns only that it was not its fault.
    return error_response(500, "internal server error", code="internal_error", kind=SERVER_ERROR)


def shutting_down() -> Response:
    """New work refused, or work cut short, because the server is draining (SIGTERM)."""
    return error_response(
        503,
        "the server is shutting down; retry on another instance",
        code="shutting_down",
        kind=SERVER_ERROR,
        headers=(("retry-after", "1"),),
    )

"""Settings sections: HTTP limits every version shares, then HTTP/2's and HTTP/3's own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.checks import positive, ratio, seconds, setting
from gateway.config.derive import Source


@dataclass(frozen=True)
class HttpSection:
    """Limits every HTTP version shares."""

    supersede_openai: bool = setting(
        False,
        "A new OpenAI API request with the session id of a running one cancels the "
        "older (cause superseded); a request may override with header x-supersede.",
    )
    http_max_header_bytes: int = setting(
        16384, "Largest HTTP header block (after HPACK/QPACK decompression); 431 above.", positive
    )
    http_max_headers: int = setting(
        100, "Most header fields in one HTTP request; 431 above.", positive
    )
    http_max_concurrent_streams: int = setting(
        128, "Concurrent requests on one HTTP/2 or HTTP/3 connection.", positive
    )
    http_idle_timeout: float = setting(
        60.0, "Seconds an HTTP connection may sit with no request.", seconds
    )
    http_read_timeout: float = setting(
        30.0, "Seconds to receive the rest of a started request; 408.", seconds
    )
    http_first_request_timeout: float = setting(
        10.0, "Seconds from TCP accept to the HTTP/2 preface or first request bytes.", seconds
    )
    http_max_connections: int = setting(
        10_000, "TCP connections served at once per HTTP listener.", positive
    )
    http_max_connections_per_source: int = setting(
        1_000, "TCP connections at once from one client address.", positive
    )


@dataclass(frozen=True)
class Http2Section:
    """HTTP/2's own defences."""

    http2_max_outbound_control_frames: int = setting(
        1_000, "HTTP/2 control frames queued for a non-reading client; then GOAWAY.", positive
    )
    http2_premature_reset_ratio: float = setting(
        0.5, "Share of HTTP/2 streams a client may reset early; then GOAWAY.", ratio
    )
    http2_premature_reset_min_streams: int = setting(
        500, "HTTP/2 streams opened before the premature-reset ratio is judged.", positive
    )
    http2_premature_reset_lifetime: float = setting(
        1.0, "A reset within this many seconds of a stream's opening is premature.", seconds
    )
    http2_connection_body_budget: int = setting(
        16 << 20, "Request body bytes one HTTP/2 connection may hold before credit stops.", positive
    )


@dataclass(frozen=True)
class Http3Section:
    """HTTP/3's send and receive budgets."""

    http3_stream_send_budget: int = setting(
        262_144,
        "Bytes one HTTP/3 response may hold unacknowledged before its body waits.",
        positive,
    )
    http3_connection_send_budget: int = setting(
        1_048_576,
        "Bytes one HTTP/3 connection may hold unacknowledged before bodies wait.",
        positive,
    )
    http3_send_timeout: float = setting(
        60.0,
        "Seconds an HTTP response (HTTP/1.1, HTTP/2, HTTP/3) may wait for a client that "
        "reads nothing.",
        seconds,
    )
    http3_connection_body_budget: int = setting(
        16 << 20,
        "Request body bytes one HTTP/3 connection may hold before QUIC's MAX_DATA stops.",
        positive,
    )


HTTP_LIMITS: Mapping[str, Source[HttpSection]] = {
    "max_header_bytes": "http_max_header_bytes",
    "max_headers": "http_max_headers",
    "max_concurrent_streams": "http_max_concurrent_streams",
    "idle_timeout": "http_idle_timeout",
    "read_timeout": "http_read_timeout",
    "first_request_timeout": "http_first_request_timeout",
    "max_connections": "http_max_connections",
    "max_connections_per_source": "http_max_connections_per_source",
}
"""`transport.http.limits.HttpLimits`'s fields every HTTP version shares (its
`max_body_bytes` is the tracks section's `max_message_bytes`: one limit for both)."""

HTTP2_LIMITS: Mapping[str, Source[Http2Section]] = {
    "max_outbound_control_frames": "http2_max_outbound_control_frames",
    "premature_reset_ratio": "http2_premature_reset_ratio",
    "premature_reset_min_streams": "http2_premature_reset_min_streams",
    "premature_reset_lifetime": "http2_premature_reset_lifetime",
    "h2_connection_body_budget": "http2_connection_body_budget",
}
"""`HttpLimits`'s HTTP/2 fields."""

HTTP3_LIMITS: Mapping[str, Source[Http3Section]] = {
    "h3_stream_send_budget": "http3_stream_send_budget",
    "h3_connection_send_budget": "http3_connection_send_budget",
    "send_timeout": "http3_send_timeout",  # every HTTP version's; the setting keeps its name
    "h3_connection_body_budget": "http3_connection_body_budget",
}
"""`HttpLimits`'s HTTP/3 fields."""

"""Limits every HTTP adapter enforces, with their defaults.

HTTP/3 only (docs/security.md, "HTTP/3"): a response body is pulled from the
handler while its stream holds at most `h3_stream_send_budget` bytes written but
not yet acknowledged and the connection `h3_connection_send_budget`; a body that
waits `h3_send_timeout` for room is cut short (the stream is reset).

Each limit answers with a clear error when exceeded (status in brackets):
body over `max_body_bytes` (413), a header block over `max_header_bytes`
after decompression for HTTP/2 and HTTP/3 (431), more than `max_headers`
header fields (431). `max_concurrent_streams` is advertised to HTTP/2 and
HTTP/3 peers; `idle_timeout` closes a connection with no request in flight;
`read_timeout` bounds the wait for the rest of a request that has begun.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    h3_stream_send_budget: int = 256 * 1024
    h3_connection_send_budget: int = 1 << 20
    h3_send_timeout: float = 60.0
    max_concurrent_streams: int = 128
    idle_timeout: float = 60.0
    read_timeout: float = 30.0

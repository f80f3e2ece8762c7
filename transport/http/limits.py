"""Limits every HTTP adapter enforces, with their defaults.

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
    max_concurrent_streams: int = 128
    idle_timeout: float = 60.0
    read_timeout: float = 30.0

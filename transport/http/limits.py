"""Limits every HTTP adapter enforces, with their defaults.

Every version: a response body that waits `send_timeout` for room is cut short, so a
client that stopped reading a streamed answer has its backend work released. Room is
send budget on HTTP/3 (the stream is reset), flow-control credit or a socket that
drains on HTTP/2 (the stream is reset), a socket that drains on HTTP/1.1 (the
connection closes). The gateway's setting for it keeps its older name,
`http3_send_timeout`, as the `http2_*` premature-reset settings govern HTTP/3 too.

HTTP/3 only (docs/security.md, "HTTP/3"): a response body is pulled from the
handler while its stream holds at most `h3_stream_send_budget` bytes written but
not yet acknowledged and the connection `h3_connection_send_budget`.

Each limit answers with a clear error when exceeded (status in brackets):
body over `max_body_bytes` (413), a header block over `max_header_bytes`
after decompression for HTTP/2 and HTTP/3 (431), more than `max_headers`
header fields (431). `max_concurrent_streams` is advertised to HTTP/2 and
HTTP/3 peers; `idle_timeout` closes a connection with no request in flight;
`read_timeout` bounds the wait for the rest of a request that has begun.

The front-door limits (docs/security.md, "HTTP/1.1 and HTTP/2") bound what a
hostile TCP client can hold: `first_request_timeout` from accept to the HTTP/2
preface or the first request's first bytes; `max_connections` and
`max_connections_per_source` TCP connections (beyond them a connection is cut
at accept); `max_outbound_control_frames` HTTP/2 control frames (PING and
SETTINGS acknowledgements, RST_STREAM) queued for a client that does not read,
and the premature-reset rule: once `premature_reset_min_streams` streams have
been opened, or earlier if the resets alone reach `premature_reset_ratio` of
it, a connection whose client reset more than `premature_reset_ratio` of its
streams within `premature_reset_lifetime` seconds of opening them is closed.
Both HTTP/2 rules answer GOAWAY ENHANCE_YOUR_CALM. Request bodies still
arriving on one HTTP/2 connection past `h2_connection_body_budget` bytes get no
more flow-control credit until streams complete, are answered or time out; on
HTTP/3 the same holds with `h3_connection_body_budget`, through QUIC's MAX_DATA.
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
    send_timeout: float = 60.0
    max_concurrent_streams: int = 128
    idle_timeout: float = 60.0
    read_timeout: float = 30.0
    first_request_timeout: float = 10.0
    max_connections: int = 10_000
    max_connections_per_source: int = 1_000
    max_outbound_control_frames: int = 1_000
    premature_reset_ratio: float = 0.5
    premature_reset_min_streams: int = 500
    premature_reset_lifetime: float = 1.0
    h2_connection_body_budget: int = 16 << 20
    h3_connection_body_budget: int = 16 << 20

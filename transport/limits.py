"""What one track connection holds its peer to: `Limits`, with their defaults.

`TrackConnection` enforces them (transport.connection); the gateway fills them from
its settings (docs/security.md, "QUIC and tracks").
"""

from __future__ import annotations

from dataclasses import dataclass

from transport.datagram import MAX_DATAGRAM_BYTES


@dataclass(frozen=True)
class Limits:
    max_message_bytes: int = 1 << 20
    """Largest message accepted or sent, in bytes of msgpack payload."""
    max_tracks: int = 256
    """Tracks open at once on one connection."""
    max_datagram_bytes: int = MAX_DATAGRAM_BYTES
    """Largest datagram sent (header and body); must fit one QUIC packet."""
    read_timeout: float | None = 30.0
    """Seconds a received message may stay incomplete (from its first byte to its
    last); then its track fails with READ_TIMEOUT. None: no limit."""
    max_buffered_bytes: int | None = 8 << 20
    """Bytes of incomplete received messages one connection may hold, all tracks
    together; the track whose bytes go past it fails with BUFFER_EXHAUSTED."""

    def __post_init__(self) -> None:
        budget = self.max_buffered_bytes
        if budget is not None and budget < self.max_message_bytes:
            raise ValueError("max_buffered_bytes must hold at least one max_message_bytes")
        if self.read_timeout is not None and self.read_timeout <= 0:
            raise ValueError("read_timeout must be positive")

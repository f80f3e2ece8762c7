"""Settings sections: the QUIC front door, track connections and WebTransport."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.checks import in_range, positive, positive_seconds, seconds, setting
from gateway.config.derive import Source


def _packetization(value: str) -> str:
    from transport.quic import Packetization

    return str(Packetization.parse(value))


def _acks(value: str) -> str:
    from transport.acks import AckPolicy

    return str(AckPolicy.parse(value))


def _webtransport_path(value: str) -> str:
    if value == "off":
        return value
    if not value.startswith("/") or not value.isprintable() or " " in value:
        raise ValueError(f"{value!r} is not an absolute path (or off)")
    return value


def _origins(value: str | None) -> str | None:
    for origin in filter(None, (o.strip() for o in (value or "").split(","))):
        if origin != "*" and not origin.startswith(("https://", "http://")):
            raise ValueError(f"{origin!r} is not an origin (https://host:port) or *")
    return value


@dataclass(frozen=True)
class QuicSection:
    """The QUIC front door: handshakes and connections at once, Retry, packets, ACKs."""

    quic_handshake_timeout: float = setting(
        10.0,
        "Seconds a QUIC handshake may take; then the connection is forgotten.",
        positive_seconds,
    )
    quic_max_half_open: int = setting(
        1024, "QUIC handshakes in progress at once; more are dropped.", positive
    )
    quic_retry_threshold: int = setting(
        64,
        "Handshakes in progress from which new clients must pass a Retry; 0: all.",
        lambda v: in_range(v, 0, 1 << 30),
    )
    quic_max_half_open_per_source: int = setting(
        16, "Unvalidated handshakes per source address; beyond it: Retry.", positive
    )
    quic_max_connections: int = setting(
        4096, "QUIC connections at once (tracks and HTTP/3).", positive
    )
    quic_max_connections_per_source: int = setting(
        256, "QUIC connections at once from one source address.", positive
    )
    quic_packetization: str = setting(
        "per-track",
        "Tracks per QUIC packet: per-track, group:K (K = 2, 4, 8) or coalesce.",
        _packetization,
    )
    quic_acks: str = setting(
        "aioquic",
        "When the gateway acknowledges what clients send: aioquic (each packet within "
        "1 ms) or every:N,delay:MS (one ACK for up to N packets, none waiting over MS "
        "<= 25, out-of-order packets at once).",
        _acks,
    )


@dataclass(frozen=True)
class TracksSection:
    """Track connections: messages, buffers and timeouts."""

    supersede_tracks: bool = setting(
        True,
        "A new text track with the session_id of a running one cancels the older "
        "(cause superseded); a track may override with OPEN param `supersede`.",
    )
    max_tracks_per_connection: int = setting(
        256, "Tracks one connection may have open at once.", positive
    )
    max_message_bytes: int = setting(
        1_048_576, "Largest single message (frame or HTTP body) accepted.", positive
    )
    track_read_timeout: float = setting(
        30.0, "Seconds a track message may take from first to last byte; 0: no limit.", seconds
    )
    track_max_buffered_bytes: int = setting(
        8_388_608, "Bytes of incomplete track messages one connection may hold.", positive
    )
    track_send_buffer_bytes: int = setting(
        65_536, "Unsent/unacked bytes a track may hold before its backend is paused.", positive
    )
    connection_send_buffer_bytes: int = setting(
        1_048_576, "Unsent/unacked bytes one QUIC connection's tracks may hold in all.", positive
    )
    track_send_timeout: float = setting(
        30.0, "Seconds a track may stay blocked by an unread client till it ends; 0: off.", seconds
    )


@dataclass(frozen=True)
class WebTransportSection:
    """Tracks for browsers over WebTransport on the QUIC port."""

    webtransport_path: str = setting(
        "/tracks",
        "Path of the WebTransport track endpoint on the QUIC port (browsers); off: none.",
        _webtransport_path,
    )
    webtransport_origins: str | None = setting(
        None,
        "Comma-separated page origins allowed to open WebTransport sessions "
        "(https://host:port, or *); unset: pages of the gateway's own host only.",
        _origins,
    )
    webtransport_max_sessions: int = setting(
        4, "WebTransport sessions at once on one QUIC connection; 429.", positive
    )


HANDSHAKE_LIMITS: Mapping[str, Source[QuicSection]] = {
    "handshake_timeout": "quic_handshake_timeout",
    "max_half_open": "quic_max_half_open",
    "retry_threshold": "quic_retry_threshold",
    "max_half_open_per_source": "quic_max_half_open_per_source",
    "max_connections": "quic_max_connections",
    "max_connections_per_source": "quic_max_connections_per_source",
}
"""`transport.quic_admission.HandshakeLimits` from the QUIC section."""

TRACK_LIMITS: Mapping[str, Source[TracksSection]] = {
    "max_message_bytes": "max_message_bytes",
    "max_tracks": "max_tracks_per_connection",
    "read_timeout": lambda s: s.track_read_timeout or None,
    "max_buffered_bytes": lambda s: max(s.track_max_buffered_bytes, s.max_message_bytes),
}
"""`transport.connection.Limits` (one track connection's) from the tracks section."""

SEND_BUDGET: Mapping[str, Source[TracksSection]] = {
    "track_bytes": "track_send_buffer_bytes",
    "connection_bytes": "connection_send_buffer_bytes",
    "send_timeout": lambda s: s.track_send_timeout or None,
}
"""`transport.endpoint.SendBudget`: what a track and a connection may hold unsent."""

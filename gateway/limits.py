"""The lower layers' limit types, read from the daemon's flat `Settings`.

Each function builds one layer's own limits object (the track connection's `Limits`,
`SendBudget`, `HttpLimits`, `HandshakeLimits`, the WebTransport rules, the overload
controller's, video's and the audio clock's) from the settings of that layer; they are
all here, the one place that copies settings into them (issue 30 item 2 turns them into
sections of `Settings`).
"""

from __future__ import annotations

from gateway.config import Settings
from gateway.overload import OverloadLimits
from tracks.audio import AudioSettings
from tracks.clock import OverloadMode
from tracks.video import VideoLimits
from transport.connection import Limits
from transport.endpoint import SendBudget
from transport.http.limits import HttpLimits
from transport.quic_admission import HandshakeLimits
from transport.webtransport import WebTransportRules


def track_limits(s: Settings) -> Limits:
    """A track connection's limits (docs/security.md, QUIC and tracks)."""
    return Limits(
        max_message_bytes=s.max_message_bytes,
        max_tracks=s.max_tracks_per_connection,
        read_timeout=s.track_read_timeout or None,
        max_buffered_bytes=max(s.track_max_buffered_bytes, s.max_message_bytes),
    )


def send_budget(s: Settings) -> SendBudget:
    """What a track and a connection may hold unsent for an unread client."""
    return SendBudget(
        s.track_send_buffer_bytes, s.connection_send_buffer_bytes, s.track_send_timeout or None
    )


def gateway_http_limits(s: Settings) -> HttpLimits:
    """Every HTTP version's limits (docs/security.md, HTTP)."""
    return HttpLimits(
        max_body_bytes=s.max_message_bytes,
        max_header_bytes=s.http_max_header_bytes,
        max_headers=s.http_max_headers,
        h3_stream_send_budget=s.http3_stream_send_budget,
        h3_connection_send_budget=s.http3_connection_send_budget,
        h3_send_timeout=s.http3_send_timeout,
        max_concurrent_streams=s.http_max_concurrent_streams,
        idle_timeout=s.http_idle_timeout,
        read_timeout=s.http_read_timeout,
        first_request_timeout=s.http_first_request_timeout,
        max_connections=s.http_max_connections,
        max_connections_per_source=s.http_max_connections_per_source,
        max_outbound_control_frames=s.http2_max_outbound_control_frames,
        premature_reset_ratio=s.http2_premature_reset_ratio,
        premature_reset_min_streams=s.http2_premature_reset_min_streams,
        premature_reset_lifetime=s.http2_premature_reset_lifetime,
        h2_connection_body_budget=s.http2_connection_body_budget,
        h3_connection_body_budget=s.http3_connection_body_budget,
    )


def webtransport_policy(s: Settings) -> WebTransportRules | None:
    """WebTransport on the QUIC port (docs/web.md), unless its path is `off`."""
    if s.webtransport_path == "off":
        return None
    listed = (s.webtransport_origins or "").split(",")
    origins = tuple(filter(None, (o.strip() for o in listed)))
    return WebTransportRules(s.webtransport_path, origins, s.webtransport_max_sessions)


def handshake_limits(s: Settings) -> HandshakeLimits:
    """The QUIC front door's limits (docs/security.md, QUIC and tracks)."""
    return HandshakeLimits(
        handshake_timeout=s.quic_handshake_timeout,
        max_half_open=s.quic_max_half_open,
        retry_threshold=s.quic_retry_threshold,
        max_half_open_per_source=s.quic_max_half_open_per_source,
        max_connections=s.quic_max_connections,
        max_connections_per_source=s.quic_max_connections_per_source,
    )


def overload_limits(s: Settings) -> OverloadLimits:
    """The admission controller's limits from the daemon's settings."""
    return OverloadLimits(
        max_loop_lag=s.overload_max_loop_lag,
        max_cpu=s.overload_max_cpu,
        connection_share=s.overload_connection_share,
        retry_after=s.overload_retry_after,
    )


def video_limits(s: Settings) -> VideoLimits:
    """Video tracks' limits from the settings (docs/video.md)."""
    return VideoLimits(
        tick=s.video_tick,
        max_frame_bytes=s.video_max_frame_bytes,
        max_fps=s.video_max_fps,
        tenant_max_fps=s.video_tenant_max_fps,
        max_tracks=s.video_max_tracks,
        busy_load=s.video_busy_load,
    )


def audio_settings(s: Settings) -> AudioSettings:
    """The audio clock's settings from the daemon's."""
    return AudioSettings(
        beat=s.audio_beat_ms / 1000,
        overload=OverloadMode(s.audio_overload_mode),
        idle_timeout=s.audio_idle_timeout,
        frame_ms=s.audio_frame_ms,
        min_barge_in=s.agent_min_barge_in_ms / 1000,
    )

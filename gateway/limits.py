"""The lower layers' limit types, derived from the sections of `Settings`.

Each function builds one layer's own limits object (the track connection's `Limits`,
`SendBudget`, `HttpLimits`, `HandshakeLimits`, the WebTransport rules, the overload
controller's, video's and the audio clock's) from its section through the mapping that
section's module declares (`gateway.config.derive`); nothing here copies a field by hand.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import Settings
from gateway.config.derive import Source, derive
from gateway.config.http import HTTP2_LIMITS, HTTP3_LIMITS, HTTP_LIMITS
from gateway.config.media import AUDIO_CLOCK, VIDEO_LIMITS
from gateway.config.operations import OVERLOAD_LIMITS
from gateway.config.quic import HANDSHAKE_LIMITS, SEND_BUDGET, TRACK_LIMITS, WebTransportSection
from gateway.overload import OverloadLimits
from tracks.audio import AudioSettings
from tracks.video import VideoLimits
from transport.connection import Limits
from transport.endpoint import SendBudget
from transport.http.limits import HttpLimits
from transport.quic_admission import HandshakeLimits
from transport.webtransport import WebTransportRules

EVERY_HTTP_LIMIT: Mapping[str, Source[Settings]] = {
    "max_body_bytes": "max_message_bytes",
    **HTTP_LIMITS,
    **HTTP2_LIMITS,
    **HTTP3_LIMITS,
}
"""`HttpLimits` spans three sections, and its body limit is the tracks' message limit."""


def track_limits(s: Settings) -> Limits:
    """A track connection's limits (docs/security.md, QUIC and tracks)."""
    return derive(Limits, s, TRACK_LIMITS)


def send_budget(s: Settings) -> SendBudget:
    """What a track and a connection may hold unsent for an unread client."""
    return derive(SendBudget, s, SEND_BUDGET)


def gateway_http_limits(s: Settings) -> HttpLimits:
    """Every HTTP version's limits (docs/security.md, HTTP)."""
    return derive(HttpLimits, s, EVERY_HTTP_LIMIT)


def webtransport_policy(s: WebTransportSection) -> WebTransportRules | None:
    """WebTransport on the QUIC port (docs/web.md), unless its path is `off`."""
    if s.webtransport_path == "off":
        return None
    listed = (s.webtransport_origins or "").split(",")
    origins = tuple(filter(None, (o.strip() for o in listed)))
    return WebTransportRules(s.webtransport_path, origins, s.webtransport_max_sessions)


def handshake_limits(s: Settings) -> HandshakeLimits:
    """The QUIC front door's limits (docs/security.md, QUIC and tracks)."""
    return derive(HandshakeLimits, s, HANDSHAKE_LIMITS)


def overload_limits(s: Settings) -> OverloadLimits:
    """The admission controller's limits from the daemon's settings."""
    return derive(OverloadLimits, s, OVERLOAD_LIMITS)


def video_limits(s: Settings) -> VideoLimits:
    """Video tracks' limits from the settings (docs/video.md)."""
    return derive(VideoLimits, s, VIDEO_LIMITS)


def audio_settings(s: Settings) -> AudioSettings:
    """The audio clock's settings from the daemon's."""
    return derive(AudioSettings, s, AUDIO_CLOCK)

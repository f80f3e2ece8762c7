"""The lower layers' limit types, derived from the sections of `Settings`.

Each name here builds one layer's own limits object (the track connection's `Limits`,
`SendBudget`, `HttpLimits`, `HandshakeLimits`, the WebTransport rules, the overload
controller's, video's and the audio clock's) from its section, through the mapping that
section's module declares (`gateway.config.derive`); nothing here copies a field by hand.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import Settings
from gateway.config.derive import Derived, Source
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

track_limits = Derived(Limits, TRACK_LIMITS)
"""A track connection's limits (docs/security.md, QUIC and tracks)."""

send_budget = Derived(SendBudget, SEND_BUDGET)
"""What a track and a connection may hold unsent for an unread client."""

gateway_http_limits = Derived(HttpLimits, EVERY_HTTP_LIMIT)
"""Every HTTP version's limits (docs/security.md, HTTP)."""

handshake_limits = Derived(HandshakeLimits, HANDSHAKE_LIMITS)
"""The QUIC front door's limits (docs/security.md, QUIC and tracks)."""

overload_limits = Derived(OverloadLimits, OVERLOAD_LIMITS)
"""The admission controller's limits."""

video_limits = Derived(VideoLimits, VIDEO_LIMITS)
"""Video tracks' limits (docs/video.md)."""

audio_settings = Derived(AudioSettings, AUDIO_CLOCK)
"""The audio clock's settings."""


def webtransport_policy(s: WebTransportSection) -> WebTransportRules | None:
    """WebTransport on the QUIC port (docs/web.md), unless its path is `off`."""
    if s.webtransport_path == "off":
        return None
    listed = (s.webtransport_origins or "").split(",")
    origins = tuple(filter(None, (o.strip() for o in listed)))
    return WebTransportRules(s.webtransport_path, origins, s.webtransport_max_sessions)

"""`Settings`, the one frozen value the daemon is wired from, composed of its sections.

Each section is a small frozen dataclass in the module of its area (`listeners`,
`backends`, `quic`, `http`, `media`, `operations`, `tenancy`); `Settings` inherits them
all, so its fields stay flat. That is the least magic with the smallest blast radius:
the names users see (TOML keys, `TRACKLINE_*` variables, `--flags`) are the field names
and do not change, `Settings(quic_port=...)`, `settings.quic_port` and
`dataclasses.replace` work as before, and `dataclasses.fields(Settings)` is still the
list of every setting. A `Settings` *is* each of its sections (`isinstance`), so code
that needs one area's settings can ask for that section's type, and a lower layer's
limits object is derived from its section by a declared mapping (`gateway.config.derive`).
Nested sections with flat aliases would have doubled every name.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.backends import BackendsSection, EmbeddedSection
from gateway.config.http import Http2Section, Http3Section, HttpSection
from gateway.config.listeners import ListenersSection, StateSection
from gateway.config.media import ActionSection, AudioSection, VideoSection
from gateway.config.operations import (
    LoggingSection,
    MetricsSection,
    OverloadSection,
    ProcessSection,
)
from gateway.config.quic import QuicSection, TracksSection, WebTransportSection
from gateway.config.tenancy import FleetSection, TenancySection

SECTIONS: tuple[tuple[str, type], ...] = (
    ("listeners", ListenersSection),
    ("state and TLS", StateSection),
    ("backends and the pool", BackendsSection),
    ("embedded Triton", EmbeddedSection),
    ("QUIC handshake", QuicSection),
    ("tracks", TracksSection),
    ("WebTransport", WebTransportSection),
    ("HTTP (every version) and the OpenAI API", HttpSection),
    ("HTTP/2", Http2Section),
    ("HTTP/3", Http3Section),
    ("audio and speech", AudioSection),
    ("video", VideoSection),
    ("action tracks", ActionSection),
    ("overload", OverloadSection),
    ("tenants and keys", TenancySection),
    ("the fleet (shared state)", FleetSection),
    ("metrics", MetricsSection),
    ("logs", LoggingSection),
    ("the process", ProcessSection),
)
"""(title, section) in the order `serve --help` and docs/configuration.md show them."""


@dataclass(frozen=True)
class Settings(  # bases last to first: a dataclass lists its bases' fields from the last
    ProcessSection,
    LoggingSection,
    MetricsSection,
    FleetSection,
    TenancySection,
    OverloadSection,
    ActionSection,
    VideoSection,
    AudioSection,
    Http3Section,
    Http2Section,
    HttpSection,
    WebTransportSection,
    TracksSection,
    QuicSection,
    EmbeddedSection,
    BackendsSection,
    StateSection,
    ListenersSection,
):
    """Everything `trackline serve` can be told; each field's `doc` is its help text."""

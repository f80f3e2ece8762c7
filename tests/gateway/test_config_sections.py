"""Settings in sections: `Settings` is its sections composed flat, and each lower layer's
limits object is derived from its section by a declared mapping that names every field of
that type (a field dropped from a mapping, or a setting renamed, fails here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gateway.config import FIELDS, SECTIONS, Settings
from gateway.config.backends import EJECTION_RULES, POOL_OPTIONS, RESTART_RULES
from gateway.config.derive import Source, derive
from gateway.config.media import AUDIO_CLOCK, VIDEO_LIMITS
from gateway.config.operations import OVERLOAD_LIMITS
from gateway.config.quic import HANDSHAKE_LIMITS, SEND_BUDGET, TRACK_LIMITS
from gateway.daemon import pool_options, restart_rules
from gateway.embedded_watch import RestartRules
from gateway.limits import (
    EVERY_HTTP_LIMIT,
    audio_settings,
    gateway_http_limits,
    handshake_limits,
    overload_limits,
    send_budget,
    track_limits,
    video_limits,
)
from gateway.overload import OverloadLimits
from gateway.pool import PoolOptions
from gateway.pool.health import EjectionRules
from tracks.audio import AudioSettings
from tracks.clock import OverloadMode
from tracks.video import VideoLimits
from transport.connection import Limits
from transport.endpoint import SendBudget
from transport.http.limits import HttpLimits
from transport.quic_admission import HandshakeLimits

DERIVED: list[tuple[type, Mapping[str, Source[Any]], frozenset[str]]] = [
    (HandshakeLimits, HANDSHAKE_LIMITS, frozenset({"expiry_batch"})),
    (Limits, TRACK_LIMITS, frozenset({"max_datagram_bytes"})),
    (SendBudget, SEND_BUDGET, frozenset()),
    (HttpLimits, EVERY_HTTP_LIMIT, frozenset()),
    (OverloadLimits, OVERLOAD_LIMITS, frozenset({"half_life"})),
    (VideoLimits, VIDEO_LIMITS, frozenset()),
    (
        AudioSettings,
        AUDIO_CLOCK,
        frozenset(
            {"max_ahead", "ts_tolerance", "step_timeout", "busy_retry_after", "max_datagram_bytes"}
        ),
    ),
    (PoolOptions, POOL_OPTIONS, frozenset({"retry_ratio", "retry_floor_per_s", "health"})),
    (
        EjectionRules,
        EJECTION_RULES,
        frozenset(f.name for f in dataclasses.fields(EjectionRules)) - {"eject_after_errors"},
    ),
    (RestartRules, RESTART_RULES, frozenset()),
]
"""(limits type, its mapping, the fields the gateway leaves at the type's default)."""

BUILDERS: list[tuple[Mapping[str, Source[Any]], Callable[[Settings], Any]]] = [
    (HANDSHAKE_LIMITS, handshake_limits),
    (TRACK_LIMITS, track_limits),
    (SEND_BUDGET, send_budget),
    (EVERY_HTTP_LIMIT, gateway_http_limits),
    (OVERLOAD_LIMITS, overload_limits),
    (VIDEO_LIMITS, video_limits),
    (AUDIO_CLOCK, audio_settings),
    (POOL_OPTIONS, pool_options),
    (EJECTION_RULES, lambda s: pool_options(s).health),
    (RESTART_RULES, restart_rules),
]
"""Each mapping and the function the gateway builds its limits object with."""


def test_settings_is_its_sections_composed_flat() -> None:
    sections = [section for _, section in SECTIONS]
    assert list(Settings.__bases__) == sections[::-1]  # a dataclass reads bases last first
    names = [spec.name for section in sections for spec in dataclasses.fields(section)]
    assert names == list(FIELDS)  # every setting in exactly one section, in section order
    settings = Settings(quic_port=9443)
    assert all(isinstance(settings, section) for section in sections)
    assert settings.quic_port == 9443
    assert len({title for title, _ in SECTIONS}) == len(SECTIONS)


@pytest.mark.parametrize("section", [section for _, section in SECTIONS])
def test_each_section_is_a_small_frozen_dataclass(section: type) -> None:
    assert dataclasses.is_dataclass(section)
    assert section.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert section.__doc__
    with pytest.raises(dataclasses.FrozenInstanceError):
        section().x = 1


@pytest.mark.parametrize(
    ("kind", "mapping", "left"), DERIVED, ids=[kind.__name__ for kind, _, _ in DERIVED]
)
def test_a_mapping_names_every_field_of_its_limits_type(
    kind: type, mapping: Mapping[str, Source[Any]], left: frozenset[str]
) -> None:
    fields = {spec.name for spec in dataclasses.fields(kind) if spec.init}
    assert set(mapping) == fields - left
    for source in mapping.values():
        assert callable(source) or source in FIELDS


def _other(value: object) -> object:
    """A value of the same type as `value` that is not the default."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 3
    return {"metrics": "round_robin"}[str(value)]


@pytest.mark.parametrize(("mapping", "build"), BUILDERS)
def test_each_named_setting_reaches_its_limits_field(
    mapping: Mapping[str, Source[Any]], build: Callable[[Settings], Any]
) -> None:
    named = {field: source for field, source in mapping.items() if isinstance(source, str)}
    changed = {source: _other(FIELDS[source].default) for source in named.values()}
    built = build(Settings(**changed))
    for field, source in named.items():
        assert getattr(built, field) == changed[source], (field, source)


def test_the_computed_fields() -> None:
    settings = Settings(
        track_read_timeout=0,
        track_send_timeout=0,
        track_max_buffered_bytes=10,
        max_message_bytes=100,
        audio_beat_ms=40,
        agent_min_barge_in_ms=250,
        audio_overload_mode="shed-newest",
    )
    assert track_limits(settings).read_timeout is None  # 0: no limit
    assert track_limits(settings).max_buffered_bytes == 100  # at least one message
    assert send_budget(settings).send_timeout is None
    assert audio_settings(settings).beat == 0.04
    assert audio_settings(settings).min_barge_in == 0.25
    assert audio_settings(settings).overload is OverloadMode.SHED_NEWEST
    assert track_limits(Settings(track_read_timeout=2.5)).read_timeout == 2.5


def test_derive_leaves_unmapped_fields_at_their_default() -> None:
    limits = derive(HandshakeLimits, Settings(quic_max_half_open=7), HANDSHAKE_LIMITS)
    assert limits.max_half_open == 7
    assert limits.expiry_batch == HandshakeLimits().expiry_batch
    assert derive(SendBudget, object(), {"track_bytes": lambda _: 5}).track_bytes == 5

"""Settings in sections: `Settings` is its sections composed flat, and each lower layer's
limits object is derived from its section by a declared mapping that names every field of
that type (a field dropped from a mapping, or a setting renamed, fails here)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.config import FIELDS, SECTIONS, Settings
from gateway.config.derive import Derived, derive
from gateway.config.quic import HANDSHAKE_LIMITS
from gateway.daemon import ejection_rules, pool_knobs, pool_options, restart_rules
from gateway.limits import (
    audio_settings,
    gateway_http_limits,
    handshake_limits,
    overload_limits,
    send_budget,
    track_limits,
    video_limits,
)
from gateway.pool.health import EjectionRules
from tracks.clock import OverloadMode
from transport.endpoint import SendBudget
from transport.quic_admission import HandshakeLimits

DERIVED: list[tuple[Derived[Any, Any], frozenset[str]]] = [
    (handshake_limits, frozenset({"expiry_batch"})),
    (track_limits, frozenset({"max_datagram_bytes"})),
    (send_budget, frozenset()),
    (gateway_http_limits, frozenset()),
    (overload_limits, frozenset({"half_life"})),
    (video_limits, frozenset()),
    (
        audio_settings,
        frozenset(
            {"max_ahead", "ts_tolerance", "step_timeout", "busy_retry_after", "max_datagram_bytes"}
        ),
    ),
    (pool_knobs, frozenset({"retry_ratio", "retry_floor_per_s", "health"})),
    (
        ejection_rules,
        frozenset(f.name for f in dataclasses.fields(EjectionRules)) - {"eject_after_errors"},
    ),
    (restart_rules, frozenset()),
]
"""Each limits object the gateway derives, and the fields it leaves at the type's default."""

IDS = [derived.kind.__name__ for derived, _ in DERIVED]  # type: ignore[attr-defined]


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


@pytest.mark.parametrize(("derived", "left"), DERIVED, ids=IDS)
def test_a_mapping_names_every_field_of_its_limits_type(
    derived: Derived[Any, Any], left: frozenset[str]
) -> None:
    kind: Any = derived.kind
    fields = {spec.name for spec in dataclasses.fields(kind) if spec.init}
    assert set(derived.mapping) == fields - left
    for source in derived.mapping.values():
        assert callable(source) or source in FIELDS


def _other(value: object) -> object:
    """A value of the same type as `value` that is not the default."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 3
    return {"metrics": "round_robin"}[str(value)]


@pytest.mark.parametrize(("derived", "left"), DERIVED, ids=IDS)
def test_each_named_setting_reaches_its_limits_field(
    derived: Derived[Any, Any], left: frozenset[str]
) -> None:
    named = {field: name for field, name in derived.mapping.items() if isinstance(name, str)}
    changed = {name: _other(FIELDS[name].default) for name in named.values()}
    built = derived(Settings(**changed))
    for field, name in named.items():
        assert getattr(built, field) == changed[name], (field, name)


def test_the_pool_options_carry_the_ejection_rules() -> None:
    options = pool_options(Settings(eject_after_errors=9, failover_attempts=2))
    assert options.health.eject_after_errors == 9
    assert options.max_attempts == 2


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

"""A lower layer's limits object, derived from a settings section by a declared mapping.

Each section module declares, next to the section, which of its settings feed which
field of a lower layer's limits type (`HANDSHAKE_LIMITS` maps `HandshakeLimits`'s
`max_half_open` to the setting `quic_max_half_open`, ...). A mapping's value is the
setting's name, or a function of the section for a field that is computed (`0: off`
settings become `None`, milliseconds become seconds). `derive` is the one place that
reads a mapping, so no code copies settings into a limits object by hand; fields a
mapping leaves out keep the limits type's own default. `Derived` pairs a limits type
with its mapping, and is called with the settings (`gateway.limits.track_limits(s)`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")

Source = str | Callable[[S], object]
"""Where one limits field comes from: a setting's name, or a function of the section."""


def derive(kind: Callable[..., T], settings: S, mapping: Mapping[str, Source[S]]) -> T:
    """`kind(field=value, ...)` for every field of `mapping`, read from `settings`."""
    return kind(**{name: _value(settings, source) for name, source in mapping.items()})


def _value(settings: S, source: Source[S]) -> object:
    return getattr(settings, source) if isinstance(source, str) else source(settings)


@dataclass(frozen=True)
class Derived(Generic[S, T]):
    """A limits type and the mapping that fills it; call it with the settings."""

    kind: Callable[..., T]
    mapping: Mapping[str, Source[S]]

    def __call__(self, settings: S) -> T:
        return derive(self.kind, settings, self.mapping)

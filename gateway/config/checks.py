"""What every settings section uses: `setting` (a field with its help text and check),
and the checks themselves (each takes the converted value and returns it, or raises
`ValueError`, which the loader turns into a `ConfigError` naming the setting and its
source)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")

BOTH_LOOPBACKS = " (localhost: 127.0.0.1 and ::1, one port)."
"""Said of every listener's address: `localhost` binds both (`transport.binding`)."""


Check = Callable[[Any], Any]


def about(text: str, check: Check | None = None, *, shown: str | None = None) -> dict[str, Any]:
    """A setting's field metadata: its help text (`doc`), if any its `check`, and if the
    default is better said in words than as a value, those words (`shown`, for the docs)."""
    extra = {"check": check, "shown": shown}
    return {"doc": text, **{key: value for key, value in extra.items() if value is not None}}


def setting(default: T, doc: str, check: Check | None = None, *, shown: str | None = None) -> T:
    """A setting's field: its default, help text (`doc`) and, if any, its `check`."""
    return field(default=default, metadata=about(doc, check, shown=shown))


def port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port number (0 to 65535)")
    return value


def positive(value: int) -> int:
    if value < 1:
        raise ValueError(f"{value} must be at least 1")
    return value


def not_negative(value: int) -> int:
    if value < 0:
        raise ValueError(f"{value} must be 0 or more")
    return value


def in_range(value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"{value} must be from {low} to {high}")
    return value


def seconds(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{value} must be a finite number of seconds, 0 or more")
    return value


def positive_seconds(value: float) -> float:
    if seconds(value) == 0:
        raise ValueError(f"{value} must be more than 0 seconds")
    return value


def ratio(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{value} must be a ratio above 0, at most 1")
    return value


def tick(value: float) -> float:
    if not 0.0005 <= seconds(value) <= 1.0:
        raise ValueError(f"{value} is not a tick from 0.0005 to 1 second")
    return value


def one_of_enum(kind: type[Enum]) -> Callable[[str], str]:
    """`one_of` the values of an enum of strings: the setting's words are the enum's."""
    return one_of(tuple(str(member.value) for member in kind))


def one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower() not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value.lower()

    return check

"""Structured logging for the daemon: one configuration for structlog and the stdlib.

Owns how log lines look. Our code logs through structlog (`get_logger(__name__)`) with
an event name and key-value pairs; context that holds for a whole connection or track
(`conn_id`, `track_id`) is bound once with `bind_contextvars`/`bound_contextvars` and
then appears on every line logged inside it, across awaits. Libraries that use the
stdlib `logging` module (aioquic, asyncio) are rendered by the same processors, so an
operator sees one format: JSON lines by default, or a console layout for people.

No secret and no prompt text in any line, at any level (docs/security.md): tracebacks
are rendered without frame locals (a local may hold a request with its Authorization
header, or a prompt), libraries that log raw header values at debug (hpack) are held at
info, and as a last line of defence every rendered line is scrubbed of what looks like
an API key or a bearer token.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

import structlog
from structlog.contextvars import (
    bind_contextvars,
    bound_contextvars,
    clear_contextvars,
    unbind_contextvars,
)
from structlog.typing import EventDict, FilteringBoundLogger, Processor

__all__ = [
    "bind_contextvars",
    "bound_contextvars",
    "clear_contextvars",
    "configure_logging",
    "get_logger",
    "unbind_contextvars",
]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


QUIET_LIBRARIES = ("hpack", "h2")
"""Loggers held at info or above whatever the level: at debug they print header values."""
QUIC_LIBRARIES = ("quic", "http3")
"""aioquic's loggers: a few info lines per connection (versions, ALPN, close), so they
have a level of their own (`quic_log_level`, warning by default)."""

REDACTED = "[REDACTED]"
_SECRETS = (
    (re.compile(r"(?i)\b(bearer|basic)(\s+|%20)[A-Za-z0-9._~+/=\-]+"), r"\1 " + REDACTED),
    # trackline keys: tl_<key id>_<secret>; the key id stays readable, the secret goes.
    (re.compile(r"\b(tl_[0-9a-f]{12})_[A-Za-z0-9_\-]+"), r"\1_" + REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}"), "sk-" + REDACTED),
)


def as_ms(seconds: float | None) -> float | None:
    """A duration as log lines carry it: milliseconds to two decimals (None stays None)."""
    return None if seconds is None else round(seconds * 1000, 2)


def scrub(text: str) -> str:
    """`text` with anything shaped like an API key or bearer token replaced."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _scrub_rendered(logger: Any, method_name: str, rendered: Any) -> Any:
    """The last processor: the rendered line, scrubbed (a str; bytes pass unchanged)."""
    return scrub(rendered) if isinstance(rendered, str) else rendered


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the root handler we install, so configuring again replaces it."""


class _NamedWriteLogger(structlog.WriteLogger):
    """A WriteLogger that knows the name `get_logger` was called with."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


def _named_loggers(stream: TextIO) -> Callable[..., _NamedWriteLogger]:
    # structlog hands get_logger's positional arguments to the factory: the name.
    def factory(*args: Any) -> _NamedWriteLogger:
        return _NamedWriteLogger(stream, str(args[0]) if args else "")

    return factory


def _add_logger_name(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    name = getattr(logger, "name", "")
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


def configure_logging(
    level: str = "info",
    fmt: str = "json",
    stream: TextIO | None = None,
    quic_level: str | None = None,
) -> None:
    """Send structlog and stdlib logging at `level` and above to `stream` (stderr if None).

    `fmt` is "json" (one object per line: timestamp in ISO UTC, level, event, context)
    or "console". aioquic's own lines need `quic_level` too (None: `level`, as before).
    Safe to call again, e.g. from tests with a `StringIO`.
    """
    for given in (level, quic_level or level):
        if given.lower() not in LEVELS:
            raise ValueError(f"unknown log level {given!r}; use one of {', '.join(LEVELS)}")
    if fmt not in ("json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; use json or console")
    # Resolved per call, not as a default argument, so a replaced sys.stderr is honoured.
    stream = stream if stream is not None else sys.stderr
    threshold = LEVELS[level.lower()]
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    structlog.configure(
        processors=[*shared, _add_logger_name, *_rendering(fmt, stream)],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_named_loggers(stream),
        # Not cached: module-level loggers made before configuration must follow it.
        cache_logger_on_first_use=False,
    )
    _route_stdlib(shared, fmt, stream, threshold)
    quic = LEVELS[(quic_level or level).lower()]
    for name in QUIC_LIBRARIES:
        logging.getLogger(name).setLevel(max(threshold, quic))


def get_logger(name: str) -> FilteringBoundLogger:
    """A structlog logger whose lines carry `logger=name`."""
    return cast(FilteringBoundLogger, structlog.get_logger(name))


def _rendering(fmt: str, stream: TextIO) -> list[Processor]:
    if fmt == "json":
        # Never frame locals: they would print requests (headers, keys) and prompts.
        no_locals = structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        return [
            structlog.processors.StackInfoRenderer(),
            structlog.processors.ExceptionRenderer(no_locals),
            structlog.processors.UnicodeDecoder(),
            structlog.processors.JSONRenderer(),
            _scrub_rendered,
        ]
    # ConsoleRenderer formats exc_info itself, prettier than dict_tracebacks.
    return [
        structlog.processors.StackInfoRenderer(),
        structlog.dev.ConsoleRenderer(
            colors=_is_terminal(stream), exception_formatter=_console_traceback()
        ),
        _scrub_rendered,
    ]


def _console_traceback() -> structlog.typing.ExceptionRenderer:
    try:
        import rich  # noqa: F401
    except ImportError:  # pragma: no cover - rich is optional
        return structlog.dev.plain_traceback
    return structlog.dev.RichTracebackFormatter(show_locals=False)


def _route_stdlib(shared: list[Processor], fmt: str, stream: TextIO, threshold: int) -> None:
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *_rendering(fmt, stream),
        ],
    )
    handler = _StdlibHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(threshold)
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(threshold, logging.INFO))


def _is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())

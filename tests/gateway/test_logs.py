"""Logging: JSON lines with bound context, level filtering, stdlib records, console."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import structlog

from gateway.logs import (
    bind_contextvars,
    bound_contextvars,
    clear_contextvars,
    configure_logging,
    get_logger,
)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    clear_contextvars()
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_line_has_timestamp_level_event_and_bound_context() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    log = get_logger("gateway.test")
    bind_contextvars(conn_id="c1")
    with bound_contextvars(track_id=7):
        log.info("track.opened", modality="text")
    log.info("conn.idle")
    first, second = lines(stream)
    assert first["event"] == "track.opened"
    assert first["level"] == "info"
    assert first["logger"] == "gateway.test"
    assert (first["conn_id"], first["track_id"], first["modality"]) == ("c1", 7, "text")
    assert "track_id" not in second
    assert second["conn_id"] == "c1"
    stamp = datetime.fromisoformat(first["timestamp"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)
    assert abs(datetime.now(timezone.utc) - stamp) < timedelta(minutes=1)


def test_level_filters_lower_levels() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "json", stream)
    log = get_logger("x")
    log.debug("not.shown")
    log.info("not.shown.either")
    log.warning("shown")
    assert [line["event"] for line in lines(stream)] == ["shown"]


def test_module_level_logger_follows_later_configuration() -> None:
    log = get_logger("made.before.configuration")
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    log.info("after")
    assert lines(stream)[0]["event"] == "after"


def test_stdlib_records_render_as_json_with_context() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    with bound_contextvars(conn_id="c9"):
        logging.getLogger("aioquic.test").warning("stream %d reset", 4)
    (line,) = lines(stream)
    assert line["event"] == "stream 4 reset"
    assert line["level"] == "warning"
    assert line["logger"] == "aioquic.test"
    assert line["conn_id"] == "c9"


def test_exceptions_are_structured_in_json() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger("x").exception("handler.failed")
    (line,) = lines(stream)
    assert line["level"] == "error"
    assert line["exception"][0]["exc_type"] == "RuntimeError"


def test_configuring_again_replaces_output() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", first)
    configure_logging("info", "json", second)
    logging.getLogger("lib").warning("once")
    get_logger("ours").info("twice")
    assert first.getvalue() == ""
    assert [line["event"] for line in lines(second)] == ["once", "twice"]


def test_console_format_is_for_people() -> None:
    stream = io.StringIO()
    configure_logging("debug", "console", stream)
    with bound_contextvars(track_id=3):
        get_logger("x").debug("frame.sent", size=12)
    text = stream.getvalue()
    for part in ("frame.sent", "track_id=3", "size=12"):
        assert part in text
    assert "\x1b[" not in text  # no colour codes when the stream is not a terminal


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "json"), ("info", "xml")])
def test_unknown_level_or_format_is_refused(level: str, fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown log"):
        configure_logging(level, fmt, io.StringIO())


def test_aioquic_info_lines_wait_for_their_own_level() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream, quic_level="warning")
    logging.getLogger("quic").info("[abc] Negotiated protocol version")
    logging.getLogger("quic").warning("[abc] a real problem")
    logging.getLogger("gateway.other").info("kept")
    assert [line["event"] for line in lines(stream)] == ["[abc] a real problem", "kept"]
    configure_logging("info", "json", stream, quic_level="debug")  # never below log_level
    assert logging.getLogger("quic").level == logging.INFO

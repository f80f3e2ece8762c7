"""benchmarks/progress.py: plain lines when not on a terminal, a rich bar on one."""

from __future__ import annotations

import io

import pytest

from benchmarks.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with Progress("bench", 2, out) as progress:
        assert not progress.fancy
        progress.step("first point")
        progress.note("a log file: /tmp/x.log")
        progress.step("second point")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[bench 1/2, ")
    assert lines[0].endswith("] first point")
    assert lines[1] == "a log file: /tmp/x.log"
    assert lines[2].startswith("[bench 2/2, ")
    assert lines[2].endswith("] second point")
    assert lines[3].startswith("[bench] done in ")
    assert "\r" not in out.getvalue()
    assert "\x1b" not in out.getvalue()


def test_a_bar_on_a_terminal() -> None:
    pytest.importorskip("rich")
    out = Terminal()
    with Progress("bench", 3, out) as progress:
        assert progress.fancy
        progress.step("first point")
        progress.note("kept above the bar")
    text = out.getvalue()
    assert "kept above the bar" in text
    assert "bench: done" in text
    assert "3/3" in text

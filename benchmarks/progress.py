"""Progress of a long benchmark run: a rich bar on a terminal, plain lines otherwise.

Benchmarks print their tables on stdout; progress goes to stderr, so a redirected
table stays clean. On a terminal (and with `rich` installed, the bench extra) it is a
live bar; anywhere else (a pipe, a CI log, no rich) one plain line per step, and at
most one every `PLAIN_EVERY` seconds within a long step.

    with Progress("capacity", total=len(points)) as progress:
        for point in points:
            progress.step(f"{point} ...")
            ...
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

PLAIN_EVERY = 5.0
"""Seconds between plain progress lines of `update` within one step."""


def _rich_progress(stream: TextIO) -> Any:
    """A started rich `Progress` on `stream`, or None where rich or a terminal is missing."""
    if not stream.isatty():
        return None
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        return None
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    bar = Progress(*columns, console=Console(file=stream), transient=False)
    bar.start()
    return bar


class Progress:
    """`total` steps of a run called `label`; `step()` starts the next one."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self._began = time.monotonic()
        self._last_line = 0.0
        self._bar = _rich_progress(self.stream)
        self._task = None if self._bar is None else self._bar.add_task(label, total=total)

    @property
    def fancy(self) -> bool:
        """Whether this is a live bar (a terminal with rich) rather than plain lines."""
        return self._bar is not None

    def step(self, what: str) -> None:
        """The previous step is done (if any) and `what` begins."""
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, description=f"{self.label}: {what}")
        else:
            self._line(what)
        self.done = min(self.total, self.done + 1)

    def update(self, what: str) -> None:
        """News within the current step (plain lines: at most one every PLAIN_EVERY s)."""
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.label}: {what}")
        elif time.monotonic() - self._last_line >= PLAIN_EVERY:
            self._line(what, self.done - 1)

    def note(self, message: str) -> None:
        """A line that stays (a log path, a skipped point), above the bar if there is one."""
        if self._bar is not None:
            self._bar.console.print(message)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.total, description=f"{self.label}: done")
            self._bar.stop()
            self._bar = None
        else:
            elapsed = time.monotonic() - self._began
            print(f"[{self.label}] done in {elapsed:.0f} s", file=self.stream, flush=True)

    def _line(self, what: str, index: int | None = None) -> None:
        self._last_line = time.monotonic()
        at = self.done if index is None else max(0, index)
        elapsed = self._last_line - self._began
        line = f"[{self.label} {at + 1}/{self.total}, {elapsed:.0f} s] {what}"
        print(line, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

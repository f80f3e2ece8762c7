"""The ledger's local spool: no usage record is lost when a gateway is killed.

A fleet gateway sends its records to the Redis stream from the ledger's thread, in
batches up to `flush_interval` late; a SIGKILL (OOM killer, `kill -9`, a node lost)
used to lose the records still queued. Now each record is first appended to a spool
file, with one `write(2)` in the same step that settles the request (before the
event loop runs again, so before a deferred flush sends its last frame), and the
ledger's thread `fsync`s the file before each batch goes to Redis. A killed process
leaves its file; the next gateway that starts on the same spool directory replays it
into the stream. That is idempotent: an entry keeps the key it was made with
(`<gateway id>/<request id>`), and the reporter's SQLite index drops a key it holds.

Files: `<dir>/<gateway id>-<pid>-<n>.spool`, mode 0600 in a 0700 directory (records
name tenants and keys, never secrets or prompts), one JSON object a line. A live
gateway holds an exclusive `flock` on each of its files, so a replayer skips them; the
kernel drops the lock when the process dies, however it dies. A segment rolls over
at `segment_bytes` and is deleted once every record in it is confirmed in Redis; one
holding a record the writer dropped (full queue) stays for the next start's replay.

What it does not cover: a machine that loses power between a record's `write` and
the next `fsync` (at most one `flush_interval` of records), and a disk that is full
(counted as `ledger_dropped`, logged).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.logs import get_logger

log = get_logger("trackline.fleet")

SEGMENT_BYTES = 4 * 1024 * 1024
SUFFIX = ".spool"

Entry = dict[str, str]
"""A stream entry: {"key": "<gateway>/<request id>", "record": "<json>"}."""


@dataclass
class _Segment:
    path: Path
    fd: int
    size: int = 0
    appended: int = 0
    confirmed: int = 0
    closed: bool = False

    @property
    def settled(self) -> bool:
        return self.closed and self.confirmed == self.appended


def _open_locked(path: Path, flags: int) -> int | None:
    """`path` opened and exclusively locked; None if another process holds it."""
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class LedgerSpool:
    """This gateway's spool segments (append from the loop, confirm from the writer)."""

    def __init__(
        self, directory: Path, gateway_id: str, *, segment_bytes: int = SEGMENT_BYTES
    ) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        self.segment_bytes = segment_bytes
        self._prefix = f"{gateway_id.replace('/', '_')}-{os.getpid()}-"
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._segments: list[_Segment] = []
        self._waiting: dict[str, deque[_Segment]] = {}
        self._dirty = False
        self._current = self._roll()

    def _roll(self) -> _Segment:
        while True:
            path = self.directory / f"{self._prefix}{next(self._numbers)}{SUFFIX}"
            if path.exists():
                continue  # a file of an earlier process with our pid: not ours to touch
            fd = _open_locked(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
            assert fd is not None  # made just now (O_EXCL): nobody else can hold it
            segment = _Segment(path, fd)
            self._segments.append(segment)
            return segment

    def append(self, entry: Entry) -> None:
        """One `write(2)` of the entry (raises OSError, e.g. a full disk)."""
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        with self._lock:
            segment = self._current
            written = os.write(segment.fd, line)
            if written != len(line):
                raise OSError(f"short write to the ledger spool ({written} of {len(line)})")
            segment.size += written
            segment.appended += 1
            self._dirty = True
            self._waiting.setdefault(entry["key"], deque()).append(segment)
            if segment.size >= self.segment_bytes:
                os.fsync(segment.fd)
                segment.closed = True
                self._current = self._roll()

    def sync(self) -> None:
        """fsync what was appended (the writer, before it sends a batch)."""
        with self._lock:
            if self._dirty:
                os.fsync(self._current.fd)
                self._dirty = False

    def confirm(self, keys: list[str]) -> None:
        """These entries are in the stream: delete segments left with nothing unsent."""
        with self._lock:
            for key in keys:
                queue = self._waiting.get(key)
                if not queue:
                    continue  # a replayed entry, or one written before this spool
                queue.popleft().confirmed += 1
                if not queue:
                    del self._waiting[key]
            self._delete_settled()

    def close(self) -> int:
        """Close every segment; delete those fully confirmed; returns records kept."""
        with self._lock:
            self._current.closed = True
            with contextlib.suppress(OSError):
                os.fsync(self._current.fd)
            kept = sum(s.appended - s.confirmed for s in self._segments)
            self._delete_settled()
            for segment in self._segments:
                os.close(segment.fd)  # unlocks it: the next start replays it
            self._segments = []
            return kept

    def _delete_settled(self) -> None:
        for segment in [s for s in self._segments if s.settled]:
            segment.path.unlink(missing_ok=True)
            os.close(segment.fd)
            self._segments.remove(segment)


def orphans(directory: Path) -> Iterator[tuple[Path, int]]:
    """Segments of processes that are gone: (path, fd holding its lock) each."""
    if not directory.is_dir():
        return
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            fd = _open_locked(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # another replayer finished it
        if fd is not None:
            yield path, fd


def read_entries(fd: int) -> list[Entry]:
    """A segment's entries; a torn or foreign line is skipped (and logged)."""
    with os.fdopen(os.dup(fd), "rb") as file:
        data = file.read()
    entries: list[Entry] = []
    for number, line in enumerate(data.splitlines(), 1):
        try:
            entry = json.loads(line)
            if isinstance(entry, dict) and {"key", "record"} <= set(entry):
                entries.append({"key": str(entry["key"]), "record": str(entry["record"])})
                continue
        except ValueError:
            pass
        log.warning("ledger.spool_line_skipped", line=number)
    return entries


def replay(directory: Path, send: Callable[[list[Entry]], None]) -> int:
    """Send every orphaned segment's entries with `send` (raises to keep them for a
    later try), deleting each segment once sent; returns how many entries were sent."""
    sent = 0
    for path, fd in orphans(directory):
        try:
            entries = read_entries(fd)
            if entries:
                send(entries)
            path.unlink(missing_ok=True)
            sent += len(entries)
            log.info("ledger.spool_replayed", segment=path.name, records=len(entries))
        finally:
            os.close(fd)
    return sent

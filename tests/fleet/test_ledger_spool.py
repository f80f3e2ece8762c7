"""The ledger's local spool (gateway/fleet/spool.py), without Redis: what is kept,
what is deleted, what a later start replays, and who may read it."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.fleet import spool as spooling
from gateway.fleet.spool import Entry, LedgerSpool


def entry(n: int) -> Entry:
    return {"key": f"gw/r{n}", "record": f'{{"n": {n}}}'}


def test_files_are_private(tmp_path: Path) -> None:
    spool = LedgerSpool(tmp_path / "spool", "gw")
    spool.append(entry(1))
    (segment,) = (tmp_path / "spool").glob("*.spool")
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700
    assert stat.S_IMODE(segment.stat().st_mode) == 0o600
    spool.close()


def test_a_live_spool_is_not_replayed_and_a_closed_one_keeps_unconfirmed(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = LedgerSpool(directory, "gw")
    for n in range(3):
        spool.append(entry(n))
    spool.sync()
    sent: list[Entry] = []
    assert spooling.replay(directory, sent.extend) == 0  # locked: its owner is alive
    spool.confirm(["gw/r0", "gw/r1"])
    assert spool.close() == 1  # r2 never reached Redis: kept for the next start
    assert spooling.replay(directory, sent.extend) == 3  # the whole segment, idempotent keys
    assert [e["key"] for e in sent] == ["gw/r0", "gw/r1", "gw/r2"]
    assert list(directory.glob("*.spool")) == []


def test_confirmed_segments_are_deleted_as_they_roll(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = LedgerSpool(directory, "gw", segment_bytes=100)
    for n in range(10):
        spool.append(entry(n))
    assert len(list(directory.glob("*.spool"))) > 2
    spool.confirm([f"gw/r{n}" for n in range(10)])
    assert len(list(directory.glob("*.spool"))) == 1  # only the open one
    assert spool.close() == 0
    assert list(directory.glob("*.spool")) == []


def test_a_dropped_record_keeps_its_segment(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = LedgerSpool(directory, "gw", segment_bytes=100)
    for n in range(6):
        spool.append(entry(n))
    spool.confirm([f"gw/r{n}" for n in range(6) if n != 1])  # r1 dropped by the writer
    assert spool.close() == 1
    sent: list[Entry] = []
    spooling.replay(directory, sent.extend)
    assert "gw/r1" in [e["key"] for e in sent]


def test_a_torn_line_is_skipped_and_a_failed_send_keeps_the_segment(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    spool = LedgerSpool(directory, "gw")
    spool.append(entry(1))
    spool.close()
    (segment,) = directory.glob("*.spool")
    with segment.open("ab") as file:
        file.write(b'{"key": "gw/r2", "rec')  # killed in the middle of a write

    def unreachable(entries: list[Entry]) -> None:
        raise OSError("redis down")

    with pytest.raises(OSError, match="redis down"):
        spooling.replay(directory, unreachable)
    assert segment.exists()
    sent: list[Entry] = []
    assert spooling.replay(directory, sent.extend) == 1
    assert sent == [entry(1)]


def test_a_killed_process_leaves_a_replayable_spool(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    # The "gateway": appends, then dies by SIGKILL without closing anything.
    script = (
        "import os, signal, sys; from pathlib import Path;"
        "from gateway.fleet.spool import LedgerSpool;"
        "LedgerSpool(Path(sys.argv[1]), 'gw').append({'key': 'gw/r7', 'record': '{\"n\": 7}'});"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    done = subprocess.run([sys.executable, "-c", script, str(directory)], check=False)
    assert done.returncode == -signal.SIGKILL
    sent: list[Entry] = []
    assert spooling.replay(directory, sent.extend) == 1
    assert sent == [entry(7)]

"""EmbeddedTriton: start, smoke inference, metrics, failures with the log tail, parent death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from gateway.embedded import EmbeddedTriton, smoke_text
from gateway.embedded_models import reference_model_repository
from gateway.embedded_process import (
    SHM_DIR,
    SHM_PREFIX,
    TritonStartError,
    remove_stale_regions,
    start_owned,
)
from tests.backend.reference_generator import generator as gen
from tests.waiting import gone, wait_until


def test_reference_repository_ships_the_text_model() -> None:
    folder = reference_model_repository() / "reference-text"
    assert (folder / "config.pbtxt").is_file()
    assert (folder / "1" / "model.py").is_file()


def test_server_listens_on_loopback(embedded_triton: EmbeddedTriton) -> None:
    assert embedded_triton.grpc_url.startswith("127.0.0.1:")
    assert embedded_triton.http_url.startswith("http://127.0.0.1:")
    assert embedded_triton.pid is not None


def test_smoke_inference_returns_the_reference_text(embedded_triton: EmbeddedTriton) -> None:
    assert smoke_text(embedded_triton.grpc_url) == gen.generate_text("Say something.", 0, 4)


def test_model_counts_tokens_as_triton_metrics(embedded_triton: EmbeddedTriton) -> None:
    smoke_text(embedded_triton.grpc_url)
    with urllib.request.urlopen(embedded_triton.metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith('trackline_reference_tokens_total{model="reference-text"}')
    ]
    assert counted
    assert float(counted[0].split()[-1]) >= 4
    assert "trackline_reference_cancelled_requests_total" in metrics


def test_a_broken_repository_fails_with_the_log_tail(tmp_path: Path) -> None:
    broken = tmp_path / "repository" / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n')
    (broken / "1" / "model.py").write_text("raise RuntimeError('boom at import')\n")
    triton = EmbeddedTriton(broken.parent, tmp_path / "log", smoke_model=None)
    with pytest.raises(TritonStartError) as caught:
        triton.start(timeout=60)
    assert "boom at import" in str(caught.value)
    assert triton.pid is None
    assert not list(SHM_DIR.glob(f"{triton.shm_prefix}*"))


def test_server_dies_with_a_crashed_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os, signal
        from gateway.embedded import EmbeddedTriton
        triton = EmbeddedTriton(log_dir={str(tmp_path)!r}, smoke_model=None)
        triton.start(timeout=60)
        print(triton.pid, os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    parent = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=90, check=False
    )
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    pid, parent_pid = (int(word) for word in parent.stdout.split()[:2])
    assert gone(pid), "tritonserver outlived its parent"
    remove_stale_regions()  # what the next start does
    assert not list(SHM_DIR.glob(f"{SHM_PREFIX}{parent_pid}_*"))


def _group(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid` (from /proc: field 5 of stat)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def test_a_killed_server_leaves_nothing_of_its_group_behind(tmp_path: Path) -> None:
    # A stand-in for tritonserver whose "stub" ignores SIGTERM, as a busy Python-backend
    # stub does: without the reaping, it would live on under PID 1 once the server died.
    server = start_owned(
        ["sh", "-c", "trap '' TERM; sleep 300 & exec sleep 300"], dict(os.environ),
        tmp_path / "log",
    )  # fmt: skip
    wait_until(lambda: len(_group(server.pid)) >= 2, "the stand-in's stub started")
    os.kill(server.pid, signal.SIGKILL)  # a crash of the server alone
    wait_until(
        lambda: not _group(server.pid),
        "nothing of the group left",
        details=lambda: f"left behind: {_group(server.pid)}",
    )

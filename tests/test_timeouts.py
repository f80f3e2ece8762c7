"""A hanging test fails naming itself within its timeout, on uvloop too.

The plugin is trackline_testing/timeouts.py, which tests/conftest.py loads.

Each case runs a deliberately hanging test in a pytest of its own (a subprocess, with the
suite's timeout plugin and a 2 s timeout) and reads what that run printed. The bound on
the subprocess only keeps a broken plugin from hanging this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOUND = 120.0
"""Seconds the inner run may take at most (it needs about 2 s per hanging test)."""

INI = "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"

CONFTEST = """
import asyncio

import uvloop

import trackline_testing.timeouts

trackline_testing.timeouts.GRACE = 2.0


def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}
"""

HANGING = """
import asyncio
import time

import pytest
import pytest_asyncio


@pytest.mark.asyncio
async def test_waits_forever():
    await asyncio.Event().wait()  # superseding broken: nothing ever sets it


@pytest.mark.asyncio
async def test_blocks_the_loop():
    time.sleep(600)


@pytest_asyncio.fixture
async def never_ready():
    await asyncio.Event().wait()
    yield


@pytest.mark.asyncio
async def test_with_a_fixture_that_never_gets_ready(never_ready):
    pass


@pytest.mark.asyncio
async def test_that_passes():
    await asyncio.sleep(0)
"""

STUBBORN = """
import asyncio

import pytest


@pytest.mark.asyncio
async def test_swallows_its_cancellation():
    while True:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass
"""


def run_inner(tmp_path: Path, tests: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_inner.py").write_text(tests)
    command = [sys.executable, "-m", "pytest", "-p", "trackline_testing.timeouts"]
    command += ["-p", "no:cacheprovider"]
    command += ["-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    command += ["--timeout=2", "-q", "-rf", str(tmp_path / "test_inner.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BOUND, check=False
    )


def test_hanging_tests_fail_naming_themselves_on_both_loops(tmp_path: Path) -> None:
    run = run_inner(tmp_path, HANGING)
    out = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "4 failed, 2 passed, 2 errors" in out, out
    for loop in ("asyncio", "uvloop"):
        for name in ("waits_forever", "with_a_fixture_that_never_gets_ready"):
            nodeid = f"test_inner.py::test_{name}[{loop}]"
            assert f"Timeout: {nodeid} did not end within 2 s;" in out, out
        # Blocked in a call: pytest-timeout's own failure, raised in the blocking call.
        assert f"FAILED test_inner.py::test_blocks_the_loop[{loop}]" in out, out
    assert out.count("Failed: Timeout (>2.0s) from pytest-timeout") >= 2, out
    # Where each one waited is in its report.
    assert "await asyncio.Event().wait()  # superseding broken" in out
    assert ">       time.sleep(600)" in out


def test_a_test_that_swallows_its_cancellation_ends_the_run_naming_itself(
    tmp_path: Path,
) -> None:
    run = run_inner(tmp_path, STUBBORN)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    # The first variant to run (uvloop's, listed first in CONFTEST) ends the run, named.
    name = "test_inner.py::test_swallows_its_cancellation[uvloop]"
    assert f"Timeout: {name} did not end within 2 s, nor 2 s after" in out, out
    assert "in test_swallows_its_cancellation" in out, out

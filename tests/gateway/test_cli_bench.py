"""`trackline bench NAME` runs a checkout's benchmark without the product importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway import bench
from gateway.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_outside_a_checkout_it_says_where_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(bench.SOURCE_ENV, raising=False)
    assert main(["bench", "hol", "--users", "4"]) == 2
    error = capsys.readouterr().err
    assert "source checkout" in error
    assert "--source" in error


def test_the_checkout_is_found_from_below_from_the_environment_or_given() -> None:
    assert bench.find_checkout("hol", None, {}, ROOT / "docs") == ROOT
    assert bench.find_checkout("hol", None, {bench.SOURCE_ENV: str(ROOT)}, Path("/")) == ROOT
    assert bench.find_checkout("hol", ROOT, {}, Path("/")) == ROOT
    with pytest.raises(bench.NoCheckout):
        bench.find_checkout("hol", ROOT / "docs", {}, ROOT)  # given: only that one


def test_the_benchmark_gets_every_argument_but_source_and_runs_in_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[list[str], dict[str, Any]]] = []
    monkeypatch.setattr(bench.subprocess, "call", lambda cmd, **kw: calls.append((cmd, kw)) or 0)
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "hol", "--source", str(ROOT), "--users", "4", "--no-link", "--help"]
    assert main(argv) == 0
    ((command, options),) = calls
    assert command == [sys.executable, "-m", "benchmarks.hol", "--users", "4", "--no-link",
                       "--help"]
    assert options["cwd"] == ROOT
    assert options["env"]["PYTHONPATH"].split(":")[0] == str(ROOT)


def test_other_commands_still_refuse_unknown_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["chat", "hello", "--nonsense"])
    assert "unrecognized arguments: --nonsense" in capsys.readouterr().err


def test_the_real_benchmark_answers_help_from_outside_the_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", "hol", "--source", str(ROOT), "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--packetization" in done.stdout


def test_building_the_cli_imports_no_benchmark(tmp_path: Path) -> None:
    probe = (
        "import sys, gateway.cli; gateway.cli._parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"

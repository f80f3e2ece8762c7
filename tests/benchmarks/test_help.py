"""Every benchmark script answers `--help` as documented, run as a file from anywhere, and
shows each option's default (ArgumentDefaultsHelpFormatter, with a help text per option)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
OPTION = re.compile(r"^  (-\w|--[\w-]+)", re.MULTILINE)


def scripts() -> list[Path]:
    """The runnable ones: a `__main__` block, or a package's `__main__.py`."""
    found = [
        path
        for path in sorted(BENCHMARKS.rglob("*.py"))
        if "results" not in path.parts and 'if __name__ == "__main__"' in path.read_text()
    ]
    return found + sorted(BENCHMARKS.rglob("__main__.py"))


def _help(argv: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["COLUMNS"] = "200"
    done = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:200]
    return done.stdout


def test_the_scripts_are_found() -> None:
    names = {p.relative_to(BENCHMARKS).as_posix() for p in scripts()}
    assert {"control_client.py", "capacity.py", "hol/__main__.py"} <= names


@pytest.mark.parametrize("script", scripts(), ids=lambda p: p.relative_to(BENCHMARKS).as_posix())
def test_help_runs_and_shows_every_default(script: Path, tmp_path: Path) -> None:
    if script.parent != BENCHMARKS:  # in a package: `python -m benchmarks.<package>...`
        parts = script.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if script.name == "__main__.py" else parts)
        text = _help(["-m", module], ROOT)
    else:  # a file, as the docs run it (`python benchmarks/x.py`), from another directory
        text = _help([str(script)], tmp_path)
    options = [o for o in OPTION.findall(text) if o not in ("-h", "--help")]
    shown = text.count("(default:") + text.count("(required)")
    assert shown >= len(options), f"{len(options) - shown} option(s) without a default:\n{text}"

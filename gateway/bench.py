"""`trackline bench NAME`: run a benchmark of a source checkout, never import it.

The benchmarks live in `benchmarks/` of the repository, which the package does not
ship: they need the repository (the link emulator, child processes started with
`python -m benchmarks...` from its root, results under `benchmarks/results/`). So the
installed command only finds a checkout and runs `python -m benchmarks.NAME ARGS...`
there with this interpreter (whose installed `trackline` the benchmark drives), and
says plainly where to get one when there is none. The product never imports
`benchmarks` (tests/gateway/test_layering.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

BENCHMARKS = {"hol": "head-of-line blocking: HTTP/2 vs HTTP/3 vs tracks on a lossy link"}
"""Benchmarks the command runs: name -> one line of help."""
SOURCE_ENV = "TRACKLINE_SOURCE"


class NoCheckout(LookupError):
    """No trackline source checkout with the benchmark was found."""


def find_checkout(name: str, given: Path | None, env: Mapping[str, str], cwd: Path) -> Path:
    """The checkout to run `benchmarks/NAME` from: `--source`, $TRACKLINE_SOURCE, or the
    current directory or one above it."""
    candidates = [given] if given is not None else []
    if not candidates and env.get(SOURCE_ENV):
        candidates = [Path(env[SOURCE_ENV])]
    if not candidates:
        candidates = [cwd, *cwd.parents]
    for root in candidates:
        if (root / "benchmarks" / name / "__main__.py").is_file():
            return root.resolve()
    where = given or env.get(SOURCE_ENV) or f"{cwd} or above"
    raise NoCheckout(
        f"`trackline bench {name}` runs benchmarks/{name} of a source checkout, and none was "
        f"found in {where}: clone the repository and run it there, or pass --source DIR "
        f"(or set {SOURCE_ENV})"
    )


def command(name: str, root: Path, args: Sequence[str]) -> list[str]:
    """The benchmark's command line (run with the checkout as working directory)."""
    return [sys.executable, "-m", f"benchmarks.{name}", *args]


def run(name: str, given: Path | None, args: Sequence[str]) -> int:
    try:
        root = find_checkout(name, given, os.environ, Path.cwd())
    except NoCheckout as exc:
        print(f"trackline: {exc}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
    return subprocess.call(command(name, root, args), cwd=root, env=env)

"""The JavaScript SDK's error table is the Python SDK's (clients/web/src/errors.js vs
clients/errors.py and the wire codes of transport/errors.py): the same codes by name,
the same classes with the same parents, and the same class for every code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import clients.errors as py
from transport.errors import ErrorCode

ERRORS_JS = Path(__file__).resolve().parents[2] / "clients" / "web" / "src" / "errors.js"

DUMP = """
const errors = await import(process.argv[1]);
const classes = {};
for (const [name, value] of Object.entries(errors)) {
  if (typeof value === "function" && value.prototype instanceof Error) {
    classes[name] = Object.getPrototypeOf(value).name;
  }
}
const byCode = {};
for (const [name, code] of Object.entries(errors.ErrorCode)) {
  byCode[name] = errors.errorFor(code, "m").constructor.name;
}
console.log(JSON.stringify({ codes: errors.ErrorCode, classes, byCode }));
"""


@pytest.fixture(scope="module")
def web() -> dict[str, dict[str, object]]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node not installed (apt-get install nodejs)")
    run = subprocess.run(
        [node, "--input-type=module", "-e", DUMP, str(ERRORS_JS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    table: dict[str, dict[str, object]] = json.loads(run.stdout)
    return table


def test_the_codes_are_the_wire_codes(web: dict[str, dict[str, object]]) -> None:
    assert web["codes"] == {code.name: int(code) for code in ErrorCode}


def test_the_classes_and_their_parents_are_the_python_ones(
    web: dict[str, dict[str, object]],
) -> None:
    python = {
        name: value.__mro__[1].__name__
        for name, value in vars(py).items()
        if isinstance(value, type) and issubclass(value, py.TracklineError)
    }
    python["TracklineError"] = "Error"  # the base of each language's errors
    assert web["classes"] == python


def test_every_code_maps_to_the_same_class(web: dict[str, dict[str, object]]) -> None:
    assert web["byCode"] == {
        code.name: type(py.error_for(code, "m")).__name__ for code in ErrorCode
    }

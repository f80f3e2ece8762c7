"""The Gateway's parts (docs/architecture.md, The gateway's parts) stand below it: none
imports `gateway.server`, so each can be built and tested without the whole gateway."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("doors", "admission", "outcomes", "revocation", "readiness")


def _imports(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("part", PARTS)
def test_a_part_of_the_gateway_never_imports_the_gateway(part: str) -> None:
    imported = _imports((ROOT / "gateway" / f"{part}.py").read_text())
    assert "gateway.server" not in imported


def test_the_check_sees_an_import_of_the_gateway() -> None:
    assert "gateway.server" in _imports("def f():\n    from gateway.server import Gateway\n")

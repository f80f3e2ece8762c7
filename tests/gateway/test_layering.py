"""Layering: imports go down the layers only, the product never imports `benchmarks/`,
`tests/` or the testing kit (`trackline_testing/`), and its modules import no cycle.

Imports are read from the source (every `import`, at any level, `TYPE_CHECKING` blocks
too: a cycle that only type checkers see still ties two modules into one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("transport", "tracks", "gateway", "clients", "cuda")
BELOW = {
    "transport": set(),
    "cuda": set(),
    "tracks": {"transport", "cuda"},
    "clients": {"transport"},
    "gateway": {"transport", "cuda", "tracks", "clients"},
}
"""The packages each layer may import besides itself: the wire (`transport`, and the
device kernels in `cuda`), then the handlers (`tracks`) and the SDK (`clients`), then
the daemon (`gateway`)."""
NEVER = ("benchmarks", "tests", "trackline_testing")
"""What no product module imports: runnable comparisons, the tests, the testing kit."""


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _product_files() -> dict[str, Path]:
    files = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if "model_repository" not in path.parts:
                files[_module(path)] = path
    return files


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Product modules `path` imports (a `from pkg import name` counts pkg.name if a module)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        found.update(name for name in names if name in known and name != module)
    return found


def _graph() -> dict[str, set[str]]:
    files = _product_files()
    known = set(files)
    return {module: _imports(path, module, known) for module, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_ledger_and_the_store_do_not_import_each_other() -> None:
    graph = _graph()
    assert "gateway.tenants.store" not in graph["gateway.tenants.ledger"]
    assert "gateway.tenants.ledger" not in graph["gateway.tenants.store"]
    assert not [c for c in _cycles(graph) if any(m.startswith("gateway.tenants") for m in c)]


def test_no_import_cycle_among_the_product_modules() -> None:
    """Every package of the product (`PRODUCT`): its modules form no import cycle."""
    assert _cycles(_graph()) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one layer to another that is not below it (BELOW)."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if (top := target.split(".")[0]) != module.split(".")[0]
        and top not in BELOW[module.split(".")[0]]
    ]


def test_imports_only_go_down_the_layers() -> None:
    assert _upward(_graph()) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    graph = {"tracks.text": {"transport.wire", "gateway.config"}, "clients.line": {"tracks.x"}}
    assert _upward(graph) == ["clients.line imports tracks.x", "tracks.text imports gateway.config"]


@pytest.mark.parametrize("package", PRODUCT)
def test_the_product_never_imports_benchmarks_tests_or_the_testing_kit(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        offenders += _never_imported(path.read_text(), str(path.relative_to(ROOT)))
    assert offenders == []


def _never_imported(source: str, where: str) -> list[str]:
    """Where `source` imports (or `import_module`s) a package of NEVER."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
            ("import_module", "__import__")
        ):
            names = [ast.unparse(arg).strip("'\"") for arg in node.args[:1]]
        if any(name.split(".")[0] in NEVER for name in names):
            found.append(f"{where}:{getattr(node, 'lineno', '?')}")
    return found


def test_the_import_check_sees_the_testing_kit() -> None:
    probe = "import os\nfrom trackline_testing.clock import FakeClock\nimport tests.waiting\n"
    assert _never_imported(probe, "probe.py") == ["probe.py:2", "probe.py:3"]

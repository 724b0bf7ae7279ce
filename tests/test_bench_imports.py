"""The bench scripts run on a lent GPU, where a broken import costs a device call: every name they import from
core and console (function-local imports included) must exist. Session 18 lost its tuned contenders to one
that a refactor had renamed (core.db.fastest.apply_fastest)."""

from __future__ import annotations

import ast
import importlib

import pytest
from conftest import REPO

BENCH = sorted((REPO / "bench").glob("*.py"))


def project_imports(path) -> list[tuple[int, str, str]]:  # type: ignore[no-untyped-def]
    """(line, module, name) for each `from core...`/`from console... import name` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("core", "console"):
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("path", BENCH, ids=[p.name for p in BENCH])
def test_every_name_a_bench_script_imports_from_the_project_exists(path):  # type: ignore[no-untyped-def]
    missing = []
    for line, module, name in project_imports(path):
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{path.name}:{line}: {module}: {exc}")
            continue
        if not hasattr(loaded, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert not missing, "\n".join(missing)

"""No import circle inside a package: pyproject's acyclic_siblings contract (run by `make test` through
lint-imports) covers core and console, and it sees a circle that a function-local import hides."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def acyclic_contract() -> dict[str, object]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    found = [c for c in contracts if c["type"] == "acyclic_siblings"]
    assert len(found) == 1, "pyproject.toml declares one acyclic_siblings contract"
    return found[0]


def test_the_contract_covers_every_package_of_core_and_console():
    assert set(acyclic_contract()["ancestors"]) == {"core", "console"}


def lint(tmp_path: Path, b_source: str) -> subprocess.CompletedProcess[str]:
    """lint-imports, with the project's contract on `pkg`, over a package whose `a` imports `b` at its top."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from pkg.sub import b\n\n\ndef f() -> object:\n    return b\n")
    (pkg / "sub" / "b.py").write_text(b_source)
    contract = acyclic_contract()
    config = tmp_path / "importlinter.toml"
    config.write_text('[tool.importlinter]\nroot_packages = ["pkg"]\n\n[[tool.importlinter.contracts]]\n'
                      f'name = "cycles"\ntype = "{contract["type"]}"\nancestors = ["pkg"]\n')
    if not LINT_IMPORTS.exists():
        pytest.skip(f"lint-imports is not installed beside {sys.executable} (pip install -e '.[dev]')")
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=tmp_path,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_a_circle_through_a_function_local_import_breaks_the_contract(tmp_path: Path):
    run = lint(tmp_path, "def g() -> object:\n    from pkg.sub import a  # hidden from import time, not from grimp\n"
                         "    return a\n")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "No cycles are allowed in pkg.sub" in run.stdout
    assert ".b -> .a" in run.stdout or ".a -> .b" in run.stdout


def test_the_same_package_without_the_circle_keeps_it(tmp_path: Path):
    run = lint(tmp_path, "def g() -> int:\n    return 1\n")
    assert run.returncode == 0, run.stdout + run.stderr

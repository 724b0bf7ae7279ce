"""core is headless: importing all of it pulls in neither Textual nor Rich (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_core_imports_no_ui_libraries():
    code = (
        "import importlib, pkgutil, sys, core\n"
        "for m in pkgutil.walk_packages(core.__path__, 'core.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('textual', 'rich', 'console'))\n"
        "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_import_linter_contract_holds():
    proc = subprocess.run([sys.executable, "-m", "importlinter.cli", "lint"], cwd=REPO, capture_output=True, text=True)
    if "No module named" in proc.stderr:
        proc = subprocess.run(["lint-imports"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

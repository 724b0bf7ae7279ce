"""Shared test fixtures: every test gets its own state dir, settings file and DB path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the checkout; on the device machine a copy travels as ./shared (git-ignored).
SHARED = REPO.parent / "shared" if (REPO.parent / "shared").is_dir() else REPO / "shared"
ARTIFACT = SHARED / "nnfusion-artifact"
KERNELS = ARTIFACT / "kernels"

needs_artifact = pytest.mark.skipif(not KERNELS.is_dir(), reason="../shared/nnfusion-artifact is not present")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from the real home: state, settings and the default DB go to tmp."""
    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    monkeypatch.setenv("KDB_DB", str(tmp_path / "kernel_cache.db"))
    return tmp_path


def run_kdb(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 600):
    """Run the real `kdb` (as a module, so the test uses this checkout) and capture its output."""
    return subprocess.run([sys.executable, "-m", "console.entry", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run_kdb_json(*args: str, **kw):
    proc = run_kdb(*args, "--json", **kw)
    assert proc.stdout.strip(), proc.stderr
    return proc, json.loads(proc.stdout)


def artifact_items() -> list[tuple[str, int, dict]]:
    out = []
    for path in sorted(KERNELS.glob("*.json")):
        for i, item in enumerate(json.loads(path.read_text())):
            out.append((path.name, i, item))
    return out

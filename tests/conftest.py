"""Shared test fixtures: every test gets its own state dir, settings file and DB path.

Tests that use ../shared (tests/shared_data.py says where it is) skip where it is absent, saying what
they need; the run ends with one line that counts those skips.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from shared_data import ARTIFACT_KERNELS, REPO, read_items, shared_dir, shared_label, shared_path

KERNELS = shared_path(ARTIFACT_KERNELS)
# Session 12's tuning state from the H200 (in the repo, not ../shared): real MetaSchedule records for ResNet-18's ops
SESSION12_STATE = REPO / "bench" / "results" / "h200" / "session12" / "7-state.tgz"


def session12_job(line: str, tmp_path: Path):
    """A CUDA TuneJob of the op-config `line` whose work dir holds that op's session-12 records."""
    import shutil
    import tarfile

    from core.opconfigs.opconfig import parse_line
    from core.tuning.job import TuneJob

    job = TuneJob(parse_line(line), trials=64, target="cuda", arch="sm_90")
    folder = job.directory(tmp_path / "root").name
    with tarfile.open(SESSION12_STATE) as tar:
        members = [m for m in tar.getmembers() if f"/{folder}/database_" in m.name]
        tar.extractall(tmp_path / "x", members=members, filter="data")
    work = tmp_path / "work"
    shutil.copytree(tmp_path / "x" / "state" / "tuning" / folder, work)
    return TuneJob(job.config, trials=64, target="cuda", arch="sm_90", work_dir=work)


def needs_shared(relative: str, what: str) -> pytest.MarkDecorator:
    """Skip where ../shared/RELATIVE is absent; the reason names what it is and where it was looked for."""
    return pytest.mark.skipif(not shared_path(relative).exists(), reason=f"needs {what}: {shared_label(relative)}")


needs_artifact = needs_shared(ARTIFACT_KERNELS, "the Rammer artifact's kernels")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long tests (slow, fuzz) first: with workers (`make test`), one that started last would run on alone."""
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in ("slow", "fuzz")))


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep every test away from the real home: state, settings and the default DB go to tmp."""
    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    monkeypatch.setenv("KDB_DB", str(tmp_path / "kernel_cache.db"))
    # xdist's workers set COLUMNS=80; a kdb run by a test would fold its messages there as on a narrow terminal.
    monkeypatch.delenv("COLUMNS", raising=False)
    return tmp_path


@pytest.fixture(autouse=True)
def one_snapshot_suite_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Snapshot tests write under one fixed folder (SNAPSHOT_DIR: its paths are in the pictures), so two suites on
    one machine take turns there (an exclusive lock beside it); two at once once emptied each other's input folder
    mid-run."""
    if "snap_compare" not in request.fixturenames:
        yield
        return
    import fcntl

    from console_helpers import SNAPSHOT_DIR

    with open(SNAPSHOT_DIR.with_name(SNAPSHOT_DIR.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_kdb(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 600):
    """Run the real `kdb` (as a module, so the test uses this checkout) and capture its output."""
    return subprocess.run([sys.executable, "-m", "console.entry", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def run_kdb_json(*args: str, **kw):
    proc = run_kdb(*args, "--json", **kw)
    assert proc.stdout.strip(), proc.stderr
    return proc, json.loads(proc.stdout)


def kernel_items(folder: Path = KERNELS) -> list[tuple[str, int, dict]]:
    """(file name, index, item) of every kernel JSON item in a folder (the artifact's by default)."""
    return [(path.name, i, item) for path in sorted(folder.glob("*.json")) for i, item in enumerate(read_items(path))]


# -- one line at the very end: what was skipped for lack of ../shared --------------------------------------

def shared_need(reason: str) -> str | None:
    """The ../shared path a skip reason names (as ../shared/... or by its resolved path), or None."""
    resolved = re.escape(str(shared_dir()).rstrip("/"))
    found = re.search(rf"(?:\.\./shared|{resolved})(?![\w.+-])(/[\w.+-]+(?:/[\w.+-]+)*)?", reason)
    if found is None:
        return None
    return "../shared" + (found.group(1) or "")


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):  # xdist workers: the controller counts
        return
    needs = Counter(need for report in reporter.stats.get("skipped", [])
                    if (need := shared_need(skip_reason(report))) is not None)
    if not needs:
        found = "found" if shared_dir().is_dir() else "absent"
        reporter.write_line(f"skipped for lack of ../shared: none ({shared_dir()}: {found})")
        return
    total = sum(needs.values())
    detail = ", ".join(f"{n} need{'s' * (n == 1)} {need}" for need, n in needs.most_common())
    reporter.write_line(f"skipped for lack of ../shared: {total} test{'s' * (total != 1)} ({detail})", yellow=True)

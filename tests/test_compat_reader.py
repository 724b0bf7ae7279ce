"""The C++ compatibility reader (tests/compat) reads kdb's DB the way NNFusion's compiler does.

It is built with g++ against the system's sqlite3 and nlohmann/json, run on a DB that `kdb inject`
fills with the demo kernels, and the Rammer artifact's where ../shared has them (every row must be
fetched, none may crash), and on copies of that DB with one hand-made bad row each (the reader must name
that row and the right severity).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import KERNELS, REPO
from shared_data import project_kernels

COMPAT = REPO / "tests" / "compat"
HEADERS = (Path("/usr/include/nlohmann/json.hpp"), Path("/usr/include/sqlite3.h"))
SUMMARY = re.compile(r"^rows=(\d+) fetched=(\d+) crash=(\d+) unreachable=(\d+)$", re.M)
COLUMNS = ("Key", "Identifier", "OpType", "Attributes", "Source", "DeviceType", "Function", "Tags", "Miscs")


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed: cannot build tests/compat/kdb_compat_reader")
    missing = [str(h) for h in HEADERS if not h.exists()]
    if missing:
        pytest.skip(f"missing {', '.join(missing)} (apt-get install nlohmann-json3-dev libsqlite3-dev)")
    out = tmp_path_factory.mktemp("reader") / "kdb_compat_reader"
    proc = subprocess.run(["bash", str(COMPAT / "build.sh"), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def artifact_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo kernels, and the artifact's where ../shared has them, injected by the real `kdb inject`."""
    tmp = tmp_path_factory.mktemp("kdb")
    env = {**os.environ, "KDB_STATE_DIR": str(tmp / "state"), "KDB_CONFIG": str(tmp / "settings.toml"),
           "KDB_DB": str(tmp / "default.db")}
    db = tmp / "k.db"
    demo = tmp / "demo.json"
    demo.write_text(json.dumps(project_kernels()), encoding="utf-8")
    sources = [str(demo)] + ([str(KERNELS)] if KERNELS.is_dir() else [])
    proc = subprocess.run([sys.executable, "-m", "console.entry", "inject", "--db", str(db), "--no-compile",
                           *sources], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return db


def run_reader(reader: Path, db: Path, *args: str) -> tuple[int, str, dict[str, int]]:
    proc = subprocess.run([str(reader), str(db), *args], capture_output=True, text=True, timeout=300)
    match = SUMMARY.search(proc.stdout)
    assert match, proc.stdout + proc.stderr
    counts = dict(zip(("rows", "fetched", "crash", "unreachable"), map(int, match.groups()), strict=True))
    return proc.returncode, proc.stdout, counts


def row_count(db: Path, device_type: str | None = None) -> int:
    with sqlite3.connect(db) as conn:
        if device_type is None:
            return conn.execute("SELECT count(*) FROM KernelCache").fetchone()[0]
        return conn.execute("SELECT count(*) FROM KernelCache WHERE DeviceType = ?", (device_type,)).fetchone()[0]


# The kernels, and the CUDA twins of the fused ones (what the compiler's pattern substitution fetches).
@pytest.mark.parametrize("device_type", ["CUDA_GPU", "CUDA"])
def test_every_row_is_fetched_without_a_crash(reader: Path, artifact_db: Path, device_type: str):
    rc, out, counts = run_reader(reader, artifact_db, device_type)
    n, fetched = row_count(artifact_db), row_count(artifact_db, device_type)
    assert fetched > 0
    assert (rc, counts) == (0, {"rows": n, "fetched": fetched, "crash": 0, "unreachable": 0}), out
    assert out.strip().splitlines()[-1] == f"rows={n} fetched={fetched} crash=0 unreachable=0"


def test_another_device_type_reads_nothing(reader: Path, artifact_db: Path):
    rc, out, counts = run_reader(reader, artifact_db, "ROCM_GPU")
    assert rc == 0 and counts["fetched"] == 0 and "were not read" in out, out


def test_usage_and_open_errors_exit_2(reader: Path, tmp_path: Path):
    assert subprocess.run([str(reader)], capture_output=True).returncode == 2
    assert subprocess.run([str(reader), str(tmp_path / "absent.db")], capture_output=True).returncode == 2
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    proc = subprocess.run([str(reader), str(empty)], capture_output=True, text=True)
    assert proc.returncode == 2 and "KernelCache" in proc.stderr


def _function(change: Callable[[dict], None]) -> Callable[[dict], None]:
    def apply(row: dict) -> None:
        fn = json.loads(row["Function"])
        change(fn)
        row["Function"] = json.dumps(fn)  # NaN comes out as the bare NaN token, as Python writes it
    return apply


def _profile(**fields: object) -> Callable[[dict], None]:
    def apply(row: dict) -> None:
        miscs = json.loads(row["Miscs"])
        miscs["external_profile"].update(fields)
        row["Miscs"] = json.dumps(miscs)
    return apply


def _set(**columns: object) -> Callable[[dict], None]:
    return lambda row: row.update(columns)


# (case, change to a copy of a good row, expected severity, text the reason must contain)
BAD_ROWS = [
    ("null Miscs", _set(Miscs=None), "crash", "crash: Miscs: NULL column Miscs"),
    ("empty Function", _set(Function=""), "crash", "Function: [json.exception.parse_error"),
    ("NaN in Function", _function(lambda f: f.update(grid_dim=[float("nan"), 1, 1])), "crash",
     "Function: [json.exception.parse_error"),
    ("time not a number", _profile(time="H200:abc;"), "crash",
     'Miscs.external_profile.time: std::stof("abc;") throws std::invalid_argument'),
    ("resource a string", _profile(resource="28160"), "crash",
     "Miscs.external_profile.resource: [json.exception.type_error.302] type must be number, but is string"),
    ("External without BlockCudaEmitter", _set(Tags="KernelEmitter,CudaEmitter"), "crash",
     "Tags: CHECK failed: Source External without tag BlockCudaEmitter"),
    ("grid_dim of two", _function(lambda f: f.update(grid_dim=[1, 55])), "crash",
     "Function.grid_dim: [json.exception.type_error"),
    ("no num_syncthreads", _function(lambda f: f.pop("num_syncthreads")), "crash",
     "Function.num_syncthreads: CHECK failed"),
    ("no shared_memory", _function(lambda f: f.pop("shared_memory")), "crash",
     "Function.shared_memory: CHECK failed"),
    ("unsupported OpType", _set(OpType="Fused_Convolution_Batchnorm"), "unreachable",
     "OpType 'Fused_Convolution_Batchnorm' is not supported"),
]


@pytest.mark.parametrize(("case", "change", "severity", "reason"), BAD_ROWS, ids=[b[0] for b in BAD_ROWS])
def test_a_bad_row_is_named_with_its_severity(reader: Path, artifact_db: Path, tmp_path: Path, case: str,
                                              change: Callable[[dict], None], severity: str, reason: str):
    db = tmp_path / "bad.db"
    shutil.copy(artifact_db, db)
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        query = f"SELECT rowid, {', '.join(COLUMNS)} FROM KernelCache ORDER BY rowid LIMIT 1"
        good = dict(conn.execute(query).fetchone())
        bad = {c: good[c] for c in COLUMNS}  # same Identifier as the good row: it shares the fetch
        bad["Key"] = "bad:" + case.replace(" ", "_")
        change(bad)
        cur = conn.execute(f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * 9)})",
                           [bad[c] for c in COLUMNS])
        bad_rowid = cur.lastrowid
        same_identifier = conn.execute("SELECT count(*) FROM KernelCache WHERE Identifier = ? AND DeviceType = ?",
                                       (good["Identifier"], good["DeviceType"])).fetchone()[0]
    conn.close()

    rc, out, counts = run_reader(reader, db)
    assert rc == 1, out
    lines = [ln for ln in out.splitlines() if ln.startswith(f"row {bad_rowid} key={bad['Key'][:20]} ")]
    assert len(lines) == 1, out
    assert f": {severity}: " in lines[0] and reason in lines[0], lines[0]
    assert counts["rows"] == row_count(artifact_db) + 1
    if severity == "crash":
        assert (counts["crash"], counts["unreachable"]) == (1, 0), out
    else:
        # The unsupported row empties the whole fetch: the good rows of that identifier go too.
        assert (counts["crash"], counts["unreachable"]) == (0, same_identifier), out
        assert f"row {good['rowid']} " in out and "fetch emptied by unsupported OpType" in out

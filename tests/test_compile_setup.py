"""What `kdb nnfusion` and `kdb coverage` need before any compiler runs: which compiler (--nnfusion, then the
nnfusion_path setting, then PATH: one place decides), a DB that does not exist yet (NNFusion creates its own: an
empty DB is a valid answer), and an exit status that never passes a launch check that did not run.
(The same against the real compiler: tests/test_kdb_nnfusion.py.)"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest
from conftest import run_kdb, run_kdb_json

from core.db.kernel_db import NNFUSION_DDL, KernelDB
from core.errors import KdbError
from core.nnfusion.compile_job import CompileJob, CompileReport
from core.nnfusion.compiler import find_compiler
from core.nnfusion.coverage import MISSING
from core.nnfusion.launch_check import LaunchReport
from core.nnfusion.usage import Usage
from core.settings import Settings


def executable(folder: Path, name: str = "nnfusion") -> Path:
    """A file the resolver may pick (it is never run here)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_compiler_is_the_flags_then_the_settings_then_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    on_path, from_setting, from_flag = (executable(tmp_path / d) for d in ("bin", "setting", "flag"))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_compiler() == on_path.resolve()
    assert find_compiler("", str(from_setting)) == from_setting.resolve()
    assert find_compiler(str(from_flag), str(from_setting)) == from_flag.resolve()
    with pytest.raises(KdbError, match=r"the nnfusion_path setting \('/nowhere/nnfusion'\)"):
        find_compiler("", "/nowhere/nnfusion")
    with pytest.raises(KdbError, match=r"--nnfusion \('/nowhere/nnfusion'\)"):
        find_compiler("/nowhere/nnfusion", str(from_setting))  # asked for one: never another silently
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(KdbError, match="no NNFusion compiler found in PATH"):
        find_compiler()


def test_the_cli_and_the_console_build_the_job_from_the_settings(tmp_path: Path):
    """The console's compile dialog and `kdb nnfusion` take the compiler, flags, product and arch from one place
    (CompileJob.from_settings); a command's own options come first."""
    from console.context import ConsoleContext
    from console.screens.nnfusion import compile_screen

    settings = Settings(nnfusion_path="/opt/nnfusion/bin/nnfusion", nnfusion_flags=["-fkernel_fusion_level=0"],
                        product_name="NVIDIA H200", archs=["sm_80", "sm_90"], nvcc_path="/opt/cuda/bin/nvcc")
    job = CompileJob.from_settings(settings, tmp_path / "m.onnx", tmp_path / "k.db")
    assert (job.nnfusion_path, job.binary, job.flags, job.product_name, job.arch, job.nvcc) == (
        "/opt/nnfusion/bin/nnfusion", "", ("-fkernel_fusion_level=0",), "NVIDIA H200", "sm_80", "/opt/cuda/bin/nvcc")
    given = CompileJob.from_settings(settings, tmp_path / "m.onnx", tmp_path / "k.db", binary="/x/nnfusion",
                                     arch="sm_90")
    assert (given.binary, given.nnfusion_path, given.arch) == ("/x/nnfusion", "/opt/nnfusion/bin/nnfusion", "sm_90")
    context = ConsoleContext(db_path=tmp_path / "k.db", settings=settings, device_summary="no CUDA device (test)")
    assert compile_screen(context, tmp_path / "m.onnx").job == job
    assert CompileJob(tmp_path / "m.onnx", tmp_path / "k.db", out=Path("rel")).workdir() == Path("rel").resolve()


def test_kdb_nnfusion_looks_for_the_compiler_the_settings_name(tmp_path: Path):
    """With nnfusion_path saved, the command said "no NNFusion compiler found in PATH": it never read the setting."""
    model = onnx_model(tmp_path)
    assert run_kdb("settings", "nnfusion_path=/nowhere/bin/nnfusion").returncode == 0
    proc = run_kdb("nnfusion", str(model), "--db", str(tmp_path / "k.db"))
    assert proc.returncode == 2
    assert "the nnfusion_path setting ('/nowhere/bin/nnfusion')" in proc.stderr, proc.stderr


def onnx_model(tmp_path: Path) -> Path:
    pytest.importorskip("onnx")
    from onnx_models import small_cnn, write

    return write(small_cnn(), tmp_path / "small.onnx")


def table_sql(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT sql FROM sqlite_master WHERE name = 'KernelCache'").fetchone()[0]
    finally:
        conn.close()


def test_coverage_on_a_db_not_there_yet_creates_nnfusions_table_and_answers(tmp_path: Path):
    """The README's pipeline starts with `kdb coverage model.onnx`: on a new path it said "`kdb db init` creates
    one". NNFusion creates the file and table itself, so an empty DB is the answer: every op missing."""
    model, db = onnx_model(tmp_path), tmp_path / "new" / "kernel_cache.db"
    proc, report = run_kdb_json("coverage", str(model), "--db", str(db))
    assert proc.returncode == 1, proc.stderr  # ops missing from the DB: findings
    assert report["db_created"] is True and report["summary"]["ops"][MISSING] > 0
    assert table_sql(db) == "CREATE TABLE " + NNFUSION_DDL.removeprefix("CREATE TABLE IF NOT EXISTS ").rstrip(";")
    again = run_kdb("coverage", str(model), "--db", str(db))
    assert again.returncode == 1 and "created it" not in again.stderr  # said once, when it was made
    assert "created it, empty" in run_kdb("coverage", str(model), "--db", str(tmp_path / "other.db")).stderr


def test_a_bad_model_creates_no_db(tmp_path: Path):
    db = tmp_path / "k.db"
    assert run_kdb("coverage", str(tmp_path / "none.onnx"), "--db", str(db)).returncode == 2
    assert not db.exists()


def test_ls_on_a_db_not_there_yet_names_the_command_and_creates_nothing(tmp_path: Path):
    db = tmp_path / "new.db"
    proc = run_kdb("ls", "--db", str(db))
    assert proc.returncode == 0 and f"`kdb db init --db {db}` creates it" in proc.stdout, proc.stdout
    proc, listing = run_kdb_json("ls", "--db", str(db))
    assert listing["kernels"] == [] and listing["schema"] == "missing" and not db.exists()
    # the default DB ($KDB_DB here): the command needs no --db
    assert "`kdb db init` creates it" in run_kdb("ls").stdout
    assert "`kdb db init --db " in run_kdb("show", "x", "--db", str(db)).stderr  # the commands that need one


def test_create_if_missing_keeps_a_db_and_refuses_what_is_not_one(tmp_path: Path):
    db = tmp_path / "k.db"
    assert KernelDB.create_if_missing(db) is True and KernelDB.create_if_missing(db) is False
    bare = tmp_path / "bare.db"  # an SQLite file without the table: NNFusion would create it there too
    sqlite3.connect(bare).execute("CREATE TABLE other(x)").connection.close()
    assert KernelDB.create_if_missing(bare) is True and "KernelCache" in table_sql(bare)
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(KdbError):
        KernelDB.create_if_missing(junk)


def test_a_launch_check_that_could_not_run_is_a_problem_never_a_pass(tmp_path: Path):
    job = CompileJob(tmp_path / "m.onnx", tmp_path / "k.db")
    clean = CompileReport(job, usage=Usage([], []), launches=LaunchReport("sm_90"))
    assert clean.ok and clean.problems() == []
    report = CompileReport(job, usage=Usage([], []), launches=LaunchReport("sm_90", error="the device code did not "
                                                                           "compile: nvcc (sm_90): boom"))
    assert report.problems() == ["the launch check could not run: the device code did not compile: nvcc (sm_90): "
                                 "boom"]
    assert report.as_dict()["problems"] == report.problems()
    assert CompileReport(job, usage=Usage([], [])).problems() == ["the launch check did not run (cancelled)"]
    skipped = CompileJob(tmp_path / "m.onnx", tmp_path / "k.db", launch_check=False)
    assert CompileReport(skipped, usage=Usage([], [])).problems() == []  # --no-launch-check: asked for

"""The injector's GPU stage on the CPU: several GPU children verify at once, every launch section holds the
cross-process GPU lock (no two ever overlap), rows come back in input order with their profiles, and the
children get the nvcc check's cubin instead of compiling again. The children are stand-ins that speak the
worker's protocol (the real one needs a GPU: tests/test_gpu.py runs it on the H200)."""

from __future__ import annotations

import base64
import functools
import json
import multiprocessing
import sys
import time
from pathlib import Path

import pytest
from test_kernel_row import NVCC

from core.db.kernel_db import KernelDB
from core.demo import demo_kernels
from core.gpu import jobs
from core.gpu.exclusive import gpu_exclusive
from core.inject import pipeline
from core.inject.pipeline import InjectOptions, Injector

REPO = Path(__file__).resolve().parents[1]

CHILD = f"""#!{sys.executable}
import base64, json, os, sys, time
sys.path.insert(0, {str(REPO)!r})
from core.gpu.exclusive import WAITING, gpu_exclusive
log = open(os.environ["KDB_TEST_GPU_LOG"], "a")
def say(line): print(json.dumps(line), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    cubins = job["cubins"]
    assert all(base64.b64decode(c)[:4] == b"\\x7fELF" for c in cubins.values()), "not a cubin"
    say({{"phase": "loaded"}})
    t0 = time.time(); time.sleep(0.3 if job["kind"] == "verify" else 0.0); t1 = time.time()  # the CPU's share
    say({{"phase": WAITING}})
    with gpu_exclusive():
        say({{"phase": "gpu"}})
        t2 = time.time(); time.sleep(0.05); t3 = time.time()  # the launches
    log.write(json.dumps({{"pid": os.getpid(), "kind": job["kind"], "cpu": [t0, t1], "gpu": [t2, t3],
                          "archs": sorted(cubins)}}) + "\\n"); log.flush()
    say({{"ok": True, "kind": job["kind"], "max_rel_error": 0.0, "microseconds": 7.5, "spread": [7.0, 8.0],
         "launches": 100, "device": "stand-in GPU"}})
"""

pytestmark = pytest.mark.skipif(not NVCC, reason="nvcc not found: the GPU stage gets the nvcc check's cubin")


def overlapping(intervals: list[list[float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_env: Path) -> Path:
    child = tmp_path / "child"
    child.write_text(CHILD)
    child.chmod(0o755)
    log = tmp_path / "gpu.log"
    monkeypatch.setenv("KDB_TEST_GPU_LOG", str(log))
    # Every GPU child a pool starts (jobs.GpuSessions) is the stand-in.
    monkeypatch.setattr(jobs, "GpuSession", functools.partial(jobs.GpuSession, python=str(child)))
    return log


def test_children_verify_in_parallel_and_never_launch_together(stand_in: Path, tmp_path: Path):
    items = demo_kernels()[:8]
    (tmp_path / "k.json").write_text(json.dumps(items))
    options = InjectOptions(archs=("sm_80",), nvcc=NVCC, workers=2, gpu_workers=3, verify=True, profile=True)
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        report = Injector(db, options).run([tmp_path / "k.json"])
        rows = list(db.iter_rows())
    assert report.failed == 0 and report.injected == len(items), report.failures
    assert any("gpu (stand-in GPU): 8 verified, 8 timed" in n for n in report.notes), report.notes
    for row in rows:
        kdb = json.loads(row.miscs)["kdb"]
        assert kdb["verified"]["device"] == "stand-in GPU" and kdb["profile"]["stand-in GPU"]["us"] == 7.5
    log = [json.loads(line) for line in stand_in.read_text().splitlines()]
    assert len(log) == 16 and all(e["archs"] == ["sm_80"] for e in log)  # the check's cubin, for its arch
    assert len({e["pid"] for e in log}) > 1  # more than one child
    assert overlapping([e["cpu"] for e in log if e["kind"] == "verify"]) >= 2  # the CPU shares overlapped
    assert overlapping([e["gpu"] for e in log]) == 1  # the launch sections never did


def test_without_cubin_reuse_the_children_get_none(stand_in: Path, tmp_path: Path):
    """`reuse_cubin=False` (bench_verify's "before"): the child compiles; here the stand-in sees no cubin."""
    (tmp_path / "k.json").write_text(json.dumps(demo_kernels()[:1]))
    options = InjectOptions(archs=("sm_80",), nvcc=NVCC, verify=True, reuse_cubin=False)
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        report = Injector(db, options).run([tmp_path / "k.json"])
    assert report.injected == 1
    assert [json.loads(line)["archs"] for line in stand_in.read_text().splitlines()] == [[]]


def _hold(path: str, held: multiprocessing.synchronize.Event, seconds: float) -> None:
    import os

    os.environ["KDB_GPU_LOCK"] = path
    with gpu_exclusive():
        held.set()
        time.sleep(seconds)


def test_the_gpu_lock_is_held_across_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KDB_GPU_LOCK", str(tmp_path / "gpu0.lock"))
    held = multiprocessing.get_context("spawn").Event()
    other = multiprocessing.get_context("spawn").Process(target=_hold, args=(str(tmp_path / "gpu0.lock"), held, 1.0))
    other.start()
    assert held.wait(60)
    start = time.monotonic()
    with gpu_exclusive():
        waited = time.monotonic() - start
    other.join(10)
    assert waited > 0.5  # it waited for the other process to let go


def test_a_child_waiting_for_the_lock_is_not_taken_for_a_hung_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The launch clock starts once the lock is held: waiting longer than it is not a hang."""
    lock = tmp_path / "gpu0.lock"
    monkeypatch.setenv("KDB_GPU_LOCK", str(lock))
    monkeypatch.setenv("KDB_TEST_GPU_LOG", str(tmp_path / "gpu.log"))
    child = tmp_path / "child"
    child.write_text(CHILD)
    child.chmod(0o755)
    held = multiprocessing.get_context("spawn").Event()
    other = multiprocessing.get_context("spawn").Process(target=_hold, args=(str(lock), held, 2.0))
    other.start()
    assert held.wait(60)
    cubin = base64.b64encode(b"\x7fELF stand-in").decode()
    with jobs.GpuSession(timeout_s=1.0, compile_timeout_s=30, python=str(child)) as session:
        result = session.run({"kind": "time", "cubins": {"sm_80": cubin}})
    other.join(10)
    assert result.ok, result.reason


def test_kdb_gpu_profile_runs_children_at_once_and_writes_profiles_in_order(stand_in: Path, tmp_path: Path):
    """`kdb gpu profile` over rows already in a DB (core/gpu/rows.py): children verify at once, their launch
    sections never overlap, the report keeps the rows' order and every row gets its profile."""
    from core.gpu import rows as gpu_rows

    items = demo_kernels()[:6]
    (tmp_path / "k.json").write_text(json.dumps(items))
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        Injector(db, InjectOptions(archs=("sm_80",), nvcc=NVCC, workers=2)).run([tmp_path / "k.json"])
        order = [r.key for r in gpu_rows.distinct_kernels(db.iter_table_order())]
        report = gpu_rows.check_rows(db, db.iter_table_order(), verify=True, profile=True, workers=3)
        profiled = {r.key: json.loads(r.miscs)["kdb"]["profile"]["stand-in GPU"]["us"] for r in db.iter_rows()
                    if r.device_type == "CUDA_GPU"}
    assert [c.key for c in report.checks] == order and all(c.ok for c in report.checks)
    assert report.device == "stand-in GPU" and set(profiled) == set(order) and set(profiled.values()) == {7.5}
    log = [json.loads(line) for line in stand_in.read_text().splitlines()]
    assert len({e["pid"] for e in log}) > 1 and all(e["archs"] == [] for e in log)  # no cubin: the child compiles
    assert overlapping([e["cpu"] for e in log if e["kind"] == "verify"]) >= 2
    assert overlapping([e["gpu"] for e in log]) == 1


def test_a_gpu_stage_that_raises_fails_its_kernel_and_the_batch_goes_on(stand_in: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    real = pipeline.gpu_stages
    calls: list[str] = []

    def second_one_breaks(session, row, cubins, options):  # type: ignore[no-untyped-def]
        calls.append(row.key)
        if len(calls) == 2:
            raise OSError("the GPU child could not be started")
        return real(session, row, cubins, options)

    monkeypatch.setattr(pipeline, "gpu_stages", second_one_breaks)
    (tmp_path / "k.json").write_text(json.dumps(demo_kernels()[:4]))
    options = InjectOptions(archs=("sm_80",), nvcc=NVCC, workers=2, gpu_workers=1, verify=True)
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        report = Injector(db, options).run([tmp_path / "k.json"])
    assert report.injected == 3 and report.failed == 1
    assert report.failures[0].stage == "gpu" and report.failures[0].reason == "OSError: the GPU child could not be started"


def test_kdb_gpu_profile_compiles_with_nvcc_here_and_the_child_loads_the_cubin(stand_in: Path, tmp_path: Path):
    """With an NvccBuild (what `kdb gpu` and the Kernels view pass) each row is compiled here, as injection
    does, and the child gets the cubin instead of compiling again through pycuda (seen past 300 s on the H200).
    A row nvcc rejects fails with nvcc's reason and the others are still checked."""
    import sqlite3

    from core.gpu import rows as gpu_rows

    (tmp_path / "k.json").write_text(json.dumps(demo_kernels()[:3]))
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        Injector(db, InjectOptions(archs=("sm_80",), nvcc=NVCC, workers=2)).run([tmp_path / "k.json"])
    broken = next(k for (k,) in sqlite3.connect(tmp_path / "k.db").execute(
        "SELECT Key FROM KernelCache WHERE DeviceType = 'CUDA_GPU' ORDER BY rowid"))
    conn = sqlite3.connect(tmp_path / "k.db")
    fn = json.loads(conn.execute("SELECT Function FROM KernelCache WHERE Key = ?", (broken,)).fetchone()[0])
    fn["block_function_body"] = "this is not CUDA;\n" + fn["block_function_body"]
    conn.execute("UPDATE KernelCache SET Function = ? WHERE Key = ?", (json.dumps(fn), broken))
    conn.commit()
    conn.close()
    build = gpu_rows.NvccBuild(("sm_80",), NVCC)
    with KernelDB.open(tmp_path / "k.db", write=True) as db:
        report = gpu_rows.check_rows(db, db.iter_table_order(), verify=True, profile=True, workers=2, build=build)
    by_key = {c.key: c for c in report.checks}
    assert not by_key[broken].ok and by_key[broken].error.startswith("nvcc (sm_80): ")
    assert by_key[broken].verified is None  # never sent to the GPU
    assert sum(c.ok for c in report.checks) == len(report.checks) - 1 >= 2
    log = [json.loads(line) for line in stand_in.read_text().splitlines()]
    assert log and all(e["archs"] == ["sm_80"] for e in log)  # every job brought its cubin


def test_nvcc_build_compiles_only_the_devices_arch(tmp_path: Path):
    """The GPU child loads its own arch's cubin alone; a device the settings do not name (settings sm_90, an
    A100) would otherwise get no cubin and compile the row again through pycuda."""
    from core.gpu.rows import GpuCheckRequest
    from core.settings import Settings

    nvcc = tmp_path / "nvcc"
    nvcc.write_text("")  # named by the settings: found, never run here
    settings = Settings(archs=["sm_70", "sm_90"], nvcc_path=str(nvcc), nvcc_flags=["-O3"])
    build = GpuCheckRequest.from_settings(settings, tmp_path / "k.db", ["k"], profile=False).build("sm_80")
    assert (build.archs, build.nvcc, build.flags) == (("sm_80",), str(nvcc), ("-O3",))

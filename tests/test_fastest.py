"""`kdb db fastest`: per op, the row timed fastest on one GPU stays and the others go (a fused kernel's twin
with its row), because NNFusion's kernel selection takes an op's first row, not its fastest."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import run_kdb, run_kdb_json

from core.db.fastest import plan_fastest
from core.db.kernel_db import KernelDB
from core.db.maintenance import apply_plan, fastest_plan, undo_plan
from core.kernels.kernel_row import KernelRow, twin_key
from core.kernels.opsig import signature_from_attributes

H200, V100 = "NVIDIA H200", "Tesla V100-PCIE-16GB"
FN = json.dumps({"function_signature": 'extern "C" __launch_bounds__(64) __global__ void (float* input0, '
                                       "float* output0)", "function_body": "", "grid_dim": [1, 1, 1],
                 "block_dim": [64, 1, 1], "block_function_body": "",
                 "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0})
TAGS = "KernelEmitter,CudaEmitter,BlockCudaEmitter"


def profiled(times: dict[str, float] | str | None) -> str:
    if times is None:
        return "{}"
    text = times if isinstance(times, str) else "".join(f"{d}:{us};" for d, us in times.items())
    return json.dumps({"external_profile": {"time": text, "resource": 64}})


def relu(key: str, times=None, n: int = 2) -> KernelRow:
    attrs = {"input_shape": [[n]], "output_shape": [[n]]}
    return KernelRow(key, signature_from_attributes("Relu", attrs).identifier, "Relu", json.dumps(attrs), "External",
                     "CUDA_GPU", FN, TAGS, profiled(times))


def fused(key: str, times=None) -> KernelRow:
    attrs = {"input_shape": [[1, 4, 8, 8], [8, 4, 3, 3]], "output_shape": [[1, 8, 8, 8]],
             "parameters": {"window_movement_strides": [1, 1], "window_dilation_strides": [1, 1],
                            "padding_below_diff": [1, 1]}}
    ident = signature_from_attributes("Fused_Convolution_Relu", attrs).identifier
    return KernelRow(key, ident, "Fused_Convolution_Relu", json.dumps(attrs), "External", "CUDA_GPU", FN, TAGS,
                     profiled(times))


def keys_in_table_order(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT Key FROM KernelCache ORDER BY rowid")]
    finally:
        conn.close()


def written_by_another_tool(path: Path, rows: list[KernelRow]) -> None:
    """Rows in the order given, as NNFusion's import script or a kdb from before rows were kept fastest-first
    wrote them (kdb's own writes would put each op's fastest row first)."""
    from core.kernels.kernel_row import needs_pattern_twin, pattern_twin

    KernelDB.open(path, create=True).close()
    conn = sqlite3.connect(path)
    with conn:
        for row in rows:
            for r in (row, pattern_twin(row)) if needs_pattern_twin(row) else (row,):
                conn.execute("INSERT INTO KernelCache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", r.values())
    conn.close()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "k.db"
    written_by_another_tool(path, [
        relu("kdb:relu-first-slow", {H200: 50.0}), relu("kdb:relu-fast", {H200: 20.0, V100: 90.0}),
        relu("kdb:relu-unmeasured"), relu("kdb:relu-v100-only", {V100: 1.0}),
        fused("kdb:fused-slow", {H200: 30.0}), fused("kdb:fused-fast", {H200: 10.0}),
        relu("kdb:lone", {H200: 99.0}, n=4),  # the only row of its op: never touched
        relu("kdb:other-a", {V100: 5.0}, n=8), relu("kdb:other-b", n=8)])  # none timed on the H200  # none timed on the H200
    return path


def test_the_fastest_row_of_each_op_stays_and_becomes_the_first(db_path: Path, tmp_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        plan = plan_fastest(db, H200)
        kept = {c.kept.key: c.kept.us for c in plan.choices}
        assert kept == {"kdb:relu-fast": 20.0, "kdb:fused-fast": 10.0}
        relu_choice = next(c for c in plan.choices if c.kept.key == "kdb:relu-fast")
        assert [(lo.key, lo.us) for lo in relu_choice.removed] == [
            ("kdb:relu-first-slow", 50.0), ("kdb:relu-unmeasured", None), ("kdb:relu-v100-only", None)]
        assert len(plan.unranked) == 1 and plan.unreadable == []
        before = keys_in_table_order(db_path)
        applied = apply_plan(db, fastest_plan(db, H200), undo_dir=tmp_path / "undo")
    # the slower fused kernel left with its CUDA twin; the kept one keeps its twin
    assert set(applied.deleted) == {"kdb:relu-first-slow", "kdb:relu-unmeasured", "kdb:relu-v100-only",
                                    "kdb:fused-slow", twin_key("kdb:fused-slow")}
    assert keys_in_table_order(db_path) == ["kdb:relu-fast", "kdb:fused-fast", twin_key("kdb:fused-fast"),
                                            "kdb:lone", "kdb:other-a", "kdb:other-b"]
    # the undo file holds every row of the two ops it changed, as they were; the undo puts them back in that order
    assert applied.undo_file is not None and len(keys_in_table_order(applied.undo_file)) == 8
    with KernelDB.open(db_path, write=True) as db:
        apply_plan(db, undo_plan(db, applied.undo_file), undo_dir=tmp_path / "undo")
    assert sorted(keys_in_table_order(db_path)) == sorted(before)
    assert [k for k in keys_in_table_order(db_path) if k.startswith("kdb:relu")] == [
        k for k in before if k.startswith("kdb:relu")]  # the op's rows as another tool wrote them: slow one first


def test_a_broken_profile_is_named_and_counts_as_not_measured(tmp_path: Path):
    path = tmp_path / "k.db"
    with KernelDB.open(path, create=True) as db:
        db.insert(relu("kdb:broken", f"{H200}:fast;"))
        db.insert(relu("kdb:good", {H200: 7.0}))
        plan = plan_fastest(db, H200)
    assert [c.kept.key for c in plan.choices] == ["kdb:good"]
    assert [k for k, _ in plan.unreadable] == ["kdb:broken"] and "not a time" in plan.unreadable[0][1]


def test_the_cli_previews_then_applies(db_path: Path, tmp_path: Path):
    env = {"KDB_STATE_DIR": str(tmp_path / "state")}
    before = db_path.read_bytes()
    preview = run_kdb("db", "fastest", "--db", str(db_path), "--product", H200, env=env)
    assert preview.returncode == 0, preview.stderr
    assert "Keep only the fastest row of 2 op(s) on NVIDIA H200" in preview.stdout and "4 kernel(s) go" in preview.stdout
    assert "drop kdb:relu-first-slow (50.00 us)" in preview.stdout and "nothing written" in preview.stdout
    assert f"drop kdb:relu-unmeasured (not measured on {H200})" in preview.stdout
    assert "1 op(s) with several rows, none timed on NVIDIA H200" in preview.stdout
    assert db_path.read_bytes() == before  # a preview writes nothing

    # two GPUs in the profiles and none named: it asks which
    ask = run_kdb("db", "fastest", "--db", str(db_path), env=env)
    assert ask.returncode != 0 and "--product NAME" in ask.stderr and V100 in ask.stderr

    proc, report = run_kdb_json("db", "fastest", "--db", str(db_path), "--product", H200, "--apply", env=env)
    assert proc.returncode == 0 and report["rows_removed"] == 5 and Path(report["undo_file"]).exists()
    assert keys_in_table_order(db_path)[:2] == ["kdb:relu-fast", "kdb:fused-fast"]


def test_a_row_behind_an_earlier_row_of_its_op_is_called_shadowed(db_path: Path):
    from core.db.fastest import shadowed

    with KernelDB.open(db_path) as db:
        assert shadowed(db, ["kdb:relu-fast", "kdb:relu-first-slow", "kdb:lone", "kdb:fused-fast", "kdb:nothing"]) \
            == [("kdb:relu-fast", "kdb:relu-first-slow"), ("kdb:fused-fast", "kdb:fused-slow")]


def test_injecting_a_second_kernel_of_an_op_says_the_compiler_keeps_the_first(tmp_path: Path):
    from core.demo import demo_kernels
    from core.inject.pipeline import InjectOptions, Injector

    relu = next(item for item in demo_kernels() if item["op_type"] == "Relu")
    later = json.loads(json.dumps(relu))
    later["code"] = later["code"].replace("max(input0[i], 0.000000e+00f)", "fmaxf(input0[i], 0.000000e+00f)")
    assert later["code"] != relu["code"]  # a later tuning run's kernel of the same op
    (tmp_path / "first.json").write_text(json.dumps([relu]))
    (tmp_path / "later.json").write_text(json.dumps([later]))
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        first = Injector(db, InjectOptions(compile=False), state=None).run([tmp_path / "first.json"])
        assert first.injected == 1 and first.shadowed == []
        second = Injector(db, InjectOptions(compile=False), state=None).run([tmp_path / "later.json"])
        assert second.injected == 1 and len(second.shadowed) == 1
        assert any("NNFusion takes an op's first row" in note for note in second.notes)
        assert second.as_json()["shadowed"][0]["used_instead"] == second.shadowed[0][1]
        replaced = Injector(db, InjectOptions(compile=False, replace=True), state=None).run([tmp_path / "first.json"])
        assert replaced.shadowed == []  # --replace leaves the op one row

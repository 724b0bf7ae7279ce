"""Every write keeps each op's rows fastest-first (core/db/op_rows.py): NNFusion takes an op's first External row
in table order, so a write that moved a slower row ahead would make the network slower. The real compiler's side
is in test_nnfusion_compiler.py (a profile update that made a later row faster hands the compiler that row)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import run_kdb, run_kdb_json
from test_fastest import H200, V100, fused, keys_in_table_order, profiled, relu, written_by_another_tool

from core.db.kernel_db import KernelDB
from core.db.maintenance import apply_plan, standalone_plan
from core.db.op_rows import restore_order
from core.gpu.jobs import GpuResult
from core.gpu.rows import _store_profile
from core.kernels.kernel_row import antares_entry, is_standalone, twin_key
from core.kernels.ops import DEVICE_TYPE


def op_keys(db: KernelDB, identifier: str) -> list[str]:
    """The op's CUDA_GPU rows in the order the compiler reads them."""
    return [r[1] for r in db.fetch_like_compiler(identifier, DEVICE_TYPE)]


def in_order(db: KernelDB) -> None:
    assert db.order_problems() == []


def test_every_write_path_keeps_each_op_fastest_first(tmp_path: Path):
    ident = relu("x").identifier
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(relu("kdb:slow", {H200: 50.0}))
        db.insert(relu("kdb:unmeasured"))
        db.insert(relu("kdb:fast", {H200: 10.0}))  # injected last, timed fastest: the compiler must take it
        assert op_keys(db, ident) == ["kdb:fast", "kdb:slow", "kdb:unmeasured"]
        in_order(db)

        db.update_miscs("kdb:unmeasured", json.loads(profiled({H200: 5.0})))  # a profile made the last row fastest
        assert op_keys(db, ident) == ["kdb:unmeasured", "kdb:fast", "kdb:slow"]
        db.update_miscs("kdb:unmeasured", json.loads(profiled({H200: 70.0})))  # and timed again, slower
        assert op_keys(db, ident) == ["kdb:fast", "kdb:slow", "kdb:unmeasured"]

        (row,) = db.find("kdb:fast")
        db.update_function("kdb:fast", {**json.loads(row.function), "num_syncthreads": 0})  # repair's rewrite
        assert op_keys(db, ident) == ["kdb:fast", "kdb:slow", "kdb:unmeasured"]

        apply_plan(db, standalone_plan(db, [ident], H200))  # standalone and back: the order stays
        assert op_keys(db, ident) == ["kdb:fast", "kdb:slow", "kdb:unmeasured"]
        apply_plan(db, standalone_plan(db, [ident], back=True))
        assert op_keys(db, ident) == ["kdb:fast", "kdb:slow", "kdb:unmeasured"]

        gone = db.delete(["kdb:fast"])
        assert op_keys(db, ident) == ["kdb:slow", "kdb:unmeasured"]
        db.restore(gone)  # undo
        assert op_keys(db, ident) == ["kdb:fast", "kdb:slow", "kdb:unmeasured"]
        in_order(db)

        db.insert(relu("kdb:faster", {H200: 8.0}), replace=True)  # --replace: the op's only row
        assert op_keys(db, ident) == ["kdb:faster"]


def test_a_fused_kernels_rows_are_ordered_and_its_twins_follow(tmp_path: Path):
    ident = fused("x").identifier
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(fused("kdb:f-slow", {H200: 30.0}))
        db.insert(fused("kdb:f-fast", {H200: 10.0}))
        assert op_keys(db, ident) == ["kdb:f-fast", "kdb:f-slow"]
        assert {r.key for r in db.find(twin_key("kdb:f-fast"))} == {twin_key("kdb:f-fast")}
        db.update_miscs("kdb:f-slow", json.loads(profiled({H200: 3.0})))
        assert op_keys(db, ident) == ["kdb:f-slow", "kdb:f-fast"]
        (twin,) = db.find(twin_key("kdb:f-slow"))
        assert json.loads(twin.miscs) == json.loads(profiled({H200: 3.0}))  # the twin follows its row's profile
        in_order(db)


def test_rows_of_equal_rank_keep_their_place_and_undo_puts_them_back_there(tmp_path: Path):
    ident = relu("x").identifier
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        for key in ("kdb:a", "kdb:b", "kdb:c"):  # none timed: the compiler takes the first injected
            db.insert(relu(key))
        db.update_miscs("kdb:a", {"kdb": {"note": "verified"}})  # rewritten at a new rowid: still first
        assert op_keys(db, ident) == ["kdb:a", "kdb:b", "kdb:c"]
        gone = db.delete(["kdb:a", "kdb:b"])
        db.restore(gone)
        assert op_keys(db, ident) == ["kdb:a", "kdb:b", "kdb:c"]


def test_without_a_product_an_op_timed_on_two_gpus_keeps_its_order_and_the_setting_ranks_it(tmp_path: Path):
    ident = relu("x").identifier
    path = tmp_path / "k.db"
    with KernelDB.open(path, create=True) as db:
        db.insert(relu("kdb:h200", {H200: 10.0}))
        db.insert(relu("kdb:v100", {V100: 5.0}))
        db.insert(relu("kdb:none"))
        assert op_keys(db, ident) == ["kdb:h200", "kdb:v100", "kdb:none"]  # which GPU? unknown: as written
        db.update_miscs("kdb:h200", json.loads(profiled({H200: 11.0})))  # a rewrite keeps its place
        assert op_keys(db, ident) == ["kdb:h200", "kdb:v100", "kdb:none"]
        (problem,) = db.order_problems()
        assert problem.fastest == "" and V100 in problem.why and "product_name" in problem.why
    (tmp_path / "settings.toml").write_text(f'product_name = "{V100}"\n')  # KDB_CONFIG (conftest)
    with KernelDB.open(path, write=True) as db:
        assert db.ordering_product() == V100
        (problem,) = db.order_problems()
        assert problem.fastest == "kdb:v100"
        assert db.put_in_order([ident]) == ["kdb:v100", "kdb:h200", "kdb:none"]
        assert op_keys(db, ident) == ["kdb:v100", "kdb:h200", "kdb:none"]
        in_order(db)


def test_rows_another_process_wrote_are_ranked_too(tmp_path: Path):
    """Ordering knows which ops have rows without scanning the table for each insert; rows another connection
    committed since are seen (PRAGMA data_version)."""
    path = tmp_path / "k.db"
    ident = relu("x").identifier
    with KernelDB.open(path, create=True) as db:
        db.insert(relu("kdb:other-op", {H200: 1.0}, n=4))  # the insert that learns the ops present
        other = sqlite3.connect(path)
        with other:
            other.execute("INSERT INTO KernelCache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          relu("kdb:theirs", {H200: 50.0}).values())
        other.close()
        db.insert(relu("kdb:ours", {H200: 10.0}))
        assert op_keys(db, ident) == ["kdb:ours", "kdb:theirs"]


def test_a_profile_written_by_a_gpu_run_reorders_the_op_and_moves_a_standalone_rows_time(tmp_path: Path):
    ident = relu("x").identifier
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(relu("kdb:first", {H200: 20.0}))
        db.insert(relu("kdb:later"))
        (later,) = db.find("kdb:later")
        # the write path of `kdb gpu profile` (the time is this test's, not a measurement)
        _store_profile(db, later, H200, GpuResult(True, "time", microseconds=12.0, launches=100, device=H200))
        assert op_keys(db, ident) == ["kdb:later", "kdb:first"]
        apply_plan(db, standalone_plan(db, [ident], H200))
        (first,) = db.find("kdb:first")
        _store_profile(db, first, H200, GpuResult(True, "time", microseconds=4.0, launches=100, device=H200))
        (first,) = db.find("kdb:first")
        # standalone rows are chosen by Miscs.antares.time: it follows the profile
        assert is_standalone(first) and antares_entry(json.loads(first.miscs), H200)["time"] == 4.0
        assert op_keys(db, ident) == ["kdb:first", "kdb:later"]


def test_a_write_that_breaks_the_order_is_caught(tmp_path: Path):
    """What every test above relies on: order_problems names an op whose first row is not its fastest."""
    path = tmp_path / "k.db"
    written_by_another_tool(path, [relu("kdb:slow", {H200: 50.0}), relu("kdb:fast", {H200: 10.0}),
                                   relu("kdb:lone", {H200: 9.0}, n=4)])
    with KernelDB.open(path, write=True) as db:
        (problem,) = db.order_problems()
        assert (problem.first, problem.fastest) == ("kdb:slow", "kdb:fast")
        with db.writing() as raw:  # restore_order is what every write calls: it mends it
            assert restore_order(raw, problem.identifier, "") == ["kdb:fast", "kdb:slow"]
        in_order(db)


def test_repair_previews_then_puts_a_db_written_elsewhere_in_order(tmp_path: Path):
    path = tmp_path / "k.db"
    written_by_another_tool(path, [relu("kdb:slow", {H200: 50.0}), relu("kdb:fast", {H200: 10.0})])
    before = path.read_bytes()
    proc, check = run_kdb_json("db", "check", "--db", str(path))
    assert check["out_of_order"] == [relu("x").identifier]
    preview = run_kdb("db", "repair", "--db", str(path))
    assert preview.returncode == 1 and "put the rows of 1 op(s) fastest-first" in preview.stdout
    assert "reorder kdb:fast (the compiler takes kdb:slow first" in preview.stdout and "nothing written" in preview.stdout
    assert path.read_bytes() == before
    proc, report = run_kdb_json("db", "repair", "--db", str(path), "--apply")
    assert proc.returncode == 0, proc.stderr
    assert report["reordered"] == ["kdb:fast", "kdb:slow"] and report["out_of_order"][0]["fastest"] == "kdb:fast"
    assert keys_in_table_order(path) == ["kdb:fast", "kdb:slow"]


# -- a row injected for a standalone op --------------------------------------------------------


@pytest.fixture
def standalone_op(tmp_path: Path) -> tuple[Path, Path, str]:
    """A DB whose Relu op was made standalone for the H200, and a later kernel of the same op to inject."""
    from core.demo import demo_kernels
    from core.inject.pipeline import InjectOptions, Injector

    relu_item = next(item for item in demo_kernels() if item["op_type"] == "Relu")
    later = json.loads(json.dumps(relu_item))
    later["code"] = later["code"].replace("max(input0[i], 0.000000e+00f)", "fmaxf(input0[i], 0.000000e+00f)")
    (tmp_path / "first.json").write_text(json.dumps([relu_item]))
    (tmp_path / "later.json").write_text(json.dumps([later]))
    path = tmp_path / "k.db"
    with KernelDB.open(path, create=True) as db:
        assert Injector(db, InjectOptions(compile=False), state=None).run([tmp_path / "first.json"]).injected == 1
        (row,) = db.iter_rows()
        apply_plan(db, standalone_plan(db, [row.key], H200))
    return path, tmp_path / "later.json", row.identifier


def test_a_kernel_injected_later_for_a_standalone_op_goes_in_standalone_and_says_so(standalone_op):
    path, later, ident = standalone_op
    proc, report = run_kdb_json("inject", str(later), "--db", str(path), "--no-compile")
    assert proc.returncode == 0, proc.stderr
    (went,) = report["standalone"]
    assert went["product"] == H200
    with KernelDB.open(path) as db:
        rows = [r for r in db.iter_rows() if r.identifier == ident]
        assert len(rows) == 2 and all(is_standalone(r) for r in rows)  # no External row: BlockFusion skips the op
        (new,) = db.find(went["key"])
        assert antares_entry(json.loads(new.miscs), H200) is not None  # kernel selection takes it for the H200


def test_replace_keeps_a_standalone_op_standalone(standalone_op):
    from core.inject.pipeline import InjectOptions, Injector

    path, later, ident = standalone_op
    with KernelDB.open(path, write=True) as db:
        report = Injector(db, InjectOptions(compile=False, replace=True), state=None).run([later])
        (row,) = [r for r in db.iter_rows() if r.identifier == ident]
    assert report.injected == 1 and is_standalone(row) and list(report.standalone.values()) == [H200]
    assert any("standalone" in note for note in report.notes)


def test_an_op_made_fusable_again_takes_new_rows_as_they_come(standalone_op):
    path, later, ident = standalone_op
    with KernelDB.open(path, write=True) as db:
        apply_plan(db, standalone_plan(db, [ident], back=True))
    proc, report = run_kdb_json("inject", str(later), "--db", str(path), "--no-compile")
    assert proc.returncode == 0 and report["standalone"] == []  # nothing to keep: nothing said
    text = run_kdb("inject", str(later), "--db", str(path), "--no-compile", "--replace")
    assert "standalone" not in text.stdout + text.stderr


def test_realign_keeps_the_order(tmp_path: Path):
    ident = relu("x").identifier
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        db.insert(relu("kdb:a"))
        db.insert(relu("kdb:b"))
        (a,) = db.find("kdb:a")
        db.update_function(a.key, {**json.loads(a.function), "num_syncthreads": 0})  # what repair's rewrite writes
        assert op_keys(db, ident) == ["kdb:a", "kdb:b"]


def test_a_row_differing_only_in_its_profile_is_ranked_by_it(tmp_path: Path):
    ident = relu("x").identifier
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        slow = relu("kdb:one", {H200: 40.0})
        db.insert(slow)
        db.insert(replace(slow, key="kdb:two", miscs=profiled({H200: 39.0})))
        assert op_keys(db, ident) == ["kdb:two", "kdb:one"]


def test_a_rewritten_row_gets_a_rowid_no_row_had_even_the_last_one(tmp_path: Path):
    """The browse index sees a changed row by its (rowid, Key); SQLite hands the table's last row its rowid back
    when it is deleted and inserted again."""
    path = tmp_path / "k.db"
    with KernelDB.open(path, create=True) as db:
        db.insert(relu("kdb:a"))
        db.insert(relu("kdb:last", n=4))
        before = dict(db.connection().execute("SELECT Key, rowid FROM KernelCache"))
        db.update_miscs("kdb:last", json.loads(profiled({H200: 3.0})))
        after = dict(db.connection().execute("SELECT Key, rowid FROM KernelCache"))
    assert after["kdb:a"] == before["kdb:a"] and after["kdb:last"] > max(before.values())

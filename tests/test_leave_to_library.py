"""`kdb db leave-to-library`: ops whose row ran slower than the library on a GPU get their rows set aside, so
NNFusion runs cuDNN / cuBLAS / its own kernel for them; previewed first, undone from the set-aside file. Times not
measured on a GPU are never acted on. (The times here are test data, not measurements.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_kdb, run_kdb_json
from test_fastest import H200, fused, keys_in_table_order, relu

from core.db.kernel_db import KernelDB
from core.db.library import OpTimes, plan_leave_to_library, read_times
from core.db.maintenance import apply_plan, library_plan, undo_plan
from core.errors import InputError
from core.kernels.kernel_row import twin_key

RELU, FUSED, LONE = relu("x").identifier, fused("x").identifier, relu("x", n=4).identifier


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "k.db"
    with KernelDB.open(path, create=True) as db:
        for row in (relu("kdb:relu-a", {H200: 20.0}), relu("kdb:relu-b", {H200: 30.0}),
                    fused("kdb:fused", {H200: 10.0}), relu("kdb:lone", n=4)):
            db.insert(row)
    return path


def times_file(tmp_path: Path, ops: list[dict], device: str | None = H200) -> Path:
    path = tmp_path / "times.json"
    path.write_text(json.dumps({"device": device, "ops": ops} if device is not None else {"ops": ops}))
    return path


def test_the_plan_names_slower_ops_by_how_much_and_leaves_unmeasured_ones_alone(db_path: Path, tmp_path: Path):
    times = [OpTimes(RELU, 15.0),  # the row's own profile (20 us, its first row) against 15 us
             OpTimes(FUSED, 12.0),  # the row is faster: stays
             OpTimes(LONE, 3.0),  # the row has no time on the H200: not measured
             OpTimes(FUSED + "x", 1.0)]  # not in the DB
    with KernelDB.open(db_path, write=True) as db:
        plan = plan_leave_to_library(db, H200, times)
        (slow,) = plan.slower
        assert (slow.key, slow.row_us, slow.library_us, slow.extra_us) == ("kdb:relu-a", 20.0, 15.0, 5.0)
        assert slow.rows == ("kdb:relu-a", "kdb:relu-b")
        assert [v.key for v in plan.kept] == ["kdb:fused"]
        (unmeasured,) = plan.not_measured
        assert unmeasured.key == "kdb:lone" and unmeasured.why.startswith("not measured") and "its row" in unmeasured.why
        assert plan.absent == [FUSED + "x"]
        assert "5 us (1.33x) slower" in plan.slower_lines()[0][1]
        assert plan_leave_to_library(db, H200, [OpTimes(RELU, 15.0)], margin=0.5).slower == []  # within 50%

    path = times_file(tmp_path, [{"identifier": RELU, "library_us": 15.0}, {"identifier": FUSED, "library_us": 12.0},
                                 {"identifier": LONE, "library_us": 3.0}])
    with KernelDB.open(db_path, write=True) as db:
        applied = apply_plan(db, library_plan(db, path), undo_dir=tmp_path / "aside")
        assert set(applied.deleted) == {"kdb:relu-a", "kdb:relu-b"}
        assert applied.undo_file is not None
        assert keys_in_table_order(applied.undo_file) == ["kdb:relu-a", "kdb:relu-b"]
        assert db.find(RELU) == []
        assert apply_plan(db, undo_plan(db, applied.undo_file), undo_dir=tmp_path / "aside").written == 2
    assert keys_in_table_order(db_path)[-2:] == ["kdb:relu-a", "kdb:relu-b"]  # back, fastest first


def test_a_fused_kernels_twin_is_set_aside_and_put_back_with_it(db_path: Path, tmp_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        before = {r.key: r for r in db.iter_rows()}
        path = times_file(tmp_path, [{"identifier": FUSED, "library_us": 5.0, "row_us": 10.0}])
        applied = apply_plan(db, library_plan(db, path), undo_dir=tmp_path / "aside")
        assert set(applied.deleted) == {"kdb:fused", twin_key("kdb:fused")}
        assert applied.undo_file is not None
        assert apply_plan(db, undo_plan(db, applied.undo_file), undo_dir=tmp_path / "aside").written == 2
        assert {r.key: r for r in db.iter_rows()} == before  # every column as it was


def test_the_cli_previews_applies_and_undoes(db_path: Path, tmp_path: Path):
    path = times_file(tmp_path, [{"identifier": RELU, "library_us": 15.0},
                                 {"identifier": LONE, "library_us": None}])
    before = db_path.read_bytes()
    preview = run_kdb("db", "leave-to-library", str(path), "--db", str(db_path))
    assert preview.returncode == 1, preview.stderr
    assert "Leave 1 op(s) whose row ran slower than the library on NVIDIA H200 to the library" in preview.stdout
    assert "nothing written" in preview.stdout
    assert "takes 20 us, the library 15 us" in preview.stdout and "not measured" in preview.stdout
    assert db_path.read_bytes() == before  # a preview writes nothing

    proc, report = run_kdb_json("db", "leave-to-library", str(path), "--db", str(db_path), "--apply")
    assert proc.returncode == 0 and report["rows_removed"] == 2, proc.stderr
    assert [v["key"] for v in report["slower"]] == ["kdb:relu-a"] and report["not_measured"][0]["key"] == "kdb:lone"
    aside = report["undo_file"]
    assert "kdb:relu-a" not in keys_in_table_order(db_path) and "kdb:lone" in keys_in_table_order(db_path)

    look = run_kdb("db", "leave-to-library", "--undo", aside, "--db", str(db_path))
    assert look.returncode == 0 and "2 row(s) back as they were, 0 go" in look.stdout
    proc, undone = run_kdb_json("db", "leave-to-library", "--undo", aside, "--db", str(db_path), "--apply")
    assert proc.returncode == 0 and undone["rows_written"] == 2
    assert {"kdb:relu-a", "kdb:relu-b"} <= set(keys_in_table_order(db_path))


def test_times_not_measured_on_a_gpu_are_refused(db_path: Path, tmp_path: Path):
    no_device = times_file(tmp_path, [{"identifier": RELU, "library_us": 15.0}], device=None)
    proc = run_kdb("db", "leave-to-library", str(no_device), "--db", str(db_path), "--apply")
    assert proc.returncode == 2 and "not measured" in proc.stderr and str(no_device) in proc.stderr
    proc, report = run_kdb_json("db", "leave-to-library", str(times_file(tmp_path, [
        {"identifier": RELU, "library_us": None}])), "--db", str(db_path), "--apply")
    assert proc.returncode == 0 and report["rows_removed"] == 0 and report["slower"] == []
    assert report["not_measured"][0]["why"].startswith("not measured")


@pytest.mark.parametrize(("ops", "message"), [
    ([{"identifier": RELU, "library_us": "fast"}], "ops[0]: library_us 'fast' is not a positive time"),
    ([{"identifier": RELU, "library_us": -1}], "ops[0]: library_us -1 is not a positive time"),
    ([{"library_us": 3}], "ops[0]: expected an object with an \"identifier\""),
])
def test_a_bad_times_file_names_the_file_and_the_item(tmp_path: Path, ops: list, message: str):
    path = times_file(tmp_path, ops)
    with pytest.raises(InputError) as caught:
        read_times(path)
    assert str(path) in str(caught.value) and message in str(caught.value)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        read_times(tmp_path / "broken.json")

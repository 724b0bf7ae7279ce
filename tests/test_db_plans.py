"""DB maintenance as plans (core/db/maintenance.py, core/db/edit.py): both faces, the CLI's `kdb db VERB --apply` then
`kdb db undo FILE --apply` and the Kernels view's key then `u`, leave the same rows on the same DB; an apply is one
transaction with its undo file, and neither an apply nor an undo lands on a DB that moved on since."""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import run_kdb, run_kdb_json
from console_helpers import FixedDeviceApp, wait_until
from test_fastest import FN, H200, TAGS, fused, profiled, relu, written_by_another_tool

from console.context import ConsoleContext
from console.widgets.db_maintenance import DbMaintenance, PlanDialog
from console.widgets.kernel_table import KernelTable
from core.db.kernel_db import KernelDB
from core.db.maintenance import apply_plan, fastest_plan, repair_plan, undo_plan
from core.errors import DbError
from core.kernels.kernel_row import KernelRow
from core.kernels.opsig import signature_from_attributes
from core.settings import load_settings


def fused_without_twin(key: str) -> KernelRow:
    """A fused kernel of another shape, written without the CUDA twin NNFusion needs to use it."""
    attrs = {"input_shape": [[1, 8, 8, 8], [8, 8, 3, 3]], "output_shape": [[1, 8, 8, 8]],
             "parameters": {"window_movement_strides": [1, 1], "window_dilation_strides": [1, 1],
                            "padding_below_diff": [1, 1]}}
    ident = signature_from_attributes("Fused_Convolution_Relu", attrs).identifier
    return KernelRow(key, ident, "Fused_Convolution_Relu", json.dumps(attrs), "External", "CUDA_GPU", FN, TAGS,
                     profiled({H200: 5.0}))


def restricted(row: KernelRow) -> KernelRow:
    """The row in the form injection writes now: repair's rewrite leaves it alone."""
    fn = json.loads(row.function)
    fn["function_signature"] = fn["function_signature"].replace("float* ", "float* __restrict__ ")
    return replace(row, function=json.dumps(fn))


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Something for every plan: ops whose slow row comes first (another tool wrote them; the Relu's rows in the
    form injection writes now, so only putting them in order mends them), rows without __restrict__ (an older form),
    a fused kernel without its twin; every time measured on the H200 only."""
    path = tmp_path / "k.db"
    written_by_another_tool(path, [*(restricted(r) for r in (relu("kdb:relu-slow", {H200: 50.0}),
                                                            relu("kdb:relu-fast", {H200: 20.0}),
                                                            relu("kdb:relu-unmeasured"))),
                                   fused("kdb:fused-slow", {H200: 30.0}),
                                   fused("kdb:fused-fast", {H200: 10.0}), relu("kdb:lone", {H200: 9.0}, n=4)])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO KernelCache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", fused_without_twin("kdb:no-twin")
                     .values())
    conn.close()
    return path


def state(path: Path) -> list[tuple[tuple[str, str], list[tuple[Any, ...]]]]:
    """Each op's rows (Identifier, DeviceType), every column, in table order: what NNFusion reads. The rowids
    themselves differ between two DBs given the same rows, and the compiler never compares them across ops."""
    conn = sqlite3.connect(path)
    try:
        ops: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for row in conn.execute("SELECT * FROM KernelCache ORDER BY rowid"):
            ops.setdefault((row[1], row[5]), []).append(tuple(row))
        return sorted(ops.items())
    finally:
        conn.close()


def cli_apply_and_undo(path: Path, *args: str) -> tuple[list, list]:
    proc, done = run_kdb_json("db", *args, "--db", str(path), "--apply")
    assert proc.returncode == 0 and done["applied"] and done["undo_file"], proc.stderr
    after = state(path)
    proc, undone = run_kdb_json("db", "undo", done["undo_file"], "--db", str(path), "--apply")
    assert proc.returncode == 0 and undone["applied"], proc.stderr
    for undo_file in (Path(done["undo_file"]), Path(undone["undo_file"])):  # each one file, to keep or to move
        assert sorted(undo_file.parent.glob(undo_file.name + "*")) == [undo_file]
    return after, state(path)


async def console_apply_and_undo(path: Path, key: str, current: str | None = None) -> tuple[list, list, str]:
    """Press `key` in the Kernels view (on the row `current`), apply the preview, then `u`; (the rows after the
    apply, after the undo, the preview's title)."""
    app = FixedDeviceApp(ConsoleContext(db_path=path, settings=load_settings(), device_summary="no GPU (test)"))
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_until(pilot, lambda: table.row_count > 0, "the first page")
        if current is not None:
            await wait_until(pilot, lambda: current in {str(k.value) for k in table.rows}, "the row on the page")
            table.move_cursor(row=table.get_row_index(current))
        table.focus()
        await pilot.press(key)
        await wait_until(pilot, lambda: isinstance(app.screen, PlanDialog), "the plan's preview")
        title = app.screen.plan.title  # type: ignore[attr-defined]
        await pilot.press("y")
        maintenance = app.screen.query_one(DbMaintenance)
        await wait_until(pilot, lambda: bool(maintenance.undo_stack), "the apply's undo file")
        after = state(path)
        await pilot.press("u")
        await wait_until(pilot, lambda: any(n.message.startswith("Undo the") for n in app._notifications),
                         "the undo's notification")
        return after, state(path), title


@pytest.mark.parametrize(("verb", "key"), [("repair", "F"), ("fastest", "K"), ("standalone", "S")])
async def test_the_cli_and_the_console_leave_the_same_rows_after_apply_and_after_undo(db_path: Path, tmp_path: Path,
                                                                                      verb: str, key: str):
    console_db = tmp_path / "console.db"
    shutil.copy(db_path, console_db)
    before = state(db_path)
    args = (verb, "kdb:relu-fast") if verb == "standalone" else (verb,)
    _proc, preview = run_kdb_json("db", *args, "--db", str(db_path))
    assert preview["plan"]["writes"] and state(db_path) == before  # a preview writes nothing
    cli_after, cli_undone = cli_apply_and_undo(db_path, *args)
    console_after, console_undone, title = await console_apply_and_undo(
        console_db, key, "kdb:relu-fast" if verb == "standalone" else None)
    assert title == preview["plan"]["title"]  # one plan: the dialog asks what the CLI previews
    assert cli_after != before and console_after == cli_after
    assert cli_undone == before and console_undone == before


def test_repair_is_one_plan_of_twins_older_forms_and_order(db_path: Path, tmp_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        plan = repair_plan(db)
        actions = {line.action for line in plan.lines}
        assert actions == {"add", "rewrite", "reorder"}, plan.lines
        applied = apply_plan(db, plan, undo_dir=tmp_path / "undo")
        assert [r.key for r in applied.twins] == ["kdb:no-twin#CUDA"] and set(applied.moved) >= {"kdb:relu-fast"}
        assert db.order_problems() == [] and db.pair_problems() == ([], [])
        assert not repair_plan(db).writes  # nothing left to repair


def test_a_plan_made_before_another_write_is_refused_and_writes_nothing(db_path: Path, tmp_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        plan = fastest_plan(db, H200)
        db.update_miscs("kdb:relu-unmeasured", json.loads(profiled({H200: 1.0})))  # now the fastest: the plan is old
        before = state(db_path)
        with pytest.raises(DbError, match="no longer those it was made from"):
            apply_plan(db, plan, undo_dir=tmp_path / "undo")
    assert state(db_path) == before and not list((tmp_path / "undo").glob("*"))


def test_a_failure_inside_the_apply_leaves_the_db_as_it_was_and_no_undo_file(db_path: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch):
    before = state(db_path)

    def broken(self: KernelDB, keys: list[str]) -> list[KernelRow]:
        raise OSError("disk full (planted)")  # the last step of repair, after its deletes and rewrites

    monkeypatch.setattr(KernelDB, "add_twins", broken)
    with KernelDB.open(db_path, write=True) as db, pytest.raises(OSError, match="planted"):
        apply_plan(db, repair_plan(db), undo_dir=tmp_path / "undo")
    assert state(db_path) == before and not list((tmp_path / "undo").glob("*"))


def test_an_undo_after_another_write_is_refused_and_a_second_undo_does_nothing(db_path: Path, tmp_path: Path):
    with KernelDB.open(db_path, write=True) as db:
        applied = apply_plan(db, fastest_plan(db, H200), undo_dir=tmp_path / "undo")
        assert applied.undo_file is not None
        db.update_miscs("kdb:relu-fast", json.loads(profiled({H200: 19.0})))  # profiled again after the apply
        with pytest.raises(DbError, match="changed after its fastest was applied"):
            undo_plan(db, applied.undo_file)
        db.update_miscs("kdb:relu-fast", json.loads(profiled({H200: 20.0})))  # as the apply left it
        apply_plan(db, undo_plan(db, applied.undo_file), undo_dir=tmp_path / "undo")
        again = undo_plan(db, applied.undo_file)
        assert not again.writes and again.title.startswith("Nothing to undo")


def test_an_undo_file_of_another_db_or_no_undo_file_is_named_and_nothing_is_written(db_path: Path, tmp_path: Path):
    other = tmp_path / "other.db"
    shutil.copy(db_path, other)
    with KernelDB.open(other, write=True) as db:
        undo_file = apply_plan(db, fastest_plan(db, H200), undo_dir=tmp_path / "undo").undo_file
    before = state(db_path)
    proc = run_kdb("db", "undo", str(undo_file), "--db", str(db_path), "--apply")
    assert proc.returncode == 2 and f"applied to {other.resolve()}" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "junk.db").write_text("not a database, but long enough to be taken for one " * 20)
    proc = run_kdb("db", "undo", str(tmp_path / "junk.db"), "--db", str(db_path), "--apply")
    assert proc.returncode == 2 and "junk.db: not an undo file" in proc.stderr and "Traceback" not in proc.stderr
    assert state(db_path) == before


def test_a_set_aside_file_an_older_kdb_wrote_still_puts_its_rows_back(db_path: Path, tmp_path: Path):
    aside = tmp_path / "left-to-library-old.db"
    with KernelDB.open(db_path, write=True) as db:
        gone = list(db.delete(["kdb:lone"]))
    with KernelDB.open(aside, create=True) as old:  # the rows only, as leave-to-library --apply wrote them
        old.restore(gone)
    proc, report = run_kdb_json("db", "leave-to-library", "--undo", str(aside), "--db", str(db_path), "--apply")
    assert proc.returncode == 0 and report["rows_written"] == 1
    with KernelDB.open(db_path) as db:
        assert db.find("kdb:lone") == [replace(gone[0])]

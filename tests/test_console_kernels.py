"""Pilot tests of the Kernels view: page, filter as you type, sort, detail, mark, delete + undo, export."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from console_helpers import FixedDeviceApp, build_small_db, wait_until
from textual.widgets import Input

from console.context import ConsoleContext
from console.widgets.db_maintenance import PlanDialog
from console.widgets.dialogs import PathDialog
from console.widgets.kernel_detail import KernelDetail
from console.widgets.kernel_table import KernelTable, shapes_of
from core.db.kernel_db import KernelDB
from core.settings import load_settings

# The demo's 10 kernels, and the CUDA twin of its fused convolution (NNFusion needs both rows to use it).
ROWS = 11


@pytest.fixture
def app(tmp_path: Path) -> FixedDeviceApp:
    db = build_small_db(tmp_path / "k.db")
    return FixedDeviceApp(ConsoleContext(db_path=db, settings=load_settings(), device_summary="no GPU (test)"))


def shown_text(widget) -> str:
    """What a Static shows, as plain text."""
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(widget.content)
    return console.export_text()


async def wait_rows(pilot, table: KernelTable, n: int) -> None:
    await wait_until(pilot, lambda: table.row_count == n, f"the table to show {n} rows")


async def wait_for_dialog(pilot, app: FixedDeviceApp) -> PlanDialog:
    await wait_until(pilot, lambda: isinstance(app.screen, PlanDialog), "the plan's preview")
    assert isinstance(app.screen, PlanDialog)
    return app.screen


async def test_browse_filter_sort_and_detail(app: FixedDeviceApp):
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        await pilot.press("slash", *"Dot")
        await wait_rows(pilot, table, 2)
        await pilot.press("escape")
        table.focus()
        await pilot.press("down")
        await wait_until(pilot, lambda: "Dot" in shown_text(app.screen.query_one("#detail-body")),
                         "the detail pane to show the Dot row")
        # sort by the shapes column (the identifier's order), descending on the second click
        await pilot.click("#kernel-table", offset=(65, 0))
        await pilot.click("#kernel-table", offset=(65, 0))
        await wait_until(pilot, lambda: app.screen.sort == "identifier" and app.screen.descending,
                         "the descending sort by identifier")


async def test_lint_filter_shows_problem_rows_only(app: FixedDeviceApp, tmp_path: Path):
    with KernelDB.open(app.context.db_path, write=True) as db, db.writing() as conn:
        conn.execute("UPDATE KernelCache SET Tags = 'KernelEmitter' WHERE OpType = 'Relu'")
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        app.screen.query_one("#filter-lint").value = "problems"
        await wait_rows(pilot, table, 1)


async def test_delete_asks_then_undo_restores(app: FixedDeviceApp):
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        table.focus()
        await pilot.press("space", "down", "space", "d")
        assert (await wait_for_dialog(pilot, app)).question == "Delete 2 kernel(s) from the DB?"
        await pilot.press("y")
        await wait_rows(pilot, table, ROWS - 2)
        with KernelDB.open(app.context.db_path) as db:
            assert db.count() == ROWS - 2
        await pilot.press("u")
        await wait_rows(pilot, table, ROWS)
        with KernelDB.open(app.context.db_path) as db:
            assert db.count() == ROWS


async def test_export_writes_kernel_json_that_reinjects_unchanged(app: FixedDeviceApp, tmp_path: Path):
    out = tmp_path / "export.json"
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        table.focus()
        await pilot.press("e")
        await wait_until(pilot, lambda: bool(app.screen.query("#path")), "the export dialog's path field")
        field = app.screen.query_one("#path")
        field.value = str(out)
        await pilot.press("enter")
        await wait_until(pilot, lambda: any(n.message.startswith("exported ") for n in app._notifications),
                         "the export's notification")
    items = json.loads(out.read_text())
    assert len(items) == 1 and set(items[0]) >= {"tvm_func_name", "op_type", "parameters", "code", "gridDim"}
    from core.db.state import StateDB
    from core.inject.pipeline import InjectOptions, Injector

    with KernelDB.open(app.context.db_path, write=True) as db:
        report = Injector(db, InjectOptions(compile=False), state=StateDB()).run([out])
    assert report.unchanged == 1 and report.injected == 0 and report.failed == 0


async def test_detail_pane_shows_shared_memory_and_not_measured(app: FixedDeviceApp):
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        await pilot.press("slash", *"dot_m64")
        await wait_rows(pilot, table, 1)
        table.focus()

        def detail() -> str:
            return shown_text(app.screen.query_one(KernelDetail).query_one("#detail-body"))

        await wait_until(pilot, lambda: "A_shared_kdb_flat" in detail(), "the detail pane of the dot_m64 row")
        text = detail()
        assert "A_shared_kdb_flat" in text and "not measured" in text and "barriers" in text


async def test_rows_written_by_another_process_show_up_without_a_keypress(app: FixedDeviceApp):
    """The page comes from the browse index; its worker notices the DB file changed and catches up."""
    import sqlite3

    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        # the index is built in the background after the first page
        await wait_until(pilot, lambda: not app.screen.syncing, "the browse index")
        conn = sqlite3.connect(app.context.db_path)  # another tool: no notification reaches the console
        conn.execute("INSERT INTO KernelCache SELECT 'other-tool', Identifier, OpType, Attributes, Source, "
                     "DeviceType, Function, Tags, Miscs FROM KernelCache LIMIT 1")
        conn.execute("DELETE FROM KernelCache WHERE Key = (SELECT min(Key) FROM KernelCache WHERE Key != 'other-tool')")
        conn.commit()
        conn.close()
        def keys() -> set[str]:
            return {str(k.value) for k in table.rows}

        # the check runs every 3 s; the count follows the page
        await wait_until(pilot, lambda: "other-tool" in keys() and app.screen.total is not None,
                         "the other tool's row on the page")
        keys = keys()
        assert "other-tool" in keys and len(keys) == ROWS and app.screen.total == ROWS


async def test_on_a_big_db_filters_wait_for_the_browse_index(app: FixedDeviceApp, monkeypatch: pytest.MonkeyPatch):
    """Before the index exists a big DB shows its first page in Key order; a filter waits (reading every body
    of a million rows would take minutes) and applies itself once the index is built."""
    import console.widgets.kernel_pages as pages

    monkeypatch.setattr(pages, "DIRECT_FILTER_LIMIT", 5)  # "big": more than 5 rows
    real_request = pages.KernelPages.request_sync
    monkeypatch.setattr(pages.KernelPages, "request_sync", lambda self, rebuild=False: None)
    async with app.run_test(size=(180, 50)) as pilot:
        screen = app.screen
        table = screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        assert screen.shown_sort == "key" and [str(k.value) for k in table.rows] == sorted(
            str(k.value) for k in table.rows)
        await pilot.press("slash", *"Dot")
        await wait_rows(pilot, table, 0)
        assert "waits for the browse index" in shown_text(screen.query_one("#page-status"))
        real_request(screen.query_one(pages.KernelPages))
        await wait_rows(pilot, table, 2)
        assert "waits" not in shown_text(screen.query_one("#page-status"))


async def test_without_a_usable_state_dir_pages_come_from_the_db(app: FixedDeviceApp, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    import console.widgets.kernel_pages as pages

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state dir should be")
    monkeypatch.setenv("KDB_STATE_DIR", str(blocker))
    monkeypatch.setattr(pages, "SYNC_EVERY_S", 0.05)  # the periodic sync, often: the test waits for its ticks
    ticks: list[int] = []
    periodic = pages.KernelPages._periodic_sync
    monkeypatch.setattr(pages.KernelPages, "_periodic_sync", lambda self: (ticks.append(1), periodic(self)))

    def errors() -> list[str]:
        return [n.message for n in app._notifications if n.severity == "error"]

    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        await pilot.press("slash", *"Dot")
        await wait_rows(pilot, table, 2)
        await wait_until(pilot, lambda: bool(errors()), "the failed sync's report")
        ticks.clear()
        await wait_until(pilot, lambda: len(ticks) >= 3, "three periodic syncs after the failure")
        # reported once, not at every tick
        assert len(errors()) == 1 and "not-a-dir" in errors()[0], [n.title for n in app._notifications]


@pytest.mark.parametrize("mode", ["kernels", "inject", "failures", "settings", "opconfigs", "autotvm", "tuning"])
async def test_a_failing_worker_is_reported_once_on_every_view(app: FixedDeviceApp, mode: str):
    """Textual calls each class's handler along the MRO: a view that also called super() reported twice."""
    def fail() -> None:
        raise RuntimeError("the one failure")

    async with app.run_test(size=(180, 50)) as pilot:
        await app.switch_mode(mode)
        app.screen.run_worker(fail, thread=True, exit_on_error=False, group="test")
        await wait_until(pilot, lambda: any("the one failure" in n.message for n in app._notifications),
                         "the worker's failure to be reported")
        await pilot.pause()  # a second report would be posted by the same failure's handlers: processed by now
        assert [n.message for n in app._notifications if "the one failure" in n.message] == [
            "RuntimeError: the one failure"]


def test_shapes_come_from_the_identifier():
    from core.kernels.opsig import ConvParams, OpSignature

    conv = OpSignature("Fused_Convolution_Add_Relu", ((1, 64, 56, 56), (64, 64, 3, 3)), ((1, 64, 56, 56),),
                       ConvParams((1, 1), (1, 1), (1, 1)))
    assert shapes_of(conv.op_type, conv.identifier) == "1x64x56x56 64x64x3x3 → 1x64x56x56"
    dot = OpSignature("Dot", ((4, 256), (256, 512)), ((4, 512),), dtype="half")
    assert shapes_of("Dot", dot.identifier) == "4x256 256x512 → 4x512 half"
    relu6 = OpSignature("Relu6", ((1, 8),), ((1, 8),))  # the op's digit is not a dim
    assert shapes_of("Relu6", relu6.identifier) == "1x8 → 1x8"
    assert shapes_of("Dot", "written by another tool") == ""


async def test_rows_named_alike_are_told_apart_by_their_shapes(tmp_path: Path):
    """Kernel names often share their first 40 characters (the artifact's tuned_fused_convolution_op_float_...):
    op type, device and shapes, first in each row, tell every row apart."""
    from core.db.state import StateDB
    from core.demo import _conv
    from core.inject.pipeline import InjectOptions, Injector

    items = []
    for channels in (16, 32):  # same op, same launch: only the input and filter shapes differ
        item = _conv("Fused_Convolution_Relu", channels, 32, 32, 3, 1)
        name = f"tuned_fused_convolution_relu_op_float_i1_{channels}_32_32_w32_{channels}_3_3_kernel0"
        items.append({**item, "tvm_func_name": name, "code": item["code"].replace(item["tvm_func_name"], name)})
    src = tmp_path / "alike.json"
    src.write_text(json.dumps(items), encoding="utf-8")
    db_path = tmp_path / "alike.db"
    with KernelDB.open(db_path, create=True) as db:
        Injector(db, InjectOptions(compile=False), state=StateDB()).run([src])
        rows = db.count()  # a fused kernel is two rows: CUDA_GPU and its CUDA twin
    app = FixedDeviceApp(ConsoleContext(db_path=db_path, settings=load_settings(), device_summary="no GPU (test)"))
    async with app.run_test(size=(200, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, rows)
        first = [tuple(str(table.get_cell(key, column)) for column in ("op", "device", "shapes")) for key in table.rows]
        assert len(set(first)) == rows, first  # no two rows look alike in the columns that come first
        assert {shapes for _, _, shapes in first} == {"1x16x32x32 32x16x3x3 → 1x32x32x32",
                                                      "1x32x32x32 32x32x3x3 → 1x32x32x32"}


async def test_every_view_footer_fits_200_columns_with_all_its_keys(app: FixedDeviceApp,
                                                                    monkeypatch: pytest.MonkeyPatch):
    """With every action enabled (a view's widest footer), each key and the last (q Quit) stay left of ^p."""
    from textual.widgets import Footer
    from textual.widgets._footer import FooterKey

    async with app.run_test(size=(200, 50)) as pilot:
        views = [b.action.removeprefix("switch_mode('").removesuffix("')") for b in app.BINDINGS
                 if b.action.startswith("switch_mode(")]  # every view 1-8 opens, those added at start included
        assert len(views) == 8
        for mode in views:
            await app.switch_mode(mode)
            monkeypatch.setattr(type(app.screen), "check_action", lambda self, action, parameters: True)
            app.screen.refresh_bindings()
            footer = app.screen.query_one(Footer)
            wanted = {b.description for b in [*app.screen.BINDINGS, *app.BINDINGS] if b.show}
            # the footer composes its keys again once the bindings change
            await wait_until(pilot, lambda: bool(footer.query(".-command-palette")) and  # noqa: B023
                             {k.description for k in footer.query(FooterKey)} >= wanted,  # noqa: B023
                             f"every key of the {mode} view in the footer")
            keys = list(footer.query(FooterKey))
            palette = footer.query_one(".-command-palette", FooterKey)
            keys = [k for k in keys if k is not palette]
            assert {k.description for k in keys} >= wanted, (mode, wanted - {k.description for k in keys})
            assert all(k.region.right <= palette.region.x for k in keys), (
                mode, [k.description for k in keys if k.region.right > palette.region.x])


async def test_keep_fastest_asks_drops_the_slower_row_and_undo_brings_it_back(app: FixedDeviceApp):
    with KernelDB.open(app.context.db_path, write=True) as db:
        first = next(db.iter_rows("WHERE OpType = 'Relu'"))
        db.update_miscs(first.key, {"external_profile": {"time": "NVIDIA H200:50;", "resource": 64}})
        fn = json.loads(first.function)
        fn["function_body"] = "// a later run's kernel\n" + fn["function_body"]
        db.insert(replace(first, key="kdb:faster", function=json.dumps(fn),
                          miscs=json.dumps({"external_profile": {"time": "NVIDIA H200:10;", "resource": 64}})))
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS + 1)
        table.focus()
        await pilot.press("K")
        assert (await wait_for_dialog(pilot, app)).question == \
            "Keep only the fastest row of 1 op(s) on NVIDIA H200?"
        await pilot.press("y")
        await wait_rows(pilot, table, ROWS)
        with KernelDB.open(app.context.db_path) as db:
            assert not db.has_key(first.key) and db.has_key("kdb:faster")
        await pilot.press("u")
        await wait_rows(pilot, table, ROWS + 1)


async def test_leave_to_library_asks_for_the_times_file_shows_the_clis_plan_applies_and_undo_brings_back(
        app: FixedDeviceApp, tmp_path: Path):
    """`L`: `kdb db leave-to-library TIMES.json`, the same core plan: its title is the CLI's, its apply removes what
    the CLI's would, `u` puts the rows back. (The times are test data, not measurements.)"""
    from conftest import run_kdb_json

    with KernelDB.open(app.context.db_path, write=True) as db:
        relu = next(db.iter_rows("WHERE OpType = 'Relu'"))
        db.update_miscs(relu.key, {"external_profile": {"time": "NVIDIA H200:50;", "resource": 64}})
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"device": "NVIDIA H200", "ops": [{"identifier": relu.identifier, "library_us": 5.0}]}))
    _, cli = run_kdb_json("db", "leave-to-library", str(times), "--db", str(app.context.db_path))
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        table.focus()
        await pilot.press("L")
        await wait_until(pilot, lambda: isinstance(app.screen, PathDialog), "the times file's dialog")
        app.screen.query_one("#path", Input).value = str(times)
        await pilot.press("enter")
        assert (await wait_for_dialog(pilot, app)).question == f"{cli['plan']['title']}?"
        await pilot.press("y")
        await wait_rows(pilot, table, ROWS - 1)
        with KernelDB.open(app.context.db_path) as db:
            assert not db.has_key(relu.key)
        await pilot.press("u")
        await wait_rows(pilot, table, ROWS)


async def test_repair_asks_then_gives_an_old_rows_shared_arrays_their_alignment(app: FixedDeviceApp):
    """`F`: what `kdb db repair` mends, here a row injected before the symbols carried `__align__(N)`."""
    from test_shared_alignment import ITEM

    from core.inject.prepare import prepare

    aligned = prepare("k.json", 0, ITEM).row
    assert aligned is not None
    fn = json.loads(aligned.function)
    fn["shared_memory"]["symbol"] = ["a_shared", "b_shared"]  # as kdb wrote it before 1f8bb1c
    with KernelDB.open(app.context.db_path, write=True) as db:
        db.insert(replace(aligned, function=json.dumps(fn)))
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS + 1)
        table.focus()
        await pilot.press("F")
        assert (await wait_for_dialog(pilot, app)).question == "Bring 1 kernel(s) to the form injection writes now?"
        await pilot.press("y")

        def function() -> str:
            with KernelDB.open(app.context.db_path) as db:
                (row,) = db.find(aligned.key)
            return row.function

        # exactly what injection writes now
        await wait_until(pilot, lambda: function() == aligned.function, "the repaired row in the DB")
        with KernelDB.open(app.context.db_path) as db:
            assert db.count() == ROWS + 1


async def test_standalone_asks_then_runs_the_op_on_its_own_launch_and_s_again_gives_it_back(app: FixedDeviceApp):
    """`S`: what `kdb db standalone` does, for the current row's op; pressed again, the op's rows go back."""
    from core.kernels.kernel_row import is_standalone

    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_rows(pilot, table, ROWS)
        table.focus()
        key = table.current_key()
        assert key is not None

        def row_is_standalone() -> bool:
            with KernelDB.open(app.context.db_path) as db:
                (row,) = [r for r in db.find(key) if r.key == key]
            return is_standalone(row)

        async def press_s_and_confirm(question: str) -> None:
            await pilot.press("S")
            assert (await wait_for_dialog(pilot, app)).question == question
            await pilot.press("y")
            # the write runs in a worker
            await wait_until(pilot, lambda: row_is_standalone() == question.startswith("Run"), "the write in the DB")

        await press_s_and_confirm("Run 1 row(s) of 1 op(s) standalone?")
        # then the page reloads (the DB's row was rewritten before it: wait for the row the table shows, and
        # for the cursor, which follows the row to its new place in the page)
        await wait_until(pilot, lambda: key in table.rows and str(table.get_cell(key, "tags")) == "standalone",
                         "the page to show the row standalone")
        await wait_until(pilot, lambda: table.current_key() == key, "the cursor on the rewritten row")
        assert str(table.get_cell(key, "source")) == "Antares"
        await press_s_and_confirm("Give 1 standalone row(s) of 1 op(s) back to BlockFusion?")

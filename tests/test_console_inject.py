"""Pilot tests of the Inject view: a directory with a bad file, cancel, a bad arch, the compile stage, a snapshot."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from console_helpers import SNAPSHOT_DIR, FixedDeviceApp, wait_until
from textual.widgets import Checkbox, Input, Label, ProgressBar, Static

from console.context import ConsoleContext
from console.screens.inject import InjectScreen
from console.widgets.stage_progress import StageProgress
from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.demo import demo_kernels
from core.settings import Settings

VALID = demo_kernels()[:3]  # Relu, Add, Tanh: no nvcc needed unless asked


def write_inputs(folder: Path) -> Path:
    """One good file (three kernels and one item with a bad field) and one truncated file."""
    folder.mkdir(parents=True, exist_ok=True)
    bad_item = {**demo_kernels()[0], "gridDim": "many"}
    (folder / "good.json").write_text(json.dumps([*VALID, bad_item]), encoding="utf-8")
    (folder / "bad.json").write_text('[{"tvm_func_name": "cut_off', encoding="utf-8")
    return folder


def copies(n: int) -> list[dict]:
    """n kernels with distinct names and bodies (so distinct keys)."""
    base = demo_kernels()[0]
    out = []
    for i in range(n):
        name = f"copy{i}_kernel0"
        code = base["code"].replace(base["tvm_func_name"], name).replace("{\n", f"{{\n  // copy {i}\n", 1)
        out.append({**base, "tvm_func_name": name, "code": code})
    return out


def make_app(db_path: Path) -> FixedDeviceApp:
    # One worker: the CPU stages run inline, no process pool to spawn in a test.
    return FixedDeviceApp(ConsoleContext(db_path=db_path, settings=Settings(workers=1),
                                         device_summary="no CUDA device (test)"))


async def wait_for(pilot, condition: Callable[[], bool], what: str = "the Inject view") -> None:
    await wait_until(pilot, condition, what)


async def open_inject(pilot) -> InjectScreen:
    await pilot.press("2")
    screen = pilot.app.screen
    assert isinstance(screen, InjectScreen)
    await wait_for(pilot, lambda: screen.probe is not None, "the Inject view's nvcc probe")
    return screen


async def run_to_end(pilot, screen: InjectScreen) -> None:
    await pilot.press("ctrl+r")
    await wait_for(pilot, lambda: screen.report is not None and not screen.running, "the injection's end")


def text(screen: InjectScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


async def test_inject_a_directory_with_a_bad_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write_inputs(tmp_path / "inputs" / "kernels")
    monkeypatch.chdir(tmp_path / "inputs")
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_inject(pilot)
        tree = screen.query_one("#tree")
        await wait_for(pilot, lambda: tree.cursor_node is not None and len(tree.cursor_node.children) > 0,
                       "the folder's entries in the tree")
        await pilot.press("down", "space")  # the tree's first entry: the kernels/ directory
        assert screen.chosen == [(tmp_path / "inputs" / "kernels").resolve()]
        screen.query_one("#compile", Checkbox).value = False
        await run_to_end(pilot, screen)

        report = screen.report
        assert (report.injected, report.unchanged, report.failed, report.cancelled) == (3, 0, 2, False)
        summary = text(screen, "#summary")
        assert "done" in summary and "3 injected" in summary and "2 failed" in summary
        assert "bad.json · read" in summary and "good.json#3 · validate" in summary
        gpu_row = text(screen, "#stage-gpu .stage-counts")
        assert gpu_row == "not run (v/P in Kernels run it)", gpu_row
        assert "--verify" not in summary  # the CLI's flags mean nothing here
        assert "not run: compile check off" in text(screen, "#stage-compile .stage-counts")
        insert_bar = screen.query_one("#stage-insert ProgressBar", ProgressBar)
        assert (insert_bar.progress, insert_bar.total) == (3, 3)
        with KernelDB.open(db_path) as db:
            assert db.count() == 3
        state = StateDB()
        try:
            assert sorted(f.stage for f in state.failures(db_path)) == ["read", "validate"]
        finally:
            state.close()

        assert screen.query_one("#show-failures").display
        await pilot.press("f")
        assert app.current_mode == "failures"


async def test_cancel_stops_between_kernels(tmp_path: Path):
    src = tmp_path / "many.json"
    src.write_text(json.dumps(copies(3000)), encoding="utf-8")
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_inject(pilot)
        path_input = screen.query_one("#path", Input)
        path_input.value = str(src)
        path_input.focus()
        await pilot.press("enter")
        assert screen.chosen == [src.resolve()]
        screen.query_one("#compile", Checkbox).value = False
        # pilot.press waits for the app to go idle, which a busy run never does: press start in a task.
        start = asyncio.create_task(pilot.press("ctrl+r"))
        insert_bar = screen.query_one("#stage-insert ProgressBar", ProgressBar)
        await wait_for(pilot, lambda: insert_bar.progress > 0)  # cancel mid-run, not before it began
        await pilot.press("escape")
        await start
        await wait_for(pilot, lambda: screen.report is not None and not screen.running)

        report = screen.report
        assert report.cancelled and 0 < report.injected < 3000 and report.failed == 0
        assert "cancelled" in text(screen, "#summary")
    with KernelDB.open(db_path) as db:
        assert db.integrity_check() == ["ok"]
        assert db.count() == report.injected  # every kernel counted was written whole, none half


async def test_bad_arch_shows_an_inline_error_and_does_not_start(tmp_path: Path):
    src = tmp_path / "one.json"
    src.write_text(json.dumps(VALID[:1]), encoding="utf-8")
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_inject(pilot)
        screen.add_path(src)
        error = screen.query_one("#archs-error", Static)
        assert not error.display

        screen.query_one("#archs", Input).value = "sm_90, banana"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: error.display, "the arch error")
        assert "banana: not an SM arch" in text(screen, "#archs-error")
        assert not screen.running and screen.report is None

        screen.query_one("#archs", Input).value = "sm_10"  # the right shape, but no nvcc builds for it
        await pilot.pause()
        assert not error.display  # editing clears the error
        await pilot.press("ctrl+r")
        if screen.probe is not None and screen.probe.archs:
            await wait_for(pilot, lambda: error.display, "the arch error")
            assert "sm_10: not built by this nvcc" in text(screen, "#archs-error")
            assert not screen.running and screen.report is None
    assert not db_path.exists()


@pytest.mark.skipif(not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").is_file(),
                    reason="needs nvcc")
async def test_compile_stage_runs_with_nvcc(tmp_path: Path):
    src = tmp_path / "one.json"
    src.write_text(json.dumps(VALID[:1]), encoding="utf-8")
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_inject(pilot)
        assert screen.query_one("#compile", Checkbox).value, screen.probe
        screen.add_path(src)
        await run_to_end(pilot, screen)

        assert (screen.report.injected, screen.report.failed) == (1, 0)
        bar = screen.query_one("#stage-compile ProgressBar", ProgressBar)
        assert (bar.progress, bar.total, bar.percentage) == (1, 1, 1)
        assert "1 passed" in text(screen, "#stage-compile .stage-counts")
    with KernelDB.open(db_path) as db:
        miscs = json.loads(next(db.iter_rows()).miscs)
    assert set(miscs["kdb"]["compile"]) == {"sm_90"}  # the engine kept what nvcc reported


def test_snapshot_after_a_small_run(snap_compare, monkeypatch: pytest.MonkeyPatch):
    folder = SNAPSHOT_DIR / "inject"
    shutil.rmtree(folder, ignore_errors=True)
    inputs = write_inputs(folder / "input")
    db_path = folder / "kernel_cache.db"
    monkeypatch.chdir(inputs)  # the tree starts here: the same entries on every machine

    async def run_before(pilot) -> None:
        screen = await open_inject(pilot)
        tree = screen.query_one("#tree")
        await wait_for(pilot, lambda: tree.cursor_node is not None and len(tree.cursor_node.children) == 2,
                       "the input folder's two entries in the tree")
        await pilot.press("space")  # the root: the input directory
        screen.query_one("#compile", Checkbox).value = False
        await run_to_end(pilot, screen)
        await pilot.pause(0.2)

    assert snap_compare(make_app(db_path), terminal_size=(160, 45), run_before=run_before)


async def test_escape_leaves_the_path_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """In the box, digits are part of a path; escape gives the keys back to the view (1 then switches view)."""
    monkeypatch.chdir(tmp_path)
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_inject(pilot)
        await pilot.press("slash", "1", "2")
        path_input = screen.query_one("#path", Input)
        assert path_input.has_focus and path_input.value == "12"
        await pilot.press("escape")
        assert not path_input.has_focus and screen.query_one("#tree").has_focus
        assert path_input.value == "12"  # what was typed stays
        await pilot.press("1")
        assert app.current_mode == "kernels"


async def test_stage_counts_are_shown_whole_in_a_narrow_terminal(tmp_path: Path):
    """At 120 columns the bars give way to the counts ("4 passed · 1 failed", not "4 passe")."""
    src = write_inputs(tmp_path / "inputs")
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(120, 45)) as pilot:
        screen = await open_inject(pilot)
        screen.add_path(src)
        screen.query_one("#compile", Checkbox).value = False
        await run_to_end(pilot, screen)

        def counts() -> dict[str, tuple[str, int]]:
            return {row.stage: (str(label.render()), label.content_region.width)
                    for row in screen.query(StageProgress) for label in [row.query_one(".stage-counts", Label)]}

        # the counts are laid out after the run's last progress message
        await wait_for(pilot, lambda: counts().get("read", ("", 0))[0] == "4 passed · 1 failed", "the read counts")
        await pilot.pause()  # and laid out: the refresh after the update
        rows = counts()
        assert rows["read"][0] == "4 passed · 1 failed"
        assert all(len(text) <= width for text, width in rows.values()), rows

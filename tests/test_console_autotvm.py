"""Pilot tests of the AutoTVM view: the demo network's log (and the artifact's alexnet log where ../shared has
it), a log with bad lines, the scale switch, a snapshot."""

from __future__ import annotations

import json
import math
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from autotvm_logs import demo_network_log
from conftest import needs_shared
from console_helpers import SNAPSHOT_DIR, WAIT_BOUND_S, FixedDeviceApp, wait_until
from shared_data import ARTIFACT_LOGS, shared_path
from textual.widgets import Input, Sparkline, Static

from console.context import ConsoleContext
from console.screens.autotvm import AutoTvmScreen
from console.widgets.best_so_far_plot import BestSoFarPlot, TrialAxis
from console.widgets.dialogs import PathDialog
from console.widgets.workload_table import WorkloadTable
from core.settings import Settings

ALEXNET_LOG = shared_path(ARTIFACT_LOGS) / "alexnet_nchw_tuned_conv2d.1000.log"
KNOBS = [["tile_k", "sp", [-1, 2, 8]], ["tile_y", "sp", [-1, 1, 2, 8]], ["tile_x", "sp", [-1, 2, 8, 16]],
         ["auto_unroll_max_step", "ot", 1500]]


def make_app() -> FixedDeviceApp:
    return FixedDeviceApp(ConsoleContext(db_path=SNAPSHOT_DIR / "autotvm" / "kernel_cache.db",
                                         settings=Settings(workers=1), device_summary="no CUDA device (test)"))


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = WAIT_BOUND_S, what: str = "the AutoTVM view") -> None:
    await wait_until(pilot, condition, what, timeout_s=timeout)


async def open_log(pilot, path: Path, *, loads: bool = True) -> AutoTvmScreen:
    await pilot.press("6")
    screen = pilot.app.screen
    assert isinstance(screen, AutoTvmScreen)
    await pilot.press("o")
    assert isinstance(pilot.app.screen, PathDialog)
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    if loads:
        await wait_for(pilot, lambda: screen.summary is not None)
    await pilot.pause()
    return screen


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def record(m: int, trial: int, seconds: float | None) -> str:
    """One tuning record of a matmul [m, 256, 256]; seconds None: a failed build (AutoTVM's 1e9 placeholder)."""
    return json.dumps({
        "i": ["cuda", "tvm_matmul_tune_op", [m, 256, 256], {}, ["tvm_matmul_tune_op", m, 256, 256],
              {"i": trial, "t": "", "c": None, "e": KNOBS}],
        "r": [[1e9 if seconds is None else seconds], 3 if seconds is None else 0, 1.5, 1589439898.0 + trial],
        "v": 0.1})


def synthetic_log(path: Path, trials: int = 300) -> Path:
    """Two workloads tuned by a seeded random walk, one that never succeeded, and two bad lines."""
    rng = random.Random(7)
    lines = []
    for m in (16, 64):
        for trial in range(trials):
            failed = rng.random() < 0.1
            lines.append(record(m, trial, None if failed else m * 2e-6 * (1 + 30 * math.exp(-trial / 40) * rng.random())))
    lines.insert(5, '{"i": ["cuda", "tvm_matmul_tune_op"')  # cut off mid-record
    lines.insert(9, "not a record")
    lines += [record(128, trial, None) for trial in range(3)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def test_the_demo_network_log_shows_each_workload_and_its_curve(tmp_path: Path):
    plan = demo_network_log(tmp_path / "demo.log")
    async with make_app().run_test(size=(160, 45)) as pilot:
        screen = await open_log(pilot, plan.path)
        table = screen.query_one(WorkloadTable)
        assert table.row_count == len(plan.workloads) == 4
        assert f"4 workloads · {plan.records:,} records · no bad lines" in text(screen, "#log-status")
        assert str(table.get_cell_at((0, 1))) == "tvm_conv2d_nchw_tune_op"
        assert str(table.get_cell_at((3, 1))) == "tvm_matmul_tune_op"
        first, second = screen.summary.workloads[:2]
        assert str(table.get_cell_at((0, 3))) == "300" and str(table.get_cell_at((0, 7))) == str(first.best_trial)
        assert f"best {first.best_seconds * 1e6:,.2f} µs at trial {first.best_trial} of 300" in text(screen, "#plot-note")

        table.focus()
        await pilot.press("down")  # the second workload: its own curve and knobs
        assert f"at trial {second.best_trial} of 300" in text(screen, "#plot-note")
        curve = [s for s in second.best_so_far if math.isfinite(s)]
        plot = screen.query_one(BestSoFarPlot)
        assert plot.log_scale and list(screen.query_one(Sparkline).data) == pytest.approx([math.log10(s) for s in curve])
        detail = text(screen, "#workload-detail")
        assert "Convolution in 1x16x16x16 w 16x16x3x3" in detail and "tile_rx" in detail and "[-1, 3]" in detail

        await pilot.press("l")
        assert not plot.log_scale and "linear scale" in text(screen, "#plot-title")
        assert list(screen.query_one(Sparkline).data) == curve


@needs_shared(f"{ARTIFACT_LOGS}/{ALEXNET_LOG.name}", "the artifact's AlexNet AutoTVM log")
async def test_the_alexnet_log_shows_5_workloads_and_each_curve():
    async with make_app().run_test(size=(160, 45)) as pilot:
        screen = await open_log(pilot, ALEXNET_LOG)
        table = screen.query_one(WorkloadTable)
        assert table.row_count == 5
        assert "5 workloads · 5,000 records · no bad lines" in text(screen, "#log-status")
        assert str(table.get_cell_at((0, 1))) == "tvm_conv2d_nchw_tune_op"
        assert str(table.get_cell_at((0, 5))) == "64 inst · 8 runtime · 9 build t/o"
        assert (str(table.get_cell_at((0, 6))), str(table.get_cell_at((0, 7)))) == ("90.60", "374")

        plot = screen.query_one(BestSoFarPlot)
        assert "best 90.60 µs at trial 374 of 1,000" in text(screen, "#plot-note")
        table.focus()
        await pilot.press("down")  # the second workload: its own curve and knobs
        assert "best 28.09 µs at trial 695 of 1,000" in text(screen, "#plot-note")
        workload = screen.summary.workloads[1]
        curve = [s for s in workload.best_so_far if math.isfinite(s)]
        assert list(screen.query_one(Sparkline).data) == pytest.approx([math.log10(s) for s in curve])
        assert plot.log_scale and "log scale" in text(screen, "#plot-title")
        detail = text(screen, "#workload-detail")
        assert "Convolution in 1x3x227x227 w 64x3x11x11" in detail
        assert "tile_rx" in detail and "[-1, 11]" in detail and "INSTANTIATION_ERROR 95" in detail

        axis = str(screen.query_one(TrialAxis).render())
        assert axis.rstrip().endswith("1000") and "▲" in axis

        await pilot.press("l")
        assert not plot.log_scale and "linear scale" in text(screen, "#plot-title")
        assert list(screen.query_one(Sparkline).data) == curve


async def test_bad_lines_and_a_workload_without_success(tmp_path: Path):
    log = synthetic_log(tmp_path / "tune.log")
    async with make_app().run_test(size=(160, 45)) as pilot:
        screen = await open_log(pilot, log)
        assert screen.query_one(WorkloadTable).row_count == 3
        assert "3 workloads · 603 records · 2 bad lines" in text(screen, "#log-status")
        bad = text(screen, "#bad-lines")
        assert "line 6: truncated JSON" in bad and "line 10: not JSON" in bad
        assert "Bad lines (2)" in str(screen.query_one("#bad-lines-title").render())

        table = screen.query_one(WorkloadTable)
        table.focus()
        await pilot.press("down", "down")
        assert "no successful trial among 3: nothing to plot" in text(screen, "#plot-note")
        assert not screen.query_one("#plot-body").display
        assert "no successful trial" in text(screen, "#workload-detail")
        assert str(table.get_cell_at((2, 5))) == "3 compile"


async def test_an_unreadable_log_says_why(tmp_path: Path):
    async with make_app().run_test(size=(160, 45)) as pilot:
        screen = await open_log(pilot, tmp_path / "missing.log", loads=False)
        await wait_for(pilot, lambda: "cannot read" in text(screen, "#log-status"))
        assert "missing.log" in text(screen, "#log-status") and screen.summary is None


def test_snapshot_of_a_log(snap_compare):
    folder = SNAPSHOT_DIR / "autotvm"
    shutil.rmtree(folder, ignore_errors=True)
    log = synthetic_log(folder / "tune.log")

    async def run_before(pilot) -> None:
        await open_log(pilot, log)
        await pilot.pause(0.2)

    assert snap_compare(make_app(), terminal_size=(160, 45), run_before=run_before)


@pytest.mark.parametrize("width", [120, 200])
async def test_the_floor_of_the_curve_reaches_the_last_column(tmp_path: Path, width: int):
    """The best time is held to the last trial: the bottom row is drawn across the whole plot, never blank
    past some column, in both scales."""
    log = synthetic_log(tmp_path / "tune.log")
    async with make_app().run_test(size=(width, 45)) as pilot:
        screen = await open_log(pilot, log)
        for _ in ("log", "linear"):
            line, body = screen.query_one(Sparkline), screen.query_one("#plot-body")
            await wait_for(pilot, lambda line=line, body=body: line.region.right == body.region.right
                           and line.region.width > width // 3, what="the curve laid out across the plot")
            await pilot.pause()  # and drawn in the scale just chosen
            bottom = "".join(s.text for s in line.render_line(line.size.height - 1))
            assert len(bottom) == line.size.width and bottom.endswith("▁" * 10) and " " not in bottom, bottom
            await pilot.press("l")

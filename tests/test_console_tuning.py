"""Pilot tests of the Tuning view: a live llvm run (table, curve, log tail), cancel and resume, cuda without a GPU
or a tracker, the RPC tracker panel against a real tracker, the Kernels view's GPU checks without a GPU, a snapshot.

Tuning runs use the llvm target (MetaSchedule measures on the CPU: the same code path, no GPU needed) and a few
trials; on a 2-core machine a run still takes minutes (MetaSchedule's builds), so those tests are marked slow.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from console_helpers import SNAPSHOT_DIR, WAIT_BOUND_S, FixedDeviceApp, build_small_db, wait_until
from textual.widgets import Input, Select, Sparkline, Static

import core.tuning.request
from console.context import ConsoleContext
from console.screens.tuning import TuningScreen
from console.widgets.best_so_far_plot import BestSoFarPlot
from console.widgets.dialogs import PathDialog
from console.widgets.kernel_table import KernelTable
from console.widgets.log_tail import LogTailView
from console.widgets.tracker_panel import TrackerPanel
from console.widgets.tune_table import TuneTable
from core.settings import Settings
from core.tuning.job import TuneJob
from core.tuning.queue import run_queue, tuning_root
from core.tuning.records import recorded_runs

RELU = "elementwise_relu_op_float|i+1_4096|o+1_4096"
DOT = "cublas_dot_op_float|a+32_32|b+32_32|o+32_32|ta+0|tb+0"

needs_tvm = pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="needs apache-tvm")


def make_app(db_path: Path, **settings: object) -> FixedDeviceApp:
    return FixedDeviceApp(ConsoleContext(db_path=db_path, settings=Settings(workers=1, **settings),  # type: ignore[arg-type]
                                         device_summary="no CUDA device (test)"))


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same answer on every machine, GPU or not (every GPU question asks detect_devices)."""
    import core.gpu.inventory

    monkeypatch.setattr(core.gpu.inventory, "detect_devices", lambda *_, **__: ([], "no CUDA device found (test)"))


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = WAIT_BOUND_S, what: str = "the Tuning view") -> None:
    await wait_until(pilot, condition, what, timeout_s=timeout)


async def open_view(pilot) -> TuningScreen:
    await pilot.press("7")
    screen = pilot.app.screen
    assert isinstance(screen, TuningScreen)
    return screen


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def import_ops(pilot, screen: TuningScreen, path: Path, expected: int) -> None:
    await pilot.press("i")
    assert isinstance(pilot.app.screen, PathDialog)
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(screen.configs) == expected)


async def choose(pilot, screen: TuningScreen, *, trials: int, target: str) -> None:
    screen.query_one("#trials", Input).value = str(trials)
    screen.query_one("#target", Select).value = target

    await pilot.pause()  # their Changed messages: the view re-plans, and a worker reads the target's work dirs

    def read() -> bool:
        return not [w for w in pilot.app.workers if w.node is screen and w.group == "history" and not w.is_finished]

    await wait_for(pilot, read, what=f"the work dirs of {target} read")
    await pilot.pause()  # the history's message, posted before its worker finished


def text(widget, selector: str) -> str:
    return str(widget.query_one(selector, Static).render())


def key_of(screen: TuningScreen, index: int) -> str:
    return screen.configs[index].key


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.tvm
@needs_tvm
async def test_a_run_fills_the_table_the_curve_and_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    phases = []

    def watched_run_queue(jobs, **kw):  # type: ignore[no-untyped-def]
        # The view listens to the same events the CLI's --json stream prints: trials, jobs and phases.
        assert {"on_trial", "on_job", "on_phase"} <= set(kw)
        on_phase = kw["on_phase"]
        kw["on_phase"] = lambda event: (phases.append(event), on_phase(event))
        return run_queue(jobs, **kw)

    monkeypatch.setattr(core.tuning.request, "run_queue", watched_run_queue)  # run_request's, for both faces
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, write_lines(tmp_path / "ops.txt", [RELU, DOT]), 2)
        await choose(pilot, screen, trials=3, target="llvm")
        assert "ctrl+r tunes 2 ops, 3 trials each" in text(screen, "#run-note")

        await pilot.press("ctrl+r")
        assert screen.running
        await wait_for(pilot, lambda: not screen.running, timeout=1500)

        report = screen.report
        assert report is not None and not report.cancelled and not report.failures, screen.run_error
        assert [r.trials > 0 and r.best_seconds is not None for r in report.results] == [True, True]
        table = screen.query_one(TuneTable)
        for index, result in enumerate(report.results):
            key = key_of(screen, index)
            assert str(table.get_cell(key, "status")) == "done"
            assert str(table.get_cell(key, "trials")) == f"{result.trials}/3"
            assert float(str(table.get_cell(key, "best"))) == pytest.approx(result.best_seconds * 1e6, abs=0.01)
            assert str(table.get_cell(key, "speed")).endswith(("GFLOP/s", "GB/s"))
        assert "done" in text(screen, "#run-note") and "2 tuned" in text(screen, "#run-note")
        assert {e.phase for e in phases} == {"search", "build", "measure"}

        table.focus()
        table.move_cursor(row=1)  # the Dot: its curve
        await wait_for(pilot, lambda: "Dot 32x32 x 32x32" in text(screen, "#tune-selected"), what="the Dot selected")
        await pilot.pause()  # the plot follows the selection
        plot = screen.query_one(BestSoFarPlot)
        # One point per trial from the first successful one (a busy machine can fail a build or two first),
        # never rising, ending at the best time.
        points = plot.query_one(Sparkline).data or []
        assert 1 <= len(points) <= report.results[1].trials and points == sorted(points, reverse=True)
        assert 10 ** points[-1] == pytest.approx(report.results[1].best_seconds)
        assert "best" in text(plot, "#plot-note")
        assert "Dot 32x32 x 32x32" in text(screen, "#tune-selected")

        log = screen.query_one(LogTailView)
        assert any("TaskScheduler picks" in line for line in log.lines)  # MetaSchedule's own records
        assert any("kdb Dot 32x32 x 32x32: done" in line for line in log.lines)  # the queue's
        assert log.line_count <= 200


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.tvm
@needs_tvm
async def test_cancel_keeps_the_trials_and_start_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, write_lines(tmp_path / "ops.txt", [DOT]), 1)
        await choose(pilot, screen, trials=4, target="llvm")
        # Rounds of 2 trials: a cancel takes effect after the trial in flight, so at most the first round is kept.
        screen.query_one("#batch", Input).value = "2"
        key = key_of(screen, 0)
        table = screen.query_one(TuneTable)

        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.run_of(key).status == "tuning", timeout=120)
        await pilot.press("escape")
        assert "cancelling after the trial in flight" in text(screen, "#run-note")
        await wait_for(pilot, lambda: not screen.running, timeout=600)

        first = screen.report
        assert first is not None and first.cancelled
        kept = first.results[0].trials
        assert 1 <= kept <= 2 and len(recorded_runs(first.results[0].work_dir)) == kept
        assert str(table.get_cell(key, "status")) == "cancelled"
        assert str(table.get_cell(key, "trials")) == f"{kept}/4"
        note = text(screen, "#run-note")
        assert "cancelled" in note and f"continues from the {kept} trial" in note

        await pilot.press("ctrl+r")  # resume
        await wait_for(pilot, lambda: not screen.running, timeout=600)
        second = screen.report
        assert second is not None and not second.cancelled and not second.failures, screen.run_error
        result = second.results[0]
        assert (result.trials, result.new_trials) == (4, 4 - kept)
        assert len(recorded_runs(result.work_dir)) == 4
        assert result.work_dir == TuneJob(screen.configs[0], 4, "llvm", "sm_90").directory(tuning_root())
        assert str(table.get_cell(key, "trials")) == "4/4" and str(table.get_cell(key, "status")) == "done"
        assert f"tuning on from {kept} trial" in "\n".join(screen.query_one(LogTailView).lines)


async def test_a_model_is_tuned_as_one_network(tmp_path: Path, no_gpu: None):
    pytest.importorskip("onnx")
    from onnx_models import small_cnn, write

    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, write(small_cnn(), tmp_path / "small.onnx"), 2)  # Sigmoid+Relu: NNFusion's
        await choose(pilot, screen, trials=3, target="llvm")
        assert [c.op_type for c in screen.configs] == ["Fused_Convolution_Relu", "MaxPool"]
        table = screen.query_one(TuneTable)
        conv, pool = key_of(screen, 0), key_of(screen, 1)
        assert (str(table.get_cell(conv, "count")), str(table.get_cell(pool, "count"))) == ("2", "1")
        budgets = [str(table.get_cell(key, "trials")) for key in (conv, pool)]
        assert all(b.startswith("0/") for b in budgets) and sum(int(b[2:]) for b in budgets) == 6
        assert int(budgets[0][2:]) > int(budgets[1][2:])  # the convs take most of the network's time
        status = text(screen, "#tuning-status")
        assert "network small: 2 distinct ops NNFusion looks up in the kernel DB\n" in status  # nothing else
        assert "small: no op measured yet" in status
        assert "ctrl+r tunes the network: 6 trials over 2 ops" in text(screen, "#run-note")

        await pilot.press("ctrl+r")  # each op probed with a trial, then tuned to its share of the measured time
        await wait_for(pilot, lambda: not screen.running, timeout=600)
        report = screen.report
        assert report is not None and not report.failures and not report.cancelled, screen.run_error
        trials = {r.job.config.key: r.trials for r in report.results}
        assert sum(trials.values()) == 6 and min(trials.values()) >= 1
        await wait_for(pilot, lambda: sum(map(len, screen.board.history.values())) == 6)  # read back from the work dirs
        for key in (conv, pool):
            assert str(table.get_cell(key, "trials")).startswith(f"{trials[key]}/")


async def test_max_per_op_caps_the_networks_shares_and_goes_to_the_run(tmp_path: Path, no_gpu: None):
    pytest.importorskip("onnx")
    from onnx_models import small_cnn, write

    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, write(small_cnn(), tmp_path / "small.onnx"), 2)
        await choose(pilot, screen, trials=3, target="llvm")
        table = screen.query_one(TuneTable)
        conv, pool = key_of(screen, 0), key_of(screen, 1)
        assert int(str(table.get_cell(conv, "trials"))[2:]) > 3  # uncapped, the convs take most of the 6
        started = []
        screen.tune = lambda plan, *args: started.append(plan)  # type: ignore[method-assign]
        screen.query_one("#cap", Input).value = "0"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: screen.query_one("#cap", Input).has_class("bad"), what="#cap marked bad")
        assert not started
        screen.query_one("#cap", Input).value = "2"
        await wait_for(pilot, lambda: [str(table.get_cell(key, "trials")) for key in (conv, pool)] == ["0/2", "0/2"],
                       what="both ops capped at 2 trials")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: bool(started))
        assert started[0].max_per_op == 2 and started[0].network is not None


async def test_cuda_without_a_gpu_or_a_tracker_explains_instead_of_starting(tmp_path: Path, no_gpu: None):
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.press("5")  # the list comes from the Op configs view
        opconfigs = app.screen
        await pilot.press("i")
        app.screen.query_one("#path", Input).value = str(write_lines(tmp_path / "ops.txt", [RELU, DOT]))
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(opconfigs.configs) == 2)

        screen = await open_view(pilot)
        assert [c.key for c in screen.configs] == [c.key for c in opconfigs.configs]
        assert "2 ops from the Op configs view" in text(screen, "#tuning-status")
        await wait_for(pilot, lambda: screen.gpu is not None)
        assert "no CUDA device here" in text(screen, "#measure-note")

        await pilot.press("ctrl+r")
        assert not screen.running
        note = text(screen, "#run-note")
        assert "CUDA tuning measures every trial on a GPU, and there is none here" in note
        assert "no CUDA device found (test)" in note and "or tune for target llvm" in note
        assert str(screen.query_one(TuneTable).get_cell(key_of(screen, 0), "status")) == "not started"

        await choose(pilot, screen, trials=3, target="llvm")  # another choice: the explanation goes
        assert "there is none here" not in text(screen, "#run-note")


async def test_the_round_and_the_population_are_checked_and_go_to_every_job(tmp_path: Path, no_gpu: None):
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, write_lines(tmp_path / "ops.txt", [RELU, DOT]), 2)
        await choose(pilot, screen, trials=3, target="llvm")
        started = []
        screen.tune = lambda plan, *args: started.append(plan)  # type: ignore[method-assign]

        async def refused_then_started(field: str, bad: str, good: str, why: str):  # type: ignore[no-untyped-def]
            started.clear()
            screen.running = False  # the stand-in above starts no worker to end a run
            screen.query_one(field, Input).value = bad
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: screen.query_one(field, Input).has_class("bad"), what=f"{field} marked bad")
            assert not started and why in text(screen, "#run-note")  # core's reason, as `kdb tune` gives it
            screen.query_one(field, Input).value = good
            await wait_for(pilot, lambda: not screen.query_one(field, Input).has_class("bad"),
                           what=f"{field} no longer bad")
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: bool(started))
            return started[0]

        request = await refused_then_started("#batch", "0", "8", "candidates per round: must be from 1 to 4096, not 0")
        assert [job.trials_per_batch for job in request.jobs()] == [8, 8]
        assert [job.population for job in request.jobs()] == [None, None]  # kdb's default (job.search_population)
        request = await refused_then_started("#population", "4", "256",  # 4: smaller than a round of 8
                                             "population: a population of 4 cannot give batches of 8")
        assert [job.population for job in request.jobs()] == [256, 256]


@pytest.fixture
def ascending_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """RpcCluster.add_server asks free_port() twice, for the start and the end of its server's port range: two
    ephemeral ports in random order make an empty range half the time. Free ports in ascending order instead."""
    import socket

    import core.tuning.rpc

    last = 20000 + os.getpid() % 5000  # below the ephemeral range: ports there are rarely taken

    def free_port() -> int:
        nonlocal last
        while True:
            last += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", last))
                except OSError:
                    continue
                return last

    monkeypatch.setattr(core.tuning.rpc, "free_port", free_port)


@pytest.mark.slow
@pytest.mark.tvm
@needs_tvm
async def test_tracker_panel_shows_its_servers_and_queue(tmp_path: Path, ascending_ports: None):
    from core.tuning.rpc import RpcCluster

    with RpcCluster(key="kdb") as cluster:
        cluster.add_server("gpu0")
        cluster.wait_for_servers(1)
        app = make_app(tmp_path / "k.db", rpc_tracker=f"127.0.0.1:{cluster.port}", rpc_key="kdb")
        async with app.run_test(size=(160, 45)) as pilot:
            screen = await open_view(pilot)
            tracker = screen.query_one(TrackerPanel)
            await wait_for(pilot, lambda: tracker.status is not None, timeout=60)
            panel = text(screen, "#tracker")
            assert f"127.0.0.1:{cluster.port} · key kdb: reachable" in panel
            assert "queue kdb: 1 free · 0 pending" in panel and "1 server:" in panel and "kdb at 127.0.0.1:" in panel
            assert screen.query_one("#use-rpc").display

            cluster.stop()  # polled every few seconds: the panel follows
            await wait_for(pilot, lambda: tracker.status is not None and not tracker.status.reachable, timeout=30)
            assert "unreachable" in text(screen, "#tracker")


async def test_kernels_verify_without_a_gpu_says_so(tmp_path: Path, no_gpu: None):
    app = make_app(build_small_db(tmp_path / "k.db"))
    async with app.run_test(size=(180, 50)) as pilot:
        table = app.screen.query_one(KernelTable)
        await wait_for(pilot, lambda: table.row_count > 0)
        for key in ("v", "P"):
            app.clear_notifications()
            await pilot.press(key)
            await wait_for(pilot, lambda: any(n.message.startswith("no CUDA device:") for n in app._notifications))
            assert any("no CUDA device found (test)" in n.message for n in app._notifications)


def test_snapshot_before_a_run(snap_compare, no_gpu: None):
    folder = SNAPSHOT_DIR / "tuning"
    shutil.rmtree(folder, ignore_errors=True)
    ops = write_lines(folder / "ops.txt", [RELU, DOT])

    async def run_before(pilot) -> None:
        screen = await open_view(pilot)
        await import_ops(pilot, screen, ops, 2)
        await choose(pilot, screen, trials=4, target="llvm")
        screen.query_one(TuneTable).focus()
        pilot.app.clear_notifications()
        await pilot.pause(0.2)

    assert snap_compare(make_app(folder / "kernel_cache.db"), terminal_size=(160, 45), run_before=run_before)

"""Generate then inject, one run behind two faces: the Op configs view's `g` and `kdb codegen OPS --inject` both call
core.inject.generate_run.generate_and_inject and put the same rows in the DB; the kernels go from TVM to the DB in
memory (no kernel JSON written unless asked for), and a kernel that fails injection is retried like any other."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from console_helpers import FixedDeviceApp, wait_until
from textual.widgets import Input

pytest.importorskip("tvm")

import console.entry
from console.context import ConsoleContext
from console.screens.opconfigs import OpConfigsScreen
from console.widgets.dialogs import PathDialog
from core.db.state import StateDB
from core.inject import generate_run
from core.inject.generate_run import CodegenProgress, GenerateRequest, InjectSnapshot
from core.inject.pipeline import InjectOptions
from core.inject.retry import retry_failures
from core.opconfigs.opconfig import parse_line
from core.settings import load_settings

RELU = "elementwise_relu_op_float|i+1_16_32_32|o+1_16_32_32"
DOT = "cublas_dot_op_float|a+1_32|b+32_10|o+1_10|ta+0|tb+0"
GROUPED = "cudnn_convolution_op_float|i+1_8_8_8|w+8_1_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1|g+8"  # TVM refuses: no op type


def write_ops(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rows(db_path: Path) -> list[tuple[object, ...]]:
    """Every row, every column, in Key order: what NNFusion reads of the DB."""
    with sqlite3.connect(db_path) as conn:
        return sorted(conn.execute("SELECT * FROM KernelCache").fetchall(), key=lambda row: str(row))


def open_failures(db_path: Path) -> list[tuple[str, int | None, str, str]]:
    state = StateDB()
    try:
        return sorted((f.stage, f.item_index, f.name, f.reason) for f in state.failures(db_path))
    finally:
        state.close()


async def generate_in_the_console(ops: Path, db_path: Path) -> None:
    """Import `ops` in the Op configs view and press g; wait for the run's report."""
    app = FixedDeviceApp(ConsoleContext(db_path=db_path, settings=load_settings(), device_summary="no CUDA device"))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.press("5")
        screen = app.screen
        assert isinstance(screen, OpConfigsScreen)
        await pilot.press("i")
        assert isinstance(app.screen, PathDialog)
        app.screen.query_one("#path", Input).value = str(ops)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(screen.configs) == 3, "the op configs imported")
        await pilot.press("g")
        await wait_until(pilot, lambda: screen.result is not None and not screen.running, "the generate run's report",
                         timeout_s=300)
        assert screen.result is not None and screen.result.inject is not None


@pytest.fixture
def spied_runs(monkeypatch: pytest.MonkeyPatch) -> list[GenerateRequest]:
    """The requests core's generate_and_inject is called with (it still runs)."""
    real, requests = generate_run.generate_and_inject, []

    def spy(request: GenerateRequest, **kw):  # type: ignore[no-untyped-def]
        requests.append(request)
        return real(request, **kw)

    monkeypatch.setattr(generate_run, "generate_and_inject", spy)
    return requests


async def test_the_console_and_the_cli_run_the_same_core_function_and_write_the_same_rows(
        tmp_path: Path, spied_runs: list[GenerateRequest], capsys: pytest.CaptureFixture[str]):
    (tmp_path / "settings.toml").write_text("workers = 1\n")  # both faces read these settings (KDB_CONFIG)
    ops = write_ops(tmp_path / "ops.txt", [RELU, DOT, GROUPED])
    await generate_in_the_console(ops, tmp_path / "console.db")
    status = console.entry.main(["codegen", str(ops), "--inject", "--db", str(tmp_path / "cli.db")])
    assert status == 1, capsys.readouterr().err  # the grouped conv failed codegen, in both
    assert "2 injected" in capsys.readouterr().out

    console_run, cli_run = spied_runs
    assert [c.key for c in console_run.configs] == [c.key for c in cli_run.configs] == [
        parse_line(line).key for line in (RELU, DOT, GROUPED)]
    assert (console_run.options, console_run.check, console_run.inject) == (cli_run.options, cli_run.check, True)
    console_rows, cli_rows = rows(tmp_path / "console.db"), rows(tmp_path / "cli.db")
    assert len(console_rows) == 2 and console_rows == cli_rows
    assert all('"compile": {"sm_90"' in str(row) for row in cli_rows)  # nvcc checked each kernel, in both
    assert open_failures(tmp_path / "console.db") == open_failures(tmp_path / "cli.db") != []


def test_kernels_go_to_the_db_in_memory_and_the_json_only_where_asked(tmp_path: Path):
    db_path = tmp_path / "k.db"
    events: list[object] = []
    request = GenerateRequest((parse_line(RELU, "ops.txt:1"), parse_line(DOT, "ops.txt:2")), db_path,
                              InjectOptions(compile=False))
    report = generate_run.generate_and_inject(request, on_event=events.append)
    assert (report.inject.injected, report.failed, report.kernels_file) == (2, 0, None)
    assert not list(tmp_path.rglob("*.json"))  # no round trip through a file
    assert [e.done for e in events if isinstance(e, CodegenProgress)] == [0, 1, 2]
    last = events[-1]
    assert isinstance(last, InjectSnapshot) and (last.injected, last.stage("insert"), last.current) == (2, (2, 2), "")

    kept = tmp_path / "kernels.json"
    again = generate_run.generate_and_inject(GenerateRequest(request.configs, db_path, request.options,
                                                             kernels_file=kept))
    assert (again.inject.injected, again.inject.unchanged) == (0, 2)
    assert [k["tvm_func_name"] for k in json.loads(kept.read_text())] == [
        k["tvm_func_name"] for k in report.codegen.items]


def test_a_kernel_that_fails_injection_is_kept_with_its_item_and_retried(tmp_path: Path):
    refusing = tmp_path / "nvcc"  # rejects every kernel, the way nvcc reports an error
    refusing.write_text('#!/bin/sh\necho "kernel.cu(3): error: refused by the test"\nexit 1\n')
    refusing.chmod(0o755)
    db_path = tmp_path / "k.db"
    request = GenerateRequest((parse_line(RELU, "ops.txt:1"),), db_path, InjectOptions(nvcc=str(refusing)))
    report = generate_run.generate_and_inject(request)
    assert (report.inject.injected, report.inject.failed) == (0, 1)
    state = StateDB()
    try:
        [failure] = state.failures(db_path)
        assert (failure.stage, failure.file, failure.item_index) == ("compile", "generated for sm_90", 0)
        retried = retry_failures([failure.id], db_path, InjectOptions(compile=False), state=state)
        assert retried.injected == 1 and state.failures(db_path) == []
    finally:
        state.close()


def test_cli_keeps_the_json_when_asked_and_refuses_what_it_cannot_do(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]):
    ops = write_ops(tmp_path / "ops.txt", [RELU])
    db = str(tmp_path / "k.db")
    assert console.entry.main(["codegen", str(ops), "--no-compile", "--db", db]) == 2
    assert "--no-compile goes with --inject" in capsys.readouterr().err
    assert console.entry.main(["codegen", str(ops), "--inject", "-o", str(tmp_path / "no" / "k.json"),
                               "--db", db]) == 2
    assert "no such directory" in capsys.readouterr().err and not Path(db).exists()  # said before generating

    kept = tmp_path / "k.json"
    assert console.entry.main(["codegen", str(ops), "--inject", "--no-compile", "-o", str(kept), "--db", db,
                               "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["generated"], report["inject"]["injected"], report["cancelled"]) == (1, 1, False)
    assert len(json.loads(kept.read_text())) == 1 and len(rows(Path(db))) == 1


def test_a_cancel_while_injecting_stops_between_kernels_and_keeps_what_was_committed(tmp_path: Path):
    configs = tuple(parse_line(f"elementwise_relu_op_float|i+1_{n}|o+1_{n}", f"ops.txt:{n}") for n in (8, 9, 10))
    cancelled = False

    def on_event(event: object) -> None:
        nonlocal cancelled
        cancelled = cancelled or (isinstance(event, InjectSnapshot) and event.injected == 1)

    report = generate_run.generate_and_inject(GenerateRequest(configs, tmp_path / "k.db", InjectOptions(compile=False)),
                                              on_event=on_event, should_cancel=lambda: cancelled)
    assert len(report.codegen.items) == 3 and report.cancelled and report.inject.cancelled
    assert report.inject.injected == 1 and len(rows(tmp_path / "k.db")) == 1


def test_on_a_terminal_the_cli_shows_its_bars_and_finishes(tmp_path: Path):
    """Rich's bars enter their console (`with console:`): the CLI's lazy console must take that, or every run on a
    terminal (and no test without one) ended in a TypeError."""
    import os
    import re
    import subprocess
    import sys
    import threading

    from shared_data import REPO

    ops = write_ops(tmp_path / "ops.txt", [RELU])
    leader, follower = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "console.entry", "codegen", str(ops), "--inject", "--no-compile",
                             "--db", str(tmp_path / "k.db")], cwd=REPO, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    seen = bytearray()

    def read_terminal() -> None:  # drained as it goes: a full pty buffer would block the run
        try:
            while chunk := os.read(leader, 4096):
                seen.extend(chunk)
        except OSError:  # EIO: the run closed its end
            pass

    reader = threading.Thread(target=read_terminal)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(timeout=60)
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))  # Rich's colours and cursor moves
    assert proc.returncode == 0, text
    assert "codegen" in text and "insert" in text and "1 kernels generated" in text  # both bars, then the summary
    assert b"1" in out and b"injected" in out

"""Pilot tests of the Op configs view: add (valid, invalid), edit, delete, import (lines, ONNX), export round trips,
coverage against a small DB, generate + inject, and a snapshot."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import needs_shared
from console_helpers import SNAPSHOT_DIR, WAIT_BOUND_S, FixedDeviceApp, build_small_db, wait_until
from shared_data import ARTIFACT_OPCONFIGS, shared_path
from textual.widgets import Input, Static

from console.context import ConsoleContext
from console.screens.opconfigs import OpConfigsScreen
from console.widgets.dialogs import ConfirmDialog, PathDialog
from console.widgets.opconfig_dialog import TEMPLATES, OpConfigDialog, check_line
from console.widgets.opconfig_table import OpConfigTable
from core.db.kernel_db import KernelDB
from core.demo import TINY_NETWORK
from core.opconfigs.opconfig import parse_line
from core.settings import Settings

ALEXNET = shared_path(ARTIFACT_OPCONFIGS) / "alexnet_conv_kernels.txt"

RELU = "elementwise_relu_op_float|i+1_64_56_56|o+1_64_56_56"  # the small DB has it
DOT = "cublas_dot_op_float|a+64_256|b+256_128|o+64_128|ta+0|tb+0"  # the small DB has it
CONV = "cudnn_convolution_op_float|i+1_3_227_227|w+64_3_11_11|o+1_64_55_55|ws+4_4|wd+1_1|p+0_0"  # it has not
DEPTHWISE = "cudnn_convolution_op_float|i+1_32_56_56|w+32_1_3_3|o+1_32_56_56|ws+1_1|wd+1_1|p+1_1|g+32"  # no op type
MIXED = [RELU, DOT, CONV, DEPTHWISE]


def make_app(db_path: Path) -> FixedDeviceApp:
    # One worker: the CPU stages of an injection run inline, no process pool to spawn in a test.
    return FixedDeviceApp(ConsoleContext(db_path=db_path, settings=Settings(workers=1),
                                         device_summary="no CUDA device (test)"))


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = WAIT_BOUND_S, what: str = "the Op configs view") -> None:
    await wait_until(pilot, condition, what, timeout_s=timeout)


async def open_view(pilot) -> OpConfigsScreen:
    await pilot.press("5")
    screen = pilot.app.screen
    assert isinstance(screen, OpConfigsScreen)
    return screen


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def lines_of(screen: OpConfigsScreen) -> list[str]:
    from core.opconfigs.opconfig import format_line

    return [format_line(c) for c in screen.configs]


async def type_line(pilot, line: str) -> OpConfigDialog:
    dialog = pilot.app.screen
    assert isinstance(dialog, OpConfigDialog)
    dialog.query_one("#line", Input).value = line
    await pilot.pause()
    await pilot.press("enter")
    return dialog


async def import_path(pilot, screen: OpConfigsScreen, path: Path, expected: int) -> None:
    await pilot.press("i")
    assert isinstance(pilot.app.screen, PathDialog)
    pilot.app.screen.query_one("#path", Input).value = str(path)
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(screen.configs) == expected)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def test_add_a_valid_line_and_refuse_an_invalid_one(tmp_path: Path):
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        assert screen.configs == [] and screen.query_one("#opconfigs-empty").display

        await pilot.press("a")
        await type_line(pilot, RELU)
        assert app.screen is screen
        assert lines_of(screen) == [RELU] and screen.configs[0].source == "typed in"
        assert "Relu" in text(screen, "#opconfig-detail")

        await pilot.press("a")
        bad = CONV.replace("o+1_64_55_55", "o+1_64_54_55")
        dialog = await type_line(pilot, bad)
        assert app.screen is dialog  # still open: nothing invalid is added
        assert dialog.query_one("#line", Input).value == bad  # the text is kept as typed
        assert "does not follow from input 227" in text(dialog, "#line-check")
        assert dialog.query_one("#line", Input).has_class("bad")

        dialog = await type_line(pilot, RELU)  # a duplicate is refused too, naming the row
        assert app.screen is dialog and "already in the list as row 1" in text(dialog, "#line-check")

        await type_line(pilot, CONV)  # fixing the line lets it through
        assert app.screen is screen
        assert lines_of(screen) == [RELU, CONV]

        await pilot.press("a")
        await pilot.press("escape")
        assert app.screen is screen and len(screen.configs) == 2


async def test_on_the_demo_db_the_list_is_the_network_the_demo_was_built_from(tmp_path: Path):
    from core.demo import TINY_NETWORK

    db = build_small_db(tmp_path / "k.db")
    app = FixedDeviceApp(ConsoleContext(db_path=db, settings=Settings(workers=1), demo=True,
                                        device_summary="no CUDA device (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await wait_for(pilot, lambda: len(screen.coverage) == len(TINY_NETWORK.splitlines()))
        assert lines_of(screen) == TINY_NETWORK.splitlines()
        assert screen.configs[0].source == "tiny_network.txt:1"  # a real file: failures can point into it
        assert "in k.db: 8 missing" in text(screen, "#opconfigs-status")  # checked without asking (the small DB's kernels are not the network's)


async def test_edit_and_delete(tmp_path: Path):
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, write_lines(tmp_path / "ops.txt", [RELU, DOT]), 2)
        table = screen.query_one(OpConfigTable)
        table.focus()
        table.move_cursor(row=1)

        await pilot.press("e")
        dialog = app.screen
        assert isinstance(dialog, OpConfigDialog) and dialog.query_one("#line", Input).value == DOT
        await type_line(pilot, RELU)  # the other row's op: refused inline
        assert app.screen is dialog and "already in the list as row 1" in text(dialog, "#line-check")
        edited = DOT.replace("tb+0", "tb+1").replace("b+256_128", "b+128_256")
        await type_line(pilot, edited)
        assert app.screen is screen
        assert lines_of(screen) == [RELU, edited]
        assert screen.configs[1].source == "ops.txt:2 (edited)"

        await pilot.press("enter")  # enter on a row edits it too
        assert isinstance(app.screen, OpConfigDialog)
        await pilot.press("escape")
        assert lines_of(screen) == [RELU, edited]

        table.move_cursor(row=0)
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("escape")  # cancelled: nothing deleted
        assert len(screen.configs) == 2
        await pilot.press("d", "y")
        assert lines_of(screen) == [edited]
        assert table.row_count == 1


def demo_network_file(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "tiny_network.txt", TINY_NETWORK.splitlines())


@pytest.mark.parametrize("make_file", [
    pytest.param(demo_network_file, id="demo-network"),
    pytest.param(lambda _: ALEXNET, id="alexnet",
                 marks=needs_shared(f"{ARTIFACT_OPCONFIGS}/{ALEXNET.name}", "the artifact's AlexNet op configs"))])
async def test_import_an_opconfig_file_and_a_bad_one(tmp_path: Path, make_file: Callable[[Path], Path]):
    path = make_file(tmp_path)
    lines = path.read_text().splitlines()
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, path, len(lines))
        assert lines_of(screen) == lines
        assert screen.configs[0].source == f"{path.name}:1"
        assert f"{path.name}: {len(lines)} op configs ({len(lines)} added)" in text(screen, "#import-report")

        bad = write_lines(tmp_path / "more.txt", [lines[0], "cudnn_convolution_op_float|i+1"])
        await import_path(pilot, screen, bad, len(lines))
        await wait_for(pilot, lambda: "more.txt" in text(screen, "#import-report"))
        report = text(screen, "#import-report")
        assert "0 added, 1 already listed" in report
        assert "1 refused" in report and "more.txt:2: field w+ is missing" in report


async def test_import_an_onnx_model_lists_unmapped_nodes(tmp_path: Path):
    pytest.importorskip("onnx")
    from onnx_models import GraphBuilder, write

    g = GraphBuilder({"x": [1, 32, 8, 8]})
    y = g.node("Relu", [g.conv("x", 32, 32, 3, group=32, name="dw")], "relu1")
    # joined on the channels of a batch of 1, both inputs computed: laid out in place by NNFusion, no row
    cat = g.node("Concat", [y, g.node("Sigmoid", ["x"], "gate")], "cat", axis=1)
    model = write(g.model(cat, "dw_cat"), tmp_path / "dw.onnx")
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, model, 3)
        assert [c.op_type for c in screen.configs] == ["DepthwiseConv2dNative", "Relu", "Sigmoid"]
        assert screen.configs[1].source == "dw.onnx:relu1"
        report = text(screen, "#import-report")
        assert "model dw_cat, 4 nodes -> 3 distinct op configs the compiler looks up (3 added)" in report
        assert "1 node unmapped" in report
        assert "cat (Concat): every axis before the joined one (axis 1) has size 1" in report


@pytest.mark.parametrize("suffix", [".txt", ".toml", ".json"])
async def test_export_round_trips(tmp_path: Path, suffix: str):
    source = write_lines(tmp_path / "ops.txt", MIXED)
    out = tmp_path / f"exported{suffix}"
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, source, 4)
        before = list(screen.configs)

        await pilot.press("x")
        assert isinstance(app.screen, PathDialog)
        app.screen.query_one("#path", Input).value = str(out)
        await pilot.press("enter")
        await wait_for(pilot, out.exists)

        await pilot.press("D", "y")  # clear the list, then read the export back
        assert screen.configs == []
        await import_path(pilot, screen, out, 4)
        assert [c.key for c in screen.configs] == [c.key for c in before]
    if suffix == ".txt":
        assert out.read_text() == source.read_text()  # the line format reads and writes byte for byte


async def test_coverage_statuses(tmp_path: Path):
    db_path = build_small_db(tmp_path / "k.db")
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, write_lines(tmp_path / "ops.txt", MIXED), 4)
        table = screen.query_one(OpConfigTable)
        assert str(table.get_cell_at((0, 5))) == "not checked (c)"

        await pilot.press("c")
        await wait_for(pilot, lambda: len(screen.coverage) == 4)
        column = [str(table.get_cell_at((row, 5))) for row in range(4)]
        assert column[:3] == ["in DB (1 kernel)", "in DB (1 kernel)", "missing: tune it"]
        assert column[3] == "falls back"
        assert "2 in DB · 1 missing: tune it · 1 falls back" in text(screen, "#opconfigs-status")
        assert "DB kernels run" in text(screen, "#opconfigs-status")

        table.move_cursor(row=2)
        await pilot.pause()
        detail = text(screen, "#opconfig-detail")
        assert "missing: tune it" in detail and "NNFusion runs cuDNN" in detail
        assert parse_line(CONV).signature().identifier in detail.replace("\n", "")

        await pilot.press("a")  # once checked, coverage follows the list
        await type_line(pilot, "elementwise_tanh_op_float|i+1_4096|o+1_4096")
        await wait_for(pilot, lambda: len(screen.coverage) == 5)
        assert str(table.get_cell_at((4, 5))) == "in DB (1 kernel)"


@pytest.mark.tvm
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="needs apache-tvm")
async def test_generate_and_inject_two_ops(tmp_path: Path):
    relu = "elementwise_relu_op_float|i+1_16_32_32|o+1_16_32_32"
    dot = "cublas_dot_op_float|a+1_32|b+32_10|o+1_10|ta+0|tb+0"
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, write_lines(tmp_path / "ops.txt", [relu, dot]), 2)
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.result is not None and not screen.running, timeout=300)

        result = screen.result
        assert len(result.codegen.items) == 2 and not result.codegen.failed
        assert (result.inject.injected, result.inject.failed) == (2, 0)
        summary = text(screen, "#run-summary")
        assert "done" in summary and "2 generated · 2 injected · 0 unchanged · 0 failed" in summary
        bar = screen.query_one("#stage-codegen .stage-counts", Static)
        assert "2 passed" in str(bar.render())
        assert not screen.query_one("#show-failures").display  # nothing failed: nothing to show
        await wait_for(pilot, lambda: len(screen.coverage) == 2)  # the DB changed: coverage is checked again
        assert all(e.status == "in DB" for e in screen.coverage.values())
    with KernelDB.open(db_path) as db:
        assert db.count() == 2


def test_snapshot_with_coverage(snap_compare):
    folder = SNAPSHOT_DIR / "opconfigs"
    shutil.rmtree(folder, ignore_errors=True)
    db_path = build_small_db(folder / "kernel_cache.db")
    ops = write_lines(folder / "ops.txt", MIXED)

    async def run_before(pilot) -> None:
        screen = await open_view(pilot)
        await import_path(pilot, screen, ops, 4)
        await pilot.press("c")
        await wait_for(pilot, lambda: len(screen.coverage) == 4)
        screen.query_one(OpConfigTable).move_cursor(row=2)
        pilot.app.clear_notifications()
        await pilot.pause(0.2)

    assert snap_compare(make_app(db_path), terminal_size=(160, 45), run_before=run_before)


@pytest.mark.tvm
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="needs apache-tvm")
async def test_cancel_stops_between_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import asyncio
    import threading

    import core.codegen.batch as batch

    real_generate = batch.generate
    escape_pressed = threading.Event()
    generated: list[object] = []

    def held_generate(*args, **kwargs):  # type: ignore[no-untyped-def]
        if generated:  # the second op waits for the test's escape: the cancel lands between two ops
            assert escape_pressed.wait(timeout=120), "the test never pressed escape"
        generated.append(args)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(batch, "generate", held_generate)
    lines = [f"elementwise_relu_op_float|i+1_{n}|o+1_{n}" for n in range(8, 14)]
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, write_lines(tmp_path / "ops.txt", lines), 6)
        # pilot.press waits for the app to go idle, which a busy run never does: press g in a task.
        start = asyncio.create_task(pilot.press("g"))
        bar = screen.query_one("#stage-codegen .stage-counts", Static)
        await wait_for(pilot, lambda: "1 passed" in str(bar.render()))
        await pilot.press("escape")
        escape_pressed.set()
        await start
        await wait_for(pilot, lambda: screen.result is not None and not screen.running)

        result = screen.result
        assert result.cancelled and 1 <= len(result.codegen.generated) < 6
        assert result.inject is None  # a cancelled codegen injects nothing
        assert "cancelled" in text(screen, "#run-summary")
    assert not db_path.exists()


@pytest.mark.tvm
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="needs apache-tvm")
async def test_injection_failures_lead_to_the_failures_view(tmp_path: Path):
    fake_nvcc = tmp_path / "nvcc"  # rejects every kernel, the way nvcc reports an error
    fake_nvcc.write_text('#!/bin/sh\necho "kernel.cu(3): error: refused by the test"\nexit 1\n')
    fake_nvcc.chmod(0o755)
    app = FixedDeviceApp(ConsoleContext(db_path=tmp_path / "k.db", settings=Settings(workers=1, nvcc_path=str(fake_nvcc)),
                                        device_summary="no CUDA device (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, write_lines(tmp_path / "ops.txt", [RELU]), 1)
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.result is not None and not screen.running, timeout=300)

        assert (screen.result.inject.injected, screen.result.inject.failed) == (0, 1)
        summary = text(screen, "#run-summary")
        assert "1 generated · 0 injected" in summary and "compile: nvcc (sm_90): refused by the test" in summary
        assert screen.query_one("#show-failures").display
        await pilot.press("f")
        assert app.current_mode == "failures"


@pytest.mark.tvm
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None, reason="needs apache-tvm")
async def test_codegen_failures_are_kept_and_lead_to_the_failures_view(tmp_path: Path):
    from core.db.state import StateDB

    grouped = "cudnn_convolution_op_float|i+1_8_8_8|w+8_1_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1|g+8"  # no kernel-DB op
    db_path = tmp_path / "k.db"
    app = make_app(db_path)
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, write_lines(tmp_path / "ops.txt", [grouped]), 1)
        await pilot.press("g")
        await wait_for(pilot, lambda: screen.result is not None and not screen.running, timeout=300)

        assert screen.result.inject is None and len(screen.result.codegen.failed) == 1
        assert screen.query_one("#show-failures").display
        state = StateDB()
        try:
            [failure] = state.failures(db_path)
        finally:
            state.close()
        assert (failure.stage, failure.file, failure.item_index) == ("codegen", "ops.txt", 1)
        await pilot.press("f")
        assert app.current_mode == "failures"


def dense_model(tmp_path: Path) -> Path:
    """A dense layer's lone bias Add (looked up), then a residual Add + Relu NNFusion fuses into a kernel of its own
    at its default -fkernel_fusion_level=3 (looked up at 0)."""
    from onnx_models import GraphBuilder, write

    g = GraphBuilder({"x": [1, 128, 64]})
    y = g.node("Add", [g.node("MatMul", ["x", g.weight("w", [64, 64])], "dense"), g.weight("b", [64])], "bias")
    y = g.node("Relu", [g.node("Add", [g.node("MatMul", [y, g.weight("w2", [64, 64])], "dense2"), "x"], "residual")],
               "relu")
    return write(g.model(y, "dense"), tmp_path / "dense.onnx")


@pytest.mark.parametrize(("flags", "listed"), [([], ["Dot", "Add"]), (["-fkernel_fusion_level=0"], ["Dot", "Add", "Relu"])])
async def test_a_model_lists_what_kdb_opconfig_extract_writes_at_the_settings_flags(tmp_path: Path, flags: list[str],
                                                                                    listed: list[str]):
    """The view and `kdb opconfig extract -o` give one list of a model (the op configs NNFusion looks up at the
    settings' nnfusion_flags), the one generate and export then take."""
    pytest.importorskip("onnx")
    from conftest import run_kdb

    from core.opconfigs.opconfig import read_opconfigs
    from core.settings import save_settings

    model = dense_model(tmp_path)
    settings = Settings(workers=1, nnfusion_flags=flags)
    save_settings(settings)  # the CLI's settings (KDB_CONFIG), the console's the same
    proc = run_kdb("opconfig", "extract", str(model), "-o", str(tmp_path / "ops.txt"))
    assert proc.returncode == 0, proc.stderr
    written = read_opconfigs(tmp_path / "ops.txt").configs
    assert [c.op_type for c in written] == listed
    app = FixedDeviceApp(ConsoleContext(db_path=tmp_path / "k.db", settings=settings,
                                        device_summary="no CUDA device (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, model, len(written))
        assert [c.key for c in screen.configs] == [c.key for c in written]
        await pilot.press("x")  # export gives the same file back
        assert isinstance(app.screen, PathDialog)
        app.screen.query_one("#path", Input).value = str(tmp_path / "exported.txt")
        await pilot.press("enter")
        await wait_for(pilot, (tmp_path / "exported.txt").exists)
        assert (tmp_path / "exported.txt").read_text() == (tmp_path / "ops.txt").read_text()


async def test_h_converts_the_model_to_fp16_as_kdb_model_fp16_does_and_lists_its_half_op_configs(tmp_path: Path):
    """`h`: the newest imported model written in fp16 by the core conversion `kdb model fp16` runs (the same bytes),
    then imported: its op configs are half ones, never fp32 ones relabelled."""
    pytest.importorskip("onnxconverter_common")
    from conftest import run_kdb

    model = dense_model(tmp_path)
    proc = run_kdb("model", "fp16", str(model), str(tmp_path / "cli-fp16.onnx"))
    assert proc.returncode == 0, proc.stderr
    app = make_app(tmp_path / "k.db")
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, model, 2)
        await pilot.press("h")
        assert isinstance(app.screen, PathDialog)
        assert app.screen.query_one("#path", Input).value == str(tmp_path / "dense-fp16.onnx")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(screen.configs) == 4)
        assert [c.dtype for c in screen.configs] == ["float", "float", "half", "half"]
        assert next(reversed(screen.models)) == tmp_path / "dense-fp16.onnx"
    assert (tmp_path / "dense-fp16.onnx").read_bytes() == (tmp_path / "cli-fp16.onnx").read_bytes()


def test_every_template_of_the_add_dialog_is_an_op_config_it_accepts():
    """A template the dialog offers reads back as the op it is named after (Concat and Sum among them)."""
    for name, line in TEMPLATES.items():
        config, reason = check_line(line, {})
        assert config is not None and reason == "", (name, reason)
        assert name.split()[0] in config.op_type, (name, config.op_type)  # Depthwise in DepthwiseConv2dNative

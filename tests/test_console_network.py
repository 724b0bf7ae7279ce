"""The Network view (8): one model's story with the open DB, driven as a user would. Its ops are `kdb coverage`'s; its
history holds what either face did (a `kdb nnfusion` in a terminal and `c` in the console record alike, through the
core use case); recent models are remembered across launches. Real compiler, real rows; no GPU here: the view says
what only a GPU can show."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("tvm")

from conftest import run_kdb, run_kdb_json
from console_helpers import FixedDeviceApp, wait_until
from onnx_models import GraphBuilder, write
from test_nnfusion_run import COMPILER, needs_compiler
from textual.widgets import DataTable, Input, OptionList, Static

from console.context import ConsoleContext
from console.widgets.dialogs import PathDialog
from core.db.state import ModelEvent, StateDB
from core.settings import Settings, save_settings


def _text(widget: Static) -> str:
    return str(widget.render())


def _history(app: FixedDeviceApp) -> list[tuple[str, str]]:
    table = app.screen.query_one("#network-history", DataTable)
    return [(str(table.get_row(k)[1]), str(table.get_row(k)[3])) for k in table.rows]


async def open_in_network_view(pilot, app: FixedDeviceApp, model: Path):  # type: ignore[no-untyped-def]
    """The Network view (8), the model opened with `o` as a user types its path; the view."""
    await pilot.press("8")
    await pilot.press("o")
    await wait_until(pilot, lambda: isinstance(app.screen, PathDialog), "the model's dialog")
    app.screen.query_one("#path", Input).value = str(model)
    await pilot.press("enter")
    return app.screen


def no_gpu_app(tmp_path: Path) -> FixedDeviceApp:
    return FixedDeviceApp(ConsoleContext(db_path=tmp_path / "k.db", settings=Settings(workers=1),
                                         device_summary="no CUDA device (test)"))


async def opened(pilot, app: FixedDeviceApp, model: Path):  # type: ignore[no-untyped-def]
    """The Network view with the model opened and loaded."""
    screen = await open_in_network_view(pilot, app, model)
    await wait_until(pilot, lambda: getattr(screen, "model", None) == model, "the model")
    return screen


@needs_compiler
async def test_a_model_from_onnx_file_to_its_story_with_the_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from test_nnfusion_compiler import build_db

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    settings = Settings(workers=1, nnfusion_path=str(COMPILER))
    save_settings(settings)  # the CLI's settings and the console's are one
    g = GraphBuilder({"x": [1, 8, 16, 16]})
    y = g.node("Relu", [g.conv("x", 8, 16, 3, bias=True, name="c1")], "r1")
    model = write(g.model(g.node("MaxPool", [y], "mp", kernel_shape=[2, 2], strides=[2, 2]), "net"),
                  tmp_path / "net.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    _, coverage = run_kdb_json("coverage", str(model), "--db", str(db))

    app = FixedDeviceApp(ConsoleContext(db_path=db, settings=settings, device_summary="no CUDA device (test)"))
    async with app.run_test(size=(200, 50)) as pilot:
        screen = await open_in_network_view(pilot, app, model)
        ops = screen.query_one("#network-ops", DataTable)
        await wait_until(pilot, lambda: ops.row_count == len(coverage["entries"]), "the model's ops")
        shown = [(str(ops.get_row(k)[0]), str(ops.get_row(k)[2])) for k in ops.rows]
        assert shown == [(e["description"], e["runs"]) for e in coverage["entries"]]  # kdb coverage's answer
        assert _history(app) == [("-", "nothing yet: c compiles it")]
        assert "need a CUDA GPU" in _text(screen.query_one("#network-gpu", Static))
        assert "tuning (7) so far: net: no op measured yet" in _text(screen.query_one("#network-coverage", Static))

        # A compile in a terminal is part of the story...
        proc = run_kdb("nnfusion", str(model), "--db", str(db))
        assert proc.returncode == 0, proc.stderr
        await pilot.press("R")
        await wait_until(pilot, lambda: len(_history(app)) == 1 and _history(app)[0][0] == "compile",
                         "the terminal's compile in the history")
        assert _history(app)[0][1].endswith("promised == used")
        # ... and so is one from the console
        await pilot.press("c")
        dialog = app.screen
        await wait_until(pilot, lambda: getattr(dialog, "report", None) is not None, "the compile", timeout_s=300)
        await pilot.press("escape")
        await wait_until(pilot, lambda: len(_history(app)) == 2, "the console's compile in the history")
        assert [kind for kind, _ in _history(app)] == ["compile", "compile"]

        # Op times measured on a GPU (recorded as measure_library_times records them; these ratios are test data):
        # the ops are listed the slowest against the library first, each with its ratio and a bar
        ids = [e["lookup"] or e["identifier"] for e in coverage["entries"]]
        ratios = dict(zip(ids, [0.5, 2.5], strict=True))
        with closing(StateDB()) as state:
            state.record_model_event(ModelEvent(model=str(model.resolve()), db_path=str(db), kind="op-times",
                                                    ok=False, headline="op times: test data",
                                                    detail=json.dumps({"ratios": ratios})))
        await pilot.press("R")
        await wait_until(pilot, lambda: len(_history(app)) == 3, "the op times in the history")
        ops = app.screen.query_one("#network-ops", DataTable)
        column = [str(ops.get_row(k)[4]) for k in ops.rows]
        assert column[0].startswith(" 2.50x █") and column[1].startswith(" 0.50x █")

        # k opens the selected op's row in the Kernels view
        ops.focus()
        key = str(ops.get_row_at(0)[-1])
        await pilot.press("k")
        def shown_keys() -> list[str]:
            tables = app.screen.query("#kernel-table")
            return [str(r.value) for r in tables.first(DataTable).rows] if tables else []

        await wait_until(pilot, lambda: shown_keys() == [key], "the row alone in the Kernels view", timeout_s=30)

    again = FixedDeviceApp(ConsoleContext(db_path=db, settings=settings, device_summary="no CUDA device (test)"))
    async with again.run_test(size=(200, 50)) as pilot:
        await pilot.press("8")
        recent = again.screen.query_one("#network-recent", OptionList)
        await wait_until(pilot, lambda: recent.option_count == 1, "the model among the recent ones")
        assert recent.get_option_at_index(0).id == str(model.resolve())


async def test_e_writes_out_the_ops_nnfusion_cannot_import_as_kdb_model_expand_does_and_opens_that_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`e`: the open model with its HardSwish written out by the core conversion `kdb model expand` runs (the same
    bytes), then opened: the Network view's story is the expanded model's."""
    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    g = GraphBuilder({"x": [1, 8, 16, 16]})
    model = write(g.model(g.node("HardSwish", [g.conv("x", 8, 16, 3, name="c1")], "hs"), "mnv3"),
                  tmp_path / "mnv3.onnx")
    assert run_kdb("model", "expand", str(model), str(tmp_path / "cli.onnx")).returncode == 0
    app = no_gpu_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        screen = await opened(pilot, app, model)
        await pilot.press("e")
        await wait_until(pilot, lambda: isinstance(app.screen, PathDialog), "the output's dialog")
        assert app.screen.query_one("#path", Input).value == str(tmp_path / "mnv3-expanded.onnx")
        await pilot.press("enter")
        await wait_until(pilot, lambda: screen.model == tmp_path / "mnv3-expanded.onnx", "the expanded model opened")
    assert (tmp_path / "mnv3-expanded.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()


async def test_g_lists_the_models_op_configs_to_generate_and_t_takes_it_to_tuning_as_one_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """From the Network view on: `g` adds the op configs NNFusion looks up in the model to the Op configs view (as its
    `i` does, ready for `g` there), `t` takes the model to the Tuning view as one network (as its `i` does)."""
    from console.screens.opconfigs import OpConfigsScreen
    from console.screens.tuning import TuningScreen

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    g = GraphBuilder({"x": [1, 8, 16, 16]})
    y = g.node("Relu", [g.conv("x", 8, 16, 3, bias=True, name="c1")], "r1")
    model = write(g.model(g.node("MaxPool", [y], "mp", kernel_shape=[2, 2], strides=[2, 2]), "net"),
                  tmp_path / "net.onnx")
    _, extracted = run_kdb_json("opconfig", "extract", str(model))
    expected = {c["description"] for c in extracted["configs"]}
    assert len(expected) >= 2, extracted
    app = no_gpu_app(tmp_path)
    async with app.run_test(size=(200, 50)) as pilot:
        await opened(pilot, app, model)
        await pilot.press("g")
        await wait_until(pilot, lambda: isinstance(app.screen, OpConfigsScreen) and len(app.screen.configs) > 0,
                         "the model's op configs listed")
        assert {c.describe() for c in app.screen.configs} == expected
        await pilot.press("8")
        await pilot.press("t")
        await wait_until(pilot, lambda: isinstance(app.screen, TuningScreen) and app.screen.board.network is not None,
                         "the model taken as one network")
        assert {c.describe() for c in app.screen.board.configs} == expected

"""Nodes NNFusion compiles, whatever the DB holds, into a network that is not the model's: `kdb coverage` and `kdb
nnfusion` name them and exit 1, with the real compiler on this CPU machine.

Held out in session 25: a convolution with TF's "SAME" padding as tf2onnx writes it (pads [0, 0, 1, 1], stride 2) and a
MaxPool with ceil_mode 1. Only `kdb opconfig extract` said anything (a note); coverage and `kdb nnfusion` exited 0.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from conftest import run_kdb, run_kdb_json
from onnx_models import GraphBuilder, write

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
pytestmark = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")


def tf_same(path: Path) -> Path:
    g = GraphBuilder({"x": [1, 4, 8, 8]})
    w = g.weight("w", [8, 4, 3, 3])
    y = g.node("Conv", ["x", w], "c", kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    return write(g.model(g.node("Relu", [y], "out"), "same"), path)


def ceil_pool(path: Path) -> Path:
    g = GraphBuilder({"x": [1, 4, 9, 9]})
    y = g.node("MaxPool", ["x"], "pool", kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
    return write(g.model(g.node("Relu", [y], "out"), "ceil"), path)


@pytest.mark.parametrize("build, node, kind", [(tf_same, "c", "wrong numbers"), (ceil_pool, "pool", "wrong shape")])
def test_coverage_and_the_compile_name_the_node_nnfusion_compiles_into_another_network(tmp_path: Path, build, node,
                                                                                        kind):
    model = build(tmp_path / "m.onnx")
    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml")}
    assert run_kdb("settings", f"nnfusion_path={COMPILER}", env=env).returncode == 0
    db = str(tmp_path / "k.db")
    pytest.importorskip("tvm")  # every op with its row: the exit status is the miscompile's alone
    assert run_kdb("opconfig", "extract", str(model), "-o", str(tmp_path / "ops.txt"), env=env).returncode == 0
    assert run_kdb("codegen", str(tmp_path / "ops.txt"), "--inject", "--db", db, "--arch", "sm_90", "--no-compile",
                   env=env).returncode == 0
    proc = run_kdb("coverage", str(model), "--db", db, env=env)
    assert proc.returncode == 1 and "into another network" in proc.stdout and f"node {node}: {kind}" in proc.stdout
    proc, report = run_kdb_json("nnfusion", str(model), "--db", db, "--out", str(tmp_path / "out"), env=env)
    assert proc.returncode == 1 and report["compiled"], proc.stderr
    assert [(w["node"], w["kind"]) for w in report["miscompiles"]] == [(node, kind)]
    assert any(p.startswith(f"{kind}: node {node}: ") for p in report["problems"])
    code = (tmp_path / "out" / "nnfusion_rt" / "cuda_codegen" / "nnfusion_rt.cu").read_text()
    if node == "c":  # what kdb says of the compiler, in its own code: the Pad node pads before, where ONNX pads after
        assert "padding_below2 = 1" in code and "padding_below3 = 1" in code
    else:  # and the pool rounds down: 9 -> 4 where ONNX gives 5
        assert "NNFUSION_GRAPH_OUTPUT_SHAPE_0 {1, 4, 4, 4}" in code


async def test_the_compile_dialog_says_so_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from console_helpers import app_with_compiler, compile_dialog
    from test_nnfusion_run import empty_db
    from textual.widgets import Static

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    model = tf_same(tmp_path / "m.onnx")
    app = app_with_compiler(empty_db(tmp_path / "k.db"), COMPILER)
    async with app.run_test(size=(160, 45)) as pilot:
        dialog = await compile_dialog(pilot, app, model)
        summary = str(dialog.query_one("#compile-summary", Static).render())
        assert "wrong numbers: node c: NNFusion's importer swaps the two halves of its pads" in summary, summary

"""Depthwise rows (issue 39: every op NNFusion asks the DB for): a DepthwiseConv2dNative identifier is its shapes only,
so a row made for one stride is fetched for another node of the same shapes; coverage says the numbers would be
wrong. A dilated one aborts NNFusion's import, and kdb says so first. (The layout and the numbers:
tests/test_codegen.py; the zoo's depthwise networks: tests/test_zoo.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_kdb

pytest.importorskip("tvm")
pytest.importorskip("onnx")

from core.opconfigs.one_op_model import one_op_model
from core.opconfigs.opconfig import parse_line

# A 3x3 at SAME padding on a 2x2 map: stride 2 and stride 3 both give 1x1, one identifier for both
MADE = "cudnn_depthwise_conv2d_op_float|i+1_16_2_2|w+3_3_16_1|o+1_16_1_1|ws+2_2|wd+1_1|p+1_1"
OTHER = "cudnn_depthwise_conv2d_op_float|i+1_16_2_2|w+3_3_16_1|o+1_16_1_1|ws+3_3|wd+1_1|p+1_1"


def test_a_depthwise_row_made_for_another_stride_of_the_same_shapes_is_named_wrong_numbers(tmp_path: Path):
    import onnx

    made, other = parse_line(MADE), parse_line(OTHER)
    assert made.signature().identifier == other.signature().identifier
    ops, db = tmp_path / "ops.txt", tmp_path / "k.db"
    ops.write_text(MADE + "\n")
    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml")}
    assert run_kdb("codegen", str(ops), "--inject", "--db", str(db), "--arch", "sm_90", "--no-compile",
                   env=env).returncode == 0
    for config, wrong in ((other, True), (made, False)):
        model = tmp_path / "dw.onnx"
        onnx.save(one_op_model(config), model)
        proc = run_kdb("coverage", str(model), "--db", str(db), env={**env, "COLUMNS": "250"})
        assert "in DB" in proc.stdout, proc.stdout[-2000:]
        assert ("WRONG NUMBERS" in proc.stdout) is wrong, proc.stdout[-2000:]
        assert proc.returncode == (1 if wrong else 0)  # a network that computes wrong numbers is no pass
        assert ("the row computes stride [2, 2], dilation [1, 1], padding [1, 1]" in proc.stdout) is wrong


def test_a_dilated_depthwise_conv_is_a_blocker_as_the_compiler_aborts_on_it(tmp_path: Path):
    """DepthwiseConv2dNative's translate rule CHECK-fails on a dilation other than 1 ("Not support other dilation
    yet", seen with the compiler on a held-out network): coverage names the node and exits 1 before any compile."""
    from onnx_models import GraphBuilder, write

    g = GraphBuilder({"x": [1, 16, 20, 20]})
    w = g.weight("w", [16, 1, 3, 3], fan_in=9)
    model = write(g.model(g.node("Conv", ["x", w], "dw_dil", kernel_shape=[3, 3], strides=[1, 1], dilations=[2, 2],
                                 pads=[2, 2, 2, 2], group=16), "dilated"), tmp_path / "d.onnx")
    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml"), "COLUMNS": "250"}
    proc = run_kdb("coverage", str(model), "--db", str(tmp_path / "k.db"), env=env)
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 1 and "node dw_dil (Conv): depthwise convolution with dilation [2, 2]" in said, said
    assert "Not support other dilation yet" in said


def test_two_depthwise_ops_of_one_identifier_in_one_network_are_judged_each_against_the_row(tmp_path: Path):
    """Coverage caches a lookup's row choice by identifier; what the row was made for is checked per op after it,
    so of two ops of one identifier only the one whose stride the row does not compute is named."""
    from core.db.kernel_db import KernelDB
    from core.nnfusion.coverage import IN_DB, coverage
    from core.opconfigs.onnx_extract import Extraction

    made, other = parse_line(MADE), parse_line(OTHER)
    ops, db = tmp_path / "ops.txt", tmp_path / "k.db"
    ops.write_text(MADE + "\n")
    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml")}
    assert run_kdb("codegen", str(ops), "--inject", "--db", str(db), "--arch", "sm_90", "--no-compile",
                   env=env).returncode == 0
    both = Extraction("op configs", 2, [made, other], {made.key: [("a",)], other.key: [("b",)]})
    with KernelDB.open(db) as kernels:
        entries = coverage(both, kernels, None, "NVIDIA H100 80GB HBM3")
    assert [e.status for e in entries] == [IN_DB, IN_DB]
    assert [any("WRONG NUMBERS" in r for r in e.reasons) for e in entries] == [False, True]

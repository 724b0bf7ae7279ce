"""Depthwise rows (issue 39: every op NNFusion asks the DB for): a DepthwiseConv2dNative identifier is its shapes only,
so a row made for one stride, dilation or padding is fetched for another node of the same shapes; coverage says the
numbers would be wrong. (The layout and the numbers: tests/test_codegen.py; the real compiler: tests/test_zoo.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_kdb

pytest.importorskip("tvm")
pytest.importorskip("onnx")

from core.opconfigs.one_op_model import one_op_model
from core.opconfigs.opconfig import parse_line

MADE = "cudnn_depthwise_conv2d_op_float|i+1_16_20_20|w+3_3_16_1|o+1_16_20_20|ws+1_1|wd+1_1|p+1_1"
DILATED = "cudnn_depthwise_conv2d_op_float|i+1_16_20_20|w+3_3_16_1|o+1_16_20_20|ws+1_1|wd+2_2|p+2_2"


def test_a_depthwise_row_made_for_another_dilation_of_the_same_shapes_is_named_wrong_numbers(tmp_path: Path):
    import onnx

    made, dilated = parse_line(MADE), parse_line(DILATED)
    assert made.signature().identifier == dilated.signature().identifier  # SAME padding: dilation 1 or 2 alike
    ops, db = tmp_path / "ops.txt", tmp_path / "k.db"
    ops.write_text(MADE + "\n")
    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml")}
    assert run_kdb("codegen", str(ops), "--inject", "--db", str(db), "--arch", "sm_90", "--no-compile",
                   env=env).returncode == 0
    for config, wrong in ((dilated, True), (made, False)):
        model = tmp_path / "dw.onnx"
        onnx.save(one_op_model(config), model)
        proc = run_kdb("coverage", str(model), "--db", str(db), env={**env, "COLUMNS": "250"})
        assert "in DB" in proc.stdout, proc.stdout[-2000:]
        assert ("WRONG NUMBERS" in proc.stdout) is wrong, proc.stdout[-2000:]
        assert ("the row computes stride [1, 1], dilation [1, 1], padding [1, 1]" in proc.stdout) is wrong

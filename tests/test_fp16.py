"""Half precision (issue 33): fp16 op configs in every format, extraction from fp16 models with the identifiers the
real compiler looks up, and a plain refusal of bf16, which NNFusion's ONNX importer cannot read."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from conftest import run_kdb
from onnx_models import GraphBuilder, write

from core.errors import InputError
from core.kernels.kernel_json import validate_item
from core.opconfigs.onnx_extract import extract
from core.opconfigs.opconfig import OpConfig, format_line, format_structured, parse_line, parse_structured

COMPILER = shared_path("nnfusion/bin/nnfusion")
HALF_LINES = [
    "cudnn_convolution_op_half|i+1_8_16_16|w+16_8_3_3|o+1_16_16_16|ws+1_1|wd+1_1|p+1_1|fuse+relu",
    "cudnn_maxpool_op_half|i+1_16_16_16|o+1_16_8_8|win+2_2|ws+2_2|pb+0_0|pa+0_0",
    "cublas_dot_op_half|a+1_256|b+32_256|o+1_32|ta+0|tb+1",
    "elementwise_sigmoid_op_half|i+1_16|o+1_16",
]


def small_half_model(path: Path) -> Path:
    """conv+relu, max pool, average pool, Gemm (a Dot and its bias Add), MatMul, Sigmoid: fp32 as an exporter
    writes it, then fp16 by onnxconverter-common's converter (what `kdb model fp16` runs)."""
    float16 = pytest.importorskip("onnxconverter_common.float16", reason="needs onnxconverter-common (the tvm extra)")
    g = GraphBuilder({"x": [1, 8, 16, 16]})
    y = g.node("Relu", [g.conv("x", 8, 16, 3, name="c1")], "r1")
    y = g.node("MaxPool", [y], "mp", kernel_shape=[2, 2], strides=[2, 2])
    y = g.node("AveragePool", [y], "ap", kernel_shape=[2, 2], strides=[2, 2])
    y = g.node("Flatten", [y], "fl", axis=1)
    y = g.node("Gemm", [y, g.weight("fw", [32, 256]), g.weight("fb", [32])], "fc", transB=1)
    y = g.node("Sigmoid", [g.node("MatMul", [y, g.weight("mw", [32, 16])], "mm")], "sg")
    return write(float16.convert_float_to_float16(g.model(y, "small")), path)


def test_half_op_configs_read_back_byte_for_byte_in_every_format():
    configs = [parse_line(line, f"ops.txt:{i}") for i, line in enumerate(HALF_LINES, start=1)]
    assert [format_line(c) for c in configs] == HALF_LINES
    assert {c.dtype for c in configs} == {"half"}
    for fmt in ("toml", "json"):
        assert parse_structured(format_structured(configs, fmt), fmt).configs == configs
    # A half config and its fp32 twin are two ops: two identifiers, two keys, never merged.
    fp32 = parse_line(HALF_LINES[0].replace("_op_half", "_op_float"))
    assert fp32 != configs[0] and fp32.signature().identifier != configs[0].signature().identifier
    assert configs[0].signature().identifier == ("Convolution1,8,16,16;16,8,3,3;1,16,16,16halfhalfhalfStrides{1, 1}"
                                                 "Strides{1, 1}CoordinateDiff{1, 1}Relu1,16,16,16;1,16,16,16halfhalf")


@pytest.mark.parametrize("dtype", ["bfloat16", "bf16"])
def test_bf16_is_refused_in_every_format_saying_why(dtype: str):
    line = f"elementwise_relu_op_{dtype}|i+2_3|o+2_3"
    with pytest.raises(InputError, match=r"ops\.txt:7.*NNFusion's ONNX importer has no BFLOAT16"):
        parse_line(line, "ops.txt:7")
    read = parse_structured(f'[[op]]\nop_type = "Relu"\ninput_shape = [2]\noutput_shape = [2]\ndtype = "{dtype}"\n',
                            "toml", "ops.toml")
    assert not read.configs and "ops.toml#0" in str(read.errors[0]) and "BFLOAT16" in str(read.errors[0])
    item = {"op_type": "Relu", "parameters": {"input_shape": [2], "output_shape": [2]}, "code": "x",
            "gridDim": [1], "blockDim": [1], "dtype": dtype}
    with pytest.raises(InputError, match="dtype: bfloat16 is not served"):
        validate_item(item)


def test_an_unknown_element_type_in_a_prefix_is_named():
    with pytest.raises(InputError, match=r"prefix 'cublas_dot_op_int8': 'int8' is not an element type"):
        parse_line("cublas_dot_op_int8|a+2_2|b+2_2|o+2_2|ta+0|tb+0", "ops.txt:1")


def test_a_read_prefix_takes_the_configs_own_element_type():
    """A config read as fp32 and made half (a model converted to fp16) is written as half, never as float."""
    from dataclasses import replace

    config = parse_line("elementwise_relu_op_float|i+2_3|o+2_3")
    assert format_line(replace(config, dtype="half")) == "elementwise_relu_op_half|i+2_3|o+2_3"


def test_a_bf16_model_is_unmapped_saying_nnfusion_cannot_import_it(tmp_path: Path):
    g = GraphBuilder({"x": [2, 8]})
    g.inputs[0].type.tensor_type.elem_type = 16  # BFLOAT16
    model = g.model(g.node("Relu", ["x"], "relu"))
    model.graph.output[0].type.tensor_type.elem_type = 16
    ext = extract(write(model, tmp_path / "bf16.onnx"))
    assert not ext.configs
    assert [(u.node, u.reason.split(":")[0]) for u in ext.unmapped] == [("relu", "element type BFLOAT16")]
    assert "ONNX importer has no BFLOAT16" in ext.unmapped[0].reason


def test_extraction_of_an_fp16_model_writes_half_configs_for_every_op(tmp_path: Path):
    model = small_half_model(tmp_path / "small16.onnx")
    configs = extract(model).looked_up()
    assert [(c.op_type, c.dtype) for c in configs] == [
        ("Fused_Convolution_Relu", "half"), ("MaxPool", "half"), ("AvgPool", "half"), ("Dot", "half"),
        ("Add", "half"), ("Dot", "half"), ("Sigmoid", "half")]
    proc = run_kdb("opconfig", "extract", str(model), "-o", str(tmp_path / "ops.txt"))
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "ops.txt").read_text().splitlines()
    assert len(lines) == 7 and all("_op_half|" in line for line in lines)


@pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} (../shared/nnfusion)")
def test_every_half_identifier_extraction_writes_is_one_the_real_compiler_looks_up(tmp_path: Path):
    """NNFusion with an empty DB tries every op's lookup (-min_log_level=0 logs each): kdb's identifiers for the fp16
    model are among them byte for byte, `half` in every one."""
    import subprocess

    model = small_half_model(tmp_path / "small16.onnx")
    db = tmp_path / "empty.db"
    sqlite3.connect(db).close()
    proc = subprocess.run([str(COMPILER), str(model), "-f", "onnx", f"-fkernel_cache_path={db}",
                           "-min_log_level=0"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fetched = set(re.findall(r"Trying to fetch kernel (.*) on DeviceType: \S+", proc.stdout + proc.stderr))
    written = {c.signature().identifier for c in extract(model).looked_up()}
    assert written <= fetched, sorted(written - fetched)
    assert all(re.search(r"(half){2,3}", ident) and "float" not in ident for ident in written)


def test_a_half_config_in_a_float_prefix_line_is_not_possible():
    """The line's prefix is the only place its element type is said: a half config always writes `_op_half`."""
    config = OpConfig("Relu", {"input_shapes": [[4]], "output_shape": [4]}, dtype="half")
    assert format_line(config) == "elementwise_relu_op_half|i+4|o+4"

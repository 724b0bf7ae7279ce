"""Half precision (issue 33): fp16 op configs in every format, extraction from fp16 models with the identifiers the
real compiler looks up, and a plain refusal of bf16, which NNFusion's ONNX importer cannot read."""

from __future__ import annotations

import os
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
    assert configs[0].describe() == fp32.describe() + " half"  # every view and report tells them apart
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


# -- codegen in half (step 2) ---------------------------------------------------------------------------------------

def shared_dot_schedule(config: OpConfig):  # type: ignore[no-untyped-def]
    """A real TVM schedule of a half Dot that stages both operands in shared memory (`__shared__ half` arrays and
    barriers, as tuned kernels have them): 8x16 threads per block, K in steps of 16."""
    import tvm.s_tir as s_tir

    from core.codegen.generate import prim_func_module

    sch = s_tir.Schedule(prim_func_module(config, cuda_cores=True)[0])  # a CUDA-core half kernel, as the tuner's
    block = sch.get_sblock("T_matmul_NN")
    i, j, k = sch.get_loops(block)
    (bi, ti), (bj, tj), (ko, ki) = sch.split(i, [None, 8]), sch.split(j, [None, 16]), sch.split(k, [None, 16])
    sch.reorder(bi, bj, ti, tj, ko, ki)
    for operand in (0, 1):
        sch.compute_at(sch.cache_read(block, operand, "shared"), ko)
    sch.set_scope(block, 0, "local")
    sch.reverse_compute_at(sch.get_sblock("output0"), tj)
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(sch.fuse(ti, tj), "threadIdx.x")
    return sch.mod


def half_rows(items: list[dict], db_path: Path, *, compile: bool = False) -> list:  # type: ignore[type-arg]
    import json

    from core.db.kernel_db import KernelDB
    from core.inject.pipeline import InjectOptions, Injector

    kernels = db_path.with_suffix(".json")
    kernels.write_text(json.dumps(items), encoding="utf-8")
    with KernelDB.open(db_path, create=True) as db:
        report = Injector(db, InjectOptions(compile=compile, archs=("sm_90",)), state=None).run([kernels])
        assert report.failed == 0, [f.reason for f in report.failures]
        return list(db.iter_rows())


def test_half_op_configs_give_half_kernels_which_never_call_tvms_own_half_helpers(tmp_path: Path):
    pytest.importorskip("tvm")
    import json

    from core.codegen.batch import generate_all
    from core.kernels.lint import TVM_HALF_HELPERS, lint_row

    configs = [parse_line(line) for line in HALF_LINES] + [
        parse_line(f"elementwise_{op}_op_half|i+4_32|o+4_32") for op in ("erf", "tanh", "gelu", "relu", "sqrt")]
    report = generate_all(configs, "sm_90", check=False)
    assert not report.failed, [g.error for g in report.failed]
    for item in report.items:
        assert item["dtype"] == "half" and "half* __restrict__ input0" in item["code"] and "float*" not in item["code"]
        assert not [h for h in TVM_HALF_HELPERS if re.search(rf"\b{h}\b", item["code"])], item["code"]
    for rowid, row in enumerate(half_rows(report.items, tmp_path / "k.db")):
        function = json.loads(row.function)
        assert "halfhalf" in row.identifier and "float" not in row.identifier
        assert "half* __restrict__ output0" in function["function_signature"]
        assert "float" not in function["function_signature"]
        assert lint_row((rowid, *row.values())) == [], row.identifier


def test_half_shared_arrays_are_declared_from_blockfusions_table_and_read_as_half(tmp_path: Path):
    pytest.importorskip("tvm")
    import json

    from core.codegen.generate import generate
    from core.cuda.nvcc import find_nvcc
    from core.kernels.lint import lint_row

    config = parse_line("cublas_dot_op_half|a+64_64|b+64_64|o+64_64|ta+0|tb+0")
    generated = generate(config, "sm_90", scheduled=shared_dot_schedule(config), check=False)
    assert generated.item and "__shared__ alignas(64) half input0_shared_ptr[128];" in generated.item["code"]
    nvcc = find_nvcc("") is not None
    [row] = half_rows([generated.item], tmp_path / "k.db", compile=nvcc)  # nvcc compiles NNFusion's two forms
    function = json.loads(row.function)
    assert function["shared_memory"] == {"symbol": ["__align__(64) input0_shared_ptr_kdb_bits",
                                                    "__align__(64) input1_shared_ptr_kdb_bits"],
                                         "dtype": ["uint16_t", "uint16_t"], "size": [128, 256]}
    assert function["block_function_body"].startswith(
        "half* input0_shared_ptr = reinterpret_cast<half*>(input0_shared_ptr_kdb_bits);\n"
        "half* input1_shared_ptr = reinterpret_cast<half*>(input1_shared_ptr_kdb_bits);\n")
    assert "__shared__" not in function["block_function_body"] and function["num_syncthreads"] == 8
    assert lint_row((1, *row.values())) == []
    if nvcc:
        assert json.loads(row.miscs)["kdb"]["compile"]["sm_90"]["kdb_block_kernel"]["shared_bytes"] == 768


def _shared_dot_row(tmp_path: Path):  # type: ignore[no-untyped-def]
    from core.codegen.generate import generate

    config = parse_line("cublas_dot_op_half|a+64_64|b+64_64|o+64_64|ta+0|tb+0")
    [row] = half_rows([generate(config, "sm_90", scheduled=shared_dot_schedule(config), check=False).item],
                      tmp_path / "lint.db")
    return row


def _planted(row, **changes):  # type: ignore[no-untyped-def]
    """The row with Function (or Attributes) fields replaced: a row another tool could have written."""
    import json
    from dataclasses import replace

    function, attributes = json.loads(row.function), json.loads(row.attributes)
    attributes.update(changes.pop("attributes", {}))
    function.update(changes)
    return replace(row, function=json.dumps(function), attributes=json.dumps(attributes))


@pytest.mark.parametrize(("check", "severity", "plant"), [
    ("shared-dtype", "crash", lambda f: {"shared_memory": {**f["shared_memory"], "dtype": ["half", "half"]}}),
    ("shared-size", "crash", lambda f: {"shared_memory": {**f["shared_memory"], "size": [24576, 256]}}),
    ("dynamic-shared", "crash", lambda f: {"function_body": "extern __shared__ half buf[];\n" + f["function_body"]}),
    ("signature-dtype", "crash", lambda f: {"function_signature": f["function_signature"].replace("half*", "float*")}),
    ("tvm-half-helper", "crash", lambda f: {"block_function_body": f["block_function_body"] + "\noutput0[0] = herf(output0[0]);"}),
    ("dtype", "unreachable", lambda f: {"attributes": {"dtype": "bfloat16"}}),
    ("wmma", "crash", lambda f: {"block_function_body": "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, "
                                 "half> acc;\n" + f["block_function_body"]}),
], ids=lambda v: v if isinstance(v, str) else "")
def test_lint_names_each_way_a_half_row_aborts_the_compiler_or_is_never_fetched(tmp_path: Path, check, severity, plant):
    pytest.importorskip("tvm")
    import json

    from core.kernels.lint import lint_row

    row = _shared_dot_row(tmp_path)
    assert lint_row((1, *row.values())) == []
    bad = _planted(row, **plant(json.loads(row.function)))
    assert [(f.check, f.severity) for f in lint_row((1, *bad.values())) if f.check != "identifier"] == [
        (check, severity)]


# -- verification (step 3) --------------------------------------------------------------------------------------

def test_the_tolerance_grows_with_the_reduction_length_and_halfs_roundoff():
    from core.codegen.reference import TOLERANCE, tolerance

    u = 2.0**-11
    assert tolerance("half", 1) == pytest.approx(4 * u)  # an element-wise op: its rounding and a product's
    assert tolerance("half", 4608) == pytest.approx(u * (2 + 2 * 4608**0.5))  # ResNet-50's 3x3x512 convolutions
    assert tolerance("half", 9) < tolerance("half", 768) < tolerance("half", 3072)
    assert tolerance("float", 1) == tolerance("float", 4608) == TOLERANCE  # fp32 keeps its fixed bound
    with pytest.raises(InputError, match="no tolerance policy for element type bfloat16"):
        tolerance("bfloat16", 1)


# The largest reductions of ResNet-50 (3x3x512, 1x1 from 2048) and of a BERT-base encoder (the FFN's 3072 -> 768), and
# an element-wise op computed in float: each checked in half on the CPU (TVM's llvm build of the default schedule,
# accumulating in half) against float64 numpy, within the policy's bound.
MEASURED = [
    "cudnn_convolution_op_half|i+1_512_7_7|w+512_512_3_3|o+1_512_7_7|ws+1_1|wd+1_1|p+1_1|fuse+relu",
    "cudnn_convolution_op_half|i+1_2048_7_7|w+512_2048_1_1|o+1_512_7_7|ws+1_1|wd+1_1|p+0_0|fuse+relu",
    "cublas_dot_op_half|a+1_8_3072|b+3072_768|o+1_8_768|ta+0|tb+0",
    "cudnn_avgpool_op_half|i+1_2048_7_7|o+1_2048_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0",
    "elementwise_gelu_op_half|i+1_128_3072|o+1_128_3072",
]


@pytest.mark.parametrize("line", MEASURED, ids=lambda line: line.split("|")[0])
def test_half_kernels_of_resnet50_and_bert_shapes_check_out_within_the_policy(line: str):
    pytest.importorskip("tvm")
    from core.codegen.generate import generate, on_tensor_cores, prim_func_module
    from core.codegen.reference import check_on_cpu, tolerance_for

    config = parse_line(line)
    generated = generate(config, "sm_90", check=True)
    assert generated.item is not None, generated.error
    assert generated.max_rel_error is not None and generated.max_rel_error <= tolerance_for(config) / 2
    # A CUDA-core half kernel accumulates in half: far above fp32's error, within the bound with a margin of 2 or
    # more. The tensor cores' (the default for Dots and convolutions) accumulate in fp32: below it.
    cuda_cores, shapes = prim_func_module(config, cuda_cores=True)
    half_sums = check_on_cpu(config, cuda_cores, shapes)
    assert half_sums is not None and half_sums <= tolerance_for(config) / 2
    if config.op_type != "Gelu":
        assert half_sums > 1e-3
    if on_tensor_cores(config):
        assert generated.max_rel_error < 1e-3 < half_sums


def test_a_half_kernel_that_computes_something_else_never_gets_a_kernel_json():
    """The check runs the module it is given on the CPU: a Dot reading B transposed is off by about 1."""
    pytest.importorskip("tvm")
    from dataclasses import replace

    from core.codegen.generate import prim_func_module
    from core.codegen.reference import check_on_cpu

    config = parse_line("cublas_dot_op_half|a+16_256|b+256_256|o+16_256|ta+0|tb+0")
    wrong, shapes = prim_func_module(replace(config, params={**config.params, "transpose_B": True}))
    assert check_on_cpu(config, prim_func_module(config)[0], shapes) is not None
    with pytest.raises(InputError, match=r"differs from numpy's by .* the half limit for 256 terms a sum is 0.017"):
        check_on_cpu(config, wrong, shapes)


def test_gpu_verification_of_a_half_row_uses_the_policy_and_half_buffers(tmp_path: Path):
    """What the GPU child is handed (built without a GPU): the row's element type, the policy's bound for its
    reduction, and inputs drawn in half."""
    pytest.importorskip("tvm")
    import numpy as np

    from core.codegen.batch import generate_all
    from core.codegen.reference import inputs_for, tolerance
    from core.gpu.jobs import job_for_row

    config = parse_line("cublas_dot_op_half|a+1_128_768|b+768_3072|o+1_128_3072|ta+0|tb+0")
    [row] = half_rows(generate_all([config], "sm_90", check=False).items, tmp_path / "k.db")
    job = job_for_row(row, "verify")
    assert (job["dtype"], job["tolerance"]) == ("half", tolerance("half", 768))
    assert {a.dtype for a in inputs_for(config, [(128, 768), (768, 3072)])} == {np.dtype(np.float16)}


# -- converting a model (step 4) -----------------------------------------------------------------------------------

def test_kdb_model_fp16_converts_with_onnxconverter_common_and_extraction_then_writes_half(tmp_path: Path):
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import onnx
    from onnx_models import resnet_block

    source = write(resnet_block(channels=8, size=8), tmp_path / "block.onnx")
    before = source.read_bytes()
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "block16.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["half_initializers"] == 2 and report["float_initializers"] == 0 and report["io_types"] == "half"
    model = onnx.load(str(tmp_path / "block16.onnx"))
    assert model.graph.input[0].type.tensor_type.elem_type == 10 and source.read_bytes() == before
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "block16.onnx").stat().st_mode & 0o777 == 0o666 & ~umask  # as any file the user writes
    assert {c.dtype for c in extract(tmp_path / "block16.onnx").configs} == {"half"}
    again = run_kdb("model", "fp16", str(tmp_path / "block16.onnx"), str(tmp_path / "twice.onnx"))
    assert again.returncode == 2 and "block16.onnx: nothing to convert: the model has already fp16" in again.stderr
    assert not (tmp_path / "twice.onnx").exists()
    same = run_kdb("model", "fp16", str(source), str(source))
    assert same.returncode == 2 and "would overwrite the fp32 one" in same.stderr and source.read_bytes() == before


def test_kdb_model_fp16_takes_a_float_model_with_casts_to_half_and_to_float(tmp_path: Path):
    """Held out in session 27: a float model with a rounding Cast pair (float -> half -> float) was refused as 'already
    converted'; BERT's additive mask (an int mask Cast to float) came out with a float Cast into a half graph, which
    ONNX Runtime and NNFusion refuse (exit 0 all the same)."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import numpy as np
    import onnx
    from onnx import TensorProto

    g = GraphBuilder({"x": [1, 8]})
    rounded = g.node("Cast", [g.node("Cast", ["x"], "to_half", to=TensorProto.FLOAT16)], "to_float",
                     to=TensorProto.FLOAT)
    mask = g.node("Cast", [g.constant("mask", [[1, 1, 1, 1, 1, 1, 0, 0]])], "mask_float", to=TensorProto.FLOAT)
    y = g.node("Add", [rounded, g.node("Mul", [mask, g.constant("big", [-1e4], np.float32)], "scale")], "add")
    source = write(g.model(y, "cast_pair"), tmp_path / "casts.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "casts16.onnx"))
    assert proc.returncode == 0, proc.stderr
    model = onnx.load(str(tmp_path / "casts16.onnx"))
    onnx.checker.check_model(model, full_check=True)  # raises on the float Cast into the half Mul
    # the mask's Cast and scale, of constants, are folded for NNFusion's importer: a half initializer, nothing unread
    assert [n.op_type for n in model.graph.node] == ["Add"]
    assert {t.name: t.data_type for t in model.graph.initializer} == {"scale_out": TensorProto.FLOAT16}
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(model.graph.initializer[0]),
                                  np.array([[-1e4] * 6 + [0, 0]], np.float16))


def test_kdb_model_fp16_names_what_its_converter_keeps_in_float_and_counts_no_negative_casts(tmp_path: Path):
    """Held out in session 29: onnxconverter-common's block list keeps Max, Min, Resize, ... in float between Casts
    (a MobileNetV3's HardSwish written out: 14 float nodes), and the report named only the depthwise convolutions;
    a scale computed from the input's shape (its Cast folded for the importer) gave "-1 Casts added"."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import numpy as np
    from onnx import TensorProto

    def shape_scaled() -> tuple[GraphBuilder, str]:  # x / sqrt(its last dim), the dim Cast to float
        g = GraphBuilder({"x": [1, 16, 64]})
        width = g.node("Cast", [g.node("Gather", [g.node("Shape", ["x"], "shape"), g.constant("two", 2)], "dim",
                                       axis=0)], "dim_float", to=TensorProto.FLOAT)
        return g, g.node("Div", ["x", g.node("Sqrt", [width], "root")], "scaled")

    g, scaled = shape_scaled()
    shape_only = write(g.model(g.node("Relu", [scaled], "relu"), "shape_scale"), tmp_path / "shape.onnx")
    proc = run_kdb("model", "fp16", str(shape_only), str(tmp_path / "shape16.onnx"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["casts_added"] == 0, proc.stdout + proc.stderr
    g, scaled = shape_scaled()
    y = g.node("Min", [g.node("Max", [scaled, g.constant("low", [0.0], np.float32)], "max"),
                       g.constant("high", [6.0], np.float32)], "min")
    source = write(g.model(y, "blocked"), tmp_path / "blocked.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "blocked16.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["blocked"] == {"Max": 1, "Min": 1}
    said = run_kdb("model", "fp16", str(source), str(tmp_path / "again16.onnx")).stdout
    assert "kept in float by onnxconverter-common's block list: 2 node(s) (Max x 1, Min x 1)" in " ".join(said.split())


def test_kdb_model_fp16_writes_half_means_as_matmuls_so_a_long_mean_cannot_overflow(tmp_path: Path):
    """NNFusion computes a ReduceMean as a Sum, then a Divide, and its half Sum adds in half: a mean over 768 values of
    100 is 76,800 before the Divide, past half's 65,504 (inf). The converted model computes each half mean as a MatMul
    by a column of 1/768, whose running sums never pass the largest input; ONNX Runtime gives the fp32 model's
    numbers for it."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import numpy as np
    import onnx
    from onnx import numpy_helper

    for opset in (13, 18):  # (an axes attribute; an axes input)
        g = GraphBuilder({"x": [1, 4, 768]})  # a LayerNorm's centring: x - mean(x)
        if opset < 18:
            mean = g.node("ReduceMean", ["x"], "mean", axes=[-1], keepdims=1)
        else:
            mean = g.node("ReduceMean", ["x", g.constant("axes", [-1])], "mean", keepdims=1)
        source = write(g.model(g.node("Sub", ["x", mean], "centred"), "centre", opset=opset),
                       tmp_path / f"c{opset}.onnx")
        out = tmp_path / f"c{opset}_16.onnx"
        proc = run_kdb("model", "fp16", str(source), str(out), "--json")
        assert proc.returncode == 0, proc.stderr
        kinds = json.loads(proc.stdout)["for_import"]
        assert [n for kind, n in kinds.items() if kind.startswith("half ReduceMean")] == [1], kinds
        converted = onnx.load(out)
        assert [n.op_type for n in converted.graph.node].count("ReduceMean") == 0
        [column] = [numpy_helper.to_array(t) for t in converted.graph.initializer if list(t.dims) == [768, 1]]
        assert column.dtype == np.float16 and np.all(column == np.float16(1 / 768))
        ort = pytest.importorskip("onnxruntime")
        x = 100 + np.random.default_rng(0).standard_normal([1, 4, 768]).astype(np.float32)
        want = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
        got = ort.InferenceSession(str(out)).run(None, {"x": x.astype(np.float16)})[0]
        assert np.isfinite(got).all() and np.abs(got - want).max() < 0.1, np.abs(got - want).max()
    said = run_kdb("model", "fp16", str(source), str(tmp_path / "again16.onnx")).stdout
    assert "half ReduceMean written as a MatMul" in " ".join(said.split())


def rms_norm(g: GraphBuilder, x: str) -> str:
    """RMSNorm as torch exports it: x / sqrt(mean(x * x) + eps)."""
    import numpy as np

    mean = g.node("ReduceMean", [g.node("Mul", [x, x], "square")], "mean", axes=[-1], keepdims=1)
    root = g.node("Sqrt", [g.node("Add", [mean, g.constant("eps", [1e-6], np.float32)], "padded")], "root")
    return g.node("Div", [x, root], "normed")


def layer_norm_13(g: GraphBuilder, x: str) -> str:
    """LayerNorm as torch exports it at opset 13 (no LayerNormalization op): (x - mean) / sqrt(mean((x - mean)^2))."""
    import numpy as np

    centred = g.node("Sub", [x, g.node("ReduceMean", [x], "ln_mean", axes=[-1], keepdims=1)], "ln_centred")
    square = g.node("Pow", [centred, g.constant("two", [2.0], np.float32)], "ln_pow")
    var = g.node("ReduceMean", [square], "ln_var", axes=[-1], keepdims=1)
    root = g.node("Sqrt", [g.node("Add", [var, g.constant("ln_eps", [1e-5], np.float32)], "ln_padded")], "ln_root")
    return g.node("Div", [centred, root], "ln_normed")


@pytest.mark.parametrize("norm", ["RMSNorm", "opset-13 LayerNorm", "GroupNorm, expanded first"])
def test_kdb_model_fp16_keeps_a_norms_square_in_float_so_it_cannot_overflow(tmp_path: Path, norm: str):
    """Held out in session 32 (a wav2vec2 feature extractor: GroupNorm expanded, then fp16): in half a square passes
    65,504 once a value is 256 from the mean, and the whole norm is 0. ONNX Runtime computes those nodes in float and
    showed nothing; onnx's reference computes each in its own type, as NNFusion does. The square, its mean, the epsilon
    and the root stay float between Casts: at 300 times the scale the numbers are the fp32 model's."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    g = GraphBuilder({"x": [1, 8, 64]})
    if norm == "GroupNorm, expanded first":
        y = g.node("InstanceNormalization", ["x", g.weight("s", [8]), g.weight("b", [8])], "gn", epsilon=1e-5)
    else:
        y = (rms_norm if norm == "RMSNorm" else layer_norm_13)(g, "x")
    source = write(g.model(y, "norm", opset=13), tmp_path / "m.onnx")
    if norm == "GroupNorm, expanded first":
        assert run_kdb("model", "expand", str(source), str(tmp_path / "x.onnx")).returncode == 0
        source = tmp_path / "x.onnx"
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "h.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    (square,) = json.loads(proc.stdout)["statistics_float"]
    assert "norm statistic" in run_kdb("model", "fp16", str(source), str(tmp_path / "again.onnx")).stdout
    written = onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "h.onnx")).graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*written.value_info, *written.input, *written.output)}
    (node,) = [n for n in written.node if n.name == square]
    assert node.op_type in ("Mul", "Pow") and types[node.output[0]] == onnx.TensorProto.FLOAT
    x = np.random.default_rng(0).standard_normal([1, 8, 64]).astype(np.float32) * 300
    want = ReferenceEvaluator(str(source)).run(None, {"x": x})[0]
    with np.errstate(all="ignore"):
        got = ReferenceEvaluator(str(tmp_path / "h.onnx")).run(None, {"x": x.astype(np.float16)})[0]
    assert np.isfinite(got).all() and np.abs(got.astype(np.float32) - want).max() < 1e-2, np.abs(got - want).max()


def test_kdb_model_fp16_writes_half_layer_norms_and_l2_norms_so_they_cannot_overflow(tmp_path: Path):
    """Held out in session 31: NNFusion's half LayerNorm kernel keeps its Welford sums in half (M2 = 768 x the
    variance: inf past a variance of 85) and a half ReduceL2 is a Square and a half Sum (inf past a norm of 256). The
    LayerNorm is written as its formula in float between Casts (in half its squares pass 65,504 256 from the mean),
    the L2 norm with a half MatMul mean; at a standard deviation of 30 ONNX Runtime gives the fp32 model's numbers."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import numpy as np
    import onnx

    g = GraphBuilder({"x": [1, 16, 768]})
    normed = g.node("LayerNormalization", ["x", g.weight("gamma", [768]), g.weight("beta", [768])], "ln",
                    epsilon=1e-12)
    norm = g.node("ReduceL2", [normed], "norm", axes=[-1], keepdims=1)
    source = write(g.model(g.node("Div", [normed, norm], "unit"), "ln_l2", opset=17), tmp_path / "m.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "h.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    kinds = json.loads(proc.stdout)["for_import"]
    assert {k.split(" written")[0] for k in kinds} >= {"half LayerNormalization", "half ReduceL2"}, kinds
    written = onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "h.onnx")).graph
    assert not {n.op_type for n in written.node} & {"LayerNormalization", "ReduceL2"}
    types = {v.name: v.type.tensor_type.elem_type for v in (*written.value_info, *written.input)}
    means = [n for n in written.node if n.op_type == "ReduceMean"]  # (the LayerNorm's, in float: a MatMul in half)
    assert len(means) == 2 and all(types[n.input[0]] == onnx.TensorProto.FLOAT for n in means), means
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(0).standard_normal([1, 16, 768]).astype(np.float32) * 30
    want = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(tmp_path / "h.onnx")).run(None, {"x": x.astype(np.float16)})[0]
    assert np.isfinite(got).all() and np.abs(got - want).max() < 1e-3 * np.abs(want).max() * 10


def test_kdb_model_fp16_names_expand_as_the_next_step_where_nnfusion_cannot_compile_the_model(tmp_path: Path):
    """Held out in session 31: its next step was always `opconfig extract`, which then exited 1 on a blocker that
    `kdb model expand` rewrites (a ReduceMax)."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    g = GraphBuilder({"x": [1, 8, 6, 6]})
    source = write(g.model(g.node("ReduceMax", ["x"], "amax", axes=[1], keepdims=1), "amax"), tmp_path / "m.onnx")
    said = run_kdb("model", "fp16", str(source), str(tmp_path / "h.onnx")).stdout
    assert f"next: kdb model expand {tmp_path / 'h.onnx'} {tmp_path / 'hx.onnx'}" in " ".join(said.split()), said
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "h2.onnx"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["faults"] == 1
    assert json.loads(proc.stdout)["left_by_expand"] == [] and json.loads(proc.stdout)["mended_by_expand"] == 1


def test_kdb_model_fp16_exits_1_naming_what_expand_cannot_mend_and_sends_the_user_to_coverage(tmp_path: Path):
    """Held out in session 32 (CLIP's ArgMax pooling): fp16 exited 0 and sent the user to `kdb model expand`, which
    wrote the model unchanged and exited 1 on the same node."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    g = GraphBuilder({"x": [1, 8, 6]})
    picked = g.node("ArgMax", [g.node("Relu", ["x"], "act")], "pick", axis=-1, keepdims=1)
    source = write(g.model(g.node("Cast", [picked], "as_float", to=1), "argmax"), tmp_path / "m.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "h.onnx"))
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 1, said
    assert "`kdb model expand` leaves 1 so: pick" in said and "model expand" not in said.split("next:")[1]
    assert f"next: kdb coverage {tmp_path / 'h.onnx'}" in said
    done = json.loads(run_kdb("model", "fp16", str(source), str(tmp_path / "h2.onnx"), "--json").stdout)
    assert done["faults"] == 1 and done["left_by_expand"] == ["pick"] and done["mended_by_expand"] == 0


def test_kdb_model_fp16_counts_the_values_it_clamps_and_not_a_masks_infinities(tmp_path: Path):
    """Held out in session 31: GPT-2's causal mask (-inf where masked) was reported as 1,024 values clamped to 1e4; the
    converter clamps finite values only, and the mask stays -inf. Held out in session 32: the converter's own bound,
    1e4, turned x + 30,000 into x + 10,000 (half holds 30,000) and said nothing of a Constant node's -9e15."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import numpy as np
    from onnx import helper, numpy_helper

    g = GraphBuilder({"x": [1, 8, 8]})
    mask = np.triu(np.full((1, 8, 8), -np.inf, np.float32), 1)
    held = g.constant("held", np.full((1, 8, 8), 3e4), np.float32)  # half holds it: kept
    big = g.constant("big", np.full((1, 8, 8), 1e5), np.float32)  # 64 values past half's 65,504: clamped
    g.nodes.append(helper.make_node("Constant", [], ["fill"], name="fill",
                                    value=numpy_helper.from_array(np.array([-9e15], np.float32))))  # clamped: 1
    y = g.node("Add", [g.node("Add", [g.node("Add", ["x", g.constant("mask", mask, np.float32)], "masked"), held],
                               "held_in"), big], "big_in")
    source = write(g.model(g.node("Add", [y, "fill"], "y"), "masked"), tmp_path / "m.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "h.onnx"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["clamped"] == 65, proc.stdout + proc.stderr
    import onnx

    values = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "h.onnx").graph.initializer}
    held_value, big_value = (next(v for k, v in values.items() if k.startswith(name)) for name in ("held", "big"))
    assert held_value.dtype == np.float16 and np.all(held_value == np.float16(3e4)) and np.all(big_value == 65504)


# -- tuning (the workload's element type) -----------------------------------------------------------------------

def sampled_candidate(config: OpConfig, space, postprocs, seed: int):  # type: ignore[no-untyped-def]
    """One candidate of a design space with its random decisions drawn afresh (as the search samples them)."""
    import tvm.s_tir as s_tir

    from core.codegen.generate import prim_func_module

    for attempt in range(seed, seed + 80):  # (few of a small op's SIMT candidates fit a block: 4 in 59)
        sch = s_tir.Schedule(prim_func_module(config)[0], seed=attempt)
        space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda *_: None)
        if all(p.apply(sch) for p in postprocs):
            return sch.mod
    raise AssertionError("no valid candidate in 80 draws")


@pytest.mark.parametrize("line", [  # half ops the tensor cores do not take (8 rows; 8 output channels)
    "cublas_dot_op_half|a+1_8_768|b+768_3072|o+1_8_3072|ta+0|tb+0",
    "cudnn_convolution_op_half|i+1_64_56_56|w+8_64_3_3|o+1_8_56_56|ws+1_1|wd+1_1|p+1_1|fuse+relu",
])
def test_a_half_op_tunes_in_half_on_cuda_with_spaces_whose_kernels_can_be_rows(tmp_path: Path, line: str):
    """A half op the tensor cores do not take: MetaSchedule's own tensor-core rules give it only spaces in dynamic
    shared memory (WMMA, shared.dyn), which no row can hold: kdb's space drops them and tunes MetaSchedule's SIMT
    spaces, in half, whose staged operands become uint16_t arrays read as half."""
    pytest.importorskip("tvm")
    import json

    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, generate, prim_func_module
    from core.cuda.nvcc import find_nvcc
    from core.kernels.lint import lint_row
    from core.tuning.space import self_contained_cuda_space, uses_dynamic_shared_memory

    config = parse_line(line)
    mod, _ = prim_func_module(config)
    assert re.findall(r'(?:input\d|output0): T\.Buffer\(\([\d, ]+\), "(\w+)"\)', mod.script()) == ["float16"] * 3
    generator = self_contained_cuda_space()
    context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=generator, task_name="t")
    spaces = context.space_generator.generate_design_space(mod)
    assert spaces and not any(map(uses_dynamic_shared_memory, spaces))
    items = []
    for seed in (1, 21, 61, 81, 101, 121, 141, 161):
        generated = generate(config, "sm_90", scheduled=sampled_candidate(config, spaces[0], generator.postprocs,
                                                                           seed), check=False)
        assert generated.item is not None, generated.error
        assert "__shared__" in generated.item["code"] and "extern __shared__" not in generated.item["code"]
        row = next(r for r in half_rows([generated.item], tmp_path / f"k{seed}.db") if r.device_type == "CUDA_GPU")
        assert set(json.loads(row.function)["shared_memory"]["dtype"]) == {"uint16_t"}
        # Every candidate can be a row: with TVM's default widths a third were written with `half4`, a type of its
        # own prelude (lint's tvm-half-helper), and a sixth gathered 8 halves with make_uint4 (nvcc refuses both).
        assert [f.check for f in lint_row((1, *row.values()))] == [], seed
        items.append(generated.item)
    if find_nvcc(""):
        refused = injected_with_nvcc(items, tmp_path / "nvcc")
        assert refused.failed == 0, [f.reason for f in refused.failures]


def injected_with_nvcc(items: list[dict], work: Path):  # type: ignore[no-untyped-def, type-arg]
    import json

    from core.db.kernel_db import KernelDB
    from core.inject.pipeline import InjectOptions, Injector

    work.mkdir()
    (work / "k.json").write_text(json.dumps(items), encoding="utf-8")
    with KernelDB.open(work / "k.db", create=True) as db:
        return Injector(db, InjectOptions(compile=True, archs=("sm_90",)), state=None).run([work / "k.json"])


def test_a_half_op_config_tunes_a_float16_workload_in_a_work_dir_of_its_own(tmp_path: Path):
    """On the llvm target (the CPU: all that can run here) a half Dot is tuned as float16, never as its fp32 twin."""
    pytest.importorskip("tvm")
    from dataclasses import replace

    from core.tuning.job import TuneJob
    from core.tuning.run import run_tune

    half = parse_line("cublas_dot_op_half|a+8_64|b+64_48|o+8_48|ta+0|tb+0", "dot8")  # (M = 8: the CUDA cores)
    assert TuneJob(half, 1).directory(tmp_path) != TuneJob(replace(half, dtype="float"), 1).directory(tmp_path)
    result = run_tune(TuneJob(half, trials=2, target="llvm", trials_per_batch=2, builder_workers=1, seed=3),
                      tmp_path / "llvm")
    assert result.trials == 2 and result.best_seconds is not None
    from tvm.s_tir import meta_schedule as ms

    [workload] = list((tmp_path / "llvm").rglob("database_workload.json"))
    database = ms.database.JSONDatabase(path_workload=str(workload),
                                        path_tuning_record=str(workload.with_name("database_tuning_record.json")))
    tuned = {r.workload.mod.script() for r in database.get_all_tuning_records()}
    assert tuned and all("float16" in script and "float32" not in script for script in tuned)  # a half Dot: no cast


def test_kdb_model_fp16_gives_a_kept_float_depthwise_conv_its_own_copy_of_a_shared_bias(tmp_path: Path):
    """Held out in session 28 (a ShuffleNetV2 export): torch aliases equal constants through Identity nodes (the
    folded BNs' zero biases), so a depthwise conv kept in float and a converted conv read one tensor; the converter
    made it half and the model was no valid ONNX (exit 2)."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    ort = pytest.importorskip("onnxruntime")
    import numpy as np
    import onnx


    g = GraphBuilder({"x": [1, 8, 8, 8]})
    bias = g.constant("zero_bias", [0.01] * 8, np.float32)
    aliased = g.node("Identity", [bias], "alias")
    y = g.node("Conv", ["x", g.weight("dw", [8, 1, 3, 3], fan_in=9), bias], "dw_conv", group=8,
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    y = g.node("Conv", [y, g.weight("pw", [8, 8, 1, 1], fan_in=8), aliased], "pw_conv", kernel_shape=[1, 1])
    source = write(g.model(y, "shared_bias"), tmp_path / "shared.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "shared16.onnx"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "kept in float: 1 depthwise" in proc.stdout
    model = onnx.load(str(tmp_path / "shared16.onnx"))
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal([1, 8, 8, 8]).astype(np.float32)
    want = ort.InferenceSession(str(source)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(tmp_path / "shared16.onnx")).run(None, {"x": x.astype(np.float16)})[0]
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2)
    again = run_kdb("model", "fp16", str(tmp_path / "shared16.onnx"), str(tmp_path / "twice.onnx"))
    # (converted twice, the float left around the depthwise conv gave the converter's "not topologically sorted")
    assert again.returncode == 2 and "shared16.onnx: nothing to convert: the model is fp16 already" in again.stderr \
        and "convert the fp32 model" in again.stderr, again.stderr
    assert not (tmp_path / "twice.onnx").exists()


def test_kdb_model_fp16_keeps_a_timestep_embeddings_angles_in_float(tmp_path: Path):
    """Found in session 33 (a diffusion model's sinusoidal timestep embedding; NeRF's and Fourier features' high
    frequencies): in half t x frequency for t = 999 is off by up to 0.5, so the sines are noise (3.8% of the output).
    The Sin and Cos, the Mul and the Unsqueeze before them and the frequencies stay float; the converter's round trip
    to half between the Mul and its two readers is taken out, or the rounding happens there. Onnx's reference evaluator
    computes each node in its own type, as NNFusion does."""
    pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")
    import json

    import numpy as np
    import onnx
    from onnx.reference import ReferenceEvaluator

    g = GraphBuilder({"t": [4]})
    frequencies = np.exp(-np.log(10000) * np.arange(16) / 16).astype(np.float32)[None]
    angle = g.node("Mul", [g.node("Unsqueeze", ["t", g.constant("axis", [1])], "unsqueeze"),
                           g.constant("frequencies", frequencies.tolist(), np.float32)], "angle")
    y = g.node("Concat", [g.node("Sin", [angle], "sin"), g.node("Cos", [angle], "cos")], "embedding", axis=-1)
    source = write(g.model(y, "timestep", opset=13), tmp_path / "m.onnx")
    proc = run_kdb("model", "fp16", str(source), str(tmp_path / "h.onnx"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(json.loads(proc.stdout)["angles_float"]) == ["cos", "sin"]
    written = onnx.load(tmp_path / "h.onnx").graph
    (mul,) = [n for n in written.node if n.name == "angle"]
    assert {n.name for n in written.node if mul.output[0] in n.input} == {"sin", "cos"}  # (no Cast between)
    t = np.array([1, 250, 600, 999], np.float32)  # (whole timesteps: exact in half)
    want = ReferenceEvaluator(str(source)).run(None, {"t": t})[0]
    got = ReferenceEvaluator(str(tmp_path / "h.onnx")).run(None, {"t": t.astype(np.float16)})[0]
    assert np.abs(got.astype(np.float32) - want).max() < 2e-3, np.abs(got - want).max()

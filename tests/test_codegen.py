"""TVM 0.27 code generation: every op config gives one CUDA kernel whose math matches numpy and which the
injection pipeline takes unchanged (compile-checked with nvcc for sm_90)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_shared
from shared_data import ARTIFACT_OPCONFIGS, shared_path

pytest.importorskip("tvm")

from core.codegen.batch import generate_all, load_configs
from core.codegen.generate import extract_kernel, generate
from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.errors import InputError
from core.inject.pipeline import InjectOptions, Injector
from core.kernels.kernel_row import distinct_kernels
from core.opconfigs.opconfig import OpConfig, parse_line
from core.opconfigs.ort_prepass import PrePass

OTHER_OPS = [
    "cublas_dot_op_float|a+16_256|b+256_128|o+16_128|ta+0|tb+0",
    "cublas_dot_op_float|a+256_16|b+128_256|o+16_128|ta+1|tb+1",
    "cublas_dot_op_float|a+2_8_64|b+64_48|o+2_8_48|ta+0|tb+0",  # MatMul of a rank-3 activation (BERT's dense)
    "cublas_dot_op_float|a+2_3_4_32|b+32_24|o+2_3_4_24|ta+0|tb+0",
    "cublas_batch_matmul_op_float|a+2_8_16|b+2_16_8|o+2_8_8",  # attention's Q K^T (its row's OpType says Dot)
    "cublas_batch_matmul_op_float|a+1_3_20_24|b+1_3_24_20|o+1_3_20_20",
    "cublas_batch_matmul_op_float|a+1_64|b+64_48|o+1_48",  # a MatMul of a 1-D operand: no batch axis
    "cudnn_maxpool_op_float|i+1_64_56_56|o+1_64_28_28|win+3_3|ws+2_2|pb+1_1|pa+0_0",
    "cudnn_avgpool_op_float|i+1_32_28_28|o+1_32_28_28|win+3_3|ws+1_1|pb+1_1|pa+1_1",
    "elementwise_relu_op_float|i+1_64_56_56|o+1_64_56_56",
    "elementwise_add_op_float|i+4_1000|i+4_1000|o+4_1000",
    "elementwise_sigmoid_op_float|i+4096|o+4096",
    "cudnn_convolution_op_float|i+1_16_32_32|w+32_16_3_3|o+1_32_32_32|ws+1_1|wd+1_1|p+1_1|fuse+relu",
    "cudnn_convolution_op_float|i+1_16_32_32|w+16_16_3_3|o+1_16_32_32|ws+1_1|wd+1_1|p+1_1|fuse+add_relu",
    "cudnn_convolution_op_float|i+1_8_17_17|w+8_8_3_3|o+1_8_9_9|ws+2_2|wd+2_2|p+2_2",
]


def inject(items: list[dict], tmp_path: Path) -> tuple[int, list]:
    src = tmp_path / "generated.json"
    src.write_text(json.dumps(items))
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        report = Injector(db, InjectOptions(archs=("sm_90",), compile=True, workers=2), state=StateDB()).run([src])
    return report.injected, report.failures


@needs_shared(ARTIFACT_OPCONFIGS, "the Rammer artifact's op configs")
def test_every_shared_op_config_generates_checks_and_injects(tmp_path: Path):
    configs, errors = load_configs([shared_path(ARTIFACT_OPCONFIGS)], prepass=PrePass.not_checked("op-config files only"))
    assert not errors and len(configs) == 19
    report = generate_all(configs, "sm_90")
    assert not report.failed, [(g.config.source, g.stage, g.error) for g in report.failed]
    for g in report.generated:
        assert g.max_rel_error is not None and g.max_rel_error < 1e-4, g.config.source
    injected, failures = inject(report.items, tmp_path)
    assert failures == [] and injected == 19


def test_other_ops_and_fused_convolutions(tmp_path: Path):
    configs = [parse_line(line, f"case{i}") for i, line in enumerate(OTHER_OPS)]
    report = generate_all(configs, "sm_90")
    assert not report.failed, [(g.config.source, g.stage, g.error) for g in report.failed]
    assert all(g.max_rel_error is not None and g.max_rel_error < 1e-4 for g in report.generated)
    injected, failures = inject(report.items, tmp_path)
    assert failures == [] and injected == len(OTHER_OPS)
    with KernelDB.open(tmp_path / "k.db") as db:
        for g in report.generated:
            rows = db.find(g.config.signature().identifier)
            assert len(list(distinct_kernels(rows))) == 1, g.config.describe()
            fused = g.config.op_type.startswith("Fused_")  # a fused kernel has its CUDA twin beside it
            assert sorted(r.device_type for r in rows) == (["CUDA", "CUDA_GPU"] if fused else ["CUDA_GPU"])


def test_a_dot_of_a_rank_3_activation_is_one_gemm_its_kernel_checked_against_numpy():
    """The leading axes are rows of one [M, K] x [K, N] product (the kernel's buffers are flat); the float64
    reference takes the op config's shapes (GPU verification) or TVM's 2-D ones (the CPU check) alike."""
    from core.codegen.generate import prim_func_module
    from core.codegen.reference import inputs_for, reference

    config = parse_line("cublas_dot_op_float|a+2_8_64|b+64_48|o+2_8_48|ta+0|tb+0", "bert.txt:1")
    _mod, shapes = prim_func_module(config)
    assert shapes == [(16, 64), (64, 48), (16, 48)]
    result = generate(config, "sm_90")
    assert result.item is not None and result.error == ""
    assert result.max_rel_error is not None and result.max_rel_error < 1e-4
    assert result.item["parameters"]["arg0_shape"] == [2, 8, 64]  # the row keeps the shapes NNFusion looks up
    a, b = inputs_for(config, [(2, 8, 64), (64, 48)])
    want = np.einsum("bik,kn->bin", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(reference(config, [a, b]), want, rtol=1e-12)
    np.testing.assert_allclose(reference(config, [a.reshape(16, 64), b]), want, rtol=1e-12)


ONE_D = [  # a temporal conv net's ops: NNFusion looks them up with their 1-D shapes
    "cudnn_convolution_op_{t}|i+1_32_64|w+64_32_3|o+1_64_64|ws+1|wd+2|p+2|fuse+relu",
    "cudnn_convolution_op_{t}|i+1_16_33|w+32_16_5|o+1_32_16|ws+2|wd+1|p+1",
    "cudnn_maxpool_op_{t}|i+1_64_64|o+1_64_32|win+3|ws+2|pb+1|pa+0",
    "cudnn_avgpool_op_{t}|i+1_64_64|o+1_64_31|win+3|ws+2|pb+0|pa+0",
]


@pytest.mark.parametrize("dtype, math", [("float", ""), ("float", "tf32"), ("half", "")])
def test_one_d_convolutions_and_pools_generate_as_height_one_2d_ops(dtype: str, math: str):
    """The kernels are 2-D ones of height 1 (the same elements in the same order); the rows keep the 1-D shapes, and
    the reference takes the 1-D arrays the GPU verification gives it."""
    from dataclasses import replace

    from core.codegen.reference import inputs_for, reference

    for i, line in enumerate(ONE_D):
        config = replace(parse_line(line.format(t=dtype), f"tcn.txt:{i + 1}"), math=math if "conv" in line else "")
        result = generate(config, "sm_90")
        assert result.item is not None, (line, result.stage, result.error)
        assert result.max_rel_error is not None, line
        assert result.item["parameters"] == config.params  # 1-D, as looked up
    conv = parse_line(ONE_D[1].format(t="float"), "conv1d")
    x, w = inputs_for(conv, [(1, 16, 33), (32, 16, 5)])
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1)))
    want = np.stack([sum(xp[0, :, 2 * t + j] @ w[:, :, j].T.astype(np.float64) for j in range(5)) for t in range(16)],
                    axis=-1)[None]
    np.testing.assert_allclose(reference(conv, [x, w]).reshape(1, 32, 16), want, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["float", "half"])
def test_a_scalar_op_generates_checked_against_numpy(dtype: str):
    """torch's `head_dim ** -0.5` of a traced shape, exported: a Pow of two scalars, which NNFusion looks up
    (`Power;;floatfloatfloat`); it failed at define (`KeyError: 'out_shape'`), then at schedule (no loop to fuse)."""
    result = generate(parse_line(f"elementwise_power_op_{dtype}|i+|i+|o+", "scale.txt:1"), "sm_90")
    assert result.item is not None, (result.stage, result.error)
    assert result.max_rel_error is not None and result.item["parameters"]["output_shape"] == []


def test_a_3d_convolution_or_pool_is_refused_by_name():
    for line in ("cudnn_convolution_op_half|i+1_4_8_8_8|w+8_4_3_3_3|o+1_8_6_6_6|ws+1_1_1|wd+1_1_1|p+0_0_0",
                 "cudnn_maxpool_op_float|i+1_4_8_8_8|o+1_4_4_4_4|win+2_2_2|ws+2_2_2|pb+0_0_0|pa+0_0_0"):
        result = generate(parse_line(line, "vol.txt:1"), "sm_90")
        assert result.item is None and result.stage == "define", line
        assert "1-D and 2-D" in result.error and "3-D" in result.error and "vol.txt" not in result.error, result.error


def test_grouped_convolution_is_refused_with_what_nnfusion_really_does():
    config = parse_line("cudnn_convolution_op_float|i+1_32_8_8|w+32_1_3_3|o+1_32_8_8|ws+1_1|wd+1_1|p+1_1|g+32", "dw")
    result = generate(config, "sm_90")
    assert result.item is None and "write it as a cudnn_depthwise_conv2d_op line" in result.error
    assert "DepthwiseConv2dNative" in result.error and "cuDNN" not in result.error
    grouped = parse_line("cudnn_convolution_op_float|i+1_64_8_8|w+64_2_3_3|o+1_64_8_8|ws+1_1|wd+1_1|p+1_1|g+32", "rx")
    result = generate(grouped, "sm_90")  # ResNeXt's: the compiler aborts on it (tests/test_nnfusion_compiler.py)
    assert result.item is None and "importer aborts" in result.error and "cuDNN" not in result.error


def test_a_wrong_definition_would_be_caught_by_the_numpy_check(monkeypatch: pytest.MonkeyPatch):
    import core.codegen.reference as reference

    config = parse_line("elementwise_relu_op_float|i+64|o+64", "x")
    monkeypatch.setitem(reference._ELEMENTWISE, "Relu", lambda a: a)  # pretend ReLU were the identity
    result = generate(config, "sm_90")
    assert result.item is None and result.stage == "check" and "differs from numpy" in result.error


def test_more_than_one_kernel_is_a_failure_not_a_guess():
    two = ('extern "C" __global__ void main_kernel(float* a) { a[0] = 1; }\n'
           'extern "C" __global__ void main_kernel_1(float* a) { a[1] = 1; }\n')
    with pytest.raises(InputError, match="2 kernels"):
        extract_kernel(two, "k")


def test_invalid_config_fails_at_define():
    bad = OpConfig("Relu", {"input_shape": [4], "output_shape": [5]}, source="bad")
    result = generate(bad, "sm_90")
    assert result.item is None and result.stage == "define" and "output_shape" in result.error


@pytest.mark.slow
def test_launch_dims_of_metaschedule_schedules_with_annotations():
    """A tuned schedule's bindings carry annotations; the grid must still be read (found on the H200:
    a (1, 1, 1) grid left 99.8% of the outputs unwritten, and verification caught it)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.codegen.schedule import launch_dims

    config = parse_line("cudnn_convolution_op_float|i+1_64_27_27|w+192_64_5_5|o+1_192_27_27|ws+1_1|wd+1_1|p+2_2"
                        "|fuse+relu", "x")
    mod, _ = prim_func_module(config)
    ctx = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator="post-order-apply",
                         search_strategy="replay-trace", task_name="main", rand_state=7)
    space = ctx.generate_design_space()[0]
    sch = tvm.s_tir.Schedule(mod)
    space.trace.apply_to_schedule(sch, remove_postproc=False)
    for postproc in ctx.space_generator.postprocs:
        postproc.apply(sch)
    import re

    grid, block = launch_dims(sch.mod)
    script = sch.mod.script()
    assert "annotations" in script
    bound = {tag: int(n) for n, tag in re.findall(r'thread_binding\((\d+), thread="(blockIdx\.x|threadIdx\.x)"', script)}
    assert (grid[0], block[0]) == (bound["blockIdx.x"], bound["threadIdx.x"])


# -- element-wise ops: every op of NNFusion's element-op map ------------------------------------

def _elementwise_config(op: str, dtype: str = "float") -> OpConfig:
    from core.kernels.ops import ELEMENTWISE_ARITY

    return OpConfig(op, {"input_shapes": [[3, 67]] * ELEMENTWISE_ARITY[op], "output_shape": [3, 67]}, dtype=dtype,
                    source=f"ew:{op}")


def test_every_element_wise_op_has_a_definition_or_a_reason():
    from core.codegen.te_ops import elementwise_definitions
    from core.kernels.ops import ELEMENTWISE_ARITY, ELEMENTWISE_NO_ROW

    defined = set(elementwise_definitions("float32"))
    assert defined.isdisjoint(ELEMENTWISE_NO_ROW)
    assert defined | set(ELEMENTWISE_NO_ROW) == set(ELEMENTWISE_ARITY)


def test_element_wise_ops_match_numpy_and_inject(tmp_path: Path):
    """Every op with a definition: TVM's llvm build of it against the float64 reference (NNFusion's formula),
    then its CUDA kernel compiled by nvcc for sm_90 as the injection pipeline does."""
    from core.kernels.ops import ELEMENTWISE_ARITY, ELEMENTWISE_NO_ROW

    report = generate_all([_elementwise_config(op) for op in ELEMENTWISE_ARITY if op not in ELEMENTWISE_NO_ROW],
                          "sm_90")
    assert not report.failed, [(g.config.op_type, g.stage, g.error) for g in report.failed]
    assert all(g.max_rel_error is not None and g.max_rel_error < 1e-4 for g in report.generated)
    injected, failures = inject(report.items, tmp_path)
    assert failures == [] and injected == len(report.items), [(f.name, f.stage, f.reason) for f in failures]


@pytest.mark.parametrize("op", ["Equal", "Less", "And", "Not", "Select", "Max", "Nop"])
def test_element_wise_ops_no_row_can_serve_are_refused_with_the_reason(op: str):
    result = generate(_elementwise_config(op), "sm_90")
    assert result.item is None and result.stage == "define"
    assert result.error.startswith(f"no kernel-DB row for {op}: ")
    assert ("boolean" if op not in ("Max", "Nop") else "Max and Min are reductions" if op == "Max"
            else "no NNFusion operator is named Nop") in result.error


def test_a_dtype_codegen_cannot_write_is_refused_not_written_as_float():
    result = generate(_elementwise_config("Erf", "double"), "sm_90")
    assert result.item is None and result.stage == "define" and "op config is double" in result.error
    assert "kdb generates float and half kernels" in result.error


@pytest.mark.parametrize(("op", "wrong"), [
    ("Erf", lambda a: np.tanh(a)),  # close to erf near 0, and still wrong
    ("Gelu", lambda a: a * 0.5 * (1 + np.tanh(a))),
    ("DivNoNan", lambda x0, x1: np.where(x1 != 0, x0 / np.where(x1 != 0, x1, 1), x0)),  # wrong at the zeros
    ("Relu6", lambda a: np.maximum(a, 0)),
    ("Sign", lambda a: np.where(a > 0, 1.0, 0.0)),
])
def test_a_wrong_element_wise_reference_is_caught(monkeypatch: pytest.MonkeyPatch, op: str, wrong):
    """The check compares two independent definitions: a wrong formula on either side fails it."""
    import core.codegen.reference as reference

    monkeypatch.setitem(reference._ELEMENTWISE, op, wrong)
    result = generate(_elementwise_config(op), "sm_90")
    assert result.item is None and result.stage == "check" and "differs from numpy" in result.error


@pytest.mark.parametrize("line", [
    "cudnn_depthwise_conv2d_op_float|i+1_8_9_11|w+3_3_8_1|o+1_8_5_6|ws+2_2|wd+1_1|p+1_1",
    "cudnn_depthwise_conv2d_op_float|i+2_6_12_12|w+3_3_6_1|o+2_6_12_12|ws+1_1|wd+2_2|p+2_2",
    "cudnn_depthwise_conv2d_op_float|i+1_4_10_10|w+5_3_4_1|o+1_4_6_8|ws+1_1|wd+1_1|p+0_0",
])
def test_a_depthwise_kernel_computes_onnx_s_conv_with_the_filter_as_nnfusion_transposes_it(line: str):
    """The row's filter is ONNX's [C, 1, kh, kw] reshaped to [kh, kw, C, 1] (frontend/onnx_import/op/conv.cpp's
    Reshape with axis order 2, 3, 0, 1): ONNX Runtime's Conv of group = C on the ONNX filter gives what the kernel's
    reference gives on the transposed one, and codegen's kernel matches that reference (a window of 5 x 3: a swapped
    kh/kw or a channel-first read fails)."""
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (the `run` extra) judges the layout")
    from core.codegen.reference import reference
    from core.opconfigs.one_op_model import one_op_model

    config = parse_line(line)
    model = one_op_model(config)
    filters = next(np.frombuffer(t.raw_data, np.float32).reshape(t.dims) for t in model.graph.initializer)
    x = np.random.default_rng(1).standard_normal(config.params["input_shape"]).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {session.get_inputs()[0].name: x})
    got = reference(config, [x, filters.transpose(2, 3, 0, 1).copy()])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    generated = generate(config, "sm_90")
    assert generated.item is not None and generated.max_rel_error < 1e-5, generated.error

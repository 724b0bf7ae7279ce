"""Which column decides whether NNFusion uses a row (issue 39, "every op NNFusion asks the DB for"), proved with the
real compiler.

NNFusion fetches every node's identifier, BatchMatMul and Softmax included (`Trying to fetch kernel
BatchMatMul6,...`), and its FetchBasedSelector (engine/pass/graph/kernel_selection.cpp) takes any External row of
that identifier with the BlockCudaEmitter tag. Only engine/cache/manager.cpp's fetch_all stands between: it drops
the fetch when a row's OpType column is not in its SupportOpList (the element-op map, Dot, Convolution, AvgPool,
MaxPool, the two fused convolutions, Matched_Pattern), saying "Unsupported op_type". The OpType column is read for
nothing else: a BatchMatMul row whose OpType says Dot is used.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from onnx_models import GraphBuilder, write

from core.db.kernel_db import KernelDB

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
pytestmark = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")
IDENTIFIER = "BatchMatMul2,8,16;2,16,8;2,8,8floatfloatfloat"
MARK = "kdb-probe-batch-matmul"
# One thread per output element: out[b, i, j] = sum_k a[b, i, k] * b[b, k, j] (2 x 8 x 8 = 128 outputs).
BODY = f"""
  int t = (int)threadIdx.x;
  int b = t / 64, i = (t / 8) % 8, j = t % 8;
  float acc = 0.0f;
  for (int k = 0; k < 16; ++k) {{ acc = acc + input0[(b * 8 + i) * 16 + k] * input1[(b * 16 + k) * 8 + j]; }}
  output0[t] = acc;  /* {MARK} */
"""


def batched_matmul(path: Path) -> Path:
    """x[2, 8, 16] @ w[2, 16, 8]: NNFusion's importer makes it a BatchMatMul (a right operand of rank 3)."""
    g = GraphBuilder({"x": [2, 8, 16]})
    return write(g.model(g.node("MatMul", ["x", g.weight("w", [2, 16, 8])], "mm"), "bmm"), path)


def probe_db(path: Path, op_type: str, identifier: str = IDENTIFIER, body: str = BODY,
             params: str = "float* __restrict__ input0, float* __restrict__ input1, float* __restrict__ output0",
             threads: int = 128) -> Path:
    """A DB of one External row: `body` under `identifier` and OpType `op_type`."""
    KernelDB.open(path, create=True).close()
    function = {"function_signature": f'extern "C" __launch_bounds__({threads}) __global__ void ({params})',
                "function_body": body, "block_function_body": body, "grid_dim": [1, 1, 1], "block_dim": [threads, 1, 1],
                "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO KernelCache VALUES (?, ?, ?, ?, 'External', 'CUDA_GPU', ?, ?, ?)",
                   ("probe", identifier, op_type, json.dumps({}), json.dumps(function),
                    "KernelEmitter,CudaEmitter,BlockCudaEmitter",
                    json.dumps({"external_profile": {"time": "", "resource": threads}})))
    return path


def compile_model(model: Path, db: Path, out: Path) -> tuple[str, str]:
    out.mkdir()
    proc = subprocess.run([str(COMPILER), str(model), "-f", "onnx", f"-fkernel_cache_path={db}", "-min_log_level=0"],
                          cwd=out, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr, (out / "nnfusion_rt" / "cuda_codegen" / "nnfusion_rt.cu").read_text()


@pytest.mark.parametrize("op_type, used", [("BatchMatMul", False), ("Dot", True)])
def test_the_op_type_column_decides_and_the_identifier_matches(tmp_path: Path, op_type: str, used: bool):
    model = batched_matmul(tmp_path / "bmm.onnx")
    log, code = compile_model(model, probe_db(tmp_path / "k.db", op_type), tmp_path / "out")
    assert f"Trying to fetch kernel {IDENTIFIER} on DeviceType: CUDA_GPU" in log
    assert ("Unsupported op_type: BatchMatMul, ingore this fetch" in log) is not used
    assert (MARK in code) is used
    if not used:  # NNFusion's own: cuBLAS's batched GEMM
        assert "cublasSgemmStridedBatched" in code


def through_the_readme(tmp_path: Path, half: bool = False) -> tuple[str, dict[str, str], dict]:
    """tmp_path/m.onnx (made fp16 first with `kdb model fp16` when `half`) through `kdb opconfig extract`, `codegen`
    and `inject` into k.db, as the README has them: the model's file name, the commands' environment and what extract
    said (--json)."""
    from conftest import run_kdb

    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml")}
    model = "m16.onnx" if half else "m.onnx"
    if half:
        proc = run_kdb("model", "fp16", "m.onnx", model, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr[-1500:]
    said: dict = {}
    for step in (("opconfig", "extract", model, "-o", "ops.txt", "--json"),
                 ("codegen", "ops.txt", "-o", "k.json", "--arch", "sm_90", "--db", "k.db"),
                 ("inject", "k.json", "--db", "k.db")):
        proc = run_kdb(*step, cwd=tmp_path, env=env)
        assert proc.returncode == 0, (step, proc.stdout[-1500:], proc.stderr[-1500:])
        said = said or json.loads(proc.stdout)
    return model, env, said


def compiled(tmp_path: Path, model: str, env: dict[str, str], db: str = "k.db") -> dict:
    """`kdb nnfusion MODEL --json` with the real compiler: its report, which must be ok (promised == used)."""
    from conftest import run_kdb

    proc = run_kdb("nnfusion", model, "--db", db, "--nnfusion", str(COMPILER), "--json", cwd=tmp_path, env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"], (report["reason"], report.get("broken_promises"))
    return report


def used_identifiers(report: dict) -> set[str]:
    """The identifiers of the rows the compiled code runs."""
    return {e["identifier"] for e in report["coverage"] if e["row"] and e["row"]["key"] in
            report["usage"]["db_rows_used"]}


def test_kdb_serves_batch_matmuls_through_the_readme_commands(tmp_path: Path):
    """A 4-D attention product and one whose left operand is broadcast over the batch: extracted with the broadcast
    shapes the compiler looks up, generated, injected under OpType Dot, and run by the compiled code."""
    pytest.importorskip("tvm")

    g = GraphBuilder({"q": [1, 2, 8, 16], "x": [8, 32]})
    scores = g.node("MatMul", ["q", g.weight("k", [1, 2, 16, 8])], "scores")
    shared = g.node("MatMul", ["x", g.weight("w", [2, 32, 8])], "shared")
    write(g.model(g.node("Add", [g.node("Reshape", [scores, g.constant("s", [2, 8, 8])], "flat"), shared], "sum"),
                  "bmm4"), tmp_path / "m.onnx")
    model, env, _ = through_the_readme(tmp_path)
    lines = (tmp_path / "ops.txt").read_text().splitlines()
    assert "cublas_batch_matmul_op_float|a+1_2_8_16|b+1_2_16_8|o+1_2_8_8" in lines
    assert "cublas_batch_matmul_op_float|a+2_8_32|b+2_32_8|o+2_8_8" in lines
    with sqlite3.connect(tmp_path / "k.db") as db:
        assert {r[0] for r in db.execute("SELECT OpType FROM KernelCache WHERE Identifier LIKE 'BatchMatMul%'")} \
            == {"Dot"}
    used = used_identifiers(compiled(tmp_path, model, env))
    assert {"BatchMatMul1,2,8,16;1,2,16,8;1,2,8,8floatfloatfloat", "BatchMatMul2,8,32;2,32,8;2,8,8floatfloatfloat"} \
        <= used, used


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_kdb_serves_last_axis_softmaxes_through_the_readme_commands(tmp_path: Path, half: bool):
    """Attention's softmax and a classifier's: extracted, generated (a block per row), injected under OpType Dot with
    Softmax's identifier, and run by the compiled code. With the empty DB the same nodes run NNFusion's own softmax
    (ONNX Runtime's warp softmax, launched from a host function): kdb nnfusion says so instead of skipping them."""
    pytest.importorskip("tvm")

    g = GraphBuilder({"q": [1, 2, 8, 16]})
    scores = g.node("MatMul", ["q", g.weight("k", [1, 2, 16, 8])], "scores")
    probs = g.node("Softmax", [scores], "probs", axis=-1)
    context = g.node("MatMul", [probs, g.weight("v", [1, 2, 8, 16])], "context")
    logits = g.node("Reshape", [context, g.constant("flat", [1, 256])], "logits")
    write(g.model(g.node("Softmax", [logits], "classes", axis=1), "attn"), tmp_path / "m.onnx")
    model, env, _ = through_the_readme(tmp_path, half)
    dtype = "half" if half else "float"
    lines = (tmp_path / "ops.txt").read_text().splitlines()
    assert {f"cudnn_softmax_op_{dtype}|i+1_2_8_8|o+1_2_8_8", f"cudnn_softmax_op_{dtype}|i+1_256|o+1_256"} <= set(lines)
    softmaxes = {f"Softmax1,2,8,8;1,2,8,8{dtype}{dtype}", f"Softmax1,256;1,256{dtype}{dtype}"}
    with sqlite3.connect(tmp_path / "k.db") as db:
        rows = dict(db.execute("SELECT Identifier, OpType FROM KernelCache WHERE Identifier LIKE 'Softmax%'"))
    assert rows == dict.fromkeys(softmaxes, "Dot")

    used = used_identifiers(compiled(tmp_path, model, env))
    assert softmaxes <= used, used
    empty = compiled(tmp_path, model, env, "empty.db")["usage"]
    runs = {part["node"]: part["runs"] for step in empty["steps"] for part in step["parts"]}
    assert runs["probs_out"] == runs["classes_out"] == "NNFusion's kernel", runs


def test_kdb_serves_sums_whose_shapes_tell_their_axes_through_the_readme_commands(tmp_path: Path):
    """A LayerNorm's two ReduceMeans and a ReduceSum over the batch: NNFusion fetches each Sum by its two shapes
    (Sum1,64,256;1,64floatfloat) and runs a row of OpType Dot under it. A ReduceMean of [1, 8, 8] over its last axis
    gives [1, 8] -> from [1, 8, 8] by either of two axes: unmapped, its reason said, NNFusion's own kernel runs it."""
    pytest.importorskip("tvm")

    g = GraphBuilder({"x": [1, 64, 256], "y": [8, 1000], "z": [1, 8, 8]})
    centred = g.node("Sub", ["x", g.node("ReduceMean", ["x"], "mean", axes=[-1], keepdims=1)], "centred")
    var = g.node("ReduceMean", [g.node("Mul", [centred, centred], "square")], "var", axes=[-1], keepdims=1)
    normed = g.node("Div", [centred, g.node("Sqrt", [var], "std")], "normed")
    batch = g.node("ReduceSum", ["y"], "batch_sum", axes=[0], keepdims=0)
    square = g.node("ReduceMean", ["z"], "ambiguous", axes=[-1], keepdims=0)
    model = g.model(normed, "sums")
    from onnx import TensorProto, helper

    model.graph.output.extend([helper.make_tensor_value_info(batch, TensorProto.FLOAT, [1000]),
                               helper.make_tensor_value_info(square, TensorProto.FLOAT, [1, 8])])
    write(model, tmp_path / "m.onnx")
    model, env, said = through_the_readme(tmp_path)
    unmapped = {u["node"]: u["reason"] for u in said["unmapped"]}
    assert "cannot tell them apart" in unmapped["ambiguous/sum"], unmapped
    sums = {line for line in (tmp_path / "ops.txt").read_text().splitlines() if "reduce_sum" in line}
    assert sums == {"cudnn_reduce_sum_op_float|i+1_64_256|o+1_64", "cudnn_reduce_sum_op_float|i+8_1000|o+1000"}
    used = used_identifiers(compiled(tmp_path, model, env))
    assert {"Sum1,64,256;1,64floatfloat", "Sum8,1000;1000floatfloat"} <= used, used
    with sqlite3.connect(tmp_path / "k.db") as db:
        assert {r[0] for r in db.execute("SELECT OpType FROM KernelCache WHERE Identifier LIKE 'Sum%'")} == {"Dot"}


@pytest.mark.parametrize("biased", [False, True])
def test_an_l2_normalize_is_served_as_the_square_sum_and_sqrt_nnfusion_makes_of_it(tmp_path: Path, biased: bool):
    """F.normalize as torch exports it: ReduceL2 (keepdims), Max with eps, Expand, Div. NNFusion's importer makes the
    ReduceL2 a Square, a Sum and a Sqrt (op/reducel2.hpp); the Sqrt fuses with the Max into a kernel of its own. Held
    out in session 30: coverage knew none of it and promised the Max a row the compiled code never ran. Held out in
    session 31: after a Linear's bias Add, the Expand (a Broadcast, op/expand.cpp) and the Div fuse with the Add, and
    the Div's promised row was never run."""
    pytest.importorskip("tvm")

    g = GraphBuilder({"x": [1, 16, 64]})
    y = g.node("MatMul", ["x", g.weight("w", [64, 64])], "mm")
    if biased:
        y = g.node("Add", [y, g.weight("b", [64])], "bias")
    norm = g.node("ReduceL2", [y], "norm", axes=[-1], keepdims=1)
    clamped = g.node("Max", [norm, g.constant("eps", [1e-12], np.float32)], "clamp")
    wide = g.node("Expand", [clamped, g.constant("shape", [1, 16, 64])], "expand")
    out = g.node("Div", [y, wide], "div")
    if biased:  # (and less its row's largest value, a MaxPool: the held-out network's)
        rows = g.node("Reshape", [out, g.constant("rows", [1, 1, 16, 64])], "rows")
        pooled = g.node("MaxPool", [rows], "pool", kernel_shape=[1, 64], strides=[1, 64])
        largest = g.node("Reshape", [pooled, g.constant("kept", [1, 16, 1])], "largest")
        out = g.node("Add", [g.node("Sub", [out, largest], "less"), g.node("Relu", ["x"], "skip")], "sum")
    write(g.model(out, "normalize"), tmp_path / "m.onnx")
    model, env, _ = through_the_readme(tmp_path)
    lines = set((tmp_path / "ops.txt").read_text().splitlines())
    assert "cudnn_reduce_sum_op_float|i+1_16_64|o+1_16" in lines
    assert ("elementwise_square_op_float|i+1_16_64|o+1_16_64" in lines) != biased, lines  # (biased: fused with it)
    assert not any("maximum" in line or "sqrt" in line for line in lines), lines  # (fused: never looked up)
    used = used_identifiers(compiled(tmp_path, model, env))
    assert "Sum1,16,64;1,16floatfloat" in used, used


CONCAT = "Concat1,2,4;1,3,4;1,5,4floatfloatfloat"
CONCAT_BODY = """
  int t = (int)threadIdx.x;
  if (t < 20) { output0[t] = t < 8 ? input0[t] : input1[t - 8]; }  /* kdb-probe-concat */
"""


def test_a_concat_row_under_op_type_dot_is_used_too(tmp_path: Path):
    """NNFusion fetches a Concat's identifier (DenseNet's `Concat1,128,56,56;1,32,56,56;1,160,56,56floatfloatfloat`)
    and uses a row of it under OpType Dot, as a BatchMatMul's. Where the inputs could be laid out in place in the
    output (every axis before the joined one of size 1; not here, since they are the graph's inputs), the row makes it
    copy them instead (test_an_in_place_concat_given_a_row_is_copied_by_it)."""
    g = GraphBuilder({"x": [1, 2, 4], "y": [1, 3, 4]})
    model = write(g.model(g.node("Concat", ["x", "y"], "cat", axis=1), "cat"), tmp_path / "cat.onnx")
    log, code = compile_model(model, concat_probe_db(tmp_path / "k.db"), tmp_path / "out")
    assert f"Trying to fetch kernel {CONCAT} on DeviceType: CUDA_GPU" in log
    assert "kdb-probe-concat" in code


def test_an_in_place_concat_given_a_row_is_copied_by_it(tmp_path: Path):
    """Why kdb makes no row for a Concat whose axes before the joined one all have size 1: with the empty DB NNFusion
    lays its inputs out in the output and launches nothing for it (inplace_tensor_analysis.cpp logs "inlace_concat:
    1"); with a row of its identifier the row's kernel runs, a copy that was not there."""
    g = GraphBuilder({"x": [1, 2, 4], "y": [1, 3, 4]})
    cat = g.node("Concat", [g.node("Relu", ["x"], "rx"), g.node("Sigmoid", ["y"], "sy")], "cat", axis=1)
    model = write(g.model(g.node("Tanh", [cat], "out"), "cat"), tmp_path / "cat.onnx")
    empty = tmp_path / "empty.db"
    KernelDB.open(empty, create=True).close()
    log, code = compile_model(model, empty, tmp_path / "own")
    assert "inlace_concat: 1" in log
    assert "// eliminated: Concat_" in code
    log, code = compile_model(model, concat_probe_db(tmp_path / "k.db"), tmp_path / "row")
    assert "inlace_concat: 0" in log
    launches = [line for line in code.splitlines() if "Concat_" in line and "_Call(dim3" in line]
    assert "kdb-probe-concat" in code and launches and not any(line.startswith("//") for line in launches)


def concat_probe_db(db: Path) -> Path:
    return probe_db(db, "Dot", CONCAT, CONCAT_BODY, threads=32)


GATHER = "GatherV210,4;1,3;1,3,4floatint64_tfloat"
GATHER_BODY = """
  int t = (int)threadIdx.x;
  if (t < 12) { output0[t] = input0[input1[t / 4] * 4 + t % 4]; }  /* kdb-probe-gather */
"""


def test_a_gather_row_under_op_type_dot_is_used_though_kdb_makes_none(tmp_path: Path):
    """An ONNX Gather (an embedding lookup) is NNFusion's GatherV2, fetched with its indices' type in the identifier
    (int64_t): a row of it under OpType Dot is used, as a Concat's. kdb makes none, since an op config has one element
    type for all its tensors, and extraction says so."""
    from core.opconfigs.onnx_extract import extract

    g = GraphBuilder({"x": [1, 3, 4]})
    embedded = g.node("Gather", [g.weight("table", [10, 4]), g.constant("ids", [[1, 5, 2]])], "embed", axis=0)
    model = write(g.model(g.node("Add", [embedded, "x"], "out"), "gather"), tmp_path / "gather.onnx")
    db = probe_db(tmp_path / "k.db", "Dot", GATHER, GATHER_BODY,
                  "float* __restrict__ input0, int64_t* __restrict__ input1, float* __restrict__ output0", 32)
    log, code = compile_model(model, db, tmp_path / "out")
    assert f"Trying to fetch kernel {GATHER} on DeviceType: CUDA_GPU" in log
    assert "kdb-probe-gather" in code
    (reason,) = [u.reason for u in extract(model).unmapped if u.op_type == "Gather"]
    assert "would be used" in reason and "int64_t" in reason


@pytest.mark.parametrize("op, identifier, params", [
    ("Pad", "Pad1,4,6,6;;1,4,8,8floatfloatfloat", "float* input0, float* input1, float* output0"),
    ("Transpose", "Reshape1,4,8,8;1,8,8,4floatfloat", "float* input0, float* output0"),
])
def test_a_pad_or_transpose_row_under_op_type_dot_is_used_and_kdb_says_why_it_makes_none(
        tmp_path: Path, op: str, identifier: str, params: str):
    """NNFusion fetches a Pad (its pad value a second, scalar input) and a Transpose (a Reshape with an input order) by
    their shapes alone, and a row of either under OpType Dot is used: for every node of those shapes, however padded or
    ordered. Extraction says so, rather than "no kernel-DB op type"."""
    import numpy as np

    from core.opconfigs.onnx_extract import extract

    g = GraphBuilder({"x": [1, 4, 6, 6] if op == "Pad" else [1, 4, 8, 8]})
    if op == "Pad":
        y = g.node("Pad", ["x", g.constant("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))], "pad",
                   mode="constant")  # (written out: without it the importer crashes)
    else:
        y = g.node("Transpose", ["x"], "tr", perm=[0, 2, 3, 1])
    model = write(g.model(g.node("Exp", [y], "out"), op.lower()), tmp_path / "m.onnx")
    body = "\n  output0[threadIdx.x] = 0.0f;  /* kdb-probe-layout */\n"
    db = probe_db(tmp_path / "k.db", "Dot", identifier, body, params.replace("* ", "* __restrict__ "), 32)
    log, code = compile_model(model, db, tmp_path / "out")
    assert f"Trying to fetch kernel {identifier} on DeviceType: CUDA_GPU" in log
    assert "kdb-probe-layout" in code
    (reason,) = [u.reason for u in extract(model).unmapped if u.op_type == op]
    assert "would be used" in reason and "generate_identifier" in reason


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_kdb_serves_the_concats_nnfusion_copies_through_the_readme_commands(tmp_path: Path, half: bool):
    """A Concat on the last axis of [1, 8, *] (NNFusion copies it with a kernel) is extracted, generated, injected under
    OpType Dot with Concat's identifier, and run by the compiled code; one on the channels of a batch of 1 (laid out in
    place, no kernel) gets no row and still runs none."""
    pytest.importorskip("tvm")

    g = GraphBuilder({"x": [1, 8, 16], "y": [1, 8, 8]})
    last = g.node("Concat", [g.node("Relu", ["x"], "rx"), g.node("Sigmoid", ["y"], "sy")], "cat_last", axis=-1)
    tanh = g.node("Tanh", [last], "t")
    chan = g.node("Concat", [tanh, g.node("Relu", [tanh], "rt")], "cat_chan", axis=1)
    write(g.model(g.node("Exp", [chan], "out"), "cat"), tmp_path / "m.onnx")
    model, env, _ = through_the_readme(tmp_path, half)
    dtype = "half" if half else "float"
    assert [line for line in (tmp_path / "ops.txt").read_text().splitlines() if line.startswith("concat")] == \
        [f"concat_op_{dtype}|i+1_8_16|i+1_8_8|o+1_8_24"]
    identifier = f"Concat1,8,16;1,8,8;1,8,24{dtype * 3}"
    with sqlite3.connect(tmp_path / "k.db") as db:
        assert dict(db.execute("SELECT Identifier, OpType FROM KernelCache WHERE Identifier LIKE 'Concat%'")) == \
            {identifier: "Dot"}
    report = compiled(tmp_path, model, env)
    used = used_identifiers(report)
    assert identifier in used, used
    nodes = {part["node"] for step in report["usage"]["steps"] for part in step["parts"]}
    assert not any(n.startswith("cat_chan") for n in nodes), nodes  # laid out in place: no step runs it


def test_nnfusion_skips_a_concat_of_a_constant_and_a_graph_input_and_kdb_says_so_and_serves_it(tmp_path: Path):
    """Concat(a weight, the graph's input) on axis 1 of a batch of 1 (a learned token or a soft prompt before the input
    sequence): the in-place analysis declines the graph input (inlace_concat: 0), yet NNFusion's ConcatKernel leaves
    the Concat out, since the constant and the output both sit at offset 0 of their own pools; nothing writes the
    output. `kdb nnfusion` with the empty DB names it and exits 1; extraction serves the Concat, and with its row the
    compiled code copies it."""
    g = GraphBuilder({"tokens": [1, 3, 4]})
    joined = g.node("Concat", [g.weight("prompt", [1, 2, 4]), "tokens"], "prompted", axis=1)
    write(g.model(g.node("Tanh", [joined], "out"), "prompt"), tmp_path / "m.onnx")
    model, env, said = through_the_readme(tmp_path)
    assert "concat_op_float|i+1_2_4|i+1_3_4|o+1_5_4" in (tmp_path / "ops.txt").read_text().splitlines(), said
    from conftest import run_kdb

    proc = run_kdb("nnfusion", model, "--db", "empty.db", "--nnfusion", str(COMPILER), "--json", cwd=tmp_path, env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and not report["ok"], report["problems"]
    (skipped,) = report["usage"]["skipped_copies"]
    assert "Concat" in skipped and "wrong numbers" in skipped and any("wrong numbers" in p for p in report["problems"])
    fixed = compiled(tmp_path, model, env)
    assert fixed["usage"]["skipped_copies"] == []
    assert "Concat1,2,4;1,3,4;1,5,4floatfloatfloat" in used_identifiers(fixed)

"""Coverage: what NNFusion will run for each op of a model, and why a row is not used.

Each rule of the model (core/nnfusion/coverage.py) has a test here, on small ONNX models and hand-made rows;
tests/test_nnfusion_compiler.py holds the model against the real compiler.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from conftest import run_kdb_json
from onnx_models import GraphBuilder, depthwise_block, mlp, resnet_block, write

from core.db.kernel_db import KernelDB
from core.kernels.kernel_row import COLUMNS, KernelRow, needs_pattern_twin, pattern_twin
from core.kernels.ops import BASE_TAGS
from core.nnfusion.compiler import CompilerFlags
from core.nnfusion.coverage import (
    ABORTS,
    DB_KERNEL,
    FALLS_BACK,
    FUSED_AWAY,
    IN_DB,
    MISSING,
    NOT_USED,
    coverage,
    summarize,
)
from core.opconfigs.onnx_extract import Extraction, extract
from core.opconfigs.opconfig import OpConfig

FUNCTION = {"function_signature": 'extern "C" __global__  void (float* input0, float* input1, float* output0)',
            "function_body": "", "grid_dim": [1, 1, 1], "block_dim": [1, 1, 1], "block_function_body": "",
            "shared_memory": {"symbol": [], "dtype": [], "size": []}, "num_syncthreads": 0}
H200 = "NVIDIA H200"


def kernel_row(config: OpConfig, device: str = "CUDA_GPU", extra_tags: tuple[str, ...] = (), *,
               time_us: float | None = None, resource: int = 32, salt: str = "", op_type: str = "") -> KernelRow:
    """A row as injection would write it for this op config (the kernel body does not matter here)."""
    sig = config.signature()
    tags = ",".join((*BASE_TAGS, *extra_tags))
    key = "test:" + hashlib.sha256(f"{sig.identifier}|{device}|{tags}|{salt}".encode()).hexdigest()[:20]
    profile = {"time": f"{H200}:{time_us};" if time_us is not None else "", "resource": resource}
    return KernelRow(key, sig.identifier, op_type or sig.op_type, json.dumps(sig.attributes()), "External", device,
                     json.dumps(FUNCTION), tags, json.dumps({"external_profile": profile}))


def make_db(path: Path, rows: list[KernelRow], *, raw: bool = False, twins: bool = False) -> Path:
    """Rows through KernelDB (fused kernels get their twin; each op's rows kept fastest-first), or raw: exactly these
    rows in this order (as NNFusion's import script or another tool writes them), with `twins` each fused row's CUDA
    twin after it."""
    with KernelDB.open(path, create=True) as db:
        if not raw:
            for row in rows:
                db.insert(row)
    if raw:
        written = [r for row in rows for r in ((row, pattern_twin(row)) if twins and needs_pattern_twin(row) else (row,))]
        conn = sqlite3.connect(path)
        with conn:
            conn.executemany(f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             [r.values() for r in written])
        conn.close()
    return path


def entries_for(model_path: Path, db_path: Path, flags: CompilerFlags | None = None):  # type: ignore[no-untyped-def]
    with KernelDB.open(db_path) as db:
        return coverage(extract(model_path), db, flags, H200)


def test_a_fused_kernel_with_its_twin_runs_and_one_without_does_not(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    conv_relu = extract(model).configs[0]
    paired = make_db(tmp_path / "paired.db", [kernel_row(conv_relu)])
    first, second = entries_for(model, paired)
    assert (first.status, first.runs, first.count) == (IN_DB, DB_KERNEL, 1)
    assert (second.status, second.runs) == (MISSING, "cuDNN + the Add/Relu as element-wise nodes")
    assert second.lookup == second.config.__class__("Convolution", second.config.params).signature().identifier

    alone = make_db(tmp_path / "alone.db", [kernel_row(conv_relu)], raw=True)  # NNFusion's import script's way
    first = entries_for(model, alone)[0]
    assert first.status == NOT_USED
    assert first.runs == "cuDNN + the Add/Relu as element-wise nodes"
    assert any("kdb db repair" in r for r in first.reasons)


def test_a_cuda_row_alone_makes_the_compiler_abort(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    conv_relu = extract(model).configs[0]
    db = make_db(tmp_path / "k.db", [pattern_twin(kernel_row(conv_relu))], raw=True)
    assert entries_for(model, db)[0].status == ABORTS


def test_rows_under_another_device_type_are_named(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    conv_add_relu = extract(model).configs[1]
    db = make_db(tmp_path / "k.db", [kernel_row(conv_add_relu, device="ROCM_GPU")])
    entry = entries_for(model, db)[1]
    assert entry.status == MISSING
    assert any("DeviceType 'ROCM_GPU'" in r for r in entry.reasons)


def test_the_first_row_in_table_order_is_used_and_interplay_prefers_time_x_resource(tmp_path: Path):
    """A DB another tool wrote, the slowest row first (kdb's own writes keep rows fastest-first, core/db/op_rows.py):
    the compiler takes that first row, not the fastest."""
    model = write(resnet_block(), tmp_path / "block.onnx")
    conv_relu = extract(model).configs[0]
    slow = kernel_row(conv_relu, time_us=30.0, resource=2048, salt="slow")
    fast = kernel_row(conv_relu, time_us=10.0, resource=4096, salt="fast")
    lean = kernel_row(conv_relu, time_us=12.0, resource=512, salt="lean")
    db = make_db(tmp_path / "k.db", [slow, fast, lean], raw=True, twins=True)
    entry = entries_for(model, db)[0]
    assert entry.row is not None
    assert (entry.row.key, entry.row.rows, entry.row.time_us) == (slow.key, 3, 30.0)
    assert "first of 3 External rows in table order" in entry.row.why
    assert entry.row.interplay_key == lean.key  # 12 x 512 < 10 x 4096 < 30 x 2048
    without = entries_for(model, db, CompilerFlags(blockfusion_interplay=False))[0]
    assert without.row is not None and without.row.interplay_key is None


def test_no_profile_for_the_product_is_said(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    db = make_db(tmp_path / "k.db", [kernel_row(extract(model).configs[0])])
    entry = entries_for(model, db)[0]
    assert entry.row is not None and entry.row.time_us is None
    assert any(f"no profile for {H200}" in r and "10 us" in r for r in entry.reasons)


def test_an_unsupported_op_type_poisons_the_identifier(tmp_path: Path):
    model = write(mlp(), tmp_path / "mlp.onnx")
    gemm1 = extract(model).configs[0]
    db = make_db(tmp_path / "k.db", [kernel_row(gemm1, extra_tags=("transB",)),
                                     kernel_row(gemm1, extra_tags=("transB",), salt="bn", op_type="BatchNormInference")], raw=True)
    entry = entries_for(model, db)[0]
    assert (entry.status, entry.runs) == (NOT_USED, "cuBLAS")
    assert any("unsupported OpType 'BatchNormInference'" in r for r in entry.reasons)


def test_a_dot_row_with_other_tags_is_used_anyway_and_said(tmp_path: Path):
    """Kernel selection does not read Tags: the compiler runs the row whatever its transA/transB say. Where they are
    known (a row of kdb's, which always writes them, or one whose Tags name a transpose) that is wrong numbers: the
    held-out GCN's X @ W and its Linear head, both 64x64, ran one row, exit 0."""
    from dataclasses import replace

    model = write(mlp(), tmp_path / "mlp.onnx")
    gemm1 = extract(model).configs[0]  # transB
    db = make_db(tmp_path / "k.db", [kernel_row(gemm1)])  # another tool's row, no transposes in its Tags
    entry = entries_for(model, db)[0]
    assert entry.status == IN_DB and not entry.wrong_numbers
    assert any("Tags say no transpose" in r for r in entry.reasons)
    ours = kernel_row(gemm1)
    db = make_db(tmp_path / "kdb.db", [replace(ours, key="kdb:" + ours.key.removeprefix("test:"))])
    entry = entries_for(model, db)[0]
    assert entry.wrong_numbers and "Tags say no transpose, the op has ['transB']" in entry.wrong_numbers[0]


def test_an_identifier_that_differs_is_pointed_at(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    conv_relu = extract(model).configs[0]
    p = dict(conv_relu.params, padding_below_diff=[0, 0], output_shape=[1, 64, 54, 54])
    other = OpConfig("Fused_Convolution_Relu", p)
    db = make_db(tmp_path / "k.db", [kernel_row(other)])
    entry = entries_for(model, db)[0]
    assert entry.status == MISSING
    assert any("differ" in r and other.signature().identifier in r for r in entry.reasons)


def _lone_relu_model(tmp_path: Path) -> Path:
    """Conv (no bias) -> Relu -> Flatten -> Gemm: the Relu fuses with the conv when substituted, else stands
    alone; the Gemm's bias Add stands alone."""
    g = GraphBuilder({"x": [1, 4, 8, 8]})
    y = g.node("Relu", [g.conv("x", 4, 4, 3, name="c")], "r")
    y = g.node("MatMul", [g.node("Flatten", [y], "f", axis=1), g.weight("w", [256, 10])], "mm")
    y = g.node("Relu", [g.node("Sigmoid", [y], "s")], "r2")
    return write(g.model(y, "lone"), tmp_path / "lone.onnx")


def test_element_wise_ops_are_fused_away_in_chains_and_looked_up_alone(tmp_path: Path):
    block = write(resnet_block(), tmp_path / "block.onnx")
    add_row = kernel_row(OpConfig("Add", {"input_shapes": [[1, 64, 56, 56]] * 2, "output_shape": [1, 64, 56, 56]}))
    db = make_db(tmp_path / "k.db", [add_row])
    entries = entries_for(block, db)
    # resnet_block: conv2 -> Add(residual) -> Relu: the Add and Relu are one NNFusion kernel at the default level
    assert [e.status for e in entries] == [MISSING, MISSING]  # its configs are the two fused convs
    lone = _lone_relu_model(tmp_path)
    sig_relu = OpConfig("Sigmoid", {"input_shapes": [[1, 10]], "output_shape": [1, 10]})
    db2 = make_db(tmp_path / "k2.db", [kernel_row(sig_relu)])
    by_type = {e.config.op_type: e for e in entries_for(lone, db2)}
    assert by_type["Sigmoid"].status == FUSED_AWAY and by_type["Relu"].status == FUSED_AWAY
    assert summarize(entries_for(lone, db2))["ops"][FUSED_AWAY] == 2
    level0 = {e.config.op_type: e for e in entries_for(lone, db2, CompilerFlags(kernel_fusion_level=0))}
    assert level0["Sigmoid"].status == IN_DB and level0["Relu"].status == MISSING


def test_pattern_substitution_off_leaves_fused_rows_unused(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    db = make_db(tmp_path / "k.db", [kernel_row(extract(model).configs[0])])
    entry = entries_for(model, db, CompilerFlags(pattern_substitution=False))[0]
    assert entry.status == NOT_USED
    assert any("-fpattern_substitution=false" in r for r in entry.reasons)


def test_a_models_depthwise_conv_is_a_lookup_and_hand_written_grouped_lines_say_what_nnfusion_does(tmp_path: Path):
    model = write(depthwise_block(), tmp_path / "dw.onnx")
    assert [e.config.op_type for e in entries_for(model, make_db(tmp_path / "k.db", []))] == [
        "DepthwiseConv2dNative", "Relu", "Fused_Convolution_Relu"]  # (a hand-written g+32 line is no lookup)
    conv = {"input_shape": [1, 32, 8, 8], "output_shape": [1, 32, 8, 8], "window_movement_strides": [1, 1],
            "window_dilation_strides": [1, 1], "padding_below_diff": [1, 1]}
    depthwise = OpConfig("Convolution", {**conv, "filter_shape": [32, 1, 3, 3]}, 32, source="dw")
    grouped = OpConfig("Convolution", {**conv, "filter_shape": [32, 8, 3, 3]}, 4, source="g4")
    hand_written = Extraction("op configs", 2, [depthwise, grouped], {depthwise.key: [("dw",)], grouped.key: [("g4",)]})
    with KernelDB.open(make_db(tmp_path / "k.db", [])) as db:
        dw_entry, grouped_entry = coverage(hand_written, db, None, H200)
    assert (dw_entry.status, dw_entry.runs) == (FALLS_BACK, "DepthwiseConv2dNative (NNFusion's kernel)")
    assert "depthwise convolution (group=32)" in dw_entry.reasons[0]
    assert grouped_entry.status == ABORTS and "importer aborts" in grouped_entry.reasons[0]


def test_flops_share_counts_only_ops_that_run_db_kernels(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    conv_relu, conv_add_relu = extract(model).configs
    summary = summarize(entries_for(model, make_db(tmp_path / "k.db", [kernel_row(conv_relu)])))
    assert summary["db_flops_share"] == pytest.approx(conv_relu.flops / (conv_relu.flops + conv_add_relu.flops))
    unused = summarize(entries_for(model, make_db(tmp_path / "u.db", [kernel_row(conv_relu)], raw=True)))
    assert unused["db_flops_share"] == 0


def test_cli_coverage_json_exit_status_and_table(tmp_path: Path):
    model = write(resnet_block(), tmp_path / "block.onnx")
    ext = extract(model)
    db_path = make_db(tmp_path / "k.db", [kernel_row(c) for c in ext.configs])
    proc, data = run_kdb_json("coverage", "--db", str(db_path), str(model), "--product-name", H200)
    assert proc.returncode == 0, proc.stderr
    assert [e["status"] for e in data["entries"]] == [IN_DB, IN_DB]
    assert data["summary"]["db_flops_share"] == 1.0
    db_path = make_db(tmp_path / "k1.db", [kernel_row(ext.configs[0])])
    proc, data = run_kdb_json("coverage", "--db", str(db_path), str(model))
    assert proc.returncode == 1  # an op is missing: a finding, as the README says
    assert [e["status"] for e in data["entries"]] == [IN_DB, MISSING]


def test_a_bert_dense_dot_is_promised_from_its_row_and_falls_back_to_cublas_without(tmp_path: Path):
    """NNFusion makes a Dot of a [1,128,768] x [768,768] MatMul: coverage promises its row (the compiler test
    finds it used), and says cuBLAS runs it while the DB has none; the bias Add after it, alone, is looked up as a
    full-shape Add."""
    g = GraphBuilder({"x": [1, 128, 768]})
    y = g.node("Add", [g.node("MatMul", ["x", g.weight("w", [768, 768])], "dense"), g.weight("b", [768])], "bias")
    model = write(g.model(y, "bert_dense"), tmp_path / "bert.onnx")
    dot, add = extract(model).configs
    row = kernel_row(dot)
    assert row.identifier == "Dot1,128,768;768,768;1,128,768floatfloatfloat"
    assert add.signature().identifier == "Add1,128,768;1,128,768;1,128,768floatfloatfloat"
    entry, add_entry = entries_for(model, make_db(tmp_path / "k.db", [row]))
    assert (entry.status, entry.runs, entry.row and entry.row.key) == (IN_DB, DB_KERNEL, row.key)
    assert entry.db_flops == 2 * 128 * 768 * 768
    assert (add_entry.status, add_entry.runs) == (MISSING, "NNFusion's kernel")
    none, _ = entries_for(model, make_db(tmp_path / "empty.db", []))
    assert (none.status, none.runs, none.row) == (MISSING, "cuBLAS", None)


def test_a_compiler_that_threw_is_reported_with_the_exceptions_message(tmp_path: Path):
    """The `what():` line carries the message of the exception that ended NNFusion (the NASNet cell of
    tests/test_zoo.py, its log's last two lines here): the decisive lines keep it, not the exception's type alone."""
    from core.nnfusion.compiler import CompileResult

    log = tmp_path / "nnfusion.log"
    log.write_text("[INFO] 2026-12-05T07:38:57z onnx.cpp 86\tParsing\n"
                   "terminate called after throwing an instance of 'nnfusion::graph::autobroadcast_incompatible_shapes'\n"
                   "  what():  Auto-broadcast not possible for these input shapes: shape1=[1, 44, 26, 26] "
                   "shape2=[1, 44, 28, 28]\n", encoding="utf-8")
    result = CompileResult(["nnfusion"], tmp_path, -6, 0.4, log)
    message = "Auto-broadcast not possible for these input shapes: shape1=[1, 44, 26, 26] shape2=[1, 44, 28, 28]"
    assert any(message in line for line in result.decisive_lines()), result.decisive_lines()


@pytest.mark.parametrize("log_text, cause", [
    # held out in session 27: the headline was libstdc++'s line, not the message
    ("[INFO] 2026-12-07T06:58:49z graph_convert.cpp 519\tconvert node: /Trilu\n"
     "terminate called after throwing an instance of 'std::runtime_error'\n"
     "  what():  No infershape or Antares IR found for op type: Trilu\n",
     "No infershape or Antares IR found for op type: Trilu"),
    # ... or the ONNX Runtime pre-pass's "ONNX model check passed!", read as a failed CHECK
    ("[INFO] 2026-12-07T06:58:48z onnx.cpp 54\tOptimizing ONNX Graph with External Tool\n"
     "ONNX model check passed!\nImporting ONNX model into ONNX Runtime...\n"
     "[INFO] 2026-12-07T06:58:49z graph_convert.cpp 519\tconvert node: /Unsqueeze\n"
     "[ERROR] 2026-12-07T06:58:49z errors.hpp 169\tCheck failed: 'it != std::end(m_attributes)' at node.cpp:106:\n"
     "Node (/Unsqueeze): unknown attribute 'axes'\n"
     "terminate called after throwing an instance of 'nnfusion::errors::CheckError'\n",
     "Check failed: 'it != std::end(m_attributes)' at node.cpp:106: Node (/Unsqueeze): unknown attribute 'axes'"),
    # held out in session 28: an [ERROR] the importer logged and went on from (a Split's attribute) is not the abort
    ("[INFO] 2026-12-07T10:44:57z graph_convert.cpp 519\tconvert node: /blk/at/Split\n"
     "[ERROR] 2026-12-07T10:44:57z errors.hpp 169\tCheck failed: 'it != std::end(m_attributes)' at node.cpp:106:\n"
     "Node (/blk/at/Split): unknown attribute 'split'\n"
     "[INFO] 2026-12-07T10:44:57z graph_convert.cpp 538\tnode /blk/at/Split, output /blk/at/Split_output_0\n"
     "[INFO] 2026-12-07T10:44:57z graph_convert.cpp 519\tconvert node: /blk/at/Transpose_1\n"
     "[ERROR] 2026-12-07T10:44:57z errors.hpp 169\tFailure at numpy_transpose.cpp:76:\n"
     "The axes order [ 0, 1, 3, 2 ] is incompatible with the input shape [ 4, 100, 64 ] during numpy_transpose.\n"
     "terminate called after throwing an instance of 'nnfusion::errors::CheckError'\n"
     "  what():  Failure at numpy_transpose.cpp:76:\n"
     "The axes order [ 0, 1, 3, 2 ] is incompatible with the input shape [ 4, 100, 64 ] during numpy_transpose.\n",
     "Failure at numpy_transpose.cpp:76: The axes order [ 0, 1, 3, 2 ] is incompatible with the input shape "
     "[ 4, 100, 64 ] during numpy_transpose."),
])
def test_a_failed_compiles_reason_is_the_compilers_message(tmp_path: Path, log_text: str, cause: str):
    from core.nnfusion.compiler import CompileResult

    log = tmp_path / "nnfusion.log"
    log.write_text(log_text, encoding="utf-8")
    result = CompileResult(["nnfusion"], tmp_path, -6, 0.4, log)
    reason = result.reason()
    assert reason.startswith("nnfusion was killed by SIGABRT while importing ONNX node /") and reason.endswith(
        f": {cause}"), reason
    # the lines `kdb nnfusion` quotes are of that node too (held out in session 32: CLIP's Split check was quoted)
    assert not [line for line in result.decisive_lines() if "Split" in line], result.decisive_lines()


@pytest.mark.parametrize(("pads", "warned"), [([0, 0, 1, 1], True), ([1, 1, 1, 1], False), ([0, 0, 0, 0], False)])
def test_a_max_pool_of_pads_that_differ_says_the_library_cannot_compute_it(tmp_path: Path, pads: list[int],
                                                                            warned: bool):
    """NNFusion's cuDNN MaxPool pads both sides by the pads below (max_pool.cpp): a pool padded only after (TF's
    SAME at stride 2, `kdb model expand`'s rewrite of it) gets windows other than the output's without its row."""
    g = GraphBuilder({"x": [1, 4, 8, 8]})
    y = g.node("MaxPool", ["x"], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=pads)
    model = write(g.model(g.node("Relu", [y], "out"), "mp"), tmp_path / "m.onnx")
    (pool,) = [e for e in entries_for(model, make_db(tmp_path / "k.db", [])) if e.config.op_type == "MaxPool"]
    said = [r for r in pool.reasons if "pads both sides by the pads below" in r]
    assert pool.status == MISSING and bool(said) is warned, pool.reasons
    if warned:
        assert "makes [3, 3] windows where the model's output has [4, 4]" in said[0]

"""fp16 networks through the real compiler (issue 33): NNFusion fetches exactly the half identifiers extraction writes,
uses every half row coverage promised, and nvcc compiles what it wrote, BlockFusion groups of half rows with shared
arrays included. The models are fp32 as exporters write them, made fp16 by onnxconverter-common's converter."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("tvm")
pytest.importorskip("onnxconverter_common", reason="needs onnxconverter-common (the tvm extra)")

from onnx_models import GraphBuilder, write
from onnxconverter_common import float16
from test_fp16 import half_rows, shared_dot_schedule, small_half_model
from test_nnfusion_compiler import COMPILER, build_db, compile_with, extract, kernel_db_lookups, nvcc_compiles

from core.codegen.batch import generate_all
from core.codegen.generate import generate
from core.opconfigs.opconfig import parse_line

pytestmark = [
    pytest.mark.tvm,
    pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                       "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone"),
]


def test_an_fp16_model_fetches_what_extraction_writes_uses_every_half_row_and_compiles(tmp_path: Path):
    model = small_half_model(tmp_path / "small16.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    report = compile_with(model, db, tmp_path)
    written = {c.signature().identifier for c in extract(model).looked_up()}
    assert kernel_db_lookups(report.result.log_file) == written
    assert report.usage is not None and report.promised() and report.usage.used_keys() == report.promised()
    assert not report.usage.library_calls, "every op runs its half row: no cuDNN/cuBLAS call is left"
    source = (report.result.project / "nnfusion_rt.cu").read_text()
    assert "half* __restrict__ input0" in source
    nvcc_compiles(report.result.project, tmp_path)


def two_half_dots() -> Path:
    """Two independent [64,64] x [64,64] MatMuls of one input, summed: BlockFusion runs the two Dots as one kernel."""
    g = GraphBuilder({"x": [64, 64]})
    a = g.node("MatMul", ["x", g.weight("wa", [64, 64])], "a")
    b = g.node("MatMul", ["x", g.weight("wb", [64, 64])], "b")
    return float16.convert_float_to_float16(g.model(g.node("Add", [a, b], "sum"), "two_dots"))


def test_a_blockfusion_group_of_half_rows_with_shared_arrays_compiles(tmp_path: Path):
    """The Dots' row stages its operands in shared arrays of half: NNFusion re-declares them from shared_memory, as
    pointers into its one shared buffer, by BlockFusion's table (uint16_t), and the body reads them as half."""
    model = write(two_half_dots(), tmp_path / "two_dots.onnx")
    config = parse_line("cublas_dot_op_half|a+64_64|b+64_64|o+64_64|ta+0|tb+0")
    items = [generate(config, "sm_90", scheduled=shared_dot_schedule(config), check=False).item]
    others = [c for c in extract(model).looked_up() if c.op_type != "Dot"]
    items += generate_all(others, "sm_90", check=False).items
    half_rows(items, tmp_path / "k.db")
    report = compile_with(model, tmp_path / "k.db", tmp_path)
    groups = report.usage.blockfusion_groups()
    assert any(len(group.parts) == 2 for group in groups), "the two Dots run as one BlockFusion kernel"
    source = (report.result.project / "nnfusion_rt.cu").read_text()
    assert re.search(r"uint16_t\* __align__\(64\) input0_shared_ptr_kdb_bits = \(uint16_t\*\)\(shared_buffer \+ \d+\)",
                     source)
    assert "half* input0_shared_ptr = reinterpret_cast<half*>(input0_shared_ptr_kdb_bits);" in source
    assert report.usage.used_keys() == report.promised()
    nvcc_compiles(report.result.project, tmp_path)


def test_a_half_shared_array_declared_as_half_makes_the_compiler_abort_as_lint_says(tmp_path: Path):
    """What the shared-dtype lint rule guards against, seen with the compiler: `half` is not in BlockFusion's table."""
    from core.db.kernel_db import KernelDB
    from core.kernels.lint import lint_row

    model = write(two_half_dots(), tmp_path / "two_dots.onnx")
    config = parse_line("cublas_dot_op_half|a+64_64|b+64_64|o+64_64|ta+0|tb+0")
    [row] = half_rows([generate(config, "sm_90", scheduled=shared_dot_schedule(config), check=False).item],
                      tmp_path / "k.db")
    function = json.loads(row.function)
    function["shared_memory"]["dtype"] = ["half", "half"]
    with sqlite3.connect(tmp_path / "k.db") as conn:  # as another tool would have written it
        conn.execute("UPDATE KernelCache SET Function = ? WHERE Key = ?", (json.dumps(function), row.key))
    with KernelDB.open(tmp_path / "k.db") as db:
        [bad] = db.iter_rows()
    assert [f.check for f in lint_row((1, *bad.values()))] == ["shared-dtype"]
    from core.nnfusion.compile_job import CompileJob, compile_and_read

    report = compile_and_read(CompileJob(model, tmp_path / "k.db", (), "NVIDIA H200", str(COMPILER), tmp_path / "nn"))
    assert not report.ok and "Unknown data type: half" in (report.result.log_file.read_text())

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


# -- the fp16 zoo (step 5) --------------------------------------------------------------------------------------
# ResNet-50, a BERT-base encoder and a GPT-style decoder (tests/zoo.py), converted by `kdb model fp16`, through the README's commands as
# tests/test_zoo.py runs the fp32 zoo: codegen (each kernel checked in half on the CPU), inject, `kdb nnfusion` (used
# equal to promised, every launch checked), and nvcc compiling nnfusion_rt.cu, BlockFusion kernels of half rows included.
HALF_DOTS = {False: ("Dot1,128,768;768,768;1,128,768halfhalfhalf", "Dot1,128,768;768,3072;1,128,3072halfhalfhalf",
                     "Dot1,128,3072;3072,768;1,128,768halfhalfhalf"),
             True: ("Dot128,768;768,768;128,768halfhalfhalf", "Dot128,768;768,3072;128,3072halfhalfhalf",
                    "Dot128,3072;3072,768;128,768halfhalfhalf")}  # True: NNFusion's ONNX Runtime pre-pass rewrote it


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert_encoder", "gpt_decoder", "resnet_unfolded_bn"])
def test_the_fp16_network_compiles_with_the_half_kernels_kdb_made(tmp_path: Path, name: str):
    from test_zoo import DB, PRODUCT, kdb, said
    from test_zoo import nvcc_compiles as nvcc_compiles_with_libraries
    from zoo import ZOO

    write(ZOO[name](), tmp_path / "model32.onnx")
    assert kdb(tmp_path, "settings", "archs=sm_90", f"product_name={PRODUCT}", f"nnfusion_path={COMPILER}").returncode == 0
    converted = kdb(tmp_path, "model", "fp16", "model32.onnx", "model.onnx", "--json")
    assert converted.returncode == 0, said(converted)
    statistics = set(json.loads(converted.stdout)["statistics_float"])  # each norm's square: its chain kept float
    extract_run = kdb(tmp_path, "opconfig", "extract", "model.onnx", "-o", "ops.txt", "--json")
    lines = (tmp_path / "ops.txt").read_text().splitlines()
    in_float = {n for c in json.loads(extract_run.stdout)["configs"] if c["config"].get("dtype", "float") != "half"
                for n in c["nodes"]}
    assert lines and all("_op_half|" in line or "_op_float|" in line for line in lines), said(extract_run)
    # float ops are only the norm statistics': the squares (a float Sum, their mean, fused away into the Sum's nodes)
    assert {n for n in in_float if "pow" in n or "square" in n} <= statistics, (in_float, statistics)
    assert not [n for n in in_float if not any(k in n for k in ("pow", "square", "mean", "var", "sqrt", "eps"))], \
        in_float
    codegen = kdb(tmp_path, "codegen", "ops.txt", "-o", "kernels.json", "--arch", "sm_90", "--db", DB, "--json")
    assert codegen.returncode == 0, said(codegen)
    errors = [k["max_rel_error"] for k in json.loads(codegen.stdout)["kernels"]]
    assert len(errors) == len(lines) and all(e is not None for e in errors)  # every half kernel checked on the CPU
    inject = kdb(tmp_path, "inject", "kernels.json", "--db", DB)
    assert inject.returncode == 0, said(inject)
    lint = kdb(tmp_path, "lint", "--db", DB)
    assert lint.returncode == 0, said(lint)
    compiled = kdb(tmp_path, "nnfusion", "model.onnx", "--db", DB, "--nnfusion", str(COMPILER), "--json")
    report = json.loads(compiled.stdout)
    assert compiled.returncode == 0 and report["ok"], f"{report['reason']}\n" + "\n".join(report["decisive_lines"])
    promised, used = set(report["promised"]), set(report["usage"]["db_rows_used"])
    assert promised and used == promised, f"used, not promised {sorted(used - promised)}; not used {sorted(promised - used)}"
    from_db = {e["identifier"] for e in report["coverage"] if e["row"] and e["row"]["key"] in used}
    in_float_rows = {i for i in from_db if "half" not in i}  # (only a norm statistic's: its Sum, its square)
    statistic_ops = ("Sum", "Power", "Multiply", "Add", "Sqrt", "Divide")
    assert not in_float_rows or (statistics and all(i.startswith(statistic_ops) for i in in_float_rows)), in_float_rows
    if name == "bert_encoder":
        assert not set(HALF_DOTS[json.loads(extract_run.stdout)["prepass"]["applied"]]) - from_db, sorted(from_db)
    elif name == "gpt_decoder":  # attention's softmax and the vocabulary's, summed in float, from the DB
        assert {"Softmax1,4,64,64;1,4,64,64halfhalf", "Softmax1,64,1000;1,64,1000halfhalf"} <= from_db, from_db
    else:
        assert report["usage"]["blockfusion_groups"], "ResNet-50's half rows run in BlockFusion groups too"
    check = report["launch_check"]
    assert check is not None and check["arch"] == "sm_90" and not check["error"] and not report["launch_failures"]
    source = (Path(report["compile"]["project"]) / "nnfusion_rt.cu").read_text()
    assert "half* __restrict__ input0" in source
    nvcc_compiles_with_libraries(Path(report["compile"]["project"]), tmp_path, report["usage"]["library_calls"])


def test_a_half_depthwise_conv_does_not_build_without_its_row_and_builds_with_it(tmp_path: Path):
    """Issue 39 #5: NNFusion's own half DepthwiseConv2dNative kernel is no valid CUDA (`float *input = input0;`).
    Coverage exited 0 and `kdb nnfusion` said ok (its launch check compiled no bounded kernel), and the build failed
    later without naming NNFusion's kernel. Now coverage and the launch check name it, and `kdb model fp16` keeps
    depthwise convolutions in float, between Casts, which builds."""
    from conftest import run_kdb
    from onnx_models import depthwise_block

    plain = write(depthwise_block(), tmp_path / "dw.onnx")
    half = write(float16.convert_float_to_float16(depthwise_block()), tmp_path / "dw16.onnx")
    db, compiler = str(tmp_path / "k.db"), ("--nnfusion", str(COMPILER))
    coverage = run_kdb("coverage", str(half), "--db", db)
    assert coverage.returncode == 1 and "does not build" in coverage.stdout, coverage.stdout
    assert "depthwise_conv2d.cpp" in " ".join(coverage.stdout.split())
    compiled = run_kdb("nnfusion", str(half), "--db", db, *compiler, "--out", str(tmp_path / "a"))
    said = " ".join(compiled.stdout.split())
    assert compiled.returncode == 1 and "NNFusion's own kernel DepthwiseConv2dNative" in said, said[-2000:]
    converted = run_kdb("model", "fp16", str(plain), str(tmp_path / "kept.onnx"), "--json")
    assert json.loads(converted.stdout)["kept_float"] == ["dw"], converted.stdout
    kept = run_kdb("nnfusion", str(tmp_path / "kept.onnx"), "--db", db, *compiler, "--out", str(tmp_path / "b"))
    said = " ".join(kept.stdout.split())
    assert kept.returncode == 0 and re.search(r"NNFusion's own \d+ compiled: they build", said), said[-2000:]
    # ... or the DB's half row stands in for NNFusion's kernel: the half network then builds as it is
    ops = tmp_path / "dw16.txt"
    assert run_kdb("opconfig", "extract", str(half), "-o", str(ops)).returncode == 0
    assert "cudnn_depthwise_conv2d_op_half|i+1_32_56_56|w+3_3_32_1|" in ops.read_text()
    assert run_kdb("codegen", str(ops), "--inject", "--db", db, "--arch", "sm_90").returncode == 0
    coverage = run_kdb("coverage", str(half), "--db", db)
    assert coverage.returncode == 0 and "does not build" not in coverage.stdout, coverage.stdout[-2000:]
    served = run_kdb("nnfusion", str(half), "--db", db, *compiler, "--out", str(tmp_path / "c"))
    said = " ".join(served.stdout.split())
    assert served.returncode == 0 and re.search(r"NNFusion's own \d+ compiled: they build", said), said[-2000:]
    assert re.search(r"DB rows in the code: (\d+) of the \1 coverage promised", said), said[-2000:]

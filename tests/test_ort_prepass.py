"""Extraction reads the graph NNFusion imports. Before importing an ONNX model the compiler runs its ONNX Runtime
pre-pass with the `python3` first on its PATH and, when that has onnxruntime, imports the rewritten model: BERT's
MatMul+Add become a 2-D Gemm, looked up as `Dot128,768;768,768;128,768...` instead of the rank-3 MatMul's
`Dot1,128,768;...`. A BERT dense block goes through the README's commands with each kind of python3 first on PATH,
and the compiler must run exactly the DB rows coverage promised.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from compiler_python import path_with_onnxruntime, path_without_onnxruntime
from conftest import run_kdb
from onnx_models import GraphBuilder, write
from zoo import _dense

from core.nnfusion.compiler import compiler_prepass
from core.opconfigs.extract_cache import extract_cached
from core.opconfigs.ort_prepass import PrePass

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
NEEDS_COMPILER = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                    "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")
RANK3_DOT = "Dot1,128,768;768,768;1,128,768floatfloatfloat"  # the model's MatMul, as the compiler imports it as given
GEMM_DOT = "Dot128,768;768,768;128,768floatfloatfloat"  # the pre-pass's Gemm
def dense_block(folder: Path) -> Path:
    """BERT's dense layer as torch exports it: MatMul [1,128,768] x [768,768] + bias, then an activation."""
    g = GraphBuilder({"x": [1, 128, 768]})
    y = g.node("Relu", [_dense(g, "x", 768, 768, "dense")], "act")
    return write(g.model(y, "bert_dense"), folder / "model.onnx")


def kdb(work: Path, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run_kdb(*args, cwd=work, env={"PATH": path})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def through_the_readme(work: Path, path: str) -> tuple[dict, dict]:
    """extract -> codegen -> inject -> kdb nnfusion with the compiler of the settings, every command with this PATH:
    (the extraction's JSON, kdb nnfusion's report)."""
    pytest.importorskip("tvm")
    dense_block(work)
    assert kdb(work, path, "settings", "archs=sm_90", f"nnfusion_path={COMPILER}").returncode == 0
    extract = kdb(work, path, "opconfig", "extract", "model.onnx", "-o", "ops.txt", "--json")
    assert extract.returncode == 0, extract.stderr[-3000:]
    codegen = kdb(work, path, "codegen", "ops.txt", "-o", "kernels.json", "--arch", "sm_90", "--db", "k.db")
    assert codegen.returncode == 0, codegen.stderr[-3000:]
    inject = kdb(work, path, "inject", "kernels.json", "--db", "k.db")
    assert inject.returncode == 0, inject.stderr[-3000:]
    compiled = kdb(work, path, "nnfusion", "model.onnx", "--db", "k.db", "--json")
    return json.loads(extract.stdout), json.loads(compiled.stdout)


def assert_promises_kept(report: dict, dot: str) -> None:
    assert report["ok"], (report["reason"], report["decisive_lines"], report["broken_promises"])
    promised, used = set(report["promised"]), set(report["usage"]["db_rows_used"])
    assert promised and used == promised, f"promised {sorted(promised)}, used {sorted(used)}"
    from_db = {e["identifier"] for e in report["coverage"] if e["row"] and e["row"]["key"] in used}
    assert dot in from_db, sorted(from_db)


@NEEDS_COMPILER
@pytest.mark.tvm
@pytest.mark.slow
def test_with_onnxruntime_on_the_compilers_path_the_rewritten_gemm_is_extracted_and_kept(tmp_path: Path):
    extraction, report = through_the_readme(tmp_path, path_with_onnxruntime())
    assert extraction["prepass"]["applied"], extraction["prepass"]
    assert any("rewrote the model: 3 nodes -> " in n["text"] for n in extraction["notes"]), extraction["notes"]
    assert extraction["configs"][0]["description"] == "Dot 128x768 x 768x768"
    assert report["prepass"]["applied"] and "rewrote the model" in report["prepass"]["note"], report["prepass"]
    assert_promises_kept(report, GEMM_DOT)


@NEEDS_COMPILER
@pytest.mark.tvm
@pytest.mark.slow
def test_without_onnxruntime_on_the_compilers_path_the_models_matmul_is_extracted_and_kept(tmp_path: Path):
    extraction, report = through_the_readme(tmp_path, path_without_onnxruntime())
    assert not extraction["prepass"]["applied"] and "onnxruntime" in extraction["prepass"]["why"], extraction["prepass"]
    assert not report["prepass"]["applied"], report["prepass"]
    assert_promises_kept(report, RANK3_DOT)


@NEEDS_COMPILER
def test_the_cache_keeps_apart_what_each_python3_makes_of_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    model = dense_block(tmp_path)
    monkeypatch.setenv("PATH", path_with_onnxruntime())
    rewritten = extract_cached(model, prepass=compiler_prepass(str(COMPILER)))
    monkeypatch.setenv("PATH", path_without_onnxruntime())
    as_given = extract_cached(model, prepass=compiler_prepass(str(COMPILER)))
    assert rewritten.prepass["applied"] and not as_given.prepass["applied"]
    assert rewritten.model_name == as_given.model_name == "bert_dense"  # the user's model, not the temporary file
    assert rewritten.configs[0].describe() == "Dot 128x768 x 768x768"
    assert as_given.configs[0].describe() == "Dot 1x128x768 x 768x768"


def test_without_a_compiler_the_models_own_graph_is_extracted_and_the_note_says_so(tmp_path: Path):
    model = dense_block(tmp_path)
    prepass = compiler_prepass(str(tmp_path / "no-nnfusion"))
    assert prepass == PrePass.not_checked(prepass.unchecked) and "no NNFusion compiler found" in prepass.unchecked
    extraction = extract_cached(model, prepass=prepass)
    assert not extraction.prepass["applied"]
    assert extraction.configs[0].describe() == "Dot 1x128x768 x 768x768"
    assert any("pre-pass did not rewrite the model: the pre-pass could not be checked: no NNFusion compiler found"
               in n.text for n in extraction.notes), extraction.notes


def half_dense_block(folder: Path) -> Path:
    """The dense block made fp16 as `kdb model fp16` makes it (onnxconverter-common)."""
    float16 = pytest.importorskip("onnxconverter_common.float16", reason="needs onnxconverter-common (the tvm extra)")
    import onnx

    fp32 = dense_block(folder)
    return write(float16.convert_float_to_float16(onnx.load(str(fp32))), folder / "model.onnx")


@NEEDS_COMPILER
@pytest.mark.tvm
@pytest.mark.slow
def test_an_fp16_model_is_compiled_as_given_where_the_prepass_would_compute_it_in_float(tmp_path: Path):
    """ONNX Runtime's CPU rewrite casts an fp16 model's ops to float where its CPU provider has no half kernel (33
    casts in ResNet-50, 61 in two BERT layers, whose inlined Softmax NNFusion then aborts on). kdb reads the model as
    given and runs the compiler so: the half rows it generated are the ones the compiled network runs."""
    pytest.importorskip("tvm")
    path = path_with_onnxruntime()
    half_dense_block(tmp_path)
    assert kdb(tmp_path, path, "settings", "archs=sm_90", f"nnfusion_path={COMPILER}").returncode == 0
    extract = kdb(tmp_path, path, "opconfig", "extract", "model.onnx", "-o", "ops.txt", "--json")
    extraction = json.loads(extract.stdout)
    assert extraction["prepass"]["bypassed"] and "casts to float" in extraction["prepass"]["why"], extraction["prepass"]
    assert extraction["configs"][0]["description"] == "Dot 1x128x768 x 768x768 half"  # (its bias Add follows)
    assert all(c["description"].endswith(" half") for c in extraction["configs"])
    assert kdb(tmp_path, path, "codegen", "ops.txt", "--inject", "--arch", "sm_90", "--db", "k.db").returncode == 0
    report = json.loads(kdb(tmp_path, path, "nnfusion", "model.onnx", "--db", "k.db", "--json").stdout)
    assert report["prepass"]["bypassed"], report["prepass"]
    assert_promises_kept(report, RANK3_DOT.replace("float", "half"))
    source = (Path(report["compile"]["project"]) / "nnfusion_rt.cu").read_text()
    assert "mma.sync" in source  # the tensor-core row, in half

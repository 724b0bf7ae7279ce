"""The real compiler is the judge: NNFusion itself uses every kernel coverage says it will, and nothing else.

Each ONNX model is built here, goes through extract -> codegen (TVM's default schedule) -> inject, and then
through `../shared/nnfusion/bin/nnfusion` with that DB. The generated nnfusion_rt.cu must contain exactly the
rows coverage promised. Where no cuDNN/cuBLAS call is left, nnfusion_rt.cu is compiled with nvcc for sm_90
(with empty stand-ins for the two library headers it includes but then does not use): that catches a
block_function_body that does not compile in NNFusion's own form.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper
from shared_data import shared_path

pytest.importorskip("onnx")
pytest.importorskip("tvm")

from compiler_python import path_without_onnxruntime
from conftest import run_kdb, run_kdb_json
from onnx_models import GraphBuilder, basic_block, write

from core.codegen.batch import generate_all
from core.cuda.nvcc import find_nvcc
from core.db.kernel_db import KernelDB
from core.errors import KdbError
from core.inject.pipeline import InjectOptions, Injector
from core.kernels.kernel_row import COLUMNS
from core.kernels.ops import ROW_OP_TYPE, SUPPORTED_OP_TYPES, sum_axes
from core.nnfusion.compile_job import CompileJob, compile_and_read
from core.nnfusion.compiler import CompilerFlags, compiler_prepass
from core.nnfusion.coverage import IN_DB, NOT_USED
from core.opconfigs.extract_cache import extract_as_compiled
from core.opconfigs.onnx_extract import Extraction, LookupFlags

SHARED_COMPILER = shared_path("nnfusion/bin/nnfusion")
COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", SHARED_COMPILER))
pytestmark = [
    pytest.mark.tvm,
    pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                       "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone"),
]
PRODUCT = "NVIDIA H200"


def extract(model: Path, flags: LookupFlags | None = None) -> Extraction:
    """What `kdb opconfig extract` gives with this compiler: the graph it imports, after its ONNX Runtime pre-pass
    where the python3 on PATH (the compiler's here: it inherits ours) has onnxruntime."""
    return extract_as_compiled(model, flags, compiler_prepass(str(COMPILER)))


# -- models -----------------------------------------------------------------------------------

def conv_bias_relu(batch: int) -> GraphBuilder:
    g = GraphBuilder({"x": [batch, 8, 16, 16]})
    y = g.node("Relu", [g.conv("x", 8, 16, 3, bias=True, name="c1")], "r1")
    return g.finish(g.node("Relu", [g.conv(y, 16, 16, 3, stride=2, bias=True, name="c2")], "r2"))


def conv_residual(batch: int) -> GraphBuilder:
    """Conv+Add(residual)+Relu without a bias: the fused kernel's third input is the residual tensor."""
    g = GraphBuilder({"x": [batch, 16, 14, 14]})
    y = g.node("Relu", [g.conv("x", 16, 16, 3, name="c1")], "r1")
    return g.finish(g.node("Relu", [g.node("Add", [g.conv(y, 16, 16, 3, name="c2"), "x"], "add")], "r2"))


def branches(batch: int) -> GraphBuilder:
    """Two parallel convolutions of one input (a BlockFusion group), joined by an Add."""
    g = GraphBuilder({"x": [batch, 16, 14, 14]})
    a = g.conv("x", 16, 32, 3, stride=2, name="a")
    b = g.conv("x", 16, 32, 1, stride=2, pad=0, name="b")
    return g.finish(g.node("Relu", [g.node("Add", [a, b], "add")], "relu"))


def pools(batch: int) -> GraphBuilder:
    g = GraphBuilder({"x": [batch, 8, 16, 16]})
    y = g.node("MaxPool", ["x"], "mp", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = g.node("AveragePool", [y], "ap", kernel_shape=[2, 2], strides=[2, 2])
    return g.finish(g.node("GlobalAveragePool", [y], "gap"))


def gemms(batch: int) -> GraphBuilder:
    """Gemm with a bias (Dot + NNFusion's bias Add), then a Dot alone: a MatMul, since NNFusion's importer
    crashes on a Gemm without C (test_a_gemm_without_c_is_flagged)."""
    g = GraphBuilder({"x": [batch, 64]})
    y = g.node("Gemm", ["x", g.weight("w1", [32, 64]), g.weight("b1", [32])], "fc1", transB=1)
    return g.finish(g.node("MatMul", [y, g.weight("w2", [32, 16])], "fc2"))


def bert_dense(batch: int) -> GraphBuilder:
    """BERT's feed-forward on a [batch, 128, 768] activation: MatMul by a 2-D weight (a Dot of a rank-3 left
    operand in NNFusion), a broadcast bias Add, GELU written with Erf, the 3072 -> 768 MatMul back, bias."""
    g = GraphBuilder({"x": [batch, 128, 768]})

    def scalar(name: str, value: float) -> str:
        g.initializers.append(numpy_helper.from_array(np.array(value, dtype=np.float32), g.unique(name)))
        return g.initializers[-1].name

    y = g.node("Add", [g.node("MatMul", ["x", g.weight("attn_out_w", [768, 768])], "attn_out"),
                       g.weight("attn_out_b", [768])], "attn_out_bias")
    h = g.node("Add", [g.node("MatMul", [y, g.weight("ffn_in_w", [768, 3072])], "ffn_in"),
                       g.weight("ffn_in_b", [3072])], "ffn_in_bias")
    erf = g.node("Erf", [g.node("Div", [h, scalar("sqrt2", 2 ** 0.5)], "gelu_scale")], "gelu_erf")
    gelu = g.node("Mul", [g.node("Mul", [h, g.node("Add", [erf, scalar("one", 1.0)], "gelu_one")], "gelu_mul"),
                          scalar("half", 0.5)], "gelu")
    out = g.node("MatMul", [gelu, g.weight("ffn_out_w", [3072, 768])], "ffn_out")
    return g.finish(g.node("Add", [out, g.weight("ffn_out_b", [768])], "ffn_out_bias"))


def lstm_step(batch: int) -> GraphBuilder:
    """One LSTM-like step: the input's and the hidden state's [batch, H] x [H, 4H] gate products (2-D Dots),
    summed, squashed."""
    g = GraphBuilder({"x": [batch, 64], "h": [batch, 64]})
    gates = g.node("Add", [g.node("MatMul", ["x", g.weight("w_ih", [64, 256])], "gates_x"),
                           g.node("MatMul", ["h", g.weight("w_hh", [64, 256])], "gates_h")], "gates")
    return g.finish(g.node("Tanh", [g.node("Sigmoid", [gates], "squash")], "cell"))


def elementwise_chain(batch: int) -> GraphBuilder:
    """Sigmoid -> Tanh -> Exp: one NNFusion kernel at the default level; looked up one by one at level 0."""
    g = GraphBuilder({"x": [batch, 256]})
    return g.finish(g.node("Exp", [g.node("Tanh", [g.node("Sigmoid", ["x"], "s")], "t")], "e"))


def leaky_relu(batch: int) -> GraphBuilder:
    """StyleGAN's EqualLinear: MatMul, bias Add, LeakyRelu(0.2), times a scalar. NNFusion imports LeakyRelu as
    Maximum(x, Multiply(x, Broadcast(alpha))) and fuses it with the scale; the bias Add joins its own reshape in the
    wave before (kdb had LeakyRelu as one opaque node: it promised the Add's row, which never ran)."""
    g = GraphBuilder({"x": [batch, 64]})
    y = g.node("Add", [g.node("MatMul", ["x", g.weight("w", [64, 64])], "mm"), g.weight("b", [64])], "bias")
    g.initializers.append(numpy_helper.from_array(np.array(1.4142135, dtype=np.float32), "gain"))
    return g.finish(g.node("Mul", [g.node("LeakyRelu", [y], "act", alpha=0.2), "gain"], "scale"))


def _finish(self: GraphBuilder, output: str) -> GraphBuilder:
    self.output = output
    return self


GraphBuilder.finish = _finish  # type: ignore[attr-defined]
MODELS = {"conv_bias_relu": conv_bias_relu, "conv_residual": conv_residual, "branches": branches,
          "pools": pools, "gemms": gemms, "bert_dense": bert_dense, "lstm_step": lstm_step,
          "conv_bias_alone": lambda b: conv_bias_alone(b),
          "projection_residual": lambda b: projection_residual(b), "leaky_relu": leaky_relu}  # (some defined below)


# -- the pipeline -------------------------------------------------------------------------------

def build_db(model: Path, db_path: Path, work: Path) -> Path:
    """extract -> codegen -> inject, as a user runs them (kernels compile-checked below, in NNFusion's form)."""
    configs = extract(model).configs
    report = generate_all(configs, "sm_90", check=False)
    assert not report.failed, [f"{g.config.describe()}: {g.error}" for g in report.failed]
    kernels = work / "kernels.json"
    kernels.write_text(json.dumps(report.items), encoding="utf-8")
    with KernelDB.open(db_path, create=True) as db:
        injected = Injector(db, InjectOptions(compile=False), state=None).run([kernels], kind="test")
    assert injected.failed == 0, [f.reason for f in injected.failures]
    return db_path


def compile_with(model: Path, db: Path, work: Path, flags: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    report = compile_and_read(CompileJob(model, db, flags, PRODUCT, str(COMPILER), work / "nnfusion"))
    assert report.ok, f"{report.reason}: {report.decisive}"
    return report


def nvcc_compiles(project: Path, work: Path) -> None:
    nvcc = find_nvcc("")
    stand_ins = work / "no-libraries"
    stand_ins.mkdir(exist_ok=True)
    for header in ("cudnn.h", "cublas_v2.h"):
        (stand_ins / header).write_text("// the generated code includes it and calls nothing from it\n")
    proc = subprocess.run([str(nvcc), "-c", "-gencode", "arch=compute_90,code=sm_90", "--expt-relaxed-constexpr",
                           f"-I{stand_ins}", "nnfusion_rt.cu", "-o", str(work / "nnfusion_rt.o")],
                          cwd=project, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_compiler_uses_exactly_what_coverage_promised(tmp_path: Path, name: str, batch: int):
    g = MODELS[name](batch)
    model = write(g.model(g.output, name), tmp_path / f"{name}.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    report = compile_with(model, db, tmp_path)
    assert report.usage is not None
    promised, used = report.promised(), report.usage.used_keys()
    assert promised, "every model here has ops the DB serves"
    assert used == promised, f"used {sorted(used)}; promised {sorted(promised)}"
    launches = report.launches  # the real generated device code compiles, and every launch fits
    assert launches is not None and not launches.error, launches and launches.error
    assert launches.kernels and not launches.failing(), launches.reasons()
    if not report.usage.library_calls:
        nvcc_compiles(report.result.project, tmp_path)


BERT_DOTS = {"Dot1,128,768;768,768;1,128,768floatfloatfloat", "Dot1,128,768;768,3072;1,128,3072floatfloatfloat",
             "Dot1,128,3072;3072,768;1,128,768floatfloatfloat"}


def test_bert_dense_layers_run_their_rank_3_dot_rows_and_kdb_nnfusion_finds_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """NNFusion makes a Dot of each MatMul by a 2-D weight whatever the activation's rank: extraction finds the
    three [1,128,K] x [K,N] Dots, codegen and injection write their rows, and `kdb nnfusion` finds every row
    promised in the generated code and no cuBLAS call left. With a python3 without onnxruntime on the compiler's PATH, as CI has it: with one, its
    pre-pass makes 2-D Gemms of them (tests/test_ort_prepass.py)."""
    monkeypatch.setenv("PATH", path_without_onnxruntime())
    g = bert_dense(1)
    model = write(g.model(g.output, "bert_dense"), tmp_path / "bert.onnx")
    dots = [c for c in extract(model).configs if c.op_type == "Dot"]
    assert {c.signature().identifier for c in dots} == BERT_DOTS
    db = build_db(model, tmp_path / "k.db", tmp_path)
    proc, report = run_kdb_json("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER),
                                "--product-name", PRODUCT, "--out", str(tmp_path / "nnfusion"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    in_db = {e["identifier"]: e["row"]["key"] for e in report["coverage"] if e["status"] == IN_DB}
    # and the first bias Add, which feeds the next Dot alone: NNFusion looks it up as a full-shape Add
    assert set(in_db) == BERT_DOTS | {"Add1,128,768;1,128,768;1,128,768floatfloatfloat"}
    used = {k for s in report["usage"]["steps"] for part in s["parts"] for k in part["rows"]}
    assert set(report["promised"]) == used == set(in_db.values()) and not report["broken_promises"]
    assert report["usage"]["library_calls"] == {}, "no cuBLAS left: every Dot runs its DB row"
    source = (Path(report["compile"]["project"]) / "nnfusion_rt.cu").read_text()
    with KernelDB.open(db) as kdb:
        for key in in_db.values():
            (row,) = kdb.iter_rows("WHERE Key = ?", (key,))
            body = json.loads(row.function)["block_function_body"]
            assert re.sub(r"\s+", "", body) in re.sub(r"\s+", "", source), f"{row.identifier} not in the code"


def test_a_conv_whose_fused_kernel_is_missing_runs_the_plain_row_coverage_promised(tmp_path: Path):
    """A DB with a plain Convolution row and no fused one for a Conv+bias+Relu: the compiler leaves the pattern
    unsubstituted and runs the plain row. Coverage says so ("missing: tune it", runs the plain Convolution); the
    compile report counted only "in DB" ops as promised and called the row it ran unpromised."""
    g = conv_bias_relu(1)
    model = write(g.model(g.output, "cbr"), tmp_path / "cbr.onnx")
    plain = [replace(c, op_type="Convolution") for c in extract(model).configs if c.op_type.startswith("Fused_")]
    assert plain, "the model has a fused convolution"
    report = generate_all(plain, "sm_90", check=False)
    kernels = tmp_path / "plain.json"
    kernels.write_text(json.dumps(report.items), encoding="utf-8")
    db = tmp_path / "plain.db"
    with KernelDB.open(db, create=True) as kdb:
        assert Injector(kdb, InjectOptions(compile=False), state=None).run([kernels], kind="test").failed == 0
    compiled = compile_with(model, db, tmp_path)
    assert compiled.usage is not None and compiled.usage.used_keys(), "the compiler runs the plain row"
    assert compiled.promised() == compiled.usage.used_keys()
    assert not compiled.broken_promises()


def test_fused_rows_without_twins_are_not_used_and_repair_makes_them_used(tmp_path: Path):
    g = conv_bias_relu(1)
    model = write(g.model(g.output, "cbr"), tmp_path / "cbr.onnx")
    with KernelDB.open(build_db(model, tmp_path / "k.db", tmp_path)) as kdb:
        kernels = list(kdb.iter_rows("WHERE DeviceType = 'CUDA_GPU'"))
    bare = tmp_path / "bare.db"  # the kernel rows alone, as NNFusion's own import script writes them
    KernelDB.open(bare, create=True).close()
    conn = sqlite3.connect(bare)
    conn.executemany(f"INSERT INTO KernelCache ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     [r.values() for r in kernels])
    conn.commit()
    conn.close()
    report = compile_with(model, bare, tmp_path / "before")
    assert {e.status for e in report.entries} == {NOT_USED}
    assert report.usage is not None and report.usage.used_keys() == report.promised() == set()
    assert report.result.substitutions == []
    proc, repair = run_kdb_json("db", "repair", "--db", str(bare), "--apply")
    assert proc.returncode == 0 and len(repair["twins_written"]) == 2
    report = compile_with(model, bare, tmp_path / "after")
    assert len(report.result.substitutions) == 2
    assert report.usage is not None and report.usage.used_keys() == report.promised() == {r.key for r in kernels}


def test_the_compiler_takes_the_row_a_profile_update_made_fastest_and_fastest_leaves_it_alone(tmp_path: Path):
    """NNFusion takes an op's first row in table order, not its fastest: every write keeps the fastest first. A
    later row timed slower stays behind; once a profile update makes it the fastest, the compiler takes it."""
    g = pools(1)
    model = write(g.model(g.output, "pools"), tmp_path / "pools.onnx")
    db_path = build_db(model, tmp_path / "k.db", tmp_path)
    with KernelDB.open(db_path, write=True) as db:
        first = next(db.iter_rows("WHERE OpType = 'MaxPool'"))
        fn = json.loads(first.function)
        for body in ("block_function_body", "function_body"):  # neither body inside the other: usage tells them apart
            assert ";" in fn[body]
            fn[body] = fn[body].replace(";", "; // a later tuning run's kernel\n", 1)
        db.update_miscs(first.key, {"external_profile": {"time": f"{PRODUCT}:50;", "resource": 64}})
        later = replace(first, key="kdb:later", function=json.dumps(fn),
                        miscs=json.dumps({"external_profile": {"time": f"{PRODUCT}:60;", "resource": 64}}))
        db.insert(later)  # slower: behind the first row
    before = compile_with(model, db_path, tmp_path / "before")
    assert before.usage is not None and first.key in before.usage.used_keys()
    assert later.key not in before.usage.used_keys()
    with KernelDB.open(db_path, write=True) as db:  # timed again (the write `kdb gpu profile` makes): now 5x faster
        db.update_miscs(later.key, {"external_profile": {"time": f"{PRODUCT}:10;", "resource": 64}})
    after = compile_with(model, db_path, tmp_path / "after")
    assert after.usage is not None and later.key in after.usage.used_keys() and first.key not in after.usage.used_keys()
    assert after.promised() == after.usage.used_keys()  # coverage reads the same order
    proc, report = run_kdb_json("db", "fastest", "--db", str(db_path), "--product", PRODUCT, "--apply")
    assert proc.returncode == 0 and [op["kept"] for op in report["ops"]] == [later.key]  # it deletes the slower row
    kept = compile_with(model, db_path, tmp_path / "kept")
    assert kept.usage is not None and later.key in kept.usage.used_keys()


def test_element_wise_rows_are_used_only_at_fusion_level_0(tmp_path: Path):
    g = elementwise_chain(1)
    model = write(g.model(g.output, "chain"), tmp_path / "chain.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    default = compile_with(model, db, tmp_path / "level3")
    assert default.promised() == set() and default.usage is not None and default.usage.used_keys() == set()
    level0 = compile_with(model, db, tmp_path / "level0", ("-fkernel_fusion_level=0",))
    assert level0.usage is not None and len(level0.promised()) == 3
    assert level0.usage.used_keys() == level0.promised()
    assert {e.status for e in level0.entries} == {IN_DB}


# -- what the compiler fetches is what extraction writes ------------------------------------------

def conv_bias_alone(batch: int) -> GraphBuilder:
    """A conv's bias Add with no element-wise neighbour: looked up alone as a full-shape Add at every level."""
    g = GraphBuilder({"x": [batch, 8, 16, 16]})
    y = g.conv(g.conv("x", 8, 16, 1, pad=0, bias=True, name="c1"), 16, 16, 3, bias=True, name="c2")
    return g.finish(g.node("MaxPool", [y], "pool", kernel_shape=[2, 2], strides=[2, 2]))


def projection_residual(batch: int) -> GraphBuilder:
    """MobileNetV2's inverted residual: expand (conv+bias+Clip), depthwise (+bias+Clip), project (conv+bias, no
    activation), then the residual Add; a second block without the residual (its projection's Add alone)."""
    import numpy as np
    from onnx import numpy_helper

    g = GraphBuilder({"x": [batch, 8, 16, 16]})
    for value, name in ((0.0, "zero"), (6.0, "six")):
        g.initializers.append(numpy_helper.from_array(np.array(value, np.float32), name))

    def block(x: str, cin: int, cout: int, stride: int, name: str) -> str:
        y = g.node("Clip", [g.conv(x, cin, 4 * cin, 1, pad=0, bias=True, name=f"{name}_e"), "zero", "six"], f"{name}_e6")
        y = g.conv(y, 4 * cin, 4 * cin, 3, stride=stride, group=4 * cin, bias=True, name=f"{name}_dw")
        y = g.conv(g.node("Clip", [y, "zero", "six"], f"{name}_dw6"), 4 * cin, cout, 1, pad=0, bias=True,
                   name=f"{name}_p")
        return g.node("Add", [y, x], f"{name}_add") if stride == 1 and cin == cout else y

    y = block(block("x", 8, 8, 1, "b1"), 8, 12, 2, "b2")
    return g.finish(g.node("GlobalAveragePool", [y], "gap"))


def depthwise(batch: int) -> GraphBuilder:
    g = GraphBuilder({"x": [batch, 16, 16, 16]})
    y = g.node("Relu", [g.conv("x", 16, 16, 3, group=16, bias=True, name="dw")], "r")
    return g.finish(g.conv(g.conv(y, 16, 16, 3, group=16, name="dw2"), 16, 32, 1, pad=0, name="pw"))


def gemm_bias(batch: int) -> GraphBuilder:
    """Gemm+bias alone (its Add looked up), Gemm+bias+Relu (one kernel of NNFusion's own at the default level),
    two Gemms side by side (their Adds in one wave of the fusion pass: each joins its broadcast)."""
    g = GraphBuilder({"x": [batch, 64]})
    y = g.node("Gemm", ["x", g.weight("w1", [32, 64]), g.weight("b1", [32])], "fc1", transB=1)
    y = g.node("Relu", [g.node("Gemm", [y, g.weight("w2", [48, 32]), g.weight("b2", [48])], "fc2", transB=1)], "r")
    a = g.node("Gemm", [y, g.weight("w3", [16, 48]), g.weight("b3", [16])], "fc3", transB=1)
    b = g.node("Gemm", [y, g.weight("w4", [16, 48]), g.weight("b4", [16])], "fc4", transB=1)
    return g.finish(g.node("MatMul", [a, g.node("Transpose", [b], "t", perm=[1, 0])], "mm"))


def softmax_erf(batch: int) -> GraphBuilder:
    """A transformer's feed-forward and output: dense + bias, GELU written with Erf, dense + bias, Softmax, and a
    mean subtracted (ReduceMean is a Sum and a Divide by the count in NNFusion)."""
    import numpy as np
    from onnx import numpy_helper

    g = GraphBuilder({"x": [batch * 8, 32]})
    for value, name in ((1.4142135, "sqrt2"), (1.0, "one"), (0.5, "half")):
        g.initializers.append(numpy_helper.from_array(np.array(value, np.float32), name))
    f = g.node("Add", [g.node("MatMul", ["x", g.weight("w1", [32, 64])], "mm1"), g.weight("b1", [64])], "bias1")
    erf = g.node("Erf", [g.node("Div", [f, "sqrt2"], "scaled")], "erf")
    gelu = g.node("Mul", [g.node("Mul", [f, g.node("Add", [erf, "one"], "plus1")], "gate"), "half"], "gelu")
    y = g.node("Add", [g.node("MatMul", [gelu, g.weight("w2", [64, 32])], "mm2"), g.weight("b2", [32])], "bias2")
    y = g.node("Softmax", [y], "softmax", axis=-1)
    return g.finish(g.node("Sub", [y, g.node("ReduceMean", [y], "mean", axes=[-1])], "center"))


def bert_layer(batch: int) -> GraphBuilder:
    """A whole (small) BERT encoder layer: Q/K/V dense layers side by side, the batched attention MatMuls with
    the scale and Softmax, the output dense + residual, LayerNorm written out (ReduceMean, Pow, Sqrt, Div: what
    exporters write), the Erf GELU feed-forward and a second LayerNorm."""
    g = GraphBuilder({"x": [batch, 16, 32]})

    def scalar(name: str, value: float) -> str:
        g.initializers.append(numpy_helper.from_array(np.array(value, dtype=np.float32), g.unique(name)))
        return g.initializers[-1].name

    def dense(x: str, n_in: int, n_out: int, name: str) -> str:
        y = g.node("MatMul", [x, g.weight(f"{name}_w", [n_in, n_out])], name)
        return g.node("Add", [y, g.weight(f"{name}_b", [n_out])], f"{name}_bias")

    def layer_norm(x: str, name: str) -> str:
        centred = g.node("Sub", [x, g.node("ReduceMean", [x], f"{name}_mean", axes=[-1])], f"{name}_centre")
        var = g.node("ReduceMean", [g.node("Pow", [centred, scalar("two", 2.0)], f"{name}_sq")], f"{name}_var",
                     axes=[-1])
        std = g.node("Sqrt", [g.node("Add", [var, scalar("eps", 1e-5)], f"{name}_eps")], f"{name}_std")
        y = g.node("Mul", [g.node("Div", [centred, std], f"{name}_norm"), g.weight(f"{name}_g", [32])], f"{name}_mul")
        return g.node("Add", [y, g.weight(f"{name}_b", [32])], f"{name}_out")

    q, k, v = (dense("x", 32, 32, name) for name in ("q", "k", "v"))
    scores = g.node("MatMul", [q, g.node("Transpose", [k], "kt", perm=[0, 2, 1])], "qk")
    probs = g.node("Softmax", [g.node("Div", [scores, scalar("scale", 8.0)], "scaled")], "probs", axis=-1)
    h = layer_norm(g.node("Add", [dense(g.node("MatMul", [probs, v], "ctx"), 32, 32, "o"), "x"], "res1"), "ln1")
    f = dense(h, 32, 128, "ff1")
    erf = g.node("Erf", [g.node("Div", [f, scalar("sqrt2", 1.4142135)], "gelu_in")], "erf")
    gelu = g.node("Mul", [g.node("Mul", [f, g.node("Add", [erf, scalar("one", 1.0)], "gelu_1p")], "gelu_x"),
                          scalar("half", 0.5)], "gelu")
    return g.finish(layer_norm(g.node("Add", [dense(gelu, 128, 32, "ff2"), h], "res2"), "ln2"))


LOOKUP_MODELS = {"conv_bias_relu": conv_bias_relu, "conv_bias_alone": conv_bias_alone,
                 "conv_residual": conv_residual, "projection_residual": projection_residual, "depthwise": depthwise,
                 "gemm_bias": gemm_bias, "elementwise_chain": elementwise_chain, "softmax_erf": softmax_erf,
                 "bert_layer": bert_layer, "leaky_relu": leaky_relu}


def kernel_db_lookups(log: Path) -> set[str]:
    """The identifiers the compiler tried to fetch (either DeviceType) whose op type a kernel-DB row can have."""
    found = set()
    for identifier in re.findall(r"Trying to fetch kernel (.*) on DeviceType: \S+", log.read_text()):
        op = next((op for op in sorted({*SUPPORTED_OP_TYPES, *ROW_OP_TYPE}, key=len, reverse=True)
                   if identifier.startswith(op)), "")
        rest = identifier[len(op):]
        if op and rest[:1] and (rest[0].isdigit() or rest[0] == ";"):
            found.add(identifier)
    return found


@pytest.mark.parametrize("flags", [(), ("-fkernel_fusion_level=0",)], ids=["default", "level0"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", list(LOOKUP_MODELS))
def test_the_compiler_fetches_exactly_the_op_configs_extraction_writes(tmp_path: Path, name: str, batch: int, flags):
    """Extraction at the compiler's flags writes op configs; once the DB holds their kernels, the identifiers of
    kernel-DB op types the compiler tries to fetch (its -min_log_level=0 log) are exactly theirs."""
    g = LOOKUP_MODELS[name](batch)
    model = write(g.model(g.output, name), tmp_path / f"{name}.onnx")
    configs = extract(model, CompilerFlags.parse(flags)).looked_up()
    report = generate_all(configs, "sm_90", check=False)
    assert not report.failed, [f"{f.config.describe()}: {f.error}" for f in report.failed]
    (tmp_path / "kernels.json").write_text(json.dumps(report.items), encoding="utf-8")
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        assert Injector(db, InjectOptions(compile=False), state=None).run([tmp_path / "kernels.json"]).failed == 0
    compiled = compile_with(model, tmp_path / "k.db", tmp_path, flags)
    written = {c.signature().identifier for c in configs}
    fetched = kernel_db_lookups(compiled.result.log_file)
    # a Sum whose shapes do not tell its axes ([32, 32] -> [32]) is fetched and deliberately not written: no row of
    # that identifier could say which axis it sums (core/kernels/ops.py, sum_axes)
    fetched -= {i for i in fetched if i.startswith("Sum") and len(sum_axes(*_sum_shapes(i))) > 1}
    assert fetched == written, f"fetched, not written: {sorted(fetched - written)}; written, not fetched: " \
                               f"{sorted(written - fetched)}"


def _sum_shapes(identifier: str) -> tuple[list[int], list[int]]:
    """A Sum identifier's two shapes: Sum32,32;32floatfloat gives [32, 32] and [32]."""
    shapes = re.sub(r"[a-z_]+$", "", identifier[len("Sum"):]).split(";")
    return [int(d) for d in shapes[0].split(",") if d], [int(d) for d in shapes[1].split(",") if d]


def test_a_grouped_conv_that_is_not_depthwise_makes_the_compiler_abort_as_extraction_says(tmp_path: Path):
    g = GraphBuilder({"x": [1, 64, 8, 8]})
    g.output = g.conv("x", 64, 64, 3, group=32, name="resnext")  # ResNeXt's 32 groups
    model = write(g.model(g.output, "grouped"), tmp_path / "grouped.onnx")
    [unmapped] = extract(model).unmapped
    assert unmapped.node == "resnext" and "importer aborts" in unmapped.reason
    proc = subprocess.run([str(COMPILER), str(model), "-f", "onnx"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "n_filters_channels & groups == 0" in proc.stdout + proc.stderr


def test_the_compiler_starts_and_ends_while_kdb_holds_the_db_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """CI once saw NNFusion abort on its table check (manager.cpp:67): coverage's reader, run beside the compiler,
    closed the WAL file (the last close locks it exclusively) just as the compiler opened it. kdb's connection must
    be open from before the compiler starts until after it ends, so no close of ours can meet the compiler's open."""
    import core.nnfusion.compile_job as compile_job
    model = write(elementwise_chain(1).model("e", "chain"), tmp_path / "chain.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    coverage_done = threading.Event()
    real_coverage, real_compile = compile_job._coverage, compile_job.compile_model

    def coverage_then_signal(*args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return real_coverage(*args, **kwargs)
        finally:
            coverage_done.set()

    def compile_once_coverage_is_done(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert coverage_done.wait(timeout=600), "coverage never finished"
        assert _open_in_this_process(db), "kdb closed the DB before the compiler opened it"
        result = real_compile(*args, **kwargs)
        assert _open_in_this_process(db), "kdb closed the DB while the compiler ran"
        return result

    monkeypatch.setattr(compile_job, "_coverage", coverage_then_signal)
    monkeypatch.setattr(compile_job, "compile_model", compile_once_coverage_is_done)
    report = compile_with(model, db, tmp_path)
    assert report.entries and report.usage is not None


def _open_in_this_process(path: Path) -> bool:
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("needs /proc to see this process's open files")
    target, links = path.resolve(), []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # an fd another thread closes meanwhile
            links.append(Path(os.readlink(fd)))
    return target in links


def test_a_gemm_without_c_is_flagged(tmp_path: Path):
    # The compiler itself segfaults on it (seen here with ../shared/nnfusion): extraction says so before that.
    g = GraphBuilder({"x": [1, 64]})
    g.output = g.node("Gemm", ["x", g.weight("w", [64, 16])], "fc")
    model = write(g.model(g.output, "nobias"), tmp_path / "nobias.onnx")
    assert [b.node for b in extract(model).blockers if "crashes" in b.reason] == ["fc"]
    proc = subprocess.run([str(COMPILER), str(model), "-f", "onnx"], cwd=tmp_path, capture_output=True, timeout=120)
    assert proc.returncode != 0


def test_a_compiler_failure_is_a_failure_record_with_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from core.db.state import StateDB

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    g = GraphBuilder({"x": [1, 64]})
    g.output = g.node("Gemm", ["x", g.weight("w", [64, 16])], "fc")  # extraction reads it; the compiler crashes
    model = write(g.model(g.output, "nobias"), tmp_path / "nobias.onnx")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model.read_bytes()[:40])
    with pytest.raises(KdbError):  # kdb's own extraction refuses it before any compiler runs
        compile_and_read(CompileJob(truncated, tmp_path / "k.db", (), PRODUCT, str(COMPILER), tmp_path / "x"))
    KernelDB.open(tmp_path / "k.db", create=True).close()
    state = StateDB()
    report = compile_and_read(CompileJob(model, tmp_path / "k.db", (), PRODUCT, str(COMPILER), tmp_path / "crash"),
                              state=state)
    assert not report.ok and report.reason == "nnfusion was killed by SIGSEGV while importing ONNX node fc"
    (failure,) = state.failures()
    assert (failure.stage, failure.file, failure.reason) == ("nnfusion", str(model), report.reason)
    detail = json.loads(failure.detail)
    assert detail["decisive_lines"] and Path(detail["log"]).is_file()



HUNGRY_BODY = """float acc[96];
#pragma unroll
for (int i = 0; i < 96; ++i) acc[i] = input0[i * 64 + threadIdx.x] * input1[i];
#pragma unroll
for (int k = 0; k < 8; ++k) {
#pragma unroll
  for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + k + 1) % 96] + acc[(i * 7 + k) % 96];
}
#pragma unroll
for (int i = 0; i < 96; ++i) output0[i * 64 + threadIdx.x] = acc[i];"""


def failing_pair(tmp_path: Path) -> tuple[Path, Path, dict[str, tuple[str, dict]], str, str]:
    """The H200 fault, built on purpose: ResNet's downsampling block, whose first conv and shortcut conv the
    compiler puts in one BlockFusion group; one row given 1,024 threads, the other a 64-thread body that needs
    far more than 64 registers. Both rows compile alone; the fused kernel cannot launch. (Test data for the
    compiler and nvcc only: these rows do not compute a convolution and never run.)
    (model, db, {Identifier: (Key, Function)}, the wide row's Identifier, the hungry one's)."""
    g = GraphBuilder({"x": [1, 16, 14, 14]})
    model = write(g.model(basic_block(g, "x", 16, 32, stride=2), "block"), tmp_path / "block.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    conn = sqlite3.connect(db)
    rows = {ident: (key, json.loads(fn)) for key, ident, fn in conn.execute(
        "SELECT Key, Identifier, Function FROM KernelCache WHERE DeviceType = 'CUDA_GPU'")}
    wide = next(i for i in rows if ";32,16,3,3;" in i)
    hungry = next(i for i in rows if ";32,16,1,1;" in i)
    rows[wide][1]["block_dim"] = [1024, 1, 1]
    signature = rows[wide][1]["function_signature"]  # bounds to match: the row alone launches with 1,024 threads
    rows[wide][1]["function_signature"] = re.sub(r"__launch_bounds__\(\d+\)", "__launch_bounds__(1024)", signature)
    rows[hungry][1].update(block_dim=[64, 1, 1], block_function_body=HUNGRY_BODY + "\n// as BlockFusion's block function",
                           function_body=HUNGRY_BODY + "\n// as a kernel of its own (CacheCudaEmitter)",
                           num_syncthreads=0, shared_memory={"symbol": [], "dtype": [], "size": []})
    for ident in (wide, hungry):  # the fused conv's CUDA twin (same Identifier) keeps the same kernel
        conn.execute("UPDATE KernelCache SET Function = ? WHERE Identifier = ?", (json.dumps(rows[ident][1]), ident))
    conn.commit()
    conn.close()
    return model, db, rows, wide, hungry


def test_kdb_nnfusion_names_a_blockfusion_kernel_that_cannot_launch(tmp_path: Path):
    """failing_pair: named, with the rows fused into it; --fit-launches mends it; --undo brings it back."""
    model, db, rows, wide, hungry = failing_pair(tmp_path)
    proc, report = run_kdb_json("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER),
                                "--product-name", PRODUCT, "--out", str(tmp_path / "nnfusion"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["usage"]["blockfusion_groups"], "the two convolutions are fused"
    check = report["launch_check"]
    assert check["arch"] == "sm_90" and not check["error"]
    (failing,) = [x for x in check["kernels"] if not x["fits"]]
    assert failing["threads"] == 1024 and failing["registers"] > 64 and failing["max_threads"] < 1024
    (reason,) = check["failing"]
    assert failing["kernel"] in reason and "launches it with 1024" in reason
    (named,) = report["launch_failures"]  # the reason with the DB rows fused into the kernel
    assert named.startswith(reason) and rows[wide][0] in named and rows[hungry][0] in named
    again = run_kdb("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--product-name", PRODUCT,
                    "--out", str(tmp_path / "again"))
    assert again.returncode == 1 and "cannot launch" in again.stdout and "-fblockfusion_level=0" in again.stdout
    assert "kdb db standalone" in again.stdout and "--fit-launches" in again.stdout

    # --fit-launches: the 64-thread row (registers sized for 64 threads) runs on its own launch; the 1,024-thread
    # row, which fits its own block, stays in BlockFusion's hands. The compiler itself shows it: the hungry row's
    # op is no BlockCudaEmitter any more, its function_body is a kernel of its own, every launch fits.
    proc, fitted = run_kdb_json("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER),
                                "--product-name", PRODUCT, "--out", str(tmp_path / "fit"), "--fit-launches")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert fitted["made_standalone"] == [rows[hungry][0]]
    assert fitted["launch_failures"] == [] and not fitted["broken_promises"]
    assert rows[hungry][0] in fitted["promised"] and rows[wide][0] in fitted["promised"]
    fused_members = [m for group in fitted["usage"]["blockfusion_groups"] for m in group]
    hungry_step = next(s for s in fitted["usage"]["steps"] if any(rows[hungry][0] in p["rows"] for p in s["parts"]))
    assert hungry_step["kind"] == "kernel" and hungry_step["node"] not in fused_members
    log = Path(fitted["compile"]["log"]).read_text()
    assert f"Operator {hungry_step['node']} is not BlockCudaEmitter, skip in BlockFusion" in log
    (undo_file,) = fitted["undo_files"]  # the fit's one round wrote one undo file: the report names it
    undo = run_kdb("db", "undo", undo_file, "--db", str(db), "--apply")
    assert undo.returncode == 0, undo.stderr
    back = run_kdb("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--product-name", PRODUCT,
                   "--out", str(tmp_path / "back"))
    assert back.returncode == 1 and "cannot launch" in back.stdout  # given back to BlockFusion: the fault again
    # In text, the command that gives them back names the undo file this fit wrote.
    fit_text = run_kdb("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--product-name",
                       PRODUCT, "--out", str(tmp_path / "fit-text"), "--fit-launches")
    assert fit_text.returncode == 0, fit_text.stderr[-2000:]
    (written,) = set((tmp_path / "state" / "undo").glob("undo-standalone*.db")) - {Path(undo_file)}
    assert f"`kdb db undo {written} --apply` gives them back" in " ".join(fit_text.stdout.split())


def test_a_row_injected_after_the_fit_keeps_the_op_standalone_and_every_launch_fits(tmp_path: Path):
    """failing_pair fitted, then a later tuning run's kernel of the fitted op injected as the External row tuning
    writes: it goes in standalone, so the compiler does not take it first and fuse the op into the failing launch."""
    model, db, rows, _wide, hungry = failing_pair(tmp_path)
    args = ["nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--product-name", PRODUCT]
    proc, fitted = run_kdb_json(*args, "--out", str(tmp_path / "fit"), "--fit-launches")
    assert proc.returncode == 0 and fitted["made_standalone"] == [rows[hungry][0]], proc.stderr[-2000:]
    with KernelDB.open(db, write=True) as kdb:
        (made,) = kdb.find(rows[hungry][0])
        fn = dict(rows[hungry][1], block_function_body=rows[hungry][1]["block_function_body"] + "\n// a later run's",
                  function_body=rows[hungry][1]["function_body"] + "\n// a later run's")
        later = replace(made, key="kdb:later-tuning", source="External", function=json.dumps(fn),
                        tags="KernelEmitter,CudaEmitter,BlockCudaEmitter", miscs="{}")
        assert kdb.insert(later).standalone_for == PRODUCT
    proc, again = run_kdb_json(*args, "--out", str(tmp_path / "again"))
    assert proc.returncode == 0 and again["launch_failures"] == [] and not again["broken_promises"], proc.stderr[-2000:]


async def test_the_console_compiles_the_imported_model_and_shows_what_runs(tmp_path: Path):
    """Op configs view: import a model, check coverage, n compiles it; the steps come back with their rows."""
    from console_helpers import FixedDeviceApp
    from test_console_opconfigs import import_path, open_view, wait_for
    from textual.widgets import DataTable, Static

    from console.context import ConsoleContext
    from console.screens.nnfusion import CompileScreen
    from core.settings import Settings

    g = branches(1)
    model = write(g.model(g.output, "branches"), tmp_path / "branches.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    settings = Settings(workers=1, nnfusion_path=str(COMPILER), product_name=PRODUCT)
    app = FixedDeviceApp(ConsoleContext(db_path=db, settings=settings, device_summary="no CUDA device (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        screen = await open_view(pilot)
        await import_path(pilot, screen, model, len(extract(model).configs))
        await pilot.press("c")
        await wait_for(pilot, lambda: len(screen.coverage) == len(screen.configs))
        assert {e.status for e in screen.coverage.values()} == {IN_DB}
        await pilot.press("n")
        dialog = app.screen
        assert isinstance(dialog, CompileScreen)
        await wait_for(pilot, lambda: dialog.report is not None, timeout=120)
        assert dialog.report.ok and not dialog.report.broken_promises()
        steps = dialog.query_one("#compile-steps", DataTable)
        runs = [str(steps.get_row_at(i)[2]) for i in range(steps.row_count)]
        assert runs.count("DB kernel") == len(dialog.report.promised()) and "cuDNN" not in runs
        assert "DB kernel(s) in the generated code" in str(dialog.query_one("#compile-status", Static).render())
        launches = dialog.report.launches  # the launch check ran on the generated device code, and says so
        assert launches is not None and launches.kernels and not launches.error
        summary = str(dialog.query_one("#compile-summary", Static).render())
        assert f"launch check (sm_90) {launches.summary()}" in summary, summary
        assert launches.summary().startswith(f"all {launches.launch_count} kernel launches")
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen


def aligned_shared_code(name: str, params: list[str], threads: int) -> str:
    """A kernel of the op's own parameters whose shared arrays ask for alignas(64), as TVM's tuned kernels do.
    (Test data for the compiler and nvcc only: it does not compute the op and never runs.)"""
    out = next(p for p in params if p == "compute" or p.startswith("output"))
    ins = [p for p in params if p != out]
    reads = " + ".join(f"staged_shared[threadIdx.x * 4 + {i}]" for i in range(4))
    return (f'extern "C" __global__ void __launch_bounds__({threads}) {name}('
            + ", ".join(f"float* __restrict__ {p}" for p in params) + ") {\n"
            f"  __shared__ alignas(64) float staged_shared[{threads * 4}];\n"
            f"  __shared__ alignas(64) float weights_shared[{threads}];\n"
            f"  for (int i = 0; i < 4; ++i) {{ staged_shared[threadIdx.x * 4 + i] = {ins[0]}[threadIdx.x * 4 + i]; }}\n"
            f"  weights_shared[threadIdx.x] = {ins[1]}[threadIdx.x];\n"
            "  __syncthreads();\n"
            f"  {out}[blockIdx.x * {threads} + threadIdx.x] = {reads} + weights_shared[threadIdx.x];\n"
            "}\n")


def test_shared_arrays_keep_their_alignment_in_the_compilers_code_alone_and_in_blockfusion(tmp_path: Path):
    """A row's shared arrays asked for alignas(64) (TVM's: it lets nvcc read them 128 bits at a time); NNFusion
    re-declares them from shared_memory, so the row's symbols carry `__align__(64)`. The real compiler must
    take such rows, put the alignment on the arrays of a kernel that runs alone and on the pointers of a
    BlockFusion kernel, and nvcc must compile what it wrote."""
    from core.cuda.source import parse_kernel

    g = GraphBuilder({"x": [1, 16, 14, 14]})
    model = write(g.model(basic_block(g, "x", 16, 32, stride=2), "block"), tmp_path / "block.onnx")
    items = generate_all(extract(model).configs, "sm_90", check=False).items
    for item in items:
        if "Convolution" in item["op_type"]:
            params = [p.name for p in parse_kernel(item["code"]).params]
            item.update(code=aligned_shared_code(item["tvm_func_name"], params, 64), blockDim=[64, 1, 1])
    (tmp_path / "kernels.json").write_text(json.dumps(items), encoding="utf-8")
    with KernelDB.open(tmp_path / "k.db", create=True) as db:
        injected = Injector(db, InjectOptions(compile=False), state=None).run([tmp_path / "kernels.json"])
    assert injected.failed == 0, [f.reason for f in injected.failures]
    report = compile_with(model, tmp_path / "k.db", tmp_path)
    assert report.usage.blockfusion_groups, "the strided conv and the shortcut conv are fused"
    source = (report.result.project / "nnfusion_rt.cu").read_text()
    assert "__shared__ float __align__(64) staged_shared[256];" in source  # a kernel alone: the array itself
    assert "float* __align__(64) staged_shared = (float*)(shared_buffer + " in source  # BlockFusion: its pointer
    nvcc_compiles(report.result.project, tmp_path)


SESSION12_DB = Path(__file__).resolve().parents[1] / "bench" / "results" / "h200" / "session12" / "7-tuned.db.gz"


def test_the_h200s_failing_pair_runs_right_with_its_tuned_rows_made_standalone(tmp_path: Path):
    """Session 12's tuned rows as the H200 had them: ResNet-18's stage-4 downsampling pair (conv 3x3 s2 + bias +
    relu, 64 threads at 190+ registers; the shortcut 1x1 s2 conv, 448 threads). With the shortcut's input one op
    later, as in the network, the compiler fuses them and the kernel cannot launch; --fit-launches makes the
    3x3 conv's rows standalone and every launch fits, the tuned kernels still used."""
    import gzip
    import shutil

    db = tmp_path / "tuned.db"
    with gzip.open(SESSION12_DB) as src, db.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    g = GraphBuilder({"x": [1, 256, 14, 14]})
    main = g.node("Relu", [g.conv("x", 256, 512, 3, stride=2, bias=True, name="main")], "main_relu")
    shortcut = g.conv(g.node("Relu", ["x"], "pre"), 256, 512, 1, stride=2, pad=0, name="down")
    model = write(g.model(g.node("Add", [main, shortcut], "sum"), "downsample_pair"), tmp_path / "pair.onnx")
    args = ["nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--product-name", PRODUCT]
    proc, report = run_kdb_json(*args, "--out", str(tmp_path / "first"))
    assert proc.returncode == 1 and len(report["launch_failures"]) == 1, proc.stderr[-2000:]
    assert "launches it with 448" in report["launch_failures"][0]
    proc, fitted = run_kdb_json(*args, "--out", str(tmp_path / "fit"), "--fit-launches")
    assert proc.returncode == 0 and fitted["launch_failures"] == [] and not fitted["broken_promises"], proc.stderr
    conn = sqlite3.connect(db)
    made = {ident for (ident,) in conn.execute(
        f"SELECT DISTINCT Identifier FROM KernelCache WHERE Key IN ({','.join('?' * len(fitted['made_standalone']))})",
        fitted["made_standalone"])}
    conn.close()
    assert len(made) == 1 and ";512,256,3,3;" in next(iter(made))  # the 3x3 conv's op only; the 1x1 stays fusable
    used = {k for s in fitted["usage"]["steps"] for p in s["parts"] for k in p["rows"]}
    assert set(fitted["promised"]) == used and len(used) == 2  # both tuned kernels run


async def test_the_console_fits_the_launches_with_f_and_says_which_rows_it_made_standalone(tmp_path: Path):
    from console_helpers import FixedDeviceApp
    from test_console_opconfigs import wait_for
    from textual.widgets import Static

    from console.context import ConsoleContext
    from console.screens.nnfusion import compile_screen
    from core.settings import Settings

    model, db, rows, _wide, hungry = failing_pair(tmp_path)
    settings = Settings(workers=1, nnfusion_path=str(COMPILER), product_name=PRODUCT)
    context = ConsoleContext(db_path=db, settings=settings, device_summary="no CUDA device (test)")
    app = FixedDeviceApp(context)
    async with app.run_test(size=(160, 45)) as pilot:
        dialog = compile_screen(context, model)
        app.push_screen(dialog)
        await wait_for(pilot, lambda: dialog.report is not None, timeout=120)
        summary = dialog.query_one("#compile-summary", Static)
        assert dialog.report.launch_failures() and "f here makes them standalone" in str(summary.render())
        await pilot.press("f")
        await wait_for(pilot, lambda: dialog.report is not None, timeout=120)
        assert dialog.report.ok and not dialog.report.launch_failures() and not dialog.report.broken_promises()
        assert dialog.made_standalone == (rows[hungry][0],)
        (undo_file,) = dialog.report.undo_files
        text = " ".join(str(summary.render()).split())
        assert "made standalone" in text and rows[hungry][0] in text and "cannot launch" not in text
        assert f"`kdb db undo {undo_file} --apply` gives them back" in text
        assert dialog.check_action("fit_launches", ()) is False  # nothing left to fit

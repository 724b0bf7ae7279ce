"""`kdb nnfusion` as the README has users run it, against the real compiler: the compiler the settings name, a DB
not there yet, a relative --out, the launch check of a project with NNFusion's own file-scope helpers (BERT's
softmax and layer norm), and launches counted as launches. Where the check could not run, the command fails.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")

from conftest import run_kdb, run_kdb_json
from onnx_models import attention_block, unrolled_lstm, write

from core.db.kernel_db import NNFUSION_DDL
from core.nnfusion.generated import parse_generated
from core.nnfusion.launch_check import kernel_launches
from core.nnfusion.usage import DB_KERNEL
from core.settings import Settings, save_settings

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
pytestmark = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")
# PATH without any nnfusion: the compiler must come from the setting
BARE_PATH = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])}


def entry_launches(project: Path) -> tuple[int, int]:
    """(launch statements, distinct kernels launched) of kernel_entry, counted from the generated source."""
    body = parse_generated((project / "nnfusion_rt.cu").read_text()).functions["kernel_entry"].body
    running = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("//"))  # not eliminated
    calls = re.findall(r"\b(\w+)_Call\(\s*dim3", running)
    return len(calls), len(set(calls))


def test_the_readme_pipeline_on_a_new_db_with_a_relative_out_checks_every_launch(tmp_path: Path):
    """BERT's encoder: NNFusion writes `const int GPU_WARP_SIZE = 32;` and templates using it at file scope, and a
    BlockFusion kernel (no launch bounds) is compiled for the check. The check dropped the constant ("identifier
    GPU_WARP_SIZE is undefined"), a relative --out made nvcc miss its output file, and both exited 0."""
    model = write(attention_block(), tmp_path / "attention.onnx")
    assert run_kdb("settings", f"nnfusion_path={COMPILER}").returncode == 0
    proc, report = run_kdb_json("nnfusion", model.name, "--db", "new.db", "--out", "out", cwd=tmp_path,
                                env=BARE_PATH)
    assert proc.returncode == 0, (proc.stderr[-2000:], report.get("problems"))
    assert report["ok"] and report["compiled"] and report["problems"] == [] and report["db_created"] is True
    assert (tmp_path / "new.db").is_file() and NNFUSION_DDL.startswith("CREATE TABLE IF NOT EXISTS KernelCache(")
    assert Path(report["compile"]["command"][0]) == COMPILER.resolve()  # the setting's compiler
    project = Path(report["compile"]["project"])
    assert project.is_absolute() and project.is_relative_to(tmp_path / "out")
    assert "const int GPU_WARP_SIZE = 32;" in (project / "nnfusion_rt.cu").read_text()
    check = report["launch_check"]
    assert check["error"] == "", check["error"]
    unbounded = [k for k in check["kernels"] if k["launch_bounds"] is None]
    assert unbounded and all(k["registers"] for k in unbounded), "a BlockFusion kernel was compiled and measured"
    assert (check["launches"], check["distinct_kernels"]) == entry_launches(project)
    usage = report["usage"]  # cuBLAS calls are steps, not kernel launches; NNFusion's softmax and layer norm (host
    # functions that launch ONNX Runtime's warp softmax, HostApplyLayerNorm's kernel) are
    steps = parse_generated((project / "nnfusion_rt.cu").read_text()).steps
    hosted = [s.function for s in steps if s.kind == "kernel" and s.launch is None]
    assert {f.split("_")[0] for f in hosted} == {"Softmax", "LayerNorm"}, hosted
    launches, distinct = entry_launches(project)
    assert (usage["kernel_launches"], usage["distinct_kernels"]) == (launches + len(hosted),
                                                                     distinct + len(set(hosted)))
    assert usage["library_calls"].get("cuBLAS", 0) >= 3 and len(usage["steps"]) > usage["kernel_launches"]


def test_a_launch_check_that_cannot_run_fails_the_command_and_says_why(tmp_path: Path):
    model = write(attention_block(), tmp_path / "attention.onnx")
    # An nvcc that went away after it was saved (`kdb settings` and the form refuse one that is not there).
    save_settings(Settings(nvcc_path="/nowhere/bin/nvcc"))
    args = ("nnfusion", str(model), "--db", str(tmp_path / "k.db"), "--nnfusion", str(COMPILER))
    proc, report = run_kdb_json(*args, "--out", str(tmp_path / "a"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    (problem,) = report["problems"]
    assert problem.startswith("the launch check could not run: no nvcc to compile") and "/nowhere/bin/nvcc" in problem
    assert report["launch_check"]["error"] in problem
    assert report["compiled"] and not report["ok"]  # the compiler ran; the result is not clean (the exit status)
    text = run_kdb(*args, "--out", str(tmp_path / "b"))
    assert text.returncode == 1 and "launch check could not run" in text.stdout and "no nvcc" in text.stdout
    skipped = run_kdb(*args, "--out", str(tmp_path / "c"), "--no-launch-check")  # asked not to check: no problem
    assert skipped.returncode == 0 and "launch check: skipped" in skipped.stdout, skipped.stdout


def extract_and_generate(work: Path, model: str) -> None:
    """The README's extract, then codegen --inject into k.db (no nvcc check), in `work`."""
    for step in (("opconfig", "extract", model, "-o", "ops.txt"),
                 ("codegen", "ops.txt", "--inject", "--arch", "sm_90", "--db", "k.db", "--no-compile")):
        proc = run_kdb(*step, cwd=work)
        assert proc.returncode == 0, (step, proc.stderr[-1500:])


def test_launches_and_distinct_kernels_are_counted_as_what_they_are(tmp_path: Path):
    """An unrolled LSTM: 32 MatMuls of one shape run one DB row, fused by BlockFusion into a few kernels. The report
    said "N kernel launches" of kernel_entry's steps (library calls included) and then "all M kernel launches fit"
    of its distinct kernels; now launches are launch statements and distinct kernels are kernels, in both."""
    pytest.importorskip("tvm")
    from test_nnfusion_compiler import build_db

    model = write(unrolled_lstm(steps=4), tmp_path / "lstm.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    args = ("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER))
    proc, report = run_kdb_json(*args, "--out", str(tmp_path / "json"))
    assert proc.returncode == 0, (proc.stderr[-2000:], report.get("problems"))
    launches, kernels = entry_launches(Path(report["compile"]["project"]))
    assert kernels < launches, "the model launches some kernel more than once"
    usage, check = report["usage"], report["launch_check"]
    assert (usage["kernel_launches"], usage["distinct_kernels"]) == (launches, kernels)
    assert (check["launches"], check["distinct_kernels"]) == (launches, kernels)
    assert sum(k["launches"] for k in check["kernels"]) == launches
    generated = parse_generated((Path(report["compile"]["project"]) / "nnfusion_rt.cu").read_text())
    assert {k: w.launches for k, w in kernel_launches(generated).items()} == {
        k["kernel"]: k["launches"] for k in check["kernels"]}
    assert usage["nodes_run_by"][DB_KERNEL] == 32  # every MatMul runs the one Dot row
    text = run_kdb(*args, "--out", str(tmp_path / "text"))
    assert text.returncode == 0, text.stderr[-2000:]
    flat = " ".join(text.stdout.split())  # the table's caption folds
    assert f"{launches} kernel launches of {kernels} distinct kernels" in flat, flat
    assert f"all {launches} kernel launches ({kernels} distinct kernels) fit" in flat, flat
    assert "run by 32 nodes" in flat


def test_rows_with_one_body_are_told_apart_by_their_node_and_launch(tmp_path: Path):
    """Issue 42: element-wise Adds of 64, 128 and 256 x 1024 get rows whose bodies are byte for byte the same (each
    grid fits its size, so no bounds test is written): only the grid differs. The compiler fuses the 64 one with its
    Relu into a kernel of its own and runs the two other rows. Matched by body, every row counted as used and every
    node as running all three; matched by the node's tensors and launch, each node runs its own row, and the 64 one
    is not in the code."""
    pytest.importorskip("tvm")
    from onnx import TensorProto, helper
    from onnx_models import GraphBuilder

    g = GraphBuilder({"x": [1, 64, 1024], "y": [1, 128, 1024], "z": [1, 256, 1024], "w": [1, 128, 1024]})
    fused = g.node("Relu", [g.node("Add", ["x", g.weight("b64", [1, 64, 1024])], "add64")], "relu64")
    lone = [g.node("Add", [x, g.weight(f"b{n}", [1, n, 1024])], f"add{n}") for x, n in (("y", 128), ("z", 256))]
    # an Add of the 128 one's shape fused too: coverage counted both occurrences as running the row
    also_fused = g.node("Relu", [g.node("Add", ["w", g.weight("c128", [1, 128, 1024])], "add128f")], "relu128")
    model = g.model(fused, "adds")
    model.graph.output.extend(helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, n, 1024])
                              for out, n in zip([*lone, also_fused], (128, 256, 128), strict=True))
    write(model, tmp_path / "adds.onnx")
    (tmp_path / "ops.txt").write_text("".join(f"elementwise_add_op_float|i+1_{n}_1024|i+1_{n}_1024|o+1_{n}_1024\n"
                                              for n in (64, 128, 256)))
    assert run_kdb("settings", f"nnfusion_path={COMPILER}", cwd=tmp_path).returncode == 0
    proc = run_kdb("codegen", "ops.txt", "--inject", "--arch", "sm_90", "--db", "k.db", "--no-compile", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import sqlite3

    with sqlite3.connect(tmp_path / "k.db") as db:
        rows = {tuple(json.loads(a)["output_shape"][0]): (k, json.loads(f)) for k, a, f in
                db.execute("SELECT Key, Attributes, Function FROM KernelCache")}
    assert len({f["block_function_body"] for _, f in rows.values()}) == 1  # one body for all three
    key = {shape[1]: k for shape, (k, _) in rows.items()}
    proc, report = run_kdb_json("nnfusion", "adds.onnx", "--db", "k.db", cwd=tmp_path, env=BARE_PATH)
    assert report["ok"], report["problems"]
    assert set(report["usage"]["db_rows_used"]) == {key[128], key[256]} and key[64] not in report["promised"]
    parts = [p for s in report["usage"]["steps"] for p in s["parts"]]
    assert sorted(tuple(p["rows"]) for p in parts if p["rows"]) == sorted([(key[128],), (key[256],)])
    assert all(p["runs"] != DB_KERNEL for p in parts if not p["rows"])  # the Adds fused with a Relu
    coverage = json.loads(run_kdb("coverage", "adds.onnx", "--db", "k.db", "--json", cwd=tmp_path).stdout)
    assert coverage["summary"]["ops"]["in DB"] == report["usage"]["nodes_run_by"][DB_KERNEL] == 2


def test_rows_nnfusion_dedupes_into_one_blockfusion_function_are_each_used_by_their_own_node(tmp_path: Path):
    """Relus of [1,64,8,8] and [1,16,16,16]: two identifiers, the same flat body and launch. NNFusion emits one block
    function for both ("Deduped function map: Relu_6 : Relu_4"), its comment naming the first node only; its
    BlockFusion kernel calls it on each node's tensors. The promise check read the comment alone and reported the
    second row promised but not in the code (exit 1); each call's tensors say which row it runs."""
    pytest.importorskip("tvm")
    from onnx_models import GraphBuilder

    g = GraphBuilder({"x": [1, 64, 8, 8], "y": [1, 16, 16, 16]})
    pooled = [g.node("MaxPool", [g.node("Relu", [x], f"relu_{x}")], f"pool_{x}", kernel_shape=[2, 2], strides=[2, 2])
              for x in ("x", "y")]
    flat = [g.node("Reshape", [p, g.constant(f"shape_{k}", [1, 1024])], f"flat_{k}") for k, p in enumerate(pooled)]
    write(g.model(g.node("Sigmoid", [g.node("Add", flat, "sum")], "out"), "twins"), tmp_path / "twins.onnx")
    assert run_kdb("settings", f"nnfusion_path={COMPILER}", cwd=tmp_path).returncode == 0
    extract_and_generate(tmp_path, "twins.onnx")
    import sqlite3

    with sqlite3.connect(tmp_path / "k.db") as db:
        relus = {i: (k, json.loads(f)) for k, i, f in
                 db.execute("SELECT Key, Identifier, Function FROM KernelCache WHERE Identifier LIKE 'Relu%'")}
    assert len(relus) == 2 and len({f["block_function_body"] for _, f in relus.values()}) == 1  # twins
    proc, report = run_kdb_json("nnfusion", "twins.onnx", "--db", "k.db", cwd=tmp_path, env=BARE_PATH)
    assert proc.returncode == 0 and report["ok"], (report["reason"], report.get("broken_promises"))
    assert set(report["promised"]) == set(report["usage"]["db_rows_used"]) >= {k for k, _ in relus.values()}
    parts = [tuple(p["rows"]) for s in report["usage"]["steps"] for p in s["parts"] if p["node"].startswith("Relu")]
    assert sorted(parts) == sorted((k,) for k, _ in relus.values())  # each node its own row, not both the first


def test_nodes_calling_one_deduped_kernel_are_each_given_the_row_of_their_own_launch(tmp_path: Path):
    """Held out in session 26: standalone Relus of two sizes (there after a BatchNormInference, here around a pool).
    Their rows have one body, and NNFusion emits one function it calls with each one's grid; the usage table gave
    both nodes both rows. The launch tells them apart."""
    pytest.importorskip("tvm")
    from onnx_models import GraphBuilder

    g = GraphBuilder({"x": [1, 32, 16, 16]})
    y = g.node("MaxPool", [g.node("Relu", ["x"], "relu_a")], "pool", kernel_shape=[2, 2], strides=[2, 2])
    write(g.model(g.node("Relu", [y], "relu_b"), "relus"), tmp_path / "relus.onnx")
    assert run_kdb("settings", f"nnfusion_path={COMPILER}", cwd=tmp_path).returncode == 0
    extract_and_generate(tmp_path, "relus.onnx")
    import sqlite3

    with sqlite3.connect(tmp_path / "k.db") as db:
        relus = {k: json.loads(f)["block_function_body"] for k, f in
                 db.execute("SELECT Key, Function FROM KernelCache WHERE Identifier LIKE 'Relu%'")}
    assert len(relus) == 2 and len(set(relus.values())) == 1  # one body
    _, report = run_kdb_json("nnfusion", "relus.onnx", "--db", "k.db", cwd=tmp_path, env=BARE_PATH)
    assert report["ok"], report["problems"]
    relu_steps = [s for s in report["usage"]["steps"] if s["function"].startswith("Relu")]
    assert len(relu_steps) == 2 and len({s["function"] for s in relu_steps}) == 1, relu_steps  # one function
    assert sorted(tuple(p["rows"]) for s in relu_steps for p in s["parts"]) == sorted((k,) for k in relus)


def test_a_log_softmax_is_served_as_the_softmax_and_the_log_nnfusion_looks_up(tmp_path: Path):
    """Held out in session 26 (a CRNN's per-step LogSoftmax): the importer writes it as its Softmax and a Log
    (op/log_softmax.hpp), and looks both up; extraction said "no kernel-DB op type", and rows of them were used
    unpromised."""
    pytest.importorskip("tvm")
    from onnx_models import GraphBuilder

    g = GraphBuilder({"x": [1, 8, 37]})
    write(g.model(g.node("LogSoftmax", [g.node("Relu", ["x"], "relu")], "lsm", axis=-1), "lsm", opset=13),
          tmp_path / "lsm.onnx")
    assert run_kdb("settings", f"nnfusion_path={COMPILER}", cwd=tmp_path).returncode == 0
    extract_and_generate(tmp_path, "lsm.onnx")
    assert [line.split("|")[0] for line in (tmp_path / "ops.txt").read_text().split()] == [
        "elementwise_relu_op_float", "cudnn_softmax_op_float", "elementwise_log_op_float"]
    proc, report = run_kdb_json("nnfusion", "lsm.onnx", "--db", "k.db", cwd=tmp_path, env=BARE_PATH)
    assert proc.returncode == 0 and report["ok"], report["problems"]
    assert set(report["promised"]) == set(report["usage"]["db_rows_used"]) and len(report["promised"]) == 3


def test_the_launch_check_says_which_steps_it_could_not_see(tmp_path: Path):
    """Held out in session 26: '63 kernel launches' in the usage line, then 'all 47 kernel launches fit': NNFusion's own
    softmax is a library-backed function called without a launch configuration, which the check cannot see."""
    from onnx_models import GraphBuilder

    g = GraphBuilder({"x": [1, 8, 37]})
    write(g.model(g.node("Softmax", [g.node("Relu", ["x"], "relu")], "sm", axis=-1), "sm"), tmp_path / "sm.onnx")
    proc = run_kdb("nnfusion", "sm.onnx", "--db", "empty.db", "--nnfusion", str(COMPILER), cwd=tmp_path,
                   env=BARE_PATH)
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = " ".join(proc.stdout.split())
    assert "all 1 kernel launch (1 distinct kernel) fit" in said, said
    # (session 30: it said "(its LayerNorm, its Softmax)" of every network; it names the nodes now)
    assert re.search(r"1 of the steps counted as kernel launches \(nodes sm\w*\) call a function of NNFusion's own",
                     said) and "not checked" in said and "LayerNorm" not in said, said


def test_a_broken_promise_names_the_op_each_row_was_promised_for():
    """Held out in session 29: 'coverage and the compiler disagree on 1 row(s): kdb:b7e8…' sent the user to `kdb show`
    to learn it was the bias Add."""
    from core.nnfusion.compile_job import CompileJob, CompileReport
    from core.nnfusion.coverage import CoverageEntry, RowChoice
    from core.opconfigs.opconfig import parse_line

    config = parse_line("elementwise_add_op_float|i+1_256|i+1_256|o+1_256")
    entry = CoverageEntry(config, 1, config.signature().identifier, 1, "in DB", DB_KERNEL, "NNFusion's kernel",
                          RowChoice("kdb:b7e8", 1, "the only External row", None))
    report = CompileReport(CompileJob(Path("m.onnx"), Path("k.db")), entries=[entry])
    assert report.row_names({"kdb:zz", "kdb:b7e8"}) == "kdb:b7e8 (Add 1x256), kdb:zz"

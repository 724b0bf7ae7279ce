"""`kdb nnfusion MODEL --op-times TIMES.json`: each op the DB serves for a model, alone in a one-op model compiled by
the real NNFusion with a DB of only its rows and with an empty DB, both built with nvcc and timed on the GPU by kdb's
harness; the times go to the file `kdb db leave-to-library` reads.

On this CPU machine everything up to the launch happens for real (the compiler, nvcc against the cuDNN/cuBLAS wheels)
and the command stops with "no CUDA GPU", status 2, no times file. The `gpu` test runs it whole on a device machine
and feeds leave-to-library. Tests skip, with the reason, where a tool they need is absent.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnx")

from conftest import run_kdb, run_kdb_json
from onnx_models import GraphBuilder, constant, write
from test_nnfusion_run import COMPILER, libraries_or_skip, needs_compiler, no_gpu_or_skip, nvcc_or_skip

from core.db.library import read_times, write_times
from core.errors import InputError
from core.nnfusion.build import HARNESS, LIBRARY
from core.opconfigs.one_op_model import one_op_model
from core.opconfigs.onnx_extract import extract
from core.opconfigs.opconfig import OpConfig, parse_line


def mixed() -> Any:
    """Every kind of op a row can serve, once: Conv+bias+Relu, Conv+Relu, Conv+Add(residual)+Relu, MaxPool, a conv
    with its bias Add on its own (no activation), a global average pool, a transposed 2-D Dot (Gemm, with its bias
    Add), a rank-3 Dot (MatMul) and a lone Sigmoid."""
    g = GraphBuilder({"x": [1, 8, 16, 16]})
    r1 = g.node("Relu", [g.conv("x", 8, 16, 3, bias=True, name="c1")], "r1")
    r2 = g.node("Relu", [g.conv(r1, 16, 16, 3, name="c2")], "r2")
    r3 = g.node("Relu", [g.node("Add", [g.conv(r2, 16, 16, 1, name="c3"), r1], "add3")], "r3")
    y = g.node("MaxPool", [r3], "mp", kernel_shape=[2, 2], strides=[2, 2])
    y = g.node("GlobalAveragePool", [g.conv(y, 16, 32, 1, bias=True, name="c4")], "gap")
    y = g.node("Flatten", [y], "flat", axis=1)
    y = g.node("Gemm", [y, g.weight("fc_w", [16, 32], fan_in=32), g.weight("fc_b", [16])], "fc", transB=1)
    y = g.node("Reshape", [y, constant(g, "shape", [1, 2, 8])], "reshape")
    y = g.node("MatMul", [y, g.weight("proj_w", [8, 10], fan_in=8)], "proj")
    return g.model(g.node("Sigmoid", [y], "sig"), "mixed")


# What NNFusion runs for each op without its row, as the empty DB's compile of its one-op model shows it.
LIBRARY_RUNS = {"c1+r1": {"cuDNN", "NNFusion's kernel"},  # the bias Broadcast, the conv, Add+Relu fused
                "c2+r2": {"cuDNN", "NNFusion's kernel"}, "c3+add3+r3": {"cuDNN", "NNFusion's kernel"},
                "mp": {"cuDNN"}, "c4": {"cuDNN"}, "c4/bias": {"NNFusion's kernel"}, "gap": {"cuDNN"},
                "fc": {"cuBLAS"}, "fc/bias": {"NNFusion's kernel"}, "proj": {"cuBLAS"}, "sig": {"NNFusion's kernel"}}


# -- the one-op models ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float", "half"])
def test_each_op_alone_is_read_back_as_the_same_op(tmp_path: Path, dtype: str):
    """kdb's own extraction (held against the compiler's lookups by test_nnfusion_compiler) reads each one-op model
    back as exactly the op it was made of: one op config, the same identifier, looked up."""
    model = write(mixed(), tmp_path / "mixed.onnx")
    source = extract(model)
    assert {c.source for c in source.configs} == set(LIBRARY_RUNS)
    for config in source.configs:
        bias = config.op_type == "Fused_Convolution_Add_Relu" and len(source.nodes[config.key][0]) == 2
        typed = replace(config, dtype=dtype)
        model = one_op_model(typed, bias=bias)
        (found,) = extract(write(model, tmp_path / f"{config.source.replace('/', '_')}.onnx")).looked_up()
        assert found.signature().identifier == typed.signature().identifier, config.source
        if config.source == "c1+r1":  # the network's form: the Conv with its bias, then the Relu
            assert bias and [(n.op_type, len(n.input)) for n in model.graph.node] == [("Conv", 3), ("Relu", 1)]
        if config.source == "c3+add3+r3":  # the conv the Add's first input, the residual a graph input
            assert [n.op_type for n in model.graph.node] == ["Conv", "Add", "Relu"]
            assert model.graph.node[1].input[0] == model.graph.node[0].output[0]


def _conv(text: str) -> OpConfig:
    return parse_line(f"cudnn_convolution_op_float|{text}")


@pytest.mark.parametrize("dtype", ["float", "half"])
def test_a_batch_matmul_alone_is_a_matmul_of_two_activations(tmp_path: Path, dtype: str):
    config = parse_line(f"cublas_batch_matmul_op_{dtype}|a+1_6_32_16|b+1_6_16_32|o+1_6_32_32", "scores")
    model = one_op_model(config)
    assert [(n.op_type, len(n.input)) for n in model.graph.node] == [("MatMul", 2)] and not model.graph.initializer
    (found,) = extract(write(model, tmp_path / "bmm.onnx")).looked_up()
    assert found.signature().identifier == config.signature().identifier


@pytest.mark.parametrize("line", ["cudnn_softmax_op_float|i+1_4_64_64|o+1_4_64_64",
                                  "cudnn_reduce_sum_op_half|i+1_64_256|o+1_64", "cudnn_reduce_sum_op_float|i+2_3_4|o+3",
                                  "concat_op_float|i+2_3_4|i+2_5_4|o+2_8_4", "concat_op_half|i+1_8_3|i+1_8_5|o+1_8_8",
                                  "resize_op_float|i+1_4_5_6|o+1_4_10_12|mode+linear|ctm+align_corners|nm+floor"])
def test_a_softmax_sum_concat_or_resize_alone_is_read_back_as_the_same_op(tmp_path: Path, line: str):
    """A Softmax over the last axis; a Sum as a ReduceMean of its axes (the Divide by the count after it runs with and
    without the row alike); a Concat of the axis its shapes tell; a Resize with its sampling."""
    config = parse_line(line, "alone")
    found = extract(write(one_op_model(config), tmp_path / "alone.onnx")).looked_up()
    assert [c.signature().identifier for c in found if c.op_type == config.op_type] == [config.signature().identifier]
    assert next(c for c in found if c.op_type == config.op_type).params == config.params
    assert {c.op_type for c in found} <= {config.op_type, "Divide"}


@pytest.mark.parametrize(("config", "reason"), [
    (_conv("i+1_8_8_8|w+8_2_3_3|o+1_8_8_8|ws+1_1|wd+1_1|p+1_1|g+4"), "4 groups: never served by a DB row"),
    (parse_line("cudnn_avgpool_op_float|i+1_4_8_8|o+1_4_8_8|win+3_3|ws+1_1|pb+1_1|pa+1_1"),
     "NNFusion's ONNX importer makes no padded AvgPool"),
    (OpConfig("Dot", {"arg0_shape": [1, 8, 16], "arg1_shape": [8, 4], "out_shape": [1, 16, 4], "transpose_A": True,
                      "transpose_B": False}), "rebuilt as one ONNX node, it is not valid"),  # refused by validation too
    (_conv("i+1_4_8_8|w+4_4_3_3|o+1_4_9_9|ws+1_1|wd+1_1|p+1_1|pa+2_2"), "gives the shape [1, 4, 8, 8], where the "
                                                                        "op's output is [1, 4, 9, 9]"),
    (parse_line("cublas_batch_matmul_op_float|a+1_768|b+768_3072|o+1_3072"), "a MatMul of a 1-D operand"),
])
def test_an_op_no_one_node_model_can_stand_for_says_why(config: OpConfig, reason: str):
    with pytest.raises(InputError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        one_op_model(config)


# -- the times file --------------------------------------------------------------------------------------------------

def test_the_times_file_is_what_leave_to_library_reads_and_never_half_written(tmp_path: Path):
    """write_times keeps read_times' format (extra keys ride along) and writes nothing read_times would refuse.
    (The numbers are test data, not measurements.)"""
    path = tmp_path / "times.json"
    ops = [{"identifier": "Relu1,4;1,4floatfloat", "library_us": 3.0, "row_us": 4.5, "key": "kdb:r", "ratio": 1.5}]
    write_times(path, "NVIDIA H200", ops, {"method": "test data", "not_timed": []})
    assert read_times(path)[0] == "NVIDIA H200" and read_times(path)[1][0].row_us == 4.5
    assert json.loads(path.read_text())["ops"][0]["key"] == "kdb:r"
    with pytest.raises(InputError, match=r"ops\[0\]: library_us -1\.0 is not a positive time"):
        write_times(tmp_path / "bad.json", "NVIDIA H200", [{**ops[0], "library_us": -1.0}], {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["times.json"]  # neither bad.json nor its .tmp


# -- the whole command on this CPU machine ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Path]:
    """`kdb nnfusion mixed.onnx --op-times T.json --json` on a DB of kdb's kernels (TVM's default schedule), run once
    for the tests below: (the work folder, the report, the DB)."""
    if not COMPILER.is_file():
        pytest.skip(f"needs the NNFusion compiler at {COMPILER} (../shared/nnfusion, or KDB_TEST_NNFUSION)")
    libraries_or_skip(nvcc_or_skip())
    pytest.importorskip("tvm")
    no_gpu_or_skip()
    from test_nnfusion_compiler import build_db

    work = tmp_path_factory.mktemp("op_times")
    model = write(mixed(), work / "mixed.onnx")
    db = build_db(model, work / "k.db", work)
    proc, report = run_kdb_json("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--op-times",
                                str(work / "T.json"), "--out", str(work / "run"), "--workers", "2",
                                env={"KDB_STATE_DIR": str(work / "state")})
    assert proc.returncode == 2, proc.stderr
    return work, report, db


@needs_compiler
def test_without_a_gpu_every_op_is_built_with_its_row_and_with_the_library_and_no_time_is_written(built):
    work, report, _db = built
    assert report["status"] == 2 and report["device"] is None
    assert report["findings"][0].startswith("no CUDA GPU: the ops were built but not run (")
    problems = {op["identifier"]: op["problem"] for op in report["ops"] if op["problem"]}
    assert "11 of 11 op(s) with their row and with the library;" in report["findings"][0], problems
    assert "no times file written" in report["findings"][0]
    assert report["written"] is False and not (work / "T.json").exists() and not (work / "T.json.tmp").exists()
    assert report["others"] == 0 and len(report["ops"]) == 11
    for op in report["ops"]:
        assert op["problem"] == "" and op["row_us"] is None and op["library_us"] is None and op["ratio"] is None
        for contender in op["contenders"]:
            build = contender["build"]
            assert build["ok"] and contender["run"] is None and contender["timing"] is None
            project = Path(build["project"])
            assert (project / LIBRARY).is_file() and (project / HARNESS).is_file()


@needs_compiler
async def test_t_in_the_compile_dialog_runs_op_times_and_shows_each_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`t` in the console's compile dialog: `kdb nnfusion --op-times`'s core use case. On this CPU machine each op is
    built with its row and with the library and not run: the table lists it, not measured, and no file is written."""
    libraries_or_skip(nvcc_or_skip())
    pytest.importorskip("tvm")
    no_gpu_or_skip()
    from console_helpers import app_with_compiler, compile_dialog
    from test_console_opconfigs import wait_for
    from test_nnfusion_compiler import build_db
    from textual.widgets import DataTable, Input, Static


    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    g = GraphBuilder({"x": [1, 8, 16, 16]})
    model = write(g.model(g.node("Relu", [g.conv("x", 8, 16, 3, bias=True, name="c1")], "r1"), "one"),
                  tmp_path / "one.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    app = app_with_compiler(db, COMPILER)
    async with app.run_test(size=(160, 45)) as pilot:
        dialog = await compile_dialog(pilot, app, model)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.screen is not dialog)
        app.screen.query_one("#path", Input).value = str(tmp_path / "T.json")
        await pilot.press("enter")
        status = dialog.query_one("#compile-status", Static)
        await wait_for(pilot, lambda: "op times: 0 of 1 op(s) timed (no GPU: built, not run)" in str(status.render()),
                       timeout=600)
        table = dialog.query_one("#op-times", DataTable)
        (row,) = [table.get_row(key) for key in table.rows]
        assert str(row[0]).startswith("Fused_Convolution_Add_Relu kdb:")  # the conv's bias: an Add
        assert row[1:3] == ["-", "-"] and "built with its row and with the library" in str(row[3])
        assert "no CUDA GPU" in str(dialog.query_one("#compile-summary", Static).render())
    assert not (tmp_path / "T.json").exists()


@needs_compiler
def test_the_row_compile_runs_the_ops_row_and_the_library_compile_runs_none(built):
    """Each one-op model looks up its op's identifier; with the op's rows the code runs exactly the row coverage named
    for the network, with the empty DB no row, and cuDNN, cuBLAS or NNFusion's own kernel instead."""
    work, report, db = built
    import onnx

    from core.db.kernel_db import KernelDB

    sources = {c.signature().identifier: c.source for c in extract(work / "mixed.onnx").configs}
    with KernelDB.open(db) as kdb:
        for op in report["ops"]:
            source = sources[op["identifier"]]
            row, library = op["contenders"]
            assert not op["problem"], (source, op["problem"])
            assert (row["label"], library["label"]) == ("row", "library")
            assert row["compile"]["usage"]["db_rows_used"] == [op["key"]], source
            assert library["compile"]["usage"]["db_rows_used"] == [] and library["compile"]["problems"] == []
            assert kdb.find(op["key"])[0].identifier == op["identifier"]
            assert set(op["library"].split(" + ")) == LIBRARY_RUNS[source], (source, op["library"])
            if source == "c1+r1":  # rebuilt in the network's form: NNFusion broadcasts the bias, as in the network
                model = onnx.load(row["compile"]["model"])
                assert [len(n.input) for n in model.graph.node] == [3, 1]


@needs_compiler
def test_a_cancelled_run_stops_the_builds_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    libraries_or_skip(nvcc_or_skip())
    pytest.importorskip("tvm")
    from test_nnfusion_compiler import build_db

    from core.gpu.library_times import measure_library_times
    from core.nnfusion.compile_job import CompileJob

    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    g = GraphBuilder({"x": [1, 8, 8, 8]})
    model = write(g.model(g.node("Relu", [g.conv("x", 8, 8, 3, name="c")], "r"), "one"), tmp_path / "one.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    stages: list[str] = []
    run = measure_library_times(CompileJob(model, db, binary=str(COMPILER), out=tmp_path / "run"),
                                times_file=tmp_path / "T.json",
                                on_progress=lambda _stage, detail: stages.append(detail),
                                should_cancel=lambda: any(d.startswith("nvcc (row)") for d in stages))
    assert run.status == 2 and run.findings == ["cancelled: no times file written"] and not run.written
    (op,) = run.ops
    assert op.problem == "cancelled" and op.row.build is not None and op.row.build.steps[-1].cancelled
    assert not (tmp_path / "T.json").exists()


def test_the_options_op_times_cannot_honour_are_refused(tmp_path: Path):
    common = ("nnfusion", str(tmp_path / "m.onnx"), "--db", str(tmp_path / "k.db"), "--op-times", str(tmp_path / "T"))
    env = {"KDB_STATE_DIR": str(tmp_path / "state"), "KDB_CONFIG": str(tmp_path / "settings.toml")}
    for extra, message in ((("--run",), "--run and --op-times: one at a time"),
                           (("--max-error", "0.1"), "--max-error: not with --op-times"),
                           (("--no-fit-launches",), "--fit-launches / --no-fit-launches: not with --op-times")):
        proc = run_kdb(*common, *extra, env=env)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    proc = run_kdb(*common[:4], "--workers", "2", env=env)
    assert proc.returncode == 2 and "--workers: only with --op-times" in proc.stderr
    proc = run_kdb(*common[:4], "--seed", "1", env=env)
    assert proc.returncode == 2 and "--seed: only with --run or --op-times" in proc.stderr


@needs_compiler
def test_a_times_file_in_a_missing_folder_is_refused_before_any_build(tmp_path: Path):
    model = write(mixed(), tmp_path / "m.onnx")
    from core.db.kernel_db import KernelDB

    KernelDB.open(tmp_path / "k.db", create=True).close()
    proc = run_kdb("nnfusion", str(model), "--db", str(tmp_path / "k.db"), "--nnfusion", str(COMPILER), "--op-times",
                   str(tmp_path / "nowhere" / "T.json"), env={"KDB_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 2 and "nowhere/T.json" in proc.stderr and "no such folder" in proc.stderr


# -- the whole command on a GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_compiler
def test_on_the_gpu_each_op_is_timed_and_leave_to_library_judges_every_one(tmp_path: Path):
    """On a device machine: every op of the mixed model timed with its row and with the library, the file written
    with exactly those times, and `kdb db leave-to-library` judging every op from it (none 'not measured'), the
    slower ones exactly those whose row ran slower."""
    libraries_or_skip(nvcc_or_skip())
    pytest.importorskip("tvm")
    from test_nnfusion_compiler import build_db

    model = write(mixed(), tmp_path / "mixed.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    times = tmp_path / "T.json"
    env = {"KDB_STATE_DIR": str(tmp_path / "state")}
    proc, report = run_kdb_json("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--op-times",
                                str(times), "--out", str(tmp_path / "run"), "--warmup", "10", "--iterations", "200",
                                env=env)
    assert report["device"], report["no_device"]
    assert [op["problem"] for op in report["ops"]] == [""] * 11, report["findings"]
    slower = {op["identifier"] for op in report["ops"] if op["ratio"] > 1}
    assert proc.returncode == (1 if slower else 0) and report["written"], proc.stderr
    device, measured = read_times(times)
    assert device == report["device"]
    by_id = {op["identifier"]: op for op in report["ops"]}
    assert {t.identifier for t in measured} == set(by_id)
    for t in measured:
        assert t.row_us == by_id[t.identifier]["row_us"] > 0 and t.library_us == by_id[t.identifier]["library_us"] > 0
        assert by_id[t.identifier]["contenders"][0]["timing"]["iterations"] == 200

    proc, plan = run_kdb_json("db", "leave-to-library", str(times), "--db", str(db), env=env)
    assert plan["not_measured"] == [] and plan["absent"] == []
    judged = {v["identifier"]: v for v in plan["slower"] + plan["kept"]}
    assert set(judged) == set(by_id) and {v["identifier"] for v in plan["slower"]} == slower
    for identifier, verdict in judged.items():
        assert (verdict["row_us"], verdict["library_us"]) == (by_id[identifier]["row_us"],
                                                             by_id[identifier]["library_us"])
    assert proc.returncode == (1 if slower else 0)  # a preview that would write says so

"""A network NNFusion compiles only with kdb's rows (a Resize: NNFusion has no CUDA kernel of its own for it, and with
the empty DB its compile aborts) through `kdb nnfusion --run` and `--op-times`, on this CPU machine with the real
compiler and nvcc.

Held out in session 25: `--run` stopped at the empty DB's failed compile and never built, checked or timed the
network with the DB ("with-db not reached"), so no upsampling network was ever checked against ONNX Runtime; and
`--op-times` compiled the Resize's op with the empty DB too, failed, and counted it as an op not timed (exit 1).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from shared_data import shared_path

pytest.importorskip("onnx")
pytest.importorskip("tvm")

from conftest import run_kdb, run_kdb_json
from onnx_models import GraphBuilder, write
from test_nnfusion_run import libraries_or_skip, no_gpu_or_skip, nvcc_or_skip, onnxruntime_or_skip

COMPILER = Path(os.environ.get("KDB_TEST_NNFUSION", shared_path("nnfusion/bin/nnfusion")))
pytestmark = pytest.mark.skipif(not COMPILER.is_file(), reason=f"needs the NNFusion compiler at {COMPILER} "
                                "(../shared/nnfusion, or KDB_TEST_NNFUSION): absent on a fresh clone")


@pytest.fixture(scope="module")
def upsampling(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A 3x3 conv, a nearest Resize by 2, a Relu; its DB through the README's commands (extract, codegen --inject)."""
    nvcc_or_skip()
    tmp = tmp_path_factory.mktemp("upsampling")
    g = GraphBuilder({"x": [1, 4, 6, 6]})
    conv = g.conv("x", 4, 8, 3, bias=False, name="c")
    up = g.node("Resize", [conv, g.constant("roi", [], "float32"), g.constant("scales", [1, 1, 2, 2], "float32")],
                "up", mode="nearest")
    model = write(g.model(g.node("Relu", [up], "out"), "up"), tmp / "up.onnx")
    env = {"KDB_STATE_DIR": str(tmp / "state"), "KDB_CONFIG": str(tmp / "settings.toml")}
    assert run_kdb("settings", "archs=sm_90", f"nnfusion_path={COMPILER}", env=env).returncode == 0
    assert run_kdb("opconfig", "extract", str(model), "-o", str(tmp / "ops.txt"), env=env).returncode == 0
    proc = run_kdb("codegen", str(tmp / "ops.txt"), "--inject", "--db", str(tmp / "k.db"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return model, tmp / "k.db", env


def test_run_builds_the_network_the_empty_db_cannot_compile_and_says_there_is_nothing_to_compare(upsampling, tmp_path):
    nvcc = nvcc_or_skip()
    libraries_or_skip(nvcc)
    onnxruntime_or_skip()
    no_gpu_or_skip()
    model, db, env = upsampling
    proc, report = run_kdb_json("nnfusion", str(model), "--db", str(db), "--run", "--out", str(tmp_path / "run"),
                                env=env)
    assert proc.returncode == 2, proc.stderr  # built, not run: no GPU here
    with_db, empty = report["contenders"]
    assert with_db["build"] and with_db["build"]["ok"], with_db
    assert empty["build"] is None and "No valid kernel found" in empty["problem"]
    assert any(n.startswith("no comparison: with the empty DB NNFusion failed") for n in report["notes"])
    assert report["findings"][0].startswith("no CUDA GPU: the network was built but not run")
    assert report["reference"]["runtime"].startswith("onnxruntime")  # its numbers would be checked on a GPU


def test_op_times_leave_the_resize_untimed_and_say_why_rather_than_fail_it(upsampling, tmp_path):
    nvcc = nvcc_or_skip()
    libraries_or_skip(nvcc)
    no_gpu_or_skip()
    model, db, env = upsampling
    proc, report = run_kdb_json("nnfusion", str(model), "--db", str(db), "--op-times", str(tmp_path / "t.json"),
                                "--out", str(tmp_path / "ops"), env=env)
    assert proc.returncode == 2, proc.stderr  # built, not run: no GPU here
    assert [op["op_type"] for op in report["ops"]] == ["Convolution", "Relu"]
    assert all(not op["problem"] for op in report["ops"])
    assert any("not timed: the Resize rows" in n and "no kernel of its own" in n for n in report["notes"])

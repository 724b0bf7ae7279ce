"""Never slower, judged on the network (core/gpu/never_slower.py): which rows go together, the greedy search on the
network's round medians, and a machine without a GPU, where nothing is measured and the DB is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_kdb

from core.db.library import Verdict as OpVerdict
from core.gpu.never_slower import Candidate, candidates, search
from core.gpu.verdict import FASTER, WITHIN_NOISE
from core.nnfusion.generated import BLOCKFUSION, KERNEL
from core.nnfusion.usage import DB_KERNEL, Part, StepUse, Usage


def op(name: str, extra_us: float) -> OpVerdict:
    return OpVerdict(f"Convolution{name}", "Convolution", f"k{name}", (f"k{name}",), 10.0 + extra_us, 10.0)


def test_ops_blockfusion_runs_in_one_kernel_are_one_candidate_the_costliest_first():
    usage = Usage([StepUse("bf", BLOCKFUSION, (Part("c1", "f1", DB_KERNEL, ("k1",)), Part("c2", "f2", DB_KERNEL,
                                                                                            ("k2",)))),
                   StepUse("c3", KERNEL, (Part("c3", "f3", DB_KERNEL, ("k3",)),))], [], {})
    found = candidates([op("1", 1.0), op("3", 5.0), op("2", 2.0)], usage)
    assert [c.keys for c in found] == [("k3",), ("k1", "k2")]
    assert found[1].extra_us == 3.0 and "2 ops of one BlockFusion kernel" in found[1].describe()


def test_a_change_is_kept_only_when_the_network_is_faster_in_every_round():
    best = [1.00, 1.01, 0.99, 1.00, 1.02]
    measured = {"a": [0.90, 0.91, 0.92, 0.90, 0.91],  # faster than the best: kept
                "b": [0.91, 0.89, 0.92, 0.95, 0.90],  # overlaps the new best (a's): put back
                "c": None}  # not measured: put back, and the search stops
    put_back: list[Path] = []
    story: list[str] = []  # what happened, in order: each trial must be heard before the next one starts

    def try_without(c: Candidate):
        name = c.identifiers[0]
        story.append(f"try {name}")
        return measured[name], Path(f"undo-{name}"), "" if measured[name] else "no CUDA GPU", None

    pending = [Candidate((n,), (f"k{n}",), 1.0) for n in ("a", "b", "c", "d")]
    trials = search(pending, best, try_without, put_back.append, lambda t: story.append(t.line()))
    assert [line.split(" ")[0] for line in story] == ["try", "kept", "try", "put", "try", "put"], story
    assert story[1].startswith("kept     a (+1.0 us alone): faster in every round; over the empty DB 0.910x") \
        and story[1].endswith("undo: kdb db undo undo-a --apply"), story[1]
    assert story[5].endswith("no CUDA GPU; not measured"), story[5]
    assert [(t.candidate.identifiers[0], t.kept) for t in trials] == [("a", True), ("b", False), ("c", False)]
    assert trials[0].verdict.verdict == FASTER and trials[0].undo_file == Path("undo-a")
    assert trials[1].verdict.verdict == WITHIN_NOISE and trials[1].undo_file is None
    assert trials[2].verdict is None and trials[2].why == "no CUDA GPU"
    assert put_back == [Path("undo-b"), Path("undo-c")]  # d was never tried


def test_in_a_log_the_run_says_each_stage_as_it_comes(capsys: pytest.CaptureFixture[str]):
    """Not on a terminal (a script's log), a run prints a line to stderr each time it moves to another stage: a run
    a timeout cuts off still says how far it got (session 30's never-slower run left an empty log)."""
    import argparse

    from console.cli.nnfusion_run import _progress

    with _progress(argparse.Namespace(json=False), "running") as say:
        assert say is not None
        for stage, detail in [("compile (with-db)", "starting NNFusion"), ("compile (with-db)", "a log line"),
                              ("round 1/3", "with-db"), ("never slower: decided", "put back X")]:
            say(stage, detail)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" s ", 1)[1] for line in lines] == [
        "compile (with-db): starting NNFusion", "round 1/3: with-db", "never slower: decided: put back X"], lines
    with _progress(argparse.Namespace(json=True), "running") as say:
        assert say is None  # --json: stdout is the report, stderr stays quiet


def test_a_network_only_the_db_compiles_is_judged_on_its_own_times():
    """With the empty DB's compile aborting (a Resize: no kernel of NNFusion's own) each round has the DB's time
    alone; the rounds are then those times, not ratios over an empty DB that never ran."""
    from core.gpu.network_run import NetworkRun, RunOptions
    from core.gpu.never_slower import _rounds
    from core.nnfusion.compile_job import CompileJob

    run = NetworkRun(CompileJob(Path("m.onnx"), Path("k.db")), RunOptions(), Path("w"))
    run.with_db.rounds = [{"median_ms": t} for t in (0.5, 0.6)]
    assert _rounds(run) == [0.5, 0.6]
    run.empty_db.rounds = [{"median_ms": t} for t in (1.0, 2.0)]
    assert _rounds(run) == [0.5, 0.3]


def test_never_slower_asks_for_run(tmp_path: Path):
    proc = run_kdb("nnfusion", "m.onnx", "--never-slower", "t.json", cwd=tmp_path)
    assert proc.returncode == 2 and "--never-slower: only with --run" in proc.stderr, proc.stderr


def test_without_a_gpu_nothing_is_measured_and_the_db_is_left_as_it_was(tmp_path: Path):
    """The candidates come from a times file; the network as the DB is cannot be run here: status 2, no trial, the
    DB byte for byte as before."""
    pytest.importorskip("tvm")
    from test_nnfusion_compiler import build_db
    from test_nnfusion_run import (
        COMPILER,
        libraries_or_skip,
        no_gpu_or_skip,
        nvcc_or_skip,
        onnxruntime_or_skip,
        two_in_two_out,
    )

    if not COMPILER.is_file():
        pytest.skip(f"needs the NNFusion compiler at {COMPILER}")
    libraries_or_skip(nvcc_or_skip())
    onnxruntime_or_skip()
    no_gpu_or_skip()
    model = two_in_two_out(tmp_path / "two.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    import sqlite3

    rows = sqlite3.connect(db).execute("SELECT Identifier FROM KernelCache").fetchall()
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"device": "NVIDIA H100", "ops": [{"identifier": r[0], "library_us": 1.0,
                                                                    "row_us": 2.0} for r in rows]}))
    before = db.read_bytes()
    proc = run_kdb("nnfusion", str(model), "--db", str(db), "--nnfusion", str(COMPILER), "--run", "--never-slower",
                   str(times), "--json", "--out", str(tmp_path / "run"), env={"KDB_STATE_DIR": str(tmp_path / "s")})
    report = json.loads(proc.stdout)
    assert proc.returncode == 2 and report["status"] == 2 and report["trials"] == [], proc.stderr[-2000:]
    assert report["findings"][0].startswith("not measured") and any("no CUDA GPU" in f for f in report["findings"])
    assert db.read_bytes() == before


async def test_n_in_the_compile_dialog_runs_the_same_step_and_says_nothing_was_measured(tmp_path: Path,
                                                                                       monkeypatch: pytest.MonkeyPatch):
    """The console's face of --never-slower: n asks for the op times file, runs the one core use case, and shows its
    findings; without a GPU: not measured, nothing written."""
    from test_nnfusion_run import (
        COMPILER,
        empty_db,
        libraries_or_skip,
        no_gpu_or_skip,
        nvcc_or_skip,
        onnxruntime_or_skip,
        two_in_two_out,
    )

    if not COMPILER.is_file():
        pytest.skip(f"needs the NNFusion compiler at {COMPILER}")
    libraries_or_skip(nvcc_or_skip())
    onnxruntime_or_skip()
    no_gpu_or_skip()
    from console_helpers import app_with_compiler, compile_dialog
    from test_console_opconfigs import wait_for
    from textual.widgets import Input, Static


    monkeypatch.setenv("KDB_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KDB_CONFIG", str(tmp_path / "settings.toml"))
    model = two_in_two_out(tmp_path / "two.onnx")
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"device": "NVIDIA H100", "ops": []}))
    app = app_with_compiler(empty_db(tmp_path / "user.db"), COMPILER)
    async with app.run_test(size=(160, 45)) as pilot:
        dialog = await compile_dialog(pilot, app, model)
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is not dialog)
        app.screen.query_one("#path", Input).value = str(times)
        await pilot.press("enter")
        status = dialog.query_one("#compile-status", Static)
        await wait_for(pilot, lambda: "never slower: not measured" in str(status.render()), timeout=300)
        assert "no CUDA GPU" in str(dialog.query_one("#compile-status", Static).render())

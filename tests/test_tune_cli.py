"""`kdb tune` says what it did: budgets below 1 refused, llvm's results and TVM's log located, one trial event per
measured candidate with phase events between, reuse said, one progress bar per op, a model tuned as a network.

Tuning runs use --target llvm (MetaSchedule measures on the CPU) and a handful of trials."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from conftest import run_kdb
from rich.console import Console

from core.nnfusion.compiler import compiler_prepass
from core.opconfigs.opconfig import parse_line
from core.settings import load_settings
from core.tuning.job import PhaseEvent, TrialEvent, TuneJob
from core.tuning.network import network_from_model, spread_budget
from core.tuning.tvm_log import Captured

DOT = "cublas_dot_op_float|a+16_16|b+16_16|o+16_16|ta+0|tb+0"
TVM_LINES = ("task_scheduler.cc", "XGB", "TaskScheduler picks")


def text_file(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]  # raises if anything but JSON reached stdout


@pytest.mark.parametrize(("option", "refused"), [("--trials", "must be from 1 to 100000, not 0"),
                                                 ("--budget", "must be at least 1, not 0"),
                                                 ("--batch", "must be from 1 to 4096, not 0")])
def test_a_budget_below_one_is_refused_before_anything_runs(tmp_path: Path, option: str, refused: str):
    proc = run_kdb("tune", str(text_file(tmp_path / "ops.txt", DOT + "\n")), "--target", "llvm", option, "0",
                   timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{option}: {refused}" in proc.stderr
    assert not (tmp_path / "state" / "tuning").exists()


def test_one_progress_bar_per_op_whatever_the_events():
    """Seven stale 0/8 bars were left after the 8/8 one: each trial event made a new bar."""
    from console.cli.cmd_tune import _Live

    screen = io.StringIO()
    captured = Captured(Path("tvm.log"), io.StringIO(), screen)
    stdout, stderr = sys.stdout, sys.stderr
    view = _Live(captured, Console(file=screen, force_terminal=True, width=160), json_lines=False)
    job = TuneJob(parse_line(DOT, "d"), trials=3, target="llvm")
    try:
        # The bar leaves sys.stdout/stderr alone: MetaSchedule logs there, and that goes to the log file.
        assert (sys.stdout, sys.stderr) == (stdout, stderr)
        view.phase(PhaseEvent(job.name, "build", 1, 2, 3))
        for trial in (1, 2, 3):
            view.trial(TrialEvent.of(job, trial, 2e-5, 2e-5, "", 1.0))
        assert len(view.bar.tasks) == 1
        task = view.bar.tasks[0]
        assert (task.completed, task.total) == (3, 3) and task.fields["best"] == "best 20.00 us"
    finally:
        view.stop()


@pytest.mark.slow
@pytest.mark.tvm
def test_a_population_smaller_than_the_batch_is_refused_before_anything_runs(tmp_path: Path):
    proc = run_kdb("tune", str(text_file(tmp_path / "ops.txt", DOT + "\n")), "--target", "llvm", "--batch", "64",
                   "--population", "32", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--population: a population of 32 cannot give batches of 64" in proc.stderr
    assert not (tmp_path / "state" / "tuning").exists()


def test_batch_sets_the_candidates_of_each_search_round(tmp_path: Path):
    pytest.importorskip("tvm")
    ops = str(text_file(tmp_path / "dot.txt", DOT + "\n"))
    proc = run_kdb("tune", ops, "--target", "llvm", "--trials", "3", "--batch", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rounds = [e["total"] for e in events(proc.stdout) if e["event"] == "phase" and e["phase"] == "build"
              and e["done"] == 0]
    assert rounds == [2, 1]


def test_tune_says_what_it_did_streams_each_trial_and_says_when_it_reuses(tmp_path: Path):
    pytest.importorskip("tvm")
    ops = str(text_file(tmp_path / "dot.txt", DOT + "\n"))

    # 1. --json: progress events only on stdout, one trial per measured candidate, after the build phases.
    first = run_kdb("tune", ops, "--target", "llvm", "--trials", "2", "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    stream = events(first.stdout)
    kinds = [e["event"] if e["event"] != "phase" else e["phase"] for e in stream]
    assert kinds[:3] == ["job", "job", "search"] and kinds[-2:] == ["job", "summary"]
    assert [e["trial"] for e in stream if e["event"] == "trial"] == [1, 2]
    assert kinds.index("build") < kinds.index("measure") < kinds.index("trial")
    builds = [(e["done"], e["total"]) for e in stream if e["event"] == "phase" and e["phase"] == "build"]
    assert builds[0] == (0, 2) and builds[-1] == (2, 2)
    summary = stream[-1]
    work_dir, log = Path(summary["jobs"][0]["work_dir"]), Path(summary["log"])
    assert len((work_dir / "database_tuning_record.json").read_text().splitlines()) == 2
    assert summary["jobs"][0]["reused"] is False and summary["jobs"][0]["phases_s"]["search"] > 0
    assert (summary["jobs"][0]["search"], summary["jobs"][0]["model_trials"]) == ("sampled", 0)
    # TVM's own output went to the log in the state dir, not to the terminal.
    assert log.parent == tmp_path / "state" / "logs" and any(m in log.read_text() for m in TVM_LINES)
    assert not any(m in first.stderr for m in TVM_LINES), first.stderr
    assert "CPU kernels cannot enter a CUDA kernel DB" in first.stderr and f"TVM's log: {log}" in first.stderr

    # 2. Plain text, one more trial, --verbose: TVM's log shown too; says it resumed and where the results are.
    second = run_kdb("tune", ops, "--target", "llvm", "--trials", "3", "--verbose")
    assert second.returncode == 0, second.stderr[-2000:]
    assert any(m in second.stderr for m in TVM_LINES)
    assert "resuming from 2 trials already recorded" in second.stdout
    assert "done: Dot 16x16 x 16x16: best" in second.stdout and "after 3 trials" in second.stdout
    # the new process's cost model learnt the 2 recorded trials first (core/tuning/costmodel.py)
    assert "sampled (the cost model had 2 trials, too few to rank)" in second.stdout
    assert "nothing injected: CPU (llvm) kernels cannot enter a CUDA kernel DB" in second.stderr
    assert f"results: 1 tuning work dir(s) under {tmp_path / 'state' / 'tuning'}" in second.stderr
    assert str(work_dir) in second.stderr and "TVM's log: " in second.stderr

    # 3. The same budget again: nothing measured, and it says the result is an earlier run's.
    third = run_kdb("tune", ops, "--target", "llvm", "--trials", "3", "--json")
    assert third.returncode == 0, third.stderr[-2000:]
    stream = events(third.stdout)
    assert not [e for e in stream if e["event"] in ("trial", "phase")]
    done = next(e for e in stream if e["event"] == "job" and e["status"] == "done")
    assert done["detail"].startswith(f"reused (3 trials already recorded in {work_dir}")
    assert stream[-1]["jobs"][0]["reused"] is True and stream[-1]["jobs"][0]["new_trials"] == 0


def small_network(path: Path) -> Path:
    pytest.importorskip("onnx")
    from onnx_models import small_cnn, write

    return write(small_cnn(), path)


@pytest.mark.slow
@pytest.mark.tvm
def test_a_model_is_tuned_as_one_network_and_resumes_without_measuring_again(tmp_path: Path):
    pytest.importorskip("tvm")
    model = str(small_network(tmp_path / "small.onnx"))
    first = run_kdb("tune", model, "--target", "llvm", "--budget", "6", "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "network small: 2 distinct ops" in first.stderr and "6 trials spread" in first.stderr
    assert "not tuned" not in first.stderr  # the Sigmoid and Relu NNFusion fuses are no op of the network at all
    stream = events(first.stdout)
    jobs = stream[-1]["jobs"]
    # Each op is probed with one trial (the floor of a 6-trial budget over 2 ops) before the budget is spread,
    # and the spread weighs what the probes measured, not the FLOPs.
    probes = {e["job"]: e["seconds"] for e in stream if e["event"] == "trial" and e["trial"] == 1}
    queued = [i for i, e in enumerate(stream) if e["event"] == "job" and e["status"] == "queued"]
    assert len(probes) == 2 and len(queued) == 4  # the probes' queue, then the tuning's
    probed = [e for e in stream[:queued[2]] if e["event"] == "job" and e["status"] == "done"]
    assert len(probed) == 2 and all("after 1 trials" in e["detail"] for e in probed)
    # each job event says its queue: the probes' is "probe", and the index counts within it
    assert [(stream[i]["stage"], stream[i]["index"], stream[i]["of"]) for i in queued] == \
        [("probe", 0, 2), ("probe", 1, 2), ("", 0, 2), ("", 1, 2)]
    network = network_from_model(Path(model), prepass=compiler_prepass("", load_settings().nnfusion_path))
    expected = spread_budget(network.ops, 6, recorded={op.config.key: 1 for op in network.ops},
                             best={op.config.key: probes[op.config.describe()] for op in network.ops})
    trials = {j["op"]: j["trials"] for j in jobs}
    assert trials == {op.config.describe(): expected[op.config.key] for op in network.ops} and sum(trials.values()) == 6
    assert all(j["new_trials"] == j["trials"] for j in jobs)  # probe and tuning, one result per op
    predictions = [e for e in stream if e["event"] == "network"]
    assert len(predictions) > 2 and predictions[0]["predicted_seconds"] is None
    final = stream[-1]["network"]
    assert final["measured_ops"] == final["ops"] == 2 and final["library_seconds"] is None  # no cuDNN on llvm
    best = {j["op"].split(" ")[0]: j["best_us"] * 1e-6 for j in jobs}
    assert final["predicted_seconds"] == pytest.approx(2 * best["Fused_Convolution_Relu"] + best["MaxPool"])

    again = run_kdb("tune", model, "--target", "llvm", "--budget", "6", "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    stream = events(again.stdout)
    assert not [e for e in stream if e["event"] == "trial"]
    assert all(j["reused"] and j["new_trials"] == 0 for j in stream[-1]["jobs"])
    assert stream[-1]["network"]["predicted_seconds"] == pytest.approx(final["predicted_seconds"])


@pytest.mark.slow
@pytest.mark.tvm
def test_two_processes_joining_one_run_tune_each_op_once(tmp_path: Path):
    """`kdb tune model --join RUN` in two processes at once, one state dir: each op's probe and job run in one of
    them (the other says "elsewhere"), and between them they spend the budget once."""
    pytest.importorskip("tvm")
    import os
    import subprocess

    model = str(small_network(tmp_path / "small.onnx"))
    cmd = [sys.executable, "-m", "console.entry", "tune", model, "--target", "llvm", "--budget", "6", "--json",
           "--join", "run-1", "--workers", "1"]
    env = {**os.environ, "KDB_STATE_DIR": str(tmp_path / "state")}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                              cwd=Path(__file__).resolve().parents[1]) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    streams = [events(out) for out, _ in outputs]
    for stage in ("probe", ""):
        tuned = [e["job"] for s in streams for e in s
                 if e["event"] == "job" and e["stage"] == stage and e["status"] == "tuning"]
        elsewhere = [e["job"] for s in streams for e in s
                     if e["event"] == "job" and e["stage"] == stage and e["status"] == "elsewhere"]
        assert len(tuned) == 2 and len(set(tuned)) == 2, f"stage {stage!r}: each op once: {tuned}"
        assert sorted(elsewhere) == sorted(tuned), f"stage {stage!r}: the other process left each op alone"
    # An op's probe and its job can run in different processes: each lists the op, with the trials it measured
    # itself (new_trials; "trials" counts the op's work dir, the other process's too).
    jobs = [j for s in streams for j in s[-1]["jobs"]]
    assert sum(j["new_trials"] for j in jobs) == 6 and len({j["op"] for j in jobs}) == 2, jobs
    assert all(s[-1]["network"]["measured_ops"] == 2 for s in streams), "each process predicts from all records"
    # the same run name again: every op is claimed already, and the process says why it tuned nothing
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=Path(__file__).resolve().parents[1],
                           timeout=600)
    assert again.returncode == 0 and events(again.stdout)[-1]["jobs"] == []
    assert "--join run-1: the run's other processes had claimed every op" in again.stderr


def test_join_needs_a_network(tmp_path: Path):
    proc = run_kdb("tune", str(text_file(tmp_path / "ops.txt", DOT + "\n")), "--target", "llvm", "--join", "r",
                   timeout=120)
    assert proc.returncode == 2 and "--join: several processes share the ops of one network" in proc.stderr


@pytest.mark.slow
@pytest.mark.tvm
def test_max_per_op_caps_every_ops_share_of_the_budget(tmp_path: Path):
    pytest.importorskip("tvm")
    model = str(small_network(tmp_path / "small.onnx"))
    proc = run_kdb("tune", model, "--target", "llvm", "--budget", "6", "--max-per-op", "2", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = events(proc.stdout)[-1]["jobs"]
    assert sorted(j["trials"] for j in jobs) == [2, 2], "6 trials over 2 ops, neither above 2"
    refused = run_kdb("tune", str(text_file(tmp_path / "ops.txt", DOT + "\n")), "--target", "llvm",
                      "--max-per-op", "2", timeout=120)
    assert refused.returncode == 2 and "--max-per-op: only a network's trials are spread" in refused.stderr

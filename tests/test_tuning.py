"""Tuning on MetaSchedule with the llvm target (measures on the CPU: the same code path as CUDA, runs in CI):
live events, resume from a torn work dir with the budget honoured, measurement over TVM's RPC tracker
with several servers, and a server dying mid-job."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("tvm")

from tvm.s_tir.meta_schedule.runner import RunnerResult

from core.opconfigs.opconfig import parse_line
from core.tuning.job import RpcTarget, TuneJob
from core.tuning.measure import COLD_RUNS
from core.tuning.records import recorded_runs, repair_work_dir
from core.tuning.resilient import RequeuedFuture, is_session_error
from core.tuning.rpc import RpcCluster
from core.tuning.run import run_tune

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
DOT = parse_line("cublas_dot_op_float|a+16_16|b+16_16|o+16_16|ta+0|tb+0", "dot16")


def job(trials: int, **kw) -> TuneJob:
    return TuneJob(DOT, trials=trials, **{"target": "llvm", "trials_per_batch": 3, "builder_workers": 2, "seed": 3,
                                          **kw})


@pytest.mark.slow
def test_events_per_trial_and_resume_after_a_torn_record(tmp_path: Path):
    events = []
    first = run_tune(job(3), tmp_path, on_event=events.append)
    assert first.trials == 3 and [e.trial for e in events] == [1, 2, 3]
    assert all(e.total == 3 for e in events) and events[-1].best_seconds == first.best_seconds
    records = first.work_dir / "database_tuning_record.json"
    records.write_bytes(records.read_bytes()[:-25])  # a kill in the middle of the last write
    assert repair_work_dir(first.work_dir) == 2
    events.clear()
    resumed = run_tune(job(5), tmp_path, on_event=events.append)
    assert resumed.trials == 5 and resumed.new_trials == 3  # 2 kept + 3 new: the budget of 5 honoured
    assert [e.trial for e in events] == [3, 4, 5]
    for line in records.read_text().splitlines():
        json.loads(line)
    assert len(recorded_runs(first.work_dir)) == 5


@pytest.mark.slow
def test_cold_l2_timing_runs_each_trial_singly_after_a_flush(tmp_path: Path):
    # What CUDA tuning uses (on by default there), run here through the same LocalRunner worker on the CPU.
    result = run_tune(job(2, cold_l2=True), tmp_path)
    runs = [json.loads(line)[1][1] for line in (result.work_dir / "database_tuning_record.json").read_text().splitlines()]
    assert len(runs) == 2 and all(len(r) == COLD_RUNS and all(0 < s < 1 for s in r) for r in runs)
    warm = run_tune(job(1, cold_l2=False), tmp_path / "warm")
    warm_runs = json.loads((warm.work_dir / "database_tuning_record.json").read_text().splitlines()[0])[1][1]
    assert len(warm_runs) == 1  # MetaSchedule's own evaluator: one average of back-to-back runs


@pytest.mark.slow
def test_rpc_tracker_with_two_servers_and_one_dying_mid_job(tmp_path: Path):
    with RpcCluster(key="kdb-test") as cluster:
        cluster.add_server("a")
        cluster.add_server("b")
        status = cluster.wait_for_servers(2)
        assert status.reachable and len(status.servers) == 2 and status.queue["kdb-test"]["free"] == 2
        killed = threading.Event()

        def on_event(event) -> None:  # type: ignore[no-untyped-def]
            if not killed.is_set():  # after the first measured batch, one server goes away
                cluster.kill_server("a")
                killed.set()

        # cold_l2: the servers time each run after an L2 flush, as CUDA tuning does over RPC
        result = run_tune(job(6, rpc=RpcTarget("127.0.0.1", cluster.port, "kdb-test"), rpc_workers=2, cold_l2=True),
                          tmp_path, on_event=on_event)
    assert killed.is_set()
    assert result.trials == 6 and result.best_seconds is not None
    records = (result.work_dir / "database_tuning_record.json").read_text().splitlines()
    assert all(len(json.loads(line)[1][1]) == COLD_RUNS for line in records)
    assert not any(k.startswith("run") for k in result.errors), result.errors  # no trial lost to the dead server


class _FakeRunner:
    """Stands in for RPCRunner in the re-queue unit test: fails the first run of each input like a lost session."""

    def __init__(self) -> None:
        self.calls = 0
        self.requeued = 0

    def run(self, inputs):  # type: ignore[no-untyped-def]
        self.calls += 1
        outcome = (RunnerResult(None, "RPCRunner: An exception occurred\nConnection reset by peer")
                   if self.calls == 1 else RunnerResult([1e-5], None))
        return [type("F", (), {"done": lambda self: True, "result": lambda self, o=outcome: o})() for _ in inputs]


def test_a_trial_lost_with_its_session_is_measured_again():
    inner = _FakeRunner()
    owner = type("Owner", (), {"inner": inner, "requeued": 0})()
    future = RequeuedFuture(owner, "input", inner.run(["input"])[0], retries=2)
    result = future.result()
    assert result.error_msg is None and [float(s) for s in result.run_secs] == [1e-5] and owner.requeued == 1
    assert is_session_error("RPCRunner: Timeout, killed after 10 seconds")
    assert not is_session_error("CUDA error: an illegal memory access was encountered")


def test_the_cuda_design_space_drops_async_pipelines_and_keeps_metaschedules_rules():
    """sm_90 spaces with cp.async pipelines give kernels that lean on helpers outside the kernel body."""
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.tuning.space import self_contained_cuda_space, uses_async_pipeline

    conv = parse_line("cudnn_convolution_op_float|i+1_64_27_27|w+192_64_5_5|o+1_192_27_27|ws+1_1|wd+1_1|p+2_2", "conv")
    mod, _ = prim_func_module(conv)

    def spaces(generator):  # type: ignore[no-untyped-def]
        context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=generator, task_name="t")
        return context.space_generator, context.space_generator.generate_design_space(mod)

    default, default_spaces = spaces("post-order-apply")
    ours, our_spaces = spaces(self_contained_cuda_space())
    assert any(uses_async_pipeline(s) for s in default_spaces)
    assert our_spaces and not any(uses_async_pipeline(s) for s in our_spaces)
    assert len(our_spaces) == sum(not uses_async_pipeline(s) for s in default_spaces)

    def names(objects) -> list[str]:  # type: ignore[no-untyped-def]
        return [type(o).__name__ for o in objects]

    assert names(ours.sch_rules) == names(default.sch_rules)
    assert names(ours.postprocs) == names(default.postprocs)
    assert names(ours.mutator_probs) == names(default.mutator_probs)


@pytest.mark.parametrize("line", [
    "cudnn_maxpool_op_float|i+1_64_112_112|o+1_64_56_56|win+3_3|ws+2_2|pb+1_1|pa+1_1",  # ResNet-18's
    "cudnn_maxpool_op_float|i+1_8_16_16|o+1_8_8_8|win+2_2|ws+2_2|pb+0_0|pa+0_0",
    "cudnn_avgpool_op_float|i+1_32_28_28|o+1_32_28_28|win+3_3|ws+1_1|pb+1_1|pa+1_1",
    "cudnn_avgpool_op_float|i+1_512_7_7|o+1_512_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0",  # ResNet-18's
    "cudnn_softmax_op_float|i+1_12_128_128|o+1_12_128_128",  # BERT's attention
    "cudnn_softmax_op_half|i+2_1000|o+2_1000",
])
def test_every_cuda_design_space_of_a_pool_or_softmax_builds_into_one_kernel(line: str):
    """topi's pool ended in a stage after its reduction (a copy; the average's division) that MetaSchedule
    bound apart: two kernels per schedule, so a whole tuning of ResNet-18's MaxPool on the H200 gave nothing
    a DB row could hold. A softmax's two reductions: most of MetaSchedule's spaces launch a kernel for each."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, extract_kernel, prim_func_module
    from core.tuning.space import self_contained_cuda_space

    mod, _ = prim_func_module(parse_line(line, "pool"))
    target = cuda_target("sm_90")
    context = ms.TuneContext(mod=mod, target=target, space_generator=self_contained_cuda_space(), task_name="t")
    spaces = context.space_generator.generate_design_space(mod)
    assert spaces
    for space in spaces:
        schedule = space.copy()
        for postproc in context.space_generator.postprocs:
            assert postproc.apply(schedule)
        source = tvm.compile(schedule.mod, target=target).mod.imports[0].inspect_source()
        extract_kernel(source, "k")  # InputError("the schedule produced 2 kernels ...") before


@pytest.mark.parametrize(("line", "dropped", "kept"), [
    # 3x3 window: 9 elements over 4-512 threads, one output per block (125 us against cuDNN's 8.4 on the H200)
    ("cudnn_maxpool_op_float|i+1_64_112_112|o+1_64_56_56|win+3_3|ws+2_2|pb+1_1|pa+1_1", 1, 1),
    ("cudnn_avgpool_op_float|i+1_512_7_7|o+1_512_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0", 0, 2),  # 49: a warp's worth
])
def test_the_cuda_design_space_drops_cross_thread_reductions_shorter_than_a_warp(line: str, dropped: int, kept: int):
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.tuning.space import self_contained_cuda_space, spreads_a_short_reduction_over_threads

    mod, _ = prim_func_module(parse_line(line, "pool"))
    generator = self_contained_cuda_space()
    context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=generator, task_name="t")
    every = generator.inner.generate_design_space(mod)
    ours = context.space_generator.generate_design_space(mod)
    assert sum(map(spreads_a_short_reduction_over_threads, every)) == dropped
    assert len(ours) == kept == len(every) - dropped
    assert not any(map(spreads_a_short_reduction_over_threads, ours))


def test_the_cuda_design_space_of_a_softmax_keeps_only_its_one_kernel_schedule():
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.tuning.space import launches, self_contained_cuda_space

    mod, _ = prim_func_module(parse_line("cudnn_softmax_op_float|i+1_12_128_128|o+1_12_128_128", "softmax"))
    generator = self_contained_cuda_space()
    context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=generator, task_name="t")
    assert sorted(map(launches, generator.inner.generate_design_space(mod))) == [1, 2, 3, 3]  # a kernel a stage
    assert list(map(launches, context.space_generator.generate_design_space(mod))) == [1]


def test_a_rank_3_dot_tunes_the_2d_gemm_workload_in_a_work_dir_of_its_own(tmp_path: Path):
    """NNFusion's Dot of a [2,8,64] activation by a [64,48] weight: MetaSchedule tunes the [16,64] x [64,48] GEMM
    (the very workload of that 2-D Dot, which CUDA tuning already handles), in a work dir of its own (its kernels
    are the rank-3 op's rows); an llvm job measures it."""
    import tvm

    from core.codegen.generate import prim_func_module

    rank3 = parse_line("cublas_dot_op_float|a+2_8_64|b+64_48|o+2_8_48|ta+0|tb+0", "bert")
    flat = parse_line("cublas_dot_op_float|a+16_64|b+64_48|o+16_48|ta+0|tb+0", "gemm")
    mod, _ = prim_func_module(rank3)
    tvm.ir.assert_structural_equal(mod, prim_func_module(flat)[0])
    assert TuneJob(rank3, 1).directory(tmp_path) != TuneJob(flat, 1).directory(tmp_path)
    result = run_tune(TuneJob(rank3, trials=2, target="llvm", trials_per_batch=2, builder_workers=2, seed=3),
                      tmp_path / "llvm")
    assert result.trials == 2 and result.best_seconds is not None


def test_a_changed_definition_tunes_in_a_work_dir_of_its_own_and_the_others_keep_theirs(tmp_path: Path):
    """A work dir's trials are of one TVM workload: the pools' new definition must not resume the old one's
    trials (their best could not be rebuilt), while every other op resumes the H200 runs' records."""
    conv = parse_line("cudnn_convolution_op_float|i+1_64_56_56|w+64_64_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1", "c")
    pool = parse_line("cudnn_maxpool_op_float|i+1_64_112_112|o+1_64_56_56|win+3_3|ws+2_2|pb+1_1|pa+1_1", "p")
    # the names of these ops' work dirs in the H200 runs' records (sessions 6 and 7)
    assert TuneJob(conv, 1).directory(tmp_path).name == "convolution-2b7e692b3f27"
    assert TuneJob(pool, 1).directory(tmp_path).name not in ("maxpool-bafa16a98e52", "")


# ---------------------------------------------------------------------------------------------
# Streaming: each candidate recorded, then reported, as it is measured (core/tuning/pipeline.py)


def test_each_trial_is_on_disk_when_reported_and_phases_come_between(tmp_path: Path):
    seen = []

    def on_event(event) -> None:  # type: ignore[no-untyped-def]
        # Recorded before it is reported: the work dir holds exactly the trials reported so far, not the batch.
        seen.append(("trial", event.trial, len(recorded_runs(event_dir[0]))))

    event_dir = [job(4).directory(tmp_path)]
    result = run_tune(job(4, trials_per_batch=4), tmp_path, on_event=on_event,
                      on_phase=lambda e: seen.append((e.phase, e.done, e.total)))
    assert result.trials == 4 and not result.cancelled
    assert [s for s in seen if s[0] == "trial"] == [("trial", n, n) for n in (1, 2, 3, 4)]
    kinds = [s[0] for s in seen]
    # On the CPU every build finishes before the measurement starts (timing on busy cores would be wrong).
    assert kinds[0] == "search" and kinds.index("measure") < kinds.index("trial")
    builds = [s for s in seen if s[0] == "build"]
    assert builds[0] == ("build", 0, 4) and builds[-1] == ("build", 4, 4)
    assert kinds.index("measure") > max(i for i, k in enumerate(kinds) if k == "build")
    assert set(result.phases) >= {"set-up", "search", "build", "measure", "record", "cost model", "other"}
    assert result.phases["build workers"] > 0 and result.phases["search"] > 0
    assert sum(v for k, v in result.phases.items() if k != "build workers") == pytest.approx(result.seconds, rel=0.01)


@pytest.mark.parametrize("overlap", [False, True])
def test_build_failures_are_recorded_and_reported_as_build_failures(tmp_path: Path, overlap: bool):
    # A 1 ms build timeout: every candidate fails to build, with the runner measuring beside the builds or not.
    events = []
    result = run_tune(job(2, trials_per_batch=2, builder_timeout_s=0.001, overlap=overlap), tmp_path,
                      on_event=events.append)
    assert [e.trial for e in events] == [1, 2]
    assert all(e.seconds is None and e.error.startswith("build: ") and "Timeout" in e.error for e in events)
    assert result.errors == {"build: timeout": 2} and result.best_seconds is None
    records = (result.work_dir / "database_tuning_record.json").read_text().splitlines()
    assert len(records) == 2 and recorded_runs(result.work_dir) == [None, None]


def test_cancel_stops_after_the_trial_in_flight_and_keeps_it(tmp_path: Path):
    asked = threading.Event()

    def on_event(event) -> None:  # type: ignore[no-untyped-def]
        asked.set()  # cancel as soon as the first trial is reported: the rest of its batch is not measured

    result = run_tune(job(4, trials_per_batch=4), tmp_path, on_event=on_event, should_cancel=asked.is_set)
    assert result.cancelled and result.trials == result.new_trials == 1
    assert len(recorded_runs(result.work_dir)) == 1
    resumed = run_tune(job(4, trials_per_batch=4), tmp_path)
    assert (resumed.trials, resumed.new_trials, resumed.resumed) == (4, 3, 1) and not resumed.reused
    again = run_tune(job(4), tmp_path)
    assert again.reused and again.new_trials == 0 and again.best_seconds == resumed.best_seconds


def test_an_llvm_job_does_not_import_the_tensor_intrinsics(tmp_path: Path):
    """TuneContext imports tvm.s_tir.tensor_intrin (all CUDA, ARM, ... intrinsics through TVMScript: tens of
    seconds per process); the llvm rules use none, so an llvm job leaves it out, and leaves no stand-in behind."""
    code = (
        "import sys; from pathlib import Path\n"
        "from core.opconfigs.opconfig import parse_line\n"
        "from core.tuning.job import TuneJob\n"
        "from core.tuning.run import run_tune\n"
        "c = parse_line('cublas_dot_op_float|a+8_8|b+8_8|o+8_8|ta+0|tb+0', 'd')\n"
        f"r = run_tune(TuneJob(c, 1, 'llvm', builder_workers=1), Path({str(tmp_path)!r}))\n"
        "assert r.trials == 1, r\n"
        "print(sorted(m for m in sys.modules if m.startswith('tvm.s_tir.tensor_intrin')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow
def test_a_time_budget_keeps_the_job_in_flights_best_and_starts_no_other(tmp_path: Path, monkeypatch):
    """`kdb tune --minutes`: unlike a cancel, the job the budget stops counts as done with what it measured (on
    cuda its best is injected), the run is not "cancelled" (exit 0), and the jobs after it never start."""
    from core.tuning import queue

    monkeypatch.setattr(queue, "tuning_root", lambda: tmp_path)
    seen: list[int] = []
    events: list[queue.JobEvent] = []
    other = parse_line("cublas_dot_op_float|a+8_8|b+8_8|o+8_8|ta+0|tb+0", "dot8")
    jobs = [job(6, trials_per_batch=1), TuneJob(other, trials=3, target="llvm", builder_workers=2)]
    report = queue.run_queue(jobs, db_path=None, inject_options=None, on_trial=lambda e: seen.append(e.trial),
                             on_job=events.append, out_of_time=lambda: bool(seen))  # runs out at the first trial
    assert report.out_of_time and not report.cancelled
    [result] = report.results
    assert result.trials == 1 and result.out_of_time and not result.cancelled and result.best_seconds
    statuses = [(e.index, e.status) for e in events if e.status != "queued"]
    assert statuses == [(0, "tuning"), (0, "done"), (1, "cancelled")]
    assert "of 6 (the time budget ran out)" in events[-2].detail
    assert events[-1].detail == "not started: the time budget ran out"

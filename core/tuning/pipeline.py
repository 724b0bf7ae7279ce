"""MetaSchedule's candidates measured as a stream: each trial recorded and reported the moment it is measured,
builds overlapped with measurement, and the worker pools kept for a whole queue.

MetaSchedule builds a batch (SendToBuilder), measures it (SendToRunner; on this CPU LocalRunner measures the
whole batch inside that call), and only then runs its measure callbacks: the database got its records and
the progress view its trials at the batch's end, all at once. A 64-candidate batch on the H200 was minutes
of silence, and a kill mid-batch lost every measurement of it. Here the builder and the runner MetaSchedule
calls are two faces of one `MeasureStream`:

- Builds go to a pool of build processes that lives as long as the queue (each start imports TVM: once, not
  once per batch). Where the measurement does not run on this CPU (CUDA, RPC servers) the builder returns at
  once and the runner measures each candidate as soon as its build is done, while the others still build. On
  the CPU (llvm measured here) every build finishes first: a kernel timed on cores busy with builds is timed
  wrong. A build failure found by the runner is reported as a build failure all the same.
- The runner commits each candidate's record to the work dir's database as soon as it is measured (in place of
  MetaSchedule's AddToDatabase callback), then reports the trial: a reported trial is always on disk.
- The wall time of each phase is kept for the phase table: build (waiting for builds, nothing to measure),
  measure, record; MetaSchedule's search and cost-model update come from its own profiler.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerFuture, RunnerInput, RunnerResult
from tvm.support.popen_pool import PopenPoolExecutor

from core.tuning import measure
from core.tuning.costmodel import SharedCostModel
from core.tuning.features import append_features, line_key
from core.tuning.job import PhaseEvent, TrialEvent, TuneJob
from core.tuning.nvrtc import install as install_light_nvrtc
from core.tuning.records import FAILED_SECONDS, RECORDS
from core.tuning.resilient import ResilientRunner

FAILED_RECORD_SECONDS = 1e10  # what AddToDatabase stores for a failed candidate
POLL_S = 0.02  # how often the runner looks at builds and remote measurements in flight


def host_cpus() -> int:
    """The cores this process may run on (a container's cpuset, a taskset), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def build_workers(job: TuneJob, overlap: bool) -> int:
    """Parallel builds: the job's own figure, else every core, less one for the measuring process when it
    runs beside the builds on this host."""
    if job.builder_workers:
        return job.builder_workers
    cores = host_cpus()
    return max(1, cores - 1) if overlap and job.rpc is None else cores


def overlaps(job: TuneJob) -> bool:
    """Build while measuring: yes where the measurement does not use this CPU's cores."""
    return job.overlap if job.overlap is not None else (job.target == "cuda" or job.rpc is not None)


# ---------------------------------------------------------------------------------------------
# Pools kept for a queue


class TunePools:
    """Build workers and local measuring runners shared by the jobs of a queue (closed with it)."""

    def __init__(self) -> None:
        self.builders: dict[tuple[int, float], PopenPoolExecutor] = {}
        self.runners: dict[tuple[Any, ...], Any] = {}
        self.cost_models: dict[str, SharedCostModel] = {}  # target -> what earlier jobs taught

    def cost_model(self, target: Any, threads: int) -> Any:
        key = str(target)
        if key not in self.cost_models:
            self.cost_models[key] = SharedCostModel(target, threads)
        return self.cost_models[key]

    def build_pool(self, workers: int, timeout_s: float) -> PopenPoolExecutor:
        key = (workers, timeout_s)
        if key not in self.builders:
            # each worker compiles its candidates' CUDA without libcu++ (nvrtc.py)
            self.builders[key] = PopenPoolExecutor(max_workers=workers, timeout=timeout_s,
                                                   initializer=install_light_nvrtc)
        return self.builders[key]

    def local_runner(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        if key not in self.runners:
            self.runners[key] = make()
        return self.runners[key]

    def close(self) -> None:
        for pool in self.builders.values():
            pool.shutdown(wait=False)
        for runner in self.runners.values():
            runner.pool.shutdown(wait=False)
        self.builders.clear()
        self.runners.clear()
        self.cost_models.clear()

    def __enter__(self) -> TunePools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def measuring_runner(job: TuneJob, pools: TunePools) -> Any:
    """MetaSchedule's runner for the job: RPC servers through a tracker, or a local process kept in `pools`."""
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=job.min_repeat_ms)
    run_evaluator = rpc_run_evaluator = None
    cold = job.cold_l2 if job.cold_l2 is not None else job.target == "cuda"
    if cold:  # a network meets a layer's weights cold: on CUDA, trials are timed that way (measure.py)
        evaluator = measure.cold_evaluator_config()
        run_evaluator, rpc_run_evaluator = measure.cold_run_evaluator, measure.cold_rpc_run_evaluator
    if job.rpc is not None:
        return ResilientRunner(ms.runner.RPCRunner(
            ms.runner.RPCConfig(job.rpc.host, job.rpc.port, job.rpc.key,
                                session_timeout_sec=int(max(job.runner_timeout_s, 10))),
            evaluator_config=evaluator, max_workers=job.rpc_workers, f_run_evaluator=rpc_run_evaluator))
    return pools.local_runner(
        ("local", job.runner_timeout_s, cold, job.min_repeat_ms),
        lambda: ms.runner.LocalRunner(timeout_sec=job.runner_timeout_s, evaluator_config=evaluator,
                                      f_run_evaluator=run_evaluator, initializer=install_light_nvrtc))


def build_candidate(mod: Any, target: Any, _params: Any) -> Any:
    """The builder's build: MetaSchedule's default without `import tvm.s_tir.tensor_intrin`.

    That import registers every tensor intrinsic through TVMScript: 19 s per build worker on the H200 host
    (50 s on a busy 2-core machine), for nothing (candidates arrive already scheduled; the CUDA rules we
    tune with never tensorize).
    """
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from core.codegen import mma
    from core.codegen.whole_warps import whole_warp_module

    pipeline = "default"
    if target.kind.name == "cuda":  # time the candidate in the form its row will have
        mod = whole_warp_module(mod)
        pipeline = mma.install_pipeline() if mma.uses_fragments(mod) else pipeline
    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target, pipeline=pipeline)


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    # TVM's messages end with the cause; a traceback's last line says the most.
    return (lines[-1] if lines else "")[:300]


def error_kind(error: str) -> str:
    text = error.lower()
    for needle, kind in (("timeout", "timeout"), ("timed out", "timeout"), ("memory", "out of memory"),
                         ("illegal", "illegal access"), ("launch", "launch failed"), ("nvcc", "nvcc error")):
        if needle in text:
            return kind
    return "other"



def build_in_worker(mod: Any, target: Any, path: str) -> float:
    """A build worker's job: compile one candidate and link it into a .so at `path`; the seconds it took.

    Linked here, in parallel: MetaSchedule's default exports a .tar, which its runner links with g++ before
    every measurement, one candidate at a time (on the H200 that serial link was a large share of each trial).
    """
    start = time.perf_counter()
    build_candidate(mod, target, None).export_library(path)
    return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# The stream


@dataclass
class Candidate:
    index: int  # in MetaSchedule's batch
    path: str
    build: concurrent.futures.Future[float]
    build_error: str | None = None  # None: not looked at yet; "": built
    runner_input: RunnerInput | None = None
    measuring: RunnerFuture | None = None
    result: RunnerResult | None = None


@dataclass
class PhaseClock:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start


class MeasureStream:
    """The state shared by the builder and the runner MetaSchedule calls, for one job."""

    def __init__(self, job: TuneJob, *, pool: PopenPoolExecutor, runner: Any, overlap: bool, database: Any,
                 start: float, first_trial: int, best: float | None,
                 on_trial: Callable[[TrialEvent], None] | None, on_phase: Callable[[PhaseEvent], None] | None,
                 should_cancel: Callable[[], bool]) -> None:
        self.job, self.pool, self.inner, self.overlap, self.database = job, pool, runner, overlap, database
        self.start, self.trial, self.best, self.first_trial = start, first_trial, best, first_trial
        self.on_trial, self.on_phase, self.should_cancel = on_trial, on_phase, should_cancel
        self.scheduler: Any = None  # set once tune_tir's task scheduler exists
        self.profiler: Any = None  # MetaSchedule's, whose scopes time the search and the cost model
        self.first_build_scopes: dict[str, float] = {}
        self.workload: Any = None
        self.batch = 0
        self.generated = 0  # candidates MetaSchedule sent, this run
        self.leg_end = job.trials - first_trial  # `generated` when the tune_tir call under way ends
        self.candidates: list[Candidate] = []
        self.clock = PhaseClock()
        self.build_cpu_s = 0.0
        self.first_build_at: float | None = None
        self.errors: dict[str, int] = {}
        self.new_trials = 0
        self.cancelled = False
        # The shared model's FeatureCapture (features.py) and the work dir: the features its update extracts
        # after each batch are stored beside the records. None: no shared model, nothing stored.
        self.feature_capture: Any = None
        self.work_dir: str | None = None
        self.record_keys: dict[int, bytes] = {}  # this batch: candidate index -> its record line's key

    # -- building ----------------------------------------------------------------------------

    def build(self, inputs: list[BuilderInput]) -> list[BuilderResult]:
        if self.first_build_at is None:
            self.first_build_at = time.perf_counter()
            self.first_build_scopes = dict(self.profiler.get()) if self.profiler is not None else {}
        self.batch += 1
        self.generated += len(inputs)
        self.candidates = []
        self.record_keys = {}
        for i, build_input in enumerate(inputs):
            path = os.path.join(tempfile.mkdtemp(prefix="kdb-candidate-"), "candidate.so")
            future = self.pool.submit(build_in_worker, build_input.mod, build_input.target, path)
            self.candidates.append(Candidate(i, path, future))
        self.phase("build", 0)
        if self.overlap:
            return [BuilderResult(c.path, None) for c in self.candidates]
        with self.clock.timing("build"):
            self.wait_for_builds()
        results = []
        for candidate in self.candidates:
            if error := self.settle_build(candidate):  # MetaSchedule removes the artifacts of built ones only
                shutil.rmtree(os.path.dirname(candidate.path), ignore_errors=True)
            results.append(BuilderResult(None, error) if error else BuilderResult(candidate.path, None))
        return results

    def wait_for_builds(self) -> None:
        pending = {c.build for c in self.candidates}
        while pending:
            _, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            self.phase("build", len(self.candidates) - len(pending))

    def settle_build(self, candidate: Candidate) -> str:
        """'' when the candidate built, else why not (its build must be done)."""
        if candidate.build_error is None:
            try:
                self.build_cpu_s += candidate.build.result()
                candidate.build_error = ""
            except TimeoutError:
                candidate.build_error = f"LocalBuilder: Timeout, killed after {self.job.builder_timeout_s:g} seconds"
            except Exception as exc:  # the worker's own error, raised again here
                candidate.build_error = f"LocalBuilder: An exception occurred\n{type(exc).__name__}: {exc}"
        return candidate.build_error

    # -- measuring ---------------------------------------------------------------------------

    def run(self, inputs: list[RunnerInput]) -> list[RunnerFuture]:
        by_path = {c.path: c for c in self.candidates}
        for runner_input in inputs:
            by_path[str(runner_input.artifact_path)].runner_input = runner_input
        self.phase("measure", 0)
        waiting = list(self.candidates)
        while waiting and not self.cancelled:
            built = [c for c in waiting if c.build.done()]
            if built and self.overlap:  # builds finish while the runner measures: say how far they are
                self.phase("build", len(self.candidates) - len(waiting) + len(built))
            for candidate in built:
                if self.cancelled:
                    break
                waiting.remove(candidate)
                if self.settle_build(candidate) or candidate.runner_input is None:  # nothing to measure
                    self.finish(candidate, RunnerResult(None, candidate.build_error or "not sent to the runner"))
                    continue
                with self.clock.timing("measure"):
                    candidate.measuring = self.inner.run([candidate.runner_input])[0]
                self.collect(wait=False)
            if not built:
                self.wait_a_moment(waiting)
        while any(c.measuring is not None and c.result is None for c in self.candidates):
            self.collect(wait=True)
        for candidate in self.candidates:  # cancelled: neither measured nor recorded
            if candidate.result is None:
                candidate.result = RunnerResult(None, "cancelled before it was measured")
        if self.feature_capture is not None:  # MetaSchedule's UpdateCostModel comes next: keep its features
            self.feature_capture.armed = True
        return [_Done(c.result) for c in self.candidates if c.runner_input is not None]

    def wait_a_moment(self, waiting: list[Candidate]) -> None:
        in_flight = [c for c in self.candidates if c.measuring is not None and c.result is None]
        if in_flight:
            with self.clock.timing("measure"):
                time.sleep(POLL_S)
            self.collect(wait=False)
        else:
            with self.clock.timing("build"):
                concurrent.futures.wait([c.build for c in waiting], timeout=1.0,
                                        return_when=concurrent.futures.FIRST_COMPLETED)

    def collect(self, *, wait: bool) -> None:
        for candidate in self.candidates:
            if candidate.measuring is None or candidate.result is not None:
                continue
            if not wait and not candidate.measuring.done():
                continue
            with self.clock.timing("measure"):
                result = candidate.measuring.result()
            self.finish(candidate, result)

    def finish(self, candidate: Candidate, result: RunnerResult) -> None:
        """Record the candidate in the work dir's database, then report it (in that order: what was reported
        survives a kill)."""
        candidate.result = result
        seconds, error = outcome(result, built=not candidate.build_error)
        with self.clock.timing("record"):
            self.commit(candidate, result)
        self.trial += 1
        self.new_trials += 1
        if error:
            kind = f"{error.split(':')[0]}: {error_kind(error)}"
            self.errors[kind] = self.errors.get(kind, 0) + 1
        if seconds is not None and (self.best is None or seconds < self.best):
            self.best = seconds
        if self.on_trial is not None:
            self.on_trial(TrialEvent.of(self.job, self.trial, seconds, self.best, error,
                                        time.perf_counter() - self.start))
        if self.should_cancel():
            self.cancelled = True

    def commit(self, candidate: Candidate, result: RunnerResult) -> None:
        task = self.scheduler.tasks_[0]
        measured = task.measure_candidates[candidate.index]
        run_secs = result.run_secs if result.run_secs is not None and len(result.run_secs) else None
        if run_secs is None:
            from tvm.tirx import FloatImm

            run_secs = [FloatImm("float32", FAILED_RECORD_SECONDS)]
        if self.workload is None:
            self.workload = self.database.commit_workload(task.ctx.mod)
        records = os.path.join(self.work_dir, RECORDS) if self.feature_capture is not None and self.work_dir else ""
        before = os.path.getsize(records) if records and os.path.exists(records) else 0
        self.database.commit_tuning_record(ms.database.TuningRecord(
            measured.sch.trace, self.workload, run_secs, task.ctx.target, measured.args_info))
        if records:  # the line the database appended: what the record's features are stored under
            with open(records, "rb") as appended:
                appended.seek(before)
                self.record_keys[candidate.index] = line_key(appended.read().decode("utf-8", errors="replace"))

    def store_features(self, measured: Any) -> int:
        """Store the features the model update extracted for this batch's recorded candidates (`measured`:
        the task's candidates, by index); how many."""
        if self.feature_capture is None or self.work_dir is None:
            return 0
        entries = []
        for candidate, features in self.feature_capture.take():
            index = next((i for i, m in enumerate(measured) if m.same_as(candidate)), None)
            if index in self.record_keys:
                entries.append((self.record_keys[index], features))
        return append_features(Path(self.work_dir), entries)

    @property
    def last_batch(self) -> bool:
        """MetaSchedule generated the budget of this tune_tir call: the batch in flight is its last."""
        return self.generated >= self.leg_end

    def phases(self, before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        """Wall seconds by phase (job.PHASES, "other" left to the caller), from our clock and MetaSchedule's
        profiler scopes taken `before` and `after` the run."""
        def search(scopes: dict[str, Any]) -> float:
            return sum(float(v) - float(before.get(k, 0.0)) for k, v in scopes.items() if k.startswith("EvoSearch/"))

        first_build = self.first_build_at or time.perf_counter()
        first_search = search(self.first_build_scopes) if self.first_build_scopes else 0.0
        cost_model = "MeasureCallback/UpdateCostModel"
        return {"set-up": max(0.0, first_build - self.start - first_search), "search": search(after),
                "build": self.clock.seconds["build"], "measure": self.clock.seconds["measure"],
                "record": self.clock.seconds["record"],
                "cost model": float(after.get(cost_model, 0.0)) - float(before.get(cost_model, 0.0)),
                "build workers": self.build_cpu_s}

    def phase(self, phase: str, done: int) -> None:
        if self.on_phase is None:
            return
        if phase == "search":  # for the next batch: as many candidates as the budget still allows
            batch, total = self.batch + 1, min(self.job.trials_per_batch, self.job.trials - self.trial)
        else:
            batch, total = self.batch, len(self.candidates)
        self.on_phase(PhaseEvent(self.job.name, phase, batch, done, total, time.perf_counter() - self.start))


def outcome(result: RunnerResult, *, built: bool) -> tuple[float | None, str]:
    """A candidate's mean run time, or why it has none ("build: ..." / "run: ...")."""
    if result.error_msg:
        return None, ("run: " if built else "build: ") + first_line(str(result.error_msg))
    runs = [float(s) for s in result.run_secs or []]
    seconds = sum(runs) / len(runs) if runs else None
    if seconds is None or seconds >= FAILED_SECONDS:
        return None, "run: failed"
    return seconds, ""


@derived_object
class _Done(PyRunnerFuture):
    def __init__(self, result: RunnerResult) -> None:
        super().__init__()
        self.outcome = result

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return self.outcome


@derived_object
class StreamBuilder(PyBuilder):
    def __init__(self, stream: MeasureStream) -> None:
        super().__init__()
        self.stream = stream

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        return self.stream.build(list(build_inputs))


@derived_object
class StreamRunner(PyRunner):
    def __init__(self, stream: MeasureStream) -> None:
        super().__init__()
        self.stream = stream

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        return self.stream.run(list(runner_inputs))


@derived_object
class EndOfBatch(ms.measure_callback.PyMeasureCallback):
    """After MetaSchedule's own callbacks: stop the task once a cancel was asked for; say the search goes on."""

    def __init__(self, stream: MeasureStream) -> None:
        super().__init__()
        self.stream = stream

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
              runner_results: Any) -> None:
        self.stream.store_features(list(measure_candidates))
        if self.stream.cancelled or self.stream.should_cancel():
            self.stream.cancelled = True
            if not self.stream.last_batch:  # after its last batch MetaSchedule ends the task itself (twice: error)
                task_scheduler.terminate_task(task_id)
        elif self.stream.trial < self.stream.job.trials:
            self.stream.phase("search", 0)

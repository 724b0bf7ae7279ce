"""A tuning job run on MetaSchedule (TVM 0.27): one op config, a trial budget, live events per measured trial.

A job tunes in its own work dir (records.py), so it can be cancelled and resumed: the trials already recorded
count against the budget, and the search starts again from the records there. Candidates are built and
measured as a stream (pipeline.py), ranked by a cost model shared by the process (costmodel.py). Measurement
is local, or spread over TVM's RPC tracker (one rpc_server per GPU, on any hosts).
"""

from __future__ import annotations

import contextlib
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from core.errors import InputError, ToolError
from core.tuning.costmodel import op_family, search_strategy
from core.tuning.job import PHASES, PhaseEvent, TrialEvent, TuneJob, TuneResult
from core.tuning.records import open_database, recorded_runs, repair_work_dir


def target_for(job: TuneJob) -> Any:
    import tvm

    if job.target == "llvm":
        return tvm.target.Target({"kind": "llvm", "num-cores": 1})
    if job.target == "cuda":
        from core.codegen.generate import cuda_target

        return cuda_target(job.arch)
    raise InputError(f"target {job.target!r}: expected cuda or llvm", where="--target")


def run_tune(job: TuneJob, root: Path, *, on_event: Callable[[TrialEvent], None] | None = None,
             should_cancel: Callable[[], bool] | None = None,
             on_phase: Callable[[PhaseEvent], None] | None = None, pools: Any = None) -> TuneResult:
    """Tune one op config to its trial budget (resuming what the work dir holds).

    Each measured candidate is recorded in the work dir, then reported to `on_event`, as it is measured;
    `on_phase` follows the batches (pipeline.py). `pools` (pipeline.TunePools) keeps the build and measuring
    processes for the next job; without it the job starts and stops its own.
    """
    try:
        from tvm.s_tir import meta_schedule as ms
    except ImportError as exc:
        raise ToolError("Apache TVM is not installed: pip install -e '.[tvm]'") from exc

    work_dir = job.directory(root)
    work_dir.mkdir(parents=True, exist_ok=True)
    repair_work_dir(work_dir)
    history = recorded_runs(work_dir)
    result = TuneResult(job, work_dir, trials=len(history), resumed=len(history))
    cancel = should_cancel or (lambda: False)
    start = time.perf_counter()
    if job.trials > len(history) and not cancel():
        from core.tuning.pipeline import TunePools

        own = pools is None
        pools = TunePools() if own else pools
        try:
            # A caller's profiler (a benchmark's) sees the scopes; else ours, for the phase table.
            outer = ms.Profiler.current()
            with contextlib.nullcontext(outer) if outer is not None else ms.Profiler() as profiler:
                _tune(job, work_dir, history, result, start, profiler, pools, on_event, on_phase, cancel)
        finally:
            if own:
                pools.close()
    result.seconds = time.perf_counter() - start
    history = recorded_runs(work_dir)
    result.trials = len(history)
    result.best_seconds = min((s for s in history if s is not None), default=None)
    if result.phases:
        result.phases["other"] = max(0.0, result.seconds - sum(result.phases[p] for p in PHASES if p != "other"))
    return result


def search_legs(remaining: int, batch: int, model: Any | None, family: str, *, sampled: bool = False) -> list[int]:
    """The job's trials as one search or, while the shared cost model cannot rank yet, two: whole batches
    sampled until the model holds its warm-up trials of the op's kind (`family`), then the rest evolved with
    it. A search chosen once at the start would sample the whole of each process's first op, its largest: on
    the H200 (session 8) those four ops spent 182-251 trials sampled and ended at 0.82-1.51x cuDNN, while two of
    them had fused twins of the same shape, evolved with the model, that reached 0.74-0.75x in 111-112
    trials. A `sampled` job (a probe) is one leg, sampled whatever the model knows."""
    if sampled or model is None or model.can_rank(family):
        return [remaining]
    sampled = min(remaining, -(-max(1, model.warmup - model.samples_of(family)) // batch) * batch)  # whole batches
    return [sampled, remaining - sampled] if sampled < remaining else [remaining]


def _tune(job: TuneJob, work_dir: Path, history: list[float | None], result: TuneResult, start: float,
          profiler: Any, pools: Any, on_event: Callable[[TrialEvent], None] | None,
          on_phase: Callable[[PhaseEvent], None] | None, cancel: Callable[[], bool]) -> None:
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import prim_func_module
    from core.tuning import pipeline

    remaining = job.trials - len(history)
    overlap = pipeline.overlaps(job)
    database = open_database(work_dir)
    stream = pipeline.MeasureStream(
        job, pool=pools.build_pool(pipeline.build_workers(job, overlap), job.builder_timeout_s),
        runner=pipeline.measuring_runner(job, pools), overlap=overlap, database=database, start=start,
        first_trial=len(history), best=min((s for s in history if s is not None), default=None),
        on_trial=on_event, on_phase=on_phase, should_cancel=cancel)
    stream.profiler = profiler
    before = dict(profiler.get())
    mod, _ = prim_func_module(job.config)
    if job.target == "cuda":
        from core.tuning.space import cuda_space

        space: Any = cuda_space(job.config)
    else:
        space = "post-order-apply"
    stream.phase("search", 0)
    target, threads = target_for(job), job.builder_workers or pipeline.host_cpus()
    with _no_tensor_intrinsics() if job.target == "llvm" else contextlib.nullcontext():
        shared, warm_s, learn_s = None, 0.0, 0.0
        family = op_family(job.config.op_type)
        if job.transfer:
            shared = pools.cost_model(target, threads)
            shared.features.take()  # nothing a search before this job extracted is stored as this job's
            stream.feature_capture, stream.work_dir = shared.features, str(work_dir)
            warm = shared.warm_start(work_dir.parent, own=work_dir)
            warm_s = warm.seconds
            result.model_trials = shared.samples
            result.model_family, result.model_family_trials = family, shared.samples_of(family)
        legs = search_legs(remaining, min(job.trials_per_batch, remaining), shared, family, sampled=job.sampled)
        searches = []
        for leg in legs:
            if stream.cancelled:
                break
            batch = min(job.trials_per_batch, leg)
            ranks = not job.sampled and (shared is None or shared.can_rank(family))
            cost_model: Any
            if not ranks:  # at random: a model trained on other kinds of op would steer the sample (costmodel.py)
                cost_model = ms.cost_model.RandomModel()
            elif shared is None:  # MetaSchedule's own model
                cost_model = "xgb"
            else:
                cost_model = shared.model
            strategy = search_strategy(ranks, batch, job.population)
            searches.append("evolutionary" if ranks else "sampled")
            stream.scheduler = ms.task_scheduler.TaskScheduler.create("gradient")
            stream.leg_end = stream.generated + leg
            ms.tune_tir(mod, target=target, work_dir=str(work_dir), max_trials_global=leg, space=space,
                        num_trials_per_iter=batch, cost_model=cost_model, strategy=strategy,
                        builder=pipeline.StreamBuilder(stream), runner=pipeline.StreamRunner(stream),
                        database=database, task_scheduler=stream.scheduler,
                        # The stream records each trial as it is measured: MetaSchedule's AddToDatabase is left
                        # out.
                        measure_callbacks=[ms.measure_callback.RemoveBuildArtifact(),
                                           ms.measure_callback.UpdateCostModel(), pipeline.EndOfBatch(stream)],
                        num_tuning_cores=threads, seed=job.seed)
            if shared is not None and not ranks:  # the sample's trials teach the shared model now
                learn_s += shared.warm_start(work_dir.parent, own=work_dir, budget=0).seconds
        result.search = ", then ".join(searches)
        if shared is not None:
            shared.mark_seen(work_dir)
    result.new_trials, result.errors, result.cancelled = stream.new_trials, stream.errors, stream.cancelled
    result.requeued = getattr(stream.inner, "requeued", 0)
    result.phases = stream.phases(before, dict(profiler.get()))
    # learning from the records on disk is cost-model time, not set-up
    result.phases["set-up"] = max(0.0, result.phases.get("set-up", 0.0) - warm_s)
    result.phases["cost model"] = result.phases.get("cost model", 0.0) + warm_s + learn_s


TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin"


@contextlib.contextmanager
def _no_tensor_intrinsics() -> Iterator[None]:
    """Keep TuneContext from importing TVM's tensor intrinsics while an llvm job tunes.

    TuneContext imports `tvm.s_tir.tensor_intrin` unconditionally, and that parses every CUDA, ARM, ROCm...
    intrinsic through TVMScript: 19 s on the H200 host, 50-80 s on a busy 2-core machine, paid by every
    process. The llvm rules we tune with (no -mcpu: no VNNI, no AVX-512 rules) use none of them. An empty
    module stands in for the package during the job only; a CUDA job later in the process imports the real one.
    """
    if TENSOR_INTRINSICS in sys.modules:
        yield
        return
    placeholder = types.ModuleType(TENSOR_INTRINSICS, "kdb: not imported for an llvm tuning job")
    sys.modules[TENSOR_INTRINSICS] = placeholder
    try:
        yield
    finally:
        if sys.modules.get(TENSOR_INTRINSICS) is placeholder:
            del sys.modules[TENSOR_INTRINSICS]


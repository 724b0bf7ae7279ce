"""Tuning jobs on MetaSchedule (TVM 0.27): one op config, a trial budget, live events per measured trial.

A job tunes in its own work dir (MetaSchedule's JSON database: one record per measured trial, appended),
so it can be cancelled and resumed: a torn last record is cut off, the trials already recorded count
against the budget, and the search starts again from the records there. The best kernel becomes kernel
JSON; with `efficient`, also the "efficient" one (smallest time x resource, which NNFusion's BlockFusion
swaps in when a group's blocks exceed its capacity). Off by default: on the H200, ResNet-18 compiled with
both ran 1.46x slower than with the best kernels alone (docs/BENCHMARKS.md, 2026-12-03 session 5).

Measurement is local, or spread over TVM's RPC tracker (one rpc_server per GPU, on any hosts).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError, ToolError
from core.opconfigs.opconfig import OpConfig

RECORDS = "database_tuning_record.json"
WORKLOADS = "database_workload.json"
DEFAULT_BATCH = 32  # candidates per search round, unless a job says otherwise
# The evolutionary search's population, unless a job says otherwise (never below the round's batch). Half of
# MetaSchedule's 512: on this CPU it costs 0.56x the search's CPU and the model rates its picks 2% lower
# (bench/bench_search.py); on the H200 it took ResNet-18 from 122 to 150 trials/min, its kernels as good
# (0.61-0.64x cuDNN, against 0.64x: docs/BENCHMARKS.md, sessions 9 and 10).
DEFAULT_POPULATION = 256
FAILED_SECONDS = 1e9  # what MetaSchedule stores for a failed run (seen: 1e10)


@dataclass(frozen=True)
class RpcTarget:
    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, text: str) -> RpcTarget:
        """HOST:PORT:KEY (or HOST:PORT, key "kdb")."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise InputError(f"{text!r} is not HOST:PORT:KEY", where="--rpc")
        return cls(parts[0], int(parts[1]), parts[2] if len(parts) == 3 and parts[2] else "kdb")


def search_population(population: int | None, batch: int) -> int:
    """The population a search round evolves: the job's, else DEFAULT_POPULATION (or the batch, when larger)."""
    return population if population is not None else max(DEFAULT_POPULATION, batch)


@dataclass(frozen=True)
class TuneJob:
    config: OpConfig
    trials: int
    target: str = "cuda"  # cuda | llvm (llvm measures on the CPU: same code path, used in CI)
    arch: str = "sm_90"
    work_dir: Path | None = None
    builder_timeout_s: float = 120.0  # the default 30 s kills nvcc on big unrolled kernels
    runner_timeout_s: float = 30.0
    trials_per_batch: int = DEFAULT_BATCH  # candidates per search round (the search costs about the same per round)
    rpc: RpcTarget | None = None
    rpc_workers: int = 1  # measurements in flight at once over RPC (one per server/GPU)
    builder_workers: int | None = None  # parallel builds (default: sized to this host, pipeline.build_workers)
    min_repeat_ms: int = 20  # warm timing: each measurement repeats the kernel at least this long
    cold_l2: bool | None = None  # time each run after an L2 flush (measure.py); default: on for cuda
    seed: int | None = None
    overlap: bool | None = None  # build while measuring (default: when measuring off this CPU; pipeline.py)
    efficient: bool = False  # also a kernel for the most efficient record (time x resource): see above
    # when the best record's row runs RUNNER_UP_RATIO x the record's time or more, this many next records are
    # injected and timed as rows too (core.tuning.queue; runner_up_kernels)
    runner_ups: int = 2
    transfer: bool = True  # one cost model for the process, warm-started from the root's records (costmodel.py)
    population: int | None = None  # the evolutionary search's population (None: search_population's default)

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise InputError(f"{self.trials} trials: a tuning job needs at least 1", where=self.config.describe())
        if self.trials_per_batch < 1:
            raise InputError(f"batches of {self.trials_per_batch}: a search round needs at least 1 candidate",
                             where=self.config.describe())
        if self.population is not None and self.population < self.trials_per_batch:
            raise InputError(f"a population of {self.population} cannot give batches of {self.trials_per_batch}: "
                             "the search picks each batch from its population", where=self.config.describe())

    @property
    def name(self) -> str:
        return self.config.describe()

    def directory(self, root: Path) -> Path:
        from core.codegen.te_ops import revision

        rev = revision(self.config.op_type)  # revision 1 keeps the dirs named before revisions existed
        name = f"{self.config.key}|{self.target}|{self.arch}" + (f"|r{rev}" if rev > 1 else "")
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        return self.work_dir or root / f"{self.config.op_type.lower()}-{digest}"


@dataclass
class TrialEvent:
    """One measured trial (or a failed build/run), as the progress views show it."""

    job: str
    trial: int  # 1-based, counting resumed trials
    total: int
    seconds: float | None  # None: the build or the run failed
    gflops: float | None
    best_seconds: float | None
    best_gflops: float | None
    error: str = ""  # "build: ..." / "run: ..."
    elapsed_s: float = 0.0
    speed: float | None = None  # in speed_unit: GB/s for pools and element-wise ops, GFLOP/s otherwise
    best_speed: float | None = None
    speed_unit: str = "GFLOP/s"

    @classmethod
    def of(cls, job: TuneJob, trial: int, seconds: float | None, best: float | None, error: str,
           elapsed_s: float) -> TrialEvent:
        flops, unit = job.config.flops, job.config.speed(1.0)[1]
        return cls(job.name, trial, job.trials, seconds, flops / seconds / 1e9 if seconds else None, best,
                   flops / best / 1e9 if best else None, error, elapsed_s,
                   job.config.speed(seconds)[0] if seconds else None, job.config.speed(best)[0] if best else None,
                   unit)


@dataclass
class PhaseEvent:
    """Where a batch of candidates is: "search" (MetaSchedule picks the next batch), "build" (done of total
    built), "measure" (measurement begins; each measured candidate is a TrialEvent)."""

    job: str
    phase: str
    batch: int  # 1-based, in this run
    done: int
    total: int
    elapsed_s: float = 0.0


@dataclass
class TuneResult:
    job: TuneJob
    work_dir: Path
    trials: int = 0  # recorded in the work dir, resumed ones included
    new_trials: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    best_seconds: float | None = None
    cancelled: bool = False
    requeued: int = 0  # trials measured again after their RPC server died
    seconds: float = 0.0
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)  # "best"/"efficient" -> kernel JSON item
    candidates: list[dict[str, Any]] = field(default_factory=list)  # top records: seconds, resource, role
    resumed: int = 0  # trials an earlier run had recorded in the work dir
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds by phase (pipeline.py); see PHASES
    model_trials: int = 0  # trials the cost model had learnt from when the search began (transfer)
    model_family: str = ""  # the op's kind (costmodel.op_family)
    model_family_trials: int = 0  # of model_trials, those of the op's kind
    # "evolutionary" (the model ranks), "sampled" (at random: the model holds too few trials of the op's kind;
    # no mutation rounds), or "sampled, then evolutionary" (sampled until the model could rank, the rest
    # evolved: see search_legs)
    search: str = ""

    @property
    def reused(self) -> bool:
        """Nothing measured: the work dir already held the whole budget, from an earlier run."""
        return self.new_trials == 0 and self.resumed >= self.job.trials

    @property
    def trials_per_minute(self) -> float:
        return self.new_trials / (self.seconds / 60) if self.seconds > 0 else 0.0


# Phases of a job's wall time, in the order a trial meets them. "build workers" is CPU time summed over the
# parallel builds (not wall time): next to "build", it says how much of the building the overlap hid.
PHASES = ("set-up", "search", "build", "measure", "record", "cost model", "other")

# ---------------------------------------------------------------------------------------------
# The work dir: repair, count, resume


def repair_work_dir(work_dir: Path) -> int:
    """Cut a torn last record (a kill mid-write) from the JSON-lines databases; return records kept."""
    kept = 0
    for name in (WORKLOADS, RECORDS):
        path = work_dir / name
        if not path.exists():
            continue
        data = path.read_bytes()
        lines = data.split(b"\n")
        good: list[bytes] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                break  # only the last record can be torn: stop at the first bad one
            good.append(line)
        repaired = b"".join(g + b"\n" for g in good)
        if repaired != data:
            tmp = path.with_suffix(".json.repair")
            tmp.write_bytes(repaired)
            tmp.replace(path)
        if name == RECORDS:
            kept = len(good)
    return kept


def recorded_runs(work_dir: Path) -> list[float | None]:
    """Seconds of every recorded trial in order (None for failed ones)."""
    path = work_dir / RECORDS
    out: list[float | None] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            secs = record[1][1]
        except (ValueError, IndexError, TypeError):
            continue
        valid = [float(s) for s in secs or [] if isinstance(s, int | float) and 0 < s < FAILED_SECONDS]
        out.append(sum(valid) / len(valid) if valid else None)
    return out


# ---------------------------------------------------------------------------------------------
# Running


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


def search_legs(remaining: int, batch: int, model: Any | None, family: str) -> list[int]:
    """The job's trials as one search or, while the shared cost model cannot rank yet, two: whole batches
    sampled until the model holds its warm-up trials of the op's kind (`family`), then the rest evolved with
    it. A search chosen once at the start would sample the whole of each process's first op, its largest: on
    the H200 (session 8) those four ops spent 182-251 trials sampled and ended at 0.82-1.51x cuDNN, while two of
    them had fused twins of the same shape, evolved with the model, that reached 0.74-0.75x in 111-112
    trials."""
    if model is None or model.can_rank(family):
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
    database = ms.database.JSONDatabase(path_workload=str(work_dir / WORKLOADS),
                                        path_tuning_record=str(work_dir / RECORDS))
    stream = pipeline.MeasureStream(
        job, pool=pools.build_pool(pipeline.build_workers(job, overlap), job.builder_timeout_s),
        runner=pipeline.measuring_runner(job, pools), overlap=overlap, database=database, start=start,
        first_trial=len(history), best=min((s for s in history if s is not None), default=None),
        on_trial=on_event, on_phase=on_phase, should_cancel=cancel)
    stream.profiler = profiler
    before = dict(profiler.get())
    mod, _ = prim_func_module(job.config)
    if job.target == "cuda":
        from core.tuning.space import self_contained_cuda_space

        space: Any = self_contained_cuda_space()
    else:
        space = "post-order-apply"
    stream.phase("search", 0)
    target, threads = target_for(job), job.builder_workers or pipeline.host_cpus()
    with _no_tensor_intrinsics() if job.target == "llvm" else contextlib.nullcontext():
        from core.tuning.costmodel import op_family, search_strategy

        shared, warm_s, learn_s = None, 0.0, 0.0
        family = op_family(job.config.op_type)
        if job.transfer:
            shared = pools.cost_model(target, threads)
            warm = shared.warm_start(work_dir.parent, own=work_dir)
            warm_s = warm.seconds
            result.model_trials = shared.samples
            result.model_family, result.model_family_trials = family, shared.samples_of(family)
        legs = search_legs(remaining, min(job.trials_per_batch, remaining), shared, family)
        searches = []
        for leg in legs:
            if stream.cancelled:
                break
            batch = min(job.trials_per_batch, leg)
            ranks = shared is None or shared.can_rank(family)
            cost_model: Any
            if shared is None:  # MetaSchedule's own model
                cost_model = "xgb"
            elif ranks:
                cost_model = shared.model
            else:  # at random: a model trained on other kinds of op would steer the sample (costmodel.py)
                cost_model = ms.cost_model.RandomModel()
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


def build_candidate(mod: Any, target: Any, _params: Any) -> Any:
    """The builder's build: MetaSchedule's default without `import tvm.s_tir.tensor_intrin`.

    That import registers every tensor intrinsic through TVMScript: 19 s per build worker on the H200 host
    (50 s on a busy 2-core machine), for nothing (candidates arrive already scheduled; the CUDA rules we
    tune with never tensorize).
    """
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from core.codegen.whole_warps import whole_warp_module

    if target.kind.name == "cuda":  # time the candidate in the form its row will have
        mod = whole_warp_module(mod)
    return build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


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


# ---------------------------------------------------------------------------------------------
# From the records to kernels


ScoredRecord = tuple[float, int, Any, int]  # (mean seconds, resource, scheduled module, threads per block)


def scored_records(job: TuneJob, work_dir: Path, top_k: int = 16) -> list[ScoredRecord]:
    """(mean seconds, resource, scheduled module, threads per block) of the job's `top_k` fastest successful
    records: what best_kernels and runner_up_kernels choose from (reading them applies each record's trace)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import prim_func_module
    from core.codegen.schedule import launch_dims
    from core.codegen.whole_warps import whole_warp_module

    if job.target != "cuda":
        raise InputError("kernels for the kernel DB come from CUDA tuning (target cuda)")
    mod, _ = prim_func_module(job.config)
    database = ms.database.JSONDatabase(path_workload=str(work_dir / WORKLOADS),
                                        path_tuning_record=str(work_dir / RECORDS))
    scored = []
    for record in database.get_top_k(database.commit_workload(mod), top_k):
        secs = [float(s) for s in record.run_secs or []]
        if not secs or min(secs) >= FAILED_SECONDS:
            continue
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        grid, block = launch_dims(whole_warp_module(sch.mod))  # the block the row launches, as it was timed
        resource = math.ceil(math.prod(block) / 32) * 32 * math.prod(grid)
        scored.append((sum(secs) / len(secs), resource, sch.mod, math.prod(block)))
    if not scored:
        raise InputError(f"{job.name}: no successful trial recorded in {work_dir}")
    return scored


def best_kernels(job: TuneJob, work_dir: Path, *, top_k: int = 16, check: bool = True,
                 scored: list[ScoredRecord] | None = None) -> TuneResult:
    """Kernel JSON for the fastest record, and for the most efficient one (time x resource) if the job asks.
    `scored`: the records as scored_records read them, when the caller has them already."""
    result = TuneResult(job, work_dir)
    scored = scored if scored is not None else scored_records(job, work_dir, top_k)
    result.best_seconds = min(s[0] for s in scored)
    skipped: list[str] = []
    checked = False
    roles: list[tuple[str, Callable[[Any], float]]] = [("best", lambda s: s[0])]
    if job.efficient:
        roles.append(("efficient", lambda s: s[0] * s[1]))
    for role, order in roles:
        # Walk the records from the best down: a schedule may lean on TVM helper functions (cp.async...)
        # that live outside the kernel, which NNFusion cannot store; the first self-contained one wins.
        for seconds, resource, scheduled, _threads in sorted(scored, key=order):
            # The CPU check runs the op's definition (the same for every record): once per job is enough;
            # each kernel's own code is verified on the GPU when it is injected.
            item, problem, generated = _kernel_item(job, scheduled, work_dir, check=check and not checked)
            checked = checked or generated
            if item is None:
                skipped.append(f"{seconds * 1e6:.2f} us: {problem[:200]}")
                continue
            item["tvm_func_name"] = item["tvm_func_name"].replace("_kernel0", f"_{role}_kernel0")
            if item["code"] not in [k["code"] for k in result.kernels.values()]:
                result.kernels[role] = item
            result.candidates.append({"role": role, "seconds": seconds, "resource": resource})
            break
    result.errors = {f"skipped schedule ({len(skipped)})": len(skipped)} if skipped else {}
    if not result.kernels:
        raise InputError(f"{job.name}: none of the {len(scored)} best schedules gives a self-contained kernel "
                         f"(first: {skipped[0] if skipped else '?'})")
    return result


def runner_up_kernels(job: TuneJob, work_dir: Path, scored: list[ScoredRecord], taken: Iterable[str], count: int,
                      *, after_seconds: float) -> list[tuple[str, float, dict[str, Any]]]:
    """(role, seconds, kernel JSON item) for `count` more of the `scored` records, slower than `after_seconds`
    (the best kernel's record: best_kernels generated every record up to it already), whose kernels differ from
    the `taken` codes and from each other (roles best2, best3...): the fastest record of another block size than
    the best's, then the next by time (_runner_up_order).

    The tuner ranks records by TVM's build of them; NNFusion runs the row's form, compiled by nvcc. Where the
    best record's row runs far slower than the record (a row of session 12 ran 3x), the next records are
    injected too and timed as rows, so the DB can hold the fastest row rather than the fastest record."""
    taken = set(taken)
    found: list[tuple[str, float, dict[str, Any]]] = []
    for seconds, _resource, scheduled, _threads in _runner_up_order(scored):
        if len(found) >= count:
            break
        if seconds <= after_seconds:
            continue
        item, _problem, _generated = _kernel_item(job, scheduled, work_dir, check=False)
        if item is None or item["code"] in taken:
            continue
        taken.add(item["code"])
        role = f"best{len(found) + 2}"
        item["tvm_func_name"] = item["tvm_func_name"].replace("_kernel0", f"_{role}_kernel0")
        found.append((role, seconds, item))
    return found


def _runner_up_order(scored: list[ScoredRecord]) -> list[ScoredRecord]:
    """The records after the fastest, by time, but the fastest of another block size first: the row's form
    differs most from TVM's where the block does (a partial warp is padded, with non-aligned barriers), so a
    record of another block size is the likeliest to escape what slowed the best one's row."""
    ordered = sorted(scored, key=lambda s: s[0])
    other = next((s for s in ordered if s[3] != ordered[0][3]), None)
    return ordered if other is None else [other] + [s for s in ordered if s is not other]


def _kernel_item(job: TuneJob, scheduled: Any, work_dir: Path, *,
                 check: bool) -> tuple[dict[str, Any] | None, str, bool]:
    """(kernel JSON item or None, why not, whether TVM generated it without error) for a scheduled record."""
    from core.codegen.generate import generate

    generated = generate(job.config, job.arch, scheduled=scheduled, check=check)
    problem = generated.error or _standalone_problem(generated.item, job.arch, work_dir)
    return (None if problem else generated.item), problem, generated.error == ""


def _standalone_problem(item: dict[str, Any] | None, arch: str, work_dir: Path) -> str:
    """Why the kernel's code does not compile on its own (the way NNFusion will hold it), or ''."""
    from core.cuda.nvcc import compile_source, find_nvcc

    if item is None:
        return "no kernel"
    result = compile_source(item["code"], arch, nvcc=find_nvcc(), workdir=work_dir / "check")
    return "" if result.ok else result.error

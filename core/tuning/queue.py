"""A queue of tuning jobs: tune each op config, turn its best record (and, asked, its most efficient one) into kernels,
verify and time them on the GPU, and inject them. Used by `kdb tune` and the console's Tuning view.

`run_network` runs a whole network as one such queue: the budget spread over its ops (network.py), the
predicted network time reported as the trials come in.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.db.kernel_db import KernelDB
from core.db.state import state_dir
from core.errors import KdbError
from core.inject.pipeline import InjectOptions, InjectReport
from core.inject.session import InjectTarget, open_target
from core.kernels.lint import block_form_resources
from core.tuning.claims import ClaimBoard
from core.tuning.harvest import ScoredRecord, best_kernels, runner_up_kernels, scored_records
from core.tuning.job import PhaseEvent, TrialEvent, TuneJob, TuneResult
from core.tuning.network import Network, NetworkEvent, predict, probe_trials, spread_budget, tuning_order
from core.tuning.records import recorded_runs
from core.tuning.run import run_tune


@dataclass
class JobEvent:
    """A job's state changed: queued -> tuning -> generating -> injecting -> done | failed | cancelled, or
    queued -> elsewhere (another process of the run claimed it: claims.py)."""

    job: str
    index: int
    status: str
    detail: str = ""
    result: TuneResult | None = None
    inject: InjectReport | None = None
    key: str = ""  # the job's OpConfig.key
    trials: int = 0  # the job's trial budget (resumed trials included)
    of: int = 0  # jobs in this queue (`index` counts within it)
    stage: str = ""  # "probe" for a network's probe queue, "" for the tuning queue


@dataclass
class QueueReport:
    results: list[TuneResult] = field(default_factory=list)
    injects: list[InjectReport] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (job, reason)
    cancelled: bool = False
    out_of_time: bool = False  # the time budget ran out: the job in flight kept its best, later ones never started
    network: NetworkEvent | None = None  # run_network's final prediction


def tuning_root() -> Path:
    return state_dir() / "tuning"


@contextlib.contextmanager
def _queue_pools() -> Iterator[Any]:
    """Build and measuring processes kept for the whole queue (None without TVM: run_tune says so)."""
    try:
        from core.tuning.pipeline import TunePools
    except ImportError:
        yield None
        return
    with TunePools() as pools:
        yield pools


def time_budget(minutes: float | None) -> Callable[[], bool] | None:
    """run_queue's `out_of_time` for a budget of `minutes` from now (None: no budget)."""
    if not minutes:
        return None
    stop_at = time.monotonic() + minutes * 60
    return lambda: time.monotonic() >= stop_at


def run_queue(jobs: list[TuneJob], *, db_path: Path | None, inject_options: InjectOptions | None,
              on_trial: Callable[[TrialEvent], None] | None = None,
              on_job: Callable[[JobEvent], None] | None = None,
              should_cancel: Callable[[], bool] | None = None,
              on_phase: Callable[[PhaseEvent], None] | None = None, stage: str = "",
              board: ClaimBoard | None = None, out_of_time: Callable[[], bool] | None = None) -> QueueReport:
    """Tune jobs one after the other. With db_path and a cuda target, the kernels are injected. `stage` names
    the queue in its job events (a network run's "probe" queue comes before its tuning queue). With a claim
    board, a job another process of the run has claimed is left to it (status "elsewhere").

    `out_of_time` is a time budget, unlike a cancel: once it says so, the job in flight stops after its
    candidate in flight and its best kernels so far are injected as if it had finished; the jobs after it are
    not started (status "cancelled", the reason in the detail)."""
    report = QueueReport()
    user_cancel = should_cancel or (lambda: False)
    timed_out = out_of_time or (lambda: False)

    def cancel() -> bool:
        return user_cancel() or timed_out()

    def job_event(i: int, status: str, detail: str = "", **kw: Any) -> None:
        if on_job is not None:
            on_job(JobEvent(jobs[i].name, i, status, detail, key=jobs[i].config.key, trials=jobs[i].trials,
                            of=len(jobs), stage=stage, **kw))

    for i in range(len(jobs)):
        job_event(i, "queued")
    with _queue_pools() as pools:
        for i, job in enumerate(jobs):
            if user_cancel():
                report.cancelled = True
                job_event(i, "cancelled")
                continue
            if timed_out():
                report.out_of_time = True
                job_event(i, "cancelled", "not started: the time budget ran out")
                continue
            if board is not None and not board.claim(stage, job.config.key):
                job_event(i, "elsewhere", "another process of this run tunes it")
                continue
            try:
                job_event(i, "tuning", _start_text(job))
                result = run_tune(job, tuning_root(), on_event=on_trial, should_cancel=cancel, on_phase=on_phase,
                                  pools=pools)
                report.results.append(result)
                if result.cancelled and timed_out() and not user_cancel():
                    report.out_of_time = result.out_of_time = True  # what it measured counts, as a finished job's
                    result.cancelled = result.best_seconds is None
                if result.cancelled:
                    report.cancelled = report.cancelled or not report.out_of_time
                    job_event(i, "cancelled", f"{result.trials}/{job.trials} trials kept: resume to go on",
                              result=result)
                    continue
                if job.target != "cuda" or db_path is None or inject_options is None:
                    job_event(i, "done", _best_text(result), result=result)
                    continue
                _inject(i, job, result, db_path, inject_options, report, job_event)
            except KdbError as exc:
                report.failures.append((job.name, str(exc)))
                job_event(i, "failed", str(exc))
            except Exception as exc:  # TVM's own errors: this job fails, the queue goes on
                report.failures.append((job.name, f"{type(exc).__name__}: {exc}"))
                job_event(i, "failed", f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
            finally:
                if board is not None:
                    board.done(stage, job.config.key)
    return report


def _inject(i: int, job: TuneJob, result: TuneResult, db_path: Path, inject_options: InjectOptions,
            report: QueueReport, job_event: Callable[..., None]) -> None:
    job_event(i, "generating", _best_text(result), result=result)
    start = time.perf_counter()
    scored = scored_records(job, result.work_dir)  # once: the runner-ups choose from the same records
    kernels = best_kernels(job, result.work_dir, scored=scored)
    result.kernels, result.candidates = kernels.kernels, kernels.candidates
    items = list(kernels.kernels.values())
    path = _kernel_file(result.work_dir, items)
    result.phases["generate"] = time.perf_counter() - start
    job_event(i, "injecting", f"{len(items)} kernel(s)", result=result)
    start = time.perf_counter()
    with open_target(db_path) as target:
        injected, committed = _inject_file(target, path, inject_options)
        roles = list(kernels.kernels)
        keys = {roles[index]: key for index, key in committed.items()}
        slow = slower_than_tuned(target.db, keys, result.candidates)
        slow += [f"an earlier row of this op ({first}), timed faster or neither timed, comes first in the table, "
                 "and NNFusion takes the first" for _key, first in injected.shadowed]
        slow += [f"went in standalone for {product!r}, as the op's other rows are (fitted launches): BlockFusion "
                 "never fuses it" for product in dict.fromkeys(injected.standalone.values())]
        ratio = row_to_record(target.db, keys.get("best"), result.candidates)
        if job.runner_ups > 0 and ratio is not None and ratio >= RUNNER_UP_RATIO:
            job_event(i, "injecting", f"the best row runs {ratio:.2f}x its record: the next "
                                      f"{job.runner_ups} record(s) as rows too", result=result)
            line, more = _inject_runner_ups(target, job, result, scored, items, inject_options, ratio)
            slow.append(line)
            report.injects.append(more)  # a runner-up that fails is in its line, not the job's status
    result.phases["inject"] = time.perf_counter() - start
    report.injects.append(injected)
    status = "done" if not injected.failed else "failed"
    detail = (f"{_best_text(result)}; injected {injected.injected}, unchanged {injected.unchanged}, "
              f"failed {injected.failed}" + (f": {injected.failures[0].reason}" if injected.failures else "")
              + "".join(f"; {line}" for line in slow))
    job_event(i, status, detail, result=result, inject=injected)


def _kernel_file(work_dir: Path, items: list[dict[str, Any]], suffix: str = "") -> Path:
    path = work_dir / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}{suffix}.json"
    path.write_text(json.dumps(items, indent=1), encoding="utf-8")
    return path


def _inject_file(target: InjectTarget, path: Path, options: InjectOptions) -> tuple[InjectReport, dict[int, str]]:
    committed: dict[int, str] = {}  # item index -> Key
    injected = target.injector(options, on_commit=lambda c: committed.__setitem__(c.index, c.key)).run([path],
                                                                                                      kind="tune")
    return injected, committed


RUNNER_UP_RATIO = 1.2  # a best row this many times its record's time: the next records are timed as rows too


def row_to_record(db: KernelDB, key: str | None, candidates: list[dict[str, Any]], role: str = "best") -> float | None:
    """The row's own profile (our GPU job) over the time the tuner measured its record; None when either is
    missing (no GPU here, or the row was not written)."""
    tuned = next((c["seconds"] * 1e6 for c in candidates if c["role"] == role), None)
    profiled = _profiled_us(db, key) if key else None
    return profiled / tuned if profiled and tuned else None


def _profiled_us(db: KernelDB, key: str) -> float | None:
    rows = db.find(key)
    if not rows:
        return None
    profiles = json.loads(rows[0].miscs).get("kdb", {}).get("profile", {})
    return next((p["us"] for p in profiles.values() if p.get("us")), None)


def _inject_runner_ups(target: InjectTarget, job: TuneJob, result: TuneResult, scored: list[ScoredRecord],
                       items: list[dict[str, Any]], options: InjectOptions, ratio: float) -> tuple[str, InjectReport]:
    """Inject the next records' kernels as rows (roles best2, best3...); the line that says what they ran."""
    best_seconds = next(c["seconds"] for c in result.candidates if c["role"] == "best")
    ups = runner_up_kernels(job, result.work_dir, scored, [k["code"] for k in items], job.runner_ups,
                            after_seconds=best_seconds)
    head = f"the best row runs {ratio:.1f}x its record"
    if not ups:
        return f"{head}; no other record gives another self-contained kernel", InjectReport()
    path = _kernel_file(result.work_dir, [item for _role, _s, item in ups], "-runner-ups")
    injected, committed = _inject_file(target, path, options)
    failed = {f.index: f.reason for f in injected.failures}
    timed = []
    for index, (role, seconds, _item) in enumerate(ups):
        result.candidates.append({"role": role, "seconds": seconds, "resource": None})
        us = _profiled_us(target.db, committed[index]) if index in committed else None
        if us:
            timed.append(f"{role} {us:.1f} us (record {seconds * 1e6:.1f})")
        elif index in failed:
            timed.append(f"{role} failed: {failed[index][:120]}")
        else:  # not committed: the same code is already a row (its Key); committed but not timed: no GPU here
            timed.append(f"{role} not timed" + (" (already a row)" if index not in committed else ""))
    return f"{head}; the next records as rows: {', '.join(timed)} (`kdb db fastest` keeps the fastest)", injected


SLOWER_THAN_TUNED = 2.0  # a row timed this many times its tuning measurement is reported


def slower_than_tuned(db: KernelDB, keys: dict[str, str], candidates: list[dict[str, Any]]) -> list[str]:
    """Rows whose own profile (our GPU job) is far slower than the tuner measured their record, with what the
    nvcc check saw: the row is compiled as NNFusion compiles it, not as TVM did (ptxas may spill there)."""
    lines = []
    for role, key in keys.items():
        ratio = row_to_record(db, key, candidates, role)
        profiled = _profiled_us(db, key)
        if ratio is None or profiled is None or ratio < SLOWER_THAN_TUNED:
            continue
        line = f"the {role} row runs {ratio:.1f}x its tuned time ({profiled:.1f} vs {profiled / ratio:.1f} us)"
        for arch, block in block_form_resources(json.loads(db.find(key)[0].miscs)):
            if block.get("spill_stores"):
                line += f"; {arch}: {block.get('registers')} registers, {block.get('spill_stores')} B spilled"
        lines.append(line)
    return lines


def _start_text(job: TuneJob) -> str:
    kept = len(recorded_runs(job.directory(tuning_root())))
    if kept >= job.trials:
        return f"{kept} trials already recorded (by an earlier run, or this run's probe): nothing to measure"
    return f"resuming from {kept} trials already recorded" if kept else ""


def _best_text(result: TuneResult) -> str:
    reused = (f"reused ({result.resumed} trials already recorded in {result.work_dir}; raise the "
              f"trials to tune further): " if result.reused else "")
    if result.best_seconds is None:
        return f"{reused}{result.trials} trials, none succeeded"
    speed = result.job.config.speed_text(result.best_seconds)
    # a model trained on other kinds of op does not rank this one yet: say how many of its trials were of its kind
    kind = (f", {result.model_family_trials} of {result.model_family} ops"
            if result.model_family and result.model_family_trials < result.model_trials else "")
    searched = {"evolutionary": f"; searched with a cost model of {result.model_trials} trials",
                "sampled": f"; sampled (the cost model had {result.model_trials} trials{kind}, too few to rank)",
                "sampled, then evolutionary": f"; sampled until the cost model could rank (it had "
                                              f"{result.model_trials} trials{kind}), then searched with it"}
    stopped = f" of {result.job.trials} (the time budget ran out)" if result.out_of_time else ""
    return (f"{reused}best {result.best_seconds * 1e6:.2f} us ({speed}) after {result.trials} trials{stopped}"
            + (searched.get(result.search, "") if result.new_trials else ""))


# ---------------------------------------------------------------------------------------------
# A network


def _with_probe(probe: TuneResult, tuned: TuneResult) -> TuneResult:
    """One op's result over the run: its probe and its job as one (trials, time, phases, errors summed)."""
    parts = [part for text in (probe.search, tuned.search if tuned.new_trials else "") if text
             for part in text.split(", then ")]
    search = ", then ".join(part for part, _ in itertools.groupby(parts))  # "sampled, then sampled": once
    # The model the op's search ranked with: the tuning job's when it measured (a probe starts an op's tuning with
    # whatever model there was, often none; the job that follows had the probes' trials and more).
    model = tuned if tuned.new_trials else probe
    return replace(tuned, resumed=probe.resumed, model_trials=model.model_trials, model_family=model.model_family,
                   model_family_trials=model.model_family_trials, search=search,
                   new_trials=probe.new_trials + tuned.new_trials, seconds=probe.seconds + tuned.seconds,
                   requeued=probe.requeued + tuned.requeued,
                   errors={k: probe.errors.get(k, 0) + tuned.errors.get(k, 0) for k in {*probe.errors, *tuned.errors}},
                   phases={k: probe.phases.get(k, 0.0) + tuned.phases.get(k, 0.0)
                           for k in {*probe.phases, *tuned.phases}})


def run_network(network: Network, budget: int, make_job: Callable[[Any, int], TuneJob], *, db_path: Path | None,
                inject_options: InjectOptions | None, on_trial: Callable[[TrialEvent], None] | None = None,
                on_job: Callable[[JobEvent], None] | None = None,
                on_phase: Callable[[PhaseEvent], None] | None = None,
                on_network: Callable[[NetworkEvent], None] | None = None,
                should_cancel: Callable[[], bool] | None = None, board: ClaimBoard | None = None,
                cap: int | None = None, out_of_time: Callable[[], bool] | None = None) -> QueueReport:
    """Tune every op of the network in one queue: `budget` trials in all, spread by each op's share of the
    network's time, what earlier runs recorded counted in; the prediction goes to `on_network` as trials come.

    Ops with nothing measured are first probed (a short job each, nothing injected: network.probe_trials),
    so that the spread weighs measured times; then each op's job tunes it to its share and injects it.
    `make_job(config, trials)` makes each op's job (target, arch, RPC, timeouts are the caller's). `cap`: no op
    is planned more trials than this (network.spread_budget).

    With a claim board, this is one of several processes tuning the network (claims.py): each op goes to the
    process that claims it first, and every process waits for all the probes before it spreads the budget.
    `out_of_time`: run_queue's time budget, for the probes and the tuning alike.
    """
    root = tuning_root()
    cancelled, timed_out = should_cancel or (lambda: False), out_of_time or (lambda: False)

    def measured() -> tuple[dict[str, int], dict[str, float]]:
        history = {op.config.key: recorded_runs(make_job(op.config, 1).directory(root)) for op in network.ops}
        return ({key: len(runs) for key, runs in history.items()},
                {key: min(ok) for key, runs in history.items() if (ok := [s for s in runs if s is not None])})

    recorded, best = measured()
    total = sum(spread_budget(network.ops, budget, recorded=recorded, best=best, cap=cap).values())
    current = {"key": ""}

    def tell() -> None:
        if on_network is not None:
            on_network(predict(network, best, sum(recorded.values()), total))

    def job_seen(event: JobEvent) -> None:
        current["key"] = event.key
        if on_job is not None:
            on_job(event)
        if event.status == "tuning":
            tell()

    def trial_seen(event: TrialEvent) -> None:
        key = current["key"]
        recorded[key] = event.trial
        if event.best_seconds is not None:
            best[key] = event.best_seconds
        if on_trial is not None:
            on_trial(event)
        tell()

    callbacks = dict(on_trial=trial_seen, on_job=job_seen, should_cancel=should_cancel, on_phase=on_phase,
                     out_of_time=out_of_time)
    report = QueueReport()
    probes = probe_trials(network.ops, budget, recorded=recorded, best=best)
    if probes:
        ops = [op for op in tuning_order(network.ops, best) if op.config.key in probes]
        # sampled at random: a probe weighs the budget, and a search round per probe cost more than its trials
        report = run_queue([replace(make_job(op.config, probes[op.config.key]), sampled=True) for op in ops],
                           db_path=None, inject_options=None, stage="probe", board=board, **callbacks)
        if board is not None and not board.wait_for("probe", [op.config.key for op in ops],
                                                    lambda: cancelled() or timed_out()):
            over = timed_out()  # asked once: the two flags must not disagree
            report.cancelled, report.out_of_time = not over, over
        recorded, best = measured()
    if not report.cancelled and not report.out_of_time:
        shares = spread_budget(network.ops, budget, recorded=recorded, best=best, cap=cap)
        jobs = [make_job(op.config, shares[op.config.key]) for op in tuning_order(network.ops, best)]
        tuned = run_queue(jobs, db_path=db_path, inject_options=inject_options, board=board, **callbacks)
        probed = {r.job.config.key: r for r in report.results}
        report.results = [_with_probe(probed.pop(r.job.config.key), r) if r.job.config.key in probed else r
                          for r in tuned.results] + list(probed.values())
        report.injects += tuned.injects
        report.failures += tuned.failures
        report.cancelled = tuned.cancelled
        report.out_of_time = tuned.out_of_time
    if board is not None:  # the other processes' ops too, as their records stand now
        recorded, best = measured()
    report.network = predict(network, best, sum(recorded.values()), total)
    if on_network is not None:
        on_network(report.network)
    return report

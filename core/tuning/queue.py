"""A queue of tuning jobs: tune each op config, turn its best and efficient records into kernels,
verify and time them on the GPU, and inject them. Used by `kdb tune` and the console's Tuning view."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.db.kernel_db import KernelDB
from core.db.state import StateDB, state_dir
from core.errors import KdbError
from core.inject.pipeline import InjectOptions, Injector, InjectReport
from core.tuning.job import TrialEvent, TuneJob, TuneResult, best_kernels, run_tune


@dataclass
class JobEvent:
    """A job's state changed: queued -> tuning -> generating -> injecting -> done | failed | cancelled."""

    job: str
    index: int
    status: str
    detail: str = ""
    result: TuneResult | None = None
    inject: InjectReport | None = None


@dataclass
class QueueReport:
    results: list[TuneResult] = field(default_factory=list)
    injects: list[InjectReport] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (job, reason)
    cancelled: bool = False


def tuning_root() -> Path:
    return state_dir() / "tuning"


def run_queue(jobs: list[TuneJob], *, db_path: Path | None, inject_options: InjectOptions | None,
              on_trial: Callable[[TrialEvent], None] | None = None,
              on_job: Callable[[JobEvent], None] | None = None,
              should_cancel: Callable[[], bool] | None = None) -> QueueReport:
    """Tune jobs one after the other. With db_path and a cuda target, the kernels are injected."""
    report = QueueReport()
    cancel = should_cancel or (lambda: False)

    def job_event(i: int, status: str, detail: str = "", **kw: Any) -> None:
        if on_job is not None:
            on_job(JobEvent(jobs[i].name, i, status, detail, **kw))

    for i in range(len(jobs)):
        job_event(i, "queued")
    for i, job in enumerate(jobs):
        if cancel():
            report.cancelled = True
            job_event(i, "cancelled")
            continue
        try:
            job_event(i, "tuning")
            result = run_tune(job, tuning_root(), on_event=on_trial, should_cancel=cancel)
            report.results.append(result)
            if result.cancelled:
                report.cancelled = True
                job_event(i, "cancelled", f"{result.trials}/{job.trials} trials kept: resume to go on",
                          result=result)
                continue
            if job.target != "cuda" or db_path is None or inject_options is None:
                job_event(i, "done", _best_text(result), result=result)
                continue
            job_event(i, "generating", _best_text(result), result=result)
            kernels = best_kernels(job, result.work_dir)
            result.kernels, result.candidates = kernels.kernels, kernels.candidates
            items = list(kernels.kernels.values())
            path = result.work_dir / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}.json"
            path.write_text(json.dumps(items, indent=1), encoding="utf-8")
            job_event(i, "injecting", f"{len(items)} kernel(s)", result=result)
            state = StateDB()
            try:
                with KernelDB.open(db_path, create=True) as db:
                    injected = Injector(db, inject_options, state=state).run([path], kind="tune")
            finally:
                state.close()
            report.injects.append(injected)
            status = "done" if not injected.failed else "failed"
            detail = (f"{_best_text(result)}; injected {injected.injected}, unchanged {injected.unchanged}, "
                      f"failed {injected.failed}" + (f": {injected.failures[0].reason}" if injected.failures else ""))
            job_event(i, status, detail, result=result, inject=injected)
        except KdbError as exc:
            report.failures.append((job.name, str(exc)))
            job_event(i, "failed", str(exc))
        except Exception as exc:  # TVM's own errors: this job fails, the queue goes on
            report.failures.append((job.name, f"{type(exc).__name__}: {exc}"))
            job_event(i, "failed", f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
    return report


def _best_text(result: TuneResult) -> str:
    if result.best_seconds is None:
        return f"{result.trials} trials, none succeeded"
    gflops = result.job.config.flops / result.best_seconds / 1e9
    return f"best {result.best_seconds * 1e6:.2f} us ({gflops:.0f} GFLOP/s) after {result.trials} trials"

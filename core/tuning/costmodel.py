"""One cost model for every op a process tunes, warm-started from the trials already on disk.

MetaSchedule gives each `tune_tir` call a fresh XGBoost model, and that model predicts at random until it
holds 100 measured trials (`num_warmup_samples`). A network's ops get 16-80 trials each, so within an op the
model never trained: the evolutionary search (a population of 512, four rounds of mutation; 37-43% of a
tuning process's time on the H200) ranked its candidates by coin toss. Here instead:

- One model per process and target (kept on `TunePools`), fed every trial of every job in the process, and
  before each job the trials recorded under the same root that it has not seen: an earlier run's, another
  shard's, this job's own when it resumes. Its labels are normalised per op (best time / time within each
  workload) and its per-store features describe loops and accesses, not the op's name, so what one
  convolution taught ranks the next one's candidates: transfer across shapes, as Ansor and TenSet do.
- While the model is still untrained, evolving on random scores buys nothing: the search samples a small
  population and picks from it (`search_strategy`), a fraction of the time, the same candidates in law.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.tuning.job import FAILED_SECONDS, RECORDS, WORKLOADS, search_population

WARMUP_SAMPLES = 100  # MetaSchedule's XGBModel default: below it, predictions are random
WARM_BUDGET = 2000  # trials one warm start learns from other work dirs: each costs a feature extraction


@dataclass
class WarmStart:
    """What one warm start added to the model."""

    trials: int = 0
    ops: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)  # "dir: why" for work dirs that could not be read


class SharedCostModel:
    """An XGBoost cost model and the record lines of each work dir it has already learnt from."""

    def __init__(self, target: Any, threads: int, warmup: int = WARMUP_SAMPLES) -> None:
        from tvm.s_tir import meta_schedule as ms

        self.target = target
        self.threads = threads
        self.warmup = warmup
        self.model = ms.cost_model.XGBModel(num_warmup_samples=warmup, num_tuning_cores=threads)
        self.seen: dict[Path, int] = {}  # work dir -> record lines already in the model

    @property
    def samples(self) -> int:
        return int(self.model.data_size)

    @property
    def trained(self) -> bool:
        return self.samples >= self.warmup and self.model.booster is not None

    def warm_start(self, root: Path, own: Path | None = None, budget: int = WARM_BUDGET) -> WarmStart:
        """Learn from the records under `root` (one work dir per op) that the model has not seen: `own` (the
        job's work dir) first, then the most recently written, until about `budget` trials (each costs a
        feature extraction; the rest wait for a later job's warm start)."""
        started = time.perf_counter()
        report = WarmStart()
        dirs = [p for p in root.iterdir() if (p / RECORDS).is_file()] if root.is_dir() else []
        dirs.sort(key=lambda p: (p != own, -(p / RECORDS).stat().st_mtime))
        for work_dir in dirs:
            if report.trials >= budget and work_dir != own:
                break
            try:
                added, problem = self._learn(work_dir)
            # OSError/ValueError/RuntimeError (TVM's errors): a dir another process is creating, or not
            # MetaSchedule's. Skipped and said: the model learns from the rest.
            except (OSError, ValueError, RuntimeError) as exc:
                report.skipped.append(f"{work_dir.name}: {exc}")
                continue
            if problem:
                report.skipped.append(f"{work_dir.name}: {problem}")
            if added:
                report.trials += added
                report.ops += 1
        report.seconds = time.perf_counter() - started
        return report

    def mark_seen(self, work_dir: Path) -> None:
        """The trials of `work_dir` reached the model live (the job tuned in this process)."""
        self.seen[work_dir] = len(_lines(work_dir / RECORDS))

    def _learn(self, work_dir: Path) -> tuple[int, str]:
        """Trials learnt from the dir's unseen lines, and what was wrong with those it could not use."""
        from tvm.s_tir import meta_schedule as ms

        lines = _lines(work_dir / RECORDS)
        done = self.seen.get(work_dir, 0)
        workloads = [ms.database.Workload.from_json(w) for w in _parsed(_lines(work_dir / WORKLOADS))]
        by_workload: dict[int, list[Any]] = {}
        for entry in _parsed(lines[done:]):
            if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int) \
                    and 0 <= entry[0] < len(workloads):
                by_workload.setdefault(entry[0], []).append(entry[1])
        added, bad, first_error = 0, 0, ""
        for index, records in by_workload.items():
            workload = workloads[index]
            candidates, results = [], []
            for raw in records:
                try:
                    record = ms.database.TuningRecord.from_json(raw, workload)
                    candidate = record.as_measure_candidate()
                except RuntimeError as exc:  # TVM's errors (InternalError, TVMError) subclass it
                    bad, first_error = bad + 1, first_error or str(exc).strip().splitlines()[-1][:200]
                    continue
                if record.target is not None and record.target.kind.name != self.target.kind.name:
                    continue  # another target's trial (an llvm job under the same root) teaches nothing here
                candidates.append(candidate)
                results.append(runner_result(record))
            if not candidates:
                continue
            context = ms.TuneContext(mod=workload.mod, target=self.target, num_threads=self.threads)
            self.model.update(context, candidates, results)
            added += len(candidates)
        self.seen[work_dir] = len(lines)
        return added, f"{bad} record(s) TVM could not rebuild (first: {first_error})" if bad else ""


def runner_result(record: Any) -> Any:
    """A recorded trial as the runner's result the model learns from: its valid run times, or "failed"."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    secs = [float(s) for s in record.run_secs or [] if 0 < float(s) < FAILED_SECONDS]
    return RunnerResult(run_secs=secs or None, error_msg=None if secs else "failed")


def search_strategy(model: SharedCostModel, batch: int, population: int | None = None) -> Any:
    """MetaSchedule's evolutionary search where the model can rank (over `population` candidates, default
    job.search_population's); else a small sample, ranked at random."""
    from tvm.s_tir import meta_schedule as ms

    if model.trained:
        return ms.search_strategy.EvolutionarySearch(population_size=search_population(population, batch))
    # no mutation rounds: the population's random scores pick the batch (init_min_unmeasured keeps new ones)
    return ms.search_strategy.EvolutionarySearch(population_size=max(2 * batch, 64), genetic_num_iters=0)


def _lines(path: Path) -> list[str]:
    """Whole lines only: another process may be appending the last one."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.splitlines()[:-1] if text and not text.endswith("\n") else text.splitlines()


def _parsed(lines: list[str]) -> list[Any]:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a torn or foreign line: the rest still teaches
            continue
    return out

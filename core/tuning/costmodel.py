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
- The model ranks an op only once it holds `warmup` trials of the op's kind (`op_family`): before that the op's
  candidates are sampled at random, and what they measure then teaches the model. Early in a run the model
  knows a few trials of other kinds, and it ranks a new kind badly: on the H200's records (bench_transfer.py,
  session 14), a model of the first 16 trials of 34 convolution and pooling ops ranked none of the Dot's fast
  candidates (12.6 us) in its top 64 (best 38.6 us, where 16 picked at random give 13.8 on average), and
  session 14's Dot search, started from such a model, ended at 60 us against session 12's 15 us. A model of
  all 6,439 of those trials ranked them first.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.tuning.features import FeatureCapture, append_features, line_key, read_features
from core.tuning.job import search_population
from core.tuning.records import FAILED_SECONDS, RECORDS, WORKLOADS

WARMUP_SAMPLES = 100  # MetaSchedule's XGBModel default: below it, predictions are random
WARM_BUDGET = 2000  # trials one warm start learns from other work dirs: each costs a feature extraction


def op_family(op_type: str) -> str:
    """The kind of op whose trials teach the model to rank an op: a fused op's first op (a fused
    Conv+Add+Relu is a convolution), pools as one kind."""
    name = op_type.lower().removeprefix("fused_").split("_")[0]
    return "pool" if name.endswith("pool") else name


def family_of_dir(work_dir: Path) -> str:
    """The kind of op a work dir's trials are of: its name is `<op type>-<digest>` (TuneJob.directory)."""
    return op_family(work_dir.name.rsplit("-", 1)[0])


@dataclass
class WarmStart:
    """What one warm start added to the model."""

    trials: int = 0
    ops: int = 0
    seconds: float = 0.0
    stored: int = 0  # of the trials, those whose features were read from their work dir (features.py)
    skipped: list[str] = field(default_factory=list)  # "dir: why" for work dirs that could not be read


class SharedCostModel:
    """An XGBoost cost model and the record lines of each work dir it has already learnt from."""

    def __init__(self, target: Any, threads: int, warmup: int = WARMUP_SAMPLES) -> None:
        from tvm.s_tir import meta_schedule as ms

        self.target = target
        self.threads = threads
        self.warmup = warmup
        self.model = ms.cost_model.XGBModel(num_warmup_samples=warmup, num_tuning_cores=threads)
        # what the live updates extract is kept for the records' work dirs; warm starts read it back (features.py)
        self.features = FeatureCapture(self.model.extractor)
        self.model.extractor = self.features
        self.seen: dict[Path, int] = {}  # work dir -> record lines already in the model
        self.family_samples: Counter[str] = Counter()  # op_family -> trials of that kind in the model

    @property
    def samples(self) -> int:
        return int(self.model.data_size)

    def samples_of(self, family: str) -> int:
        return self.family_samples[family]

    @property
    def trained(self) -> bool:
        return self.samples >= self.warmup and self.model.booster is not None

    def can_rank(self, family: str) -> bool:
        """Trained, and on `warmup` trials of this kind of op at least."""
        return self.trained and self.samples_of(family) >= self.warmup

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
                added, stored, problem = self._learn(work_dir, own=work_dir == own)
            # OSError/ValueError/RuntimeError (TVM's errors): a dir another process is creating, or not
            # MetaSchedule's. Skipped and said: the model learns from the rest.
            except (OSError, ValueError, RuntimeError) as exc:
                report.skipped.append(f"{work_dir.name}: {exc}")
                continue
            if problem:
                report.skipped.append(f"{work_dir.name}: {problem}")
            if added:
                report.trials += added
                report.stored += stored
                report.ops += 1
        report.seconds = time.perf_counter() - started
        return report

    def mark_seen(self, work_dir: Path) -> None:
        """The trials of `work_dir` reached the model live (the job tuned in this process)."""
        lines = len(_lines(work_dir / RECORDS))
        self.family_samples[family_of_dir(work_dir)] += max(0, lines - self.seen.get(work_dir, 0))
        self.seen[work_dir] = lines

    def _learn(self, work_dir: Path, *, own: bool) -> tuple[int, int, str]:
        """Trials learnt from the dir's unseen lines, how many of them had stored features, and what was wrong
        with those it could not use. Features missing from the store are extracted, and stored when the dir is
        the job's `own` (only its tuning process writes there)."""
        lines = _lines(work_dir / RECORDS)
        trials = recorded_trials(work_dir, self.target, lines[self.seen.get(work_dir, 0):],
                                 stored=read_features(work_dir))
        stored = 0
        for group in trials.groups:
            context = ms_tune_context(group.workload.mod, self.target, self.threads)
            missing = [i for i, f in enumerate(group.features) if f is None]
            stored += len(group.candidates) - len(missing)
            if missing:
                extracted = self.features.inner.extract_from(context, [group.candidates[i] for i in missing])
                for i, feature in zip(missing, extracted, strict=True):
                    group.features[i] = feature.numpy().astype("float32")
                if own:
                    append_features(work_dir, [(group.keys[i], group.features[i]) for i in missing])
            self.features.given = [f for f in group.features if f is not None]
            try:
                # the Python model itself: through TVM's FFI a stored record (no candidate: None) is refused
                self.model._inst.update(context, group.candidates, group.results)
            finally:
                self.features.given = None
        self.seen[work_dir] = len(lines)
        self.family_samples[family_of_dir(work_dir)] += trials.count
        return trials.count, stored, trials.problem


@dataclass
class TrialGroup:
    """One workload's recorded trials, as the cost model takes them."""

    workload: Any  # ms.database.Workload
    candidates: list[Any]  # MeasureCandidate; None where the features are stored (not rebuilt)
    results: list[Any]  # RunnerResult
    features: list[Any] = field(default_factory=list)  # float32 features read from the store, else None
    keys: list[bytes] = field(default_factory=list)  # each record line's features.line_key


@dataclass
class RecordedTrials:
    groups: list[TrialGroup] = field(default_factory=list)
    bad: int = 0  # records TVM could not rebuild
    first_error: str = ""

    @property
    def count(self) -> int:
        return sum(len(g.candidates) for g in self.groups)

    @property
    def problem(self) -> str:
        return f"{self.bad} record(s) TVM could not rebuild (first: {self.first_error})" if self.bad else ""


def recorded_trials(work_dir: Path, target: Any, lines: list[str] | None = None,
                    stored: dict[bytes, Any] | None = None) -> RecordedTrials:
    """The trials of a MetaSchedule work dir (or of `lines`, some of its record lines) for `target`'s kind,
    grouped by workload: what a cost model learns from. A record whose features are in `stored` (by line key)
    is not rebuilt: its candidate is None and its features come from there."""
    from tvm.s_tir import meta_schedule as ms

    from core.codegen import mma

    mma.register()  # (a tensor-core record's trace names kdb's intrinsics: TVM reads it only once they exist)
    if lines is None:
        lines = _lines(work_dir / RECORDS)
    stored = stored or {}
    workloads = [ms.database.Workload.from_json(w) for w in _parsed(_lines(work_dir / WORKLOADS))]
    by_workload: dict[int, list[tuple[bytes, Any]]] = {}
    for line in lines:
        entry = _parsed([line])
        if entry and isinstance(entry[0], list) and len(entry[0]) == 2 and isinstance(entry[0][0], int) \
                and 0 <= entry[0][0] < len(workloads):
            by_workload.setdefault(entry[0][0], []).append((line_key(line), entry[0][1]))
    out = RecordedTrials()
    for index, records in by_workload.items():
        group = TrialGroup(workloads[index], [], [])
        for key, raw in records:
            if key in stored and _stored_record_fits(raw, target):
                group.candidates.append(None)
                group.results.append(runner_result_of(raw[1]))
                group.features.append(stored[key])
                group.keys.append(key)
                continue
            try:
                record = ms.database.TuningRecord.from_json(raw, group.workload)
                candidate = record.as_measure_candidate()
            except RuntimeError as exc:  # TVM's errors (InternalError, TVMError) subclass it
                out.bad += 1
                out.first_error = out.first_error or str(exc).strip().splitlines()[-1][:200]
                continue
            if record.target is not None and record.target.kind.name != target.kind.name:
                continue  # another target's trial (an llvm job under the same root) teaches nothing here
            group.candidates.append(candidate)
            group.results.append(runner_result(record))
            group.features.append(None)
            group.keys.append(key)
        if group.candidates:
            out.groups.append(group)
    return out


def ms_tune_context(mod: Any, target: Any, threads: int) -> Any:
    from tvm.s_tir import meta_schedule as ms

    return ms.TuneContext(mod=mod, target=target, num_threads=threads)


def runner_result(record: Any) -> Any:
    """A recorded trial as the runner's result the model learns from: its valid run times, or "failed"."""
    return runner_result_of(record.run_secs or [])


def runner_result_of(run_secs: list[Any]) -> Any:
    from tvm.s_tir.meta_schedule.runner import RunnerResult

    secs = [float(s) for s in run_secs if 0 < float(s) < FAILED_SECONDS]
    return RunnerResult(run_secs=secs or None, error_msg=None if secs else "failed")


def _stored_record_fits(raw: Any, target: Any) -> bool:
    """A stored record's line, as TuningRecord.from_json would take it (trace, run times, target, args), of
    `target`'s kind (another target's trial teaches nothing here)."""
    if not (isinstance(raw, list) and len(raw) == 4 and isinstance(raw[1], list)
            and all(isinstance(s, int | float) for s in raw[1])):
        return False
    recorded = raw[2]
    return not isinstance(recorded, dict) or recorded.get("kind", target.kind.name) == target.kind.name


# A round's first population: MetaSchedule draws candidates until it holds `init_min_unmeasured` valid ones, and
# gives the round up (no trial at all) after `max_fail_count` draws that fall short. Its defaults (50, 5) give up on
# spaces where few candidates pass VerifyGPUCode: ResNet-50's classifier Dot (1x2048 x 1000x2048, N = 1000 leaves
# few thread counts in [32, 1024]) has ~1 valid candidate in 40, and its 16-trial probe measured nothing on the
# H100 (session 18). With at most a batch asked for and 20 draws it gets its 16 (and valid-rich spaces are
# unchanged: their first draw already holds enough).
INIT_MIN_UNMEASURED = 50
SAMPLED_MIN_UNMEASURED = 16
MAX_FAIL_COUNT = 20


def search_strategy(ranks: bool, batch: int, population: int | None = None) -> Any:
    """MetaSchedule's evolutionary search where the model can rank (over `population` candidates, default
    job.search_population's); else a small sample, to be ranked at random (with ms.cost_model.RandomModel)."""
    from tvm.s_tir import meta_schedule as ms

    if ranks:
        return ms.search_strategy.EvolutionarySearch(population_size=search_population(population, batch),
                                                     init_min_unmeasured=min(INIT_MIN_UNMEASURED, batch),
                                                     max_fail_count=MAX_FAIL_COUNT)
    # no mutation rounds: the population's random scores pick the batch (init_min_unmeasured keeps new ones)
    return ms.search_strategy.EvolutionarySearch(population_size=max(2 * batch, 64), genetic_num_iters=0,
                                                 init_min_unmeasured=min(SAMPLED_MIN_UNMEASURED, batch),
                                                 max_fail_count=MAX_FAIL_COUNT)


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

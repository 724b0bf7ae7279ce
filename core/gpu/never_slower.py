"""Never slower, judged on the network: rows are left to the library only where the whole network gets faster.

`kdb nnfusion --op-times` times each op alone with its row and with the library; an op alone is not the op in its
network (BlockFusion runs rows side by side, a library call runs alone, the L2 holds the previous op's output), and
leaving every slower row to the library made BERT slower in session 19 (0.304 ms with all rows, 0.373 ms after).
So the op times only propose: each candidate (the ops whose row ran slower alone, those BlockFusion runs in one
kernel taken together) is set aside, the network is run in rounds against the empty DB (core/gpu/network_run.py),
and the change is kept only when the network's time over the empty DB's, round by round, is below the best so far
in every round (core/gpu/verdict.py); else it is put back.
Greedy, the candidates that cost the most alone first. Last, if the network is still slower than with the empty DB
outside the noise, every row it runs is left to the library (the empty DB's network, which is never slower than
itself). Each kept change has its undo file (`kdb db undo FILE --apply`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.db.kernel_db import KernelDB
from core.db.library import Verdict as OpVerdict
from core.db.maintenance import apply_plan, delete_plan, library_plan, undo_plan
from core.db.state import StateDB
from core.gpu.network_run import COULD_NOT_RUN, FAILED, OK, NetworkRun, RunOptions, run_network
from core.gpu.verdict import FASTER, SLOWER, Verdict, judge
from core.nnfusion.compile_job import CompileJob
from core.nnfusion.generated import BLOCKFUSION
from core.nnfusion.usage import Usage

if TYPE_CHECKING:
    from core.db.state_records import ModelEvent

EVERY_ROW = "every row the network runs"


@dataclass(frozen=True)
class Candidate:
    """Rows set aside together: one op's, or the ops' whose rows BlockFusion runs in one kernel."""

    identifiers: tuple[str, ...]
    keys: tuple[str, ...]
    extra_us: float  # what --op-times said they cost over the library, alone, summed

    def describe(self) -> str:
        ops = f"{len(self.identifiers)} ops of one BlockFusion kernel" if len(self.identifiers) > 1 else \
            self.identifiers[0][:90]
        return f"{ops} (+{self.extra_us:.1f} us alone)" if self.extra_us else ops


@dataclass
class Trial:
    candidate: Candidate
    verdict: Verdict | None  # the network without the candidate's rows against the best so far
    kept: bool
    undo_file: Path | None = None  # where a kept change is undone from
    why: str = ""
    run: Any = field(default=None, repr=False)  # the network's run without the candidate (try_without's)

    def line(self) -> str:
        """What was decided, and on what figures: the report's line (and the progress's, as each trial ends)."""
        said = (f"over the empty DB {self.verdict.first.median:.3f}x (rounds {self.verdict.first.low:.3f}-"
                f"{self.verdict.first.high:.3f}) against the best so far {self.verdict.second.median:.3f}x"
                if self.verdict else "not measured")
        return (f"{'kept' if self.kept else 'put back':8s} {self.candidate.describe()}: {self.why}; {said}"
                + (f"; undo: kdb db undo {self.undo_file} --apply" if self.undo_file else ""))


@dataclass
class NeverSlowerRun:
    baseline: NetworkRun | None = None
    trials: list[Trial] = field(default_factory=list)
    final: NetworkRun | None = None  # the network as the DB now is, against the empty DB
    status: int = COULD_NOT_RUN
    findings: list[str] = field(default_factory=list)

    def event(self, job: CompileJob) -> ModelEvent:
        """This step as one of the model's story (the console's Network view)."""
        kept = [t for t in self.trials if t.kept]
        from core.db.state_records import ModelEvent

        return ModelEvent(model=str(job.model.resolve()), db_path=str(job.db), kind="never-slower",
                          ok=self.status == 0,
                          headline=f"never slower: {len(kept)} of {len(self.trials)} change(s) kept; "
                                   + "; ".join(self.findings),
                          detail=json.dumps({"kept": [t.candidate.describe() for t in kept],
                                             "undo_files": [str(t.undo_file) for t in kept if t.undo_file],
                                             "status": self.status}))

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "findings": self.findings,
                "baseline": self.baseline.as_dict() if self.baseline else None,
                "trials": [{"identifiers": list(t.candidate.identifiers), "keys": list(t.candidate.keys),
                            "extra_us": t.candidate.extra_us, "kept": t.kept, "why": t.why,
                            "undo_file": str(t.undo_file) if t.undo_file else None,
                            "verdict": t.verdict.as_dict() if t.verdict else None} for t in self.trials],
                "final": self.final.as_dict() if self.final else None}


def candidates(slower: list[OpVerdict], usage: Usage | None) -> list[Candidate]:
    """The ops whose row ran slower alone, as candidates: those whose rows one BlockFusion kernel runs together (a
    row set aside changes its group's kernel), each other op alone; the costliest first."""
    groups = [{key for part in step.parts for key in part.rows} for step in (usage.steps if usage else [])
              if step.kind == BLOCKFUSION]
    found: list[list[OpVerdict]] = []
    for op in slower:
        home = next((g for g in groups if g & set(op.rows)), None)
        together = next((c for c in found if home is not None and any(set(o.rows) & home for o in c)), None)
        if together is not None:
            together.append(op)
        else:
            found.append([op])
    out = [Candidate(tuple(o.identifier for o in ops), tuple(k for o in ops for k in o.rows),
                     sum(o.extra_us for o in ops)) for ops in found]
    return sorted(out, key=lambda c: -c.extra_us)


def search(pending: list[Candidate], best: list[float],
           try_without: Callable[[Candidate], tuple[list[float] | None, Path | None, str, Any]],
           put_back: Callable[[Path], None], on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    """Greedy: each candidate set aside (try_without gives the network's round medians, or None and why not), kept
    when the network is faster than the best so far outside the noise, else put back. Stops at a trial that could
    not be measured (its change put back). on_trial hears each trial as it is decided."""
    trials: list[Trial] = []
    heard = on_trial or (lambda trial: None)
    for candidate in pending:
        rounds, undo_file, why, run = try_without(candidate)
        if rounds is None:
            if undo_file is not None:
                put_back(undo_file)
            trials.append(Trial(candidate, None, False, None, why, run))
            heard(trials[-1])
            break
        verdict = judge(rounds, best)
        kept = verdict.verdict == FASTER
        if kept:
            best = rounds
        elif undo_file is not None:
            put_back(undo_file)
        trials.append(Trial(candidate, verdict, kept, undo_file if kept else None,
                            "faster in every round" if kept else f"{verdict.verdict}: put back", run))
        heard(trials[-1])
    return trials


def run_never_slower(job: CompileJob, times_file: Path, options: RunOptions, *, margin_pct: float = 0.0,
                     on_progress: Callable[[str, str], None] | None = None,
                     should_cancel: Callable[[], bool] | None = None, state: StateDB | None = None) -> NeverSlowerRun:
    """The network-level step (see the module's docstring). Writes the DB: each kept change with its undo file. With a
    state, the step is recorded in the model's story (the console's Network view)."""
    result = _decide(job, times_file, options, margin_pct, on_progress, should_cancel)
    if state is not None and not (should_cancel and should_cancel()):
        state.record_model_event(result.event(job))
    return result


def _decide(job: CompileJob, times_file: Path, options: RunOptions, margin_pct: float,
            on_progress: Callable[[str, str], None] | None,
            should_cancel: Callable[[], bool] | None) -> NeverSlowerRun:
    say = on_progress or (lambda stage, detail: None)
    result = NeverSlowerRun()
    with KernelDB.open(job.db) as db:
        slower = library_plan(db, times_file, margin_pct).details.slower
    say("never slower", f"the network as the DB is: {len(slower)} op(s) ran slower alone")
    result.baseline = last = run_network(job, options, on_progress=on_progress, should_cancel=should_cancel)
    if last.status == COULD_NOT_RUN:
        result.findings = ["not measured: the network as the DB is could not be run", *last.findings]
        return result
    if not _right(last):  # a wrong network is no baseline to make faster
        result.status, result.findings = FAILED, ["the network is wrong with the DB: nothing tried", *last.findings]
        return result

    def try_without(candidate: Candidate) -> tuple[list[float] | None, Path | None, str, NetworkRun]:
        with KernelDB.open(job.db, write=True) as db:
            applied = apply_plan(db, delete_plan(db, list(candidate.keys)))
        say("never slower: trying", f"without {candidate.describe()}")
        run = run_network(job, options, on_progress=on_progress, should_cancel=should_cancel)
        if run.status == COULD_NOT_RUN or not _right(run):
            return None, applied.undo_file, "; ".join(run.findings) or "not measured", run
        return _rounds(run), applied.undo_file, "", run

    def put_back(undo_file: Path) -> None:
        with KernelDB.open(job.db, write=True) as db:
            apply_plan(db, undo_plan(db, undo_file))

    pending = candidates(slower, last.with_db.compile.usage if last.with_db.compile else None)
    def decided(trial: Trial) -> None:
        say("never slower: decided", trial.line())

    result.trials = search(pending, _rounds(last), try_without, put_back, decided)
    final = _final(result.trials, last)
    if final.verdict is not None and final.verdict.verdict == SLOWER:  # still slower than the empty DB
        usage = final.with_db.compile.usage if final.with_db.compile else None
        every = Candidate((EVERY_ROW,), tuple(sorted(usage.used_keys())) if usage else (), 0.0)
        result.trials += search([every], _rounds(final), try_without, put_back, decided)
        final = _final(result.trials, last)
    result.final = final
    measured = all(t.verdict is not None for t in result.trials)
    slower_than_empty = final.verdict is not None and final.verdict.verdict == SLOWER
    result.status = OK if measured and not slower_than_empty else FAILED if measured else COULD_NOT_RUN
    kept = sum(t.kept for t in result.trials)
    result.findings = [f"kept {kept} of {len(result.trials)} change(s)"] + (
        ["still slower than the empty DB outside the noise"] if slower_than_empty else []) + (
        [] if measured else ["a trial could not be measured: the search stopped there"])
    return result


def _right(run: NetworkRun) -> bool:
    return run.with_db.error is not None and run.max_error is not None and run.with_db.error <= run.max_error


def _rounds(run: NetworkRun) -> list[float]:
    """Each round's network time over the empty DB's of the same round: trials run minutes apart, and a host that
    drifts in between moves both contenders of a round alike (core/gpu/network_run.py interleaves them). A network
    NNFusion compiles only with the DB (no empty DB's time, in any trial): the DB's round medians themselves."""
    key = run.judged_by  # (the CUDA graph's time where the run was asked for it)
    if not run.empty_db.rounds:
        return [db[key] for db in run.with_db.rounds]
    return [db[key] / empty[key] for db, empty in zip(run.with_db.rounds, run.empty_db.rounds, strict=True)]


def _final(trials: list[Trial], baseline: NetworkRun) -> NetworkRun:
    """The run of the DB as it now is: the last kept trial's, else the baseline's."""
    kept = [t for t in trials if t.kept and t.run is not None]
    return kept[-1].run if kept else baseline  # type: ignore[return-value]

"""One "compile with NNFusion" job, shared by `kdb nnfusion` and the console: run the compiler on a model with
the DB, read what the generated code runs, and hold it against what coverage promised.

A compiler failure becomes a failure record (stage "nnfusion") with the log's decisive lines. Then every kernel
launch of the generated code is checked against the registers nvcc gives its kernel (launch_check): a BlockFusion
kernel that cannot launch makes the network compute wrong numbers without an error.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.cuda.nvcc import find_nvcc
from core.db.kernel_db import KernelDB
from core.db.state import StateDB, state_dir
from core.errors import KdbError, ToolError
from core.nnfusion.compiler import CompileResult, CompilerFlags, compile_model, extract_for_compiler, find_compiler
from core.nnfusion.coverage import CoverageEntry, coverage
from core.nnfusion.generated import KERNEL, Generated, parse_generated
from core.nnfusion.launch_check import LaunchedKernel, LaunchReport, check_launches
from core.nnfusion.usage import DB_KERNEL, NNFUSION_KERNEL, Usage, analyse, rows_looked_up
from core.opconfigs.nnfusion_import import Blocker, ShapeWarning
from core.opconfigs.onnx_extract import Extraction
from core.settings import Settings

if TYPE_CHECKING:
    from core.db.state_records import ModelEvent

STAGE = "nnfusion"


@dataclass(frozen=True)
class CompileJob:
    model: Path
    db: Path
    flags: tuple[str, ...] = ()
    product_name: str = ""
    binary: str = ""  # the compiler given for this job (--nnfusion); empty: nnfusion_path, else nnfusion on PATH
    out: Path | None = None  # the compiler's working folder (default: a new one under the state dir)
    timeout_s: float = 1800.0
    arch: str = "sm_90"  # the launch check's SM arch (the settings' primary arch)
    nvcc: str = ""  # the launch check's nvcc (the nvcc_path setting; empty: found on PATH)
    launch_check: bool = True
    nnfusion_path: str = ""  # the nnfusion_path setting (find_compiler: after binary, before PATH)

    @classmethod
    def from_settings(cls, settings: Settings, model: Path, db: Path, **given: Any) -> CompileJob:
        """The job as the settings say (compiler, flags, product name, the launch check's arch and nvcc); what a
        command was given (`given`, CompileJob's fields) comes first."""
        job = cls(model=model, db=db, flags=tuple(settings.nnfusion_flags), product_name=settings.product_name,
                  arch=settings.archs[0], nvcc=settings.nvcc_path, nnfusion_path=settings.nnfusion_path)
        return replace(job, **given)

    def workdir(self) -> Path:
        """Absolute: the compiler and nvcc run in folders of their own, where a relative path means another place."""
        if self.out is not None:
            return self.out.expanduser().resolve()
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", self.model.stem)[:60] or "model"
        return state_dir() / "nnfusion" / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class CompileReport:
    job: CompileJob
    result: CompileResult | None = None
    usage: Usage | None = None
    entries: list[CoverageEntry] = field(default_factory=list)
    reason: str = ""  # why it failed ('' when it ran)
    decisive: list[str] = field(default_factory=list)
    read_seconds: float = 0.0  # kdb's own work: extraction, coverage, reading the generated code
    launches: LaunchReport | None = None  # None: not checked (turned off, or the compile failed)
    db_created: bool = False  # the DB was not there: an empty one was made (NNFusion's table)
    blockers: list[Blocker] = field(default_factory=list)  # nodes kdb knows NNFusion cannot compile
    miscompiles: list[ShapeWarning] = field(default_factory=list)  # ... and nodes it compiles into another network
    prepass: dict[str, Any] = field(default_factory=dict)  # what NNFusion's ONNX Runtime pre-pass did to the model
    # Fitting the launches (compile_fitting_launches): the Keys it made standalone before this compile, and the undo
    # file each of its rounds wrote (`kdb db undo FILE --apply` puts a round's rows back).
    made_standalone: list[str] = field(default_factory=list)
    undo_files: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reason and self.usage is not None

    def problems(self) -> list[str]:
        """Why this is no clean result, each said whole; none when the compiler ran, its code runs exactly the rows
        coverage promised, every launch was checked and fits (the launch check skipped on request aside), and it
        skips no Concat whose output it needs (Usage.skipped).
        `kdb nnfusion`'s exit status follows it: a check that could not run is never a pass."""
        if not self.ok:
            return [f"NNFusion failed: {self.reason}"]
        found = [f"kdb said NNFusion cannot compile node {b.node} ({b.op_type}), and this NNFusion did: {b.reason}"
                 for b in self.blockers]  # kdb's knowledge of the importer is wrong for this compiler
        if broken := self.broken_promises():
            found.append(f"coverage and the compiler disagree on {len(broken)} row(s): {self.row_names(broken)}")
        if self.launches is not None and self.launches.error:
            found.append(f"the launch check could not run: {self.launches.error}")
        elif self.launches is None and self.job.launch_check:
            found.append("the launch check did not run (cancelled)")
        found += [f"cannot launch: {line}" for line in self.launch_failures()]
        found += [f"wrong numbers: {copy.describe()}" for copy in (self.usage.skipped if self.usage else [])]
        found += [w.describe() for w in self.miscompiles]  # the importer's, whatever the DB holds
        used = self.usage.used_keys() if self.usage else set()
        found += [f"wrong numbers: {e.config.describe()}: {said}" for e in self.entries for said in e.wrong_numbers
                  if e.row is not None and e.row.key in used]
        return found

    def row_names(self, keys: Iterable[str]) -> str:
        """Rows as a user reads them: each Key with the op coverage chose it for (a Key alone says nothing)."""
        ops = {e.row.key: e.config.describe() for e in self.entries if e.row is not None}
        return ", ".join(f"{key} ({ops[key]})" if key in ops else key for key in sorted(keys))

    def promised(self) -> set[str]:
        """The rows coverage said the compiler would run: an op's own row, or the plain Convolution row a conv
        whose fused pattern has no kernel runs (coverage's status for that op is still "missing")."""
        return {e.row.key for e in self.entries if e.row is not None and e.runs.startswith(DB_KERNEL)}

    def broken_promises(self) -> set[str]:
        """Rows promised and not in the code, and rows in the code not promised."""
        if self.usage is None:
            return set()
        return self.promised() ^ self.usage.used_keys()

    def as_dict(self) -> dict[str, Any]:
        r = self.result
        problems = self.problems()
        # "ok" is what the exit status says (a clean result); "compiled" only that the compiler ran
        return {"ok": not problems, "compiled": self.ok, "reason": self.reason, "decisive_lines": self.decisive,
                "problems": problems,
                "model": str(self.job.model), "db": str(self.job.db), "db_created": self.db_created,
                "blockers": [b._asdict() for b in self.blockers],
                "miscompiles": [w._asdict() for w in self.miscompiles], "prepass": self.prepass,
                "flags": list(self.job.flags),
                "product_name": self.job.product_name,
                "compile": None if r is None else {"command": r.command, "returncode": r.returncode,
                                                   "seconds": r.seconds, "log": str(r.log_file),
                                                   "project": str(r.project) if r.project else None,
                                                   "lookups": len(r.lookups), "substitutions": r.substitutions},
                "read_seconds": self.read_seconds,
                "usage": self.usage.as_dict() if self.usage else None,
                "promised": sorted(self.promised()), "broken_promises": sorted(self.broken_promises()),
                "launch_check": self.launches.as_dict() if self.launches else None,
                "launch_failures": self.launch_failures(),
                "made_standalone": self.made_standalone, "undo_files": [str(f) for f in self.undo_files],
                "coverage": [e.to_dict() for e in self.entries]}

    def event(self) -> ModelEvent:
        """This compile as a step of the model's story (the console's Network view)."""
        problems = self.problems()
        if not self.ok or self.usage is None:
            headline = f"NNFusion failed: {self.reason}"
            figures: dict[str, Any] = {"reason": self.reason}
        else:
            promised, used = self.promised(), self.usage.used_keys()
            nodes = sum(1 for part in self.usage.parts() if part.rows)
            calls = sum(self.usage.library_calls.values())
            headline = (f"compiled: {len(used)} of the {len(promised)} rows coverage promised in the code, run by "
                        f"{nodes} node(s); {calls} library call(s)"
                        + (f"; {len(problems)} problem(s): {problems[0]}" if problems else "; promised == used"))
            figures = {"promised": len(promised), "used": len(used), "nodes": nodes, "library_calls": calls,
                       "broken_promises": sorted(self.broken_promises()), "problems": problems}
        from core.db.state_records import ModelEvent

        return ModelEvent(model=str(self.job.model.resolve()), db_path=str(self.job.db), kind="compile",
                          ok=not problems, headline=headline, detail=json.dumps(figures))

    def standalone_note(self) -> str:
        """What fitting the launches changed in the DB and how to put it back ("" when it changed nothing)."""
        return standalone_note(self.made_standalone, self.undo_files)

    def launch_summary(self) -> str:
        """The launch check in one line, and the kernel steps it could not see: NNFusion's own functions
        (its own softmax, called without a launch configuration) launch their kernels inside."""
        if self.launches is None:
            return ""
        line = self.launches.summary()
        steps = len(self.usage.kernel_launches()) if self.usage else 0
        if not self.launches.error and steps > self.launches.launch_count:
            unseen = steps - self.launches.launch_count
            launched = {k.kernel for k in self.launches.kernels}
            nodes = [s.node for s in self.usage.kernel_launches() if s.function not in launched] if self.usage else []
            named = f" (nodes {', '.join(nodes[:4])}{', ...' if len(nodes) > 4 else ''})" if nodes else ""
            line += (f"; {unseen} of the steps counted as kernel launches{named} call a function of NNFusion's own "
                     "that launches its kernels inside, without a launch configuration to check: not checked")
        return line

    def launch_failures(self) -> list[str]:
        """Launches that cannot start on the GPU, each with its reason and the DB rows fused into it."""
        lines = []
        for (_launch, keys), reason in zip(self.failing_launches(), self.launches.reasons() if self.launches else [],
                                           strict=True):
            lines.append(reason + (f" (DB rows fused into it: {', '.join(keys)})" if keys else ""))
        return lines

    def failing_launches(self) -> list[tuple[LaunchedKernel, list[str]]]:
        """Each launch that cannot start on the GPU, with the Keys of the DB rows fused into it."""
        if self.launches is None:
            return []
        rows = {p.function: p.rows for s in (self.usage.steps if self.usage else []) for p in s.parts}
        return [(launch, [k for m in launch.members for k in rows.get(m, ())]) for launch in self.launches.failing()]


def compile_and_read(job: CompileJob, *, state: StateDB | None = None,
                     on_line: Callable[[str], None] | None = None,
                     should_cancel: Callable[[], bool] | None = None) -> CompileReport:
    """Run the job. KdbError when it cannot start (no compiler, no model); a failing compile is reported."""
    report = CompileReport(job)
    binary = find_compiler(job.binary, job.nnfusion_path)
    if not job.model.is_file():
        raise KdbError(f"{job.model}: no such model file")
    # A DB not there yet is an empty one: NNFusion itself creates the file and its table. Made before the compiler
    # and coverage read it, so both see the same file.
    report.db_created = KernelDB.create_if_missing(job.db)
    # The compiler imports the model as the extraction read it: with its ONNX Runtime pre-pass, or without it where
    # that rewrite would change the model's precision (ort_prepass; the extraction is kept by content, so the
    # coverage below reads it again for nothing).
    prepass = not extract_for_compiler(job.model, job.flags, binary=job.binary,
                                       nnfusion_path=job.nnfusion_path).prepass.get("bypassed", False)
    # kdb's own reading of the DB (coverage) runs while the compiler does: it needs nothing from it. The DB is
    # opened before the compiler starts and closed after it ends: the last connection to close a WAL file locks it
    # exclusively, and the compiler, which has no busy timeout, aborts on its table check if it opens then.
    with KernelDB.open(job.db) as db:
        with ThreadPoolExecutor(max_workers=1) as pool:
            promise = pool.submit(_coverage, job, db)
            result = compile_model(job.model, job.db, job.workdir(), binary=binary, product_name=job.product_name,
                                   flags=job.flags, timeout_s=job.timeout_s, on_line=on_line,
                                   should_cancel=should_cancel, prepass=prepass)
            report.entries, extraction, read = promise.result()  # an unreadable model raises
            report.blockers, report.miscompiles, report.prepass = (extraction.blockers, extraction.miscompiles,
                                                                   extraction.prepass)
        report.result = result
        if not result.ok:
            report.reason = result.reason()
            report.decisive = result.decisive_lines()
            if state is not None and not result.cancelled:
                _record_failure(state, job, result, report)
            return report
        started = time.monotonic()
        assert result.project is not None
        source = (result.project / "nnfusion_rt.cu").read_text(encoding="utf-8", errors="replace")
        generated = parse_generated(source)
        report.usage = analyse(generated, rows_looked_up(db, [lookup.identifier for lookup in result.lookups]))
    report.read_seconds = read + time.monotonic() - started
    if job.launch_check and not (should_cancel and should_cancel()):
        report.launches = _launch_check(job, source, generated, report.usage)
    return report


def standalone_candidates(report: CompileReport, db: KernelDB) -> list[str]:
    """The DB rows to run standalone (core/db/standalone.py) so that every launch fits: of each BlockFusion
    kernel that cannot launch, the rows fused into it whose own block is smaller than the launch's (ptxas sized
    their registers for fewer threads); all of its rows when none is."""
    keys: list[str] = []
    for launch, fused in report.failing_launches():
        smaller = [k for k in fused if _block_threads(db, k) < launch.threads]
        keys += [k for k in (smaller or fused) if k not in keys]
    return keys


def _block_threads(db: KernelDB, key: str) -> int:
    found = db.find(key)
    try:
        block = json.loads(found[0].function)["block_dim"] if found else None
        return int(block[0]) * int(block[1]) * int(block[2])
    except (ValueError, TypeError, KeyError, IndexError):
        return 0  # unreadable: counted as smaller, so the row is among those made standalone


def compile_fitting_launches(job: CompileJob, *, state: StateDB | None = None,
                             on_line: Callable[[str], None] | None = None,
                             should_cancel: Callable[[], bool] | None = None,
                             rounds: int = 3) -> tuple[CompileReport, list[str]]:
    """Compile; while a BlockFusion kernel cannot launch, make the rows fused into it standalone in the job's DB
    (standalone_candidates) and compile again, at most `rounds` times. (the last report, the Keys made
    standalone). A row made standalone keeps its kernel: the op runs it on its own launch, unfused. The last
    report carries the Keys and the undo file of each round (CompileReport.made_standalone, .undo_files)."""
    from core.db.maintenance import apply_plan, standalone_plan

    made: list[str] = []
    undo_files: list[Path] = []

    def compiled() -> CompileReport:
        report = compile_and_read(job, state=state, on_line=on_line, should_cancel=should_cancel)
        report.made_standalone, report.undo_files = list(made), list(undo_files)
        return report

    for _ in range(rounds):
        report = compiled()
        if not report.ok or report.launches is None:
            return report, made
        with KernelDB.open(job.db, write=True) as db:
            keys = [k for k in standalone_candidates(report, db) if k not in made]
            applied = apply_plan(db, standalone_plan(db, keys, job.product_name)) if keys else None
        if applied is None or not applied.rewritten:
            return report, made
        made += applied.rewritten
        if applied.undo_file is not None:
            undo_files.append(applied.undo_file)
    return compiled(), made


def standalone_note(made: Sequence[str], undo_files: Sequence[Path]) -> str:
    """The rows fitting the launches made standalone and the undo files that give them back, as both faces print it
    ("" when none was made)."""
    if not made:
        return ""
    # The newest first: an undo refuses ops whose rows moved on since its apply, as a later round's may have.
    undo = ", then ".join(f"`kdb db undo {f} --apply`" for f in reversed(undo_files)) or "`kdb db undo FILE --apply`"
    return (f"made standalone ({len(made)} row(s) of ops fused into a kernel that could not launch; they now run on "
            f"their own launch, {undo} gives them back): {', '.join(made)}")


@dataclass(frozen=True)
class Compiled:
    """A compile of the console's f and `kdb nnfusion [--fit-launches]`: the report, and the rows it made
    standalone to fit the launches (also on the report, with their undo files)."""

    report: CompileReport
    made_standalone: tuple[str, ...] = ()


def run_compile_job(job: CompileJob, *, fit_launches: bool, state: StateDB | None = None,
                on_line: Callable[[str], None] | None = None,
                should_cancel: Callable[[], bool] | None = None) -> Compiled:
    """The one compile both faces run: fitting the launches (compile_fitting_launches) or once (compile_and_read);
    with a state, it is recorded as a step of the model's story."""
    if fit_launches:
        report, made = compile_fitting_launches(job, state=state, on_line=on_line, should_cancel=should_cancel)
        compiled = Compiled(report, tuple(made))
    else:
        compiled = Compiled(compile_and_read(job, state=state, on_line=on_line, should_cancel=should_cancel))
    if state is not None and compiled.report.reason != "cancelled":
        state.record_model_event(compiled.report.event())
    return compiled


def _launch_check(job: CompileJob, source: str, generated: Generated, usage: Usage) -> LaunchReport:
    try:
        nvcc, missing = find_nvcc(job.nvcc), ""
    except ToolError as exc:  # needed only when a kernel has no launch bounds: check_launches says when
        nvcc, missing = "", str(exc)
    # NNFusion's own kernels are compiled too: kdb's rows compiled when injected, NNFusion's never did
    own = frozenset(p.function for s in usage.steps if s.kind == KERNEL for p in s.parts if p.runs == NNFUSION_KERNEL)
    report = check_launches(source, generated, job.arch, nvcc=nvcc, workdir=job.workdir(),
                            cache_dir=state_dir() / "launch-check", also_compile=own)
    if report.error and missing:
        report.error += f" ({missing})"
    return report


def known_faults(job: CompileJob) -> tuple[list[Blocker], list[ShapeWarning]]:
    """The nodes of the job's model NNFusion cannot compile, and those it compiles into another network, whatever
    the DB holds: known before it runs (the model's extraction is kept: the compile's own coverage reads it again for
    nothing)."""
    extraction = extract_for_compiler(job.model, job.flags, binary=job.binary, nnfusion_path=job.nnfusion_path)
    return extraction.blockers, extraction.miscompiles


def model_coverage(job: CompileJob, db: KernelDB | None = None) -> tuple[Extraction, list[CoverageEntry]]:
    """The model's op configs as the compiler imports them at the job's flags (kept by the model's content), and
    what the job's DB (`db` when open already) makes the compiler run for each."""
    # a model compiled before (or its blockers asked for): no ONNX
    extraction = extract_for_compiler(job.model, job.flags, binary=job.binary, nnfusion_path=job.nnfusion_path)
    with contextlib.nullcontext(db) if db is not None else KernelDB.open(job.db) as reading:
        return extraction, coverage(extraction, reading, CompilerFlags.parse(job.flags), job.product_name)


def _coverage(job: CompileJob, db: KernelDB) -> tuple[list[CoverageEntry], Extraction, float]:
    started = time.monotonic()
    extraction, entries = model_coverage(job, db)
    return entries, extraction, time.monotonic() - started


def _record_failure(state: StateDB, job: CompileJob, result: CompileResult, report: CompileReport) -> None:
    run_id = state.start_run(STAGE, job.db, {"model": str(job.model), "flags": list(job.flags)})
    from core.db.state_records import Failure

    state.record_failures([Failure(
        run_id=run_id, db_path=str(job.db), file=str(job.model), item_index=None, name=job.model.name,
        stage=STAGE, reason=report.reason,
        detail=json.dumps({"log": str(result.log_file), "command": result.command, "returncode": result.returncode,
                      "decisive_lines": report.decisive, "tail": result.tail[-20:]}, ensure_ascii=False))])
    state.finish_run(run_id, injected=0, unchanged=0, failed=1, cancelled=False)


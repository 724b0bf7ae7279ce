"""Each op the DB serves for a model, timed on the GPU with its row and with the library, the same way, into the times
file `kdb db leave-to-library` reads (`kdb nnfusion MODEL --op-times TIMES.json`).

The ops are those coverage says the compiler runs a DB row for (core/nnfusion/coverage.py), one per identifier it
looks up. Each becomes a model of that op alone (core/opconfigs/one_op_model.py), compiled with the real NNFusion
twice: with a DB holding only that op's rows, as the user's DB has them (the compiler takes the same first row),
and with an empty DB (cuDNN, cuBLAS or NNFusion's own kernel: what NNFusion runs when the row is set aside). A
compile must run what it stands for: the row's network the row coverage names, the library's none. Both projects
are built with nvcc (core/nnfusion/build.py), several ops at once, and then, on a CUDA GPU, each op's two harnesses
run one after the other, holding the GPU, kernel_entry timed between CUDA events as `--run` times a whole network
(core/gpu/harness_run.py): the median, warm L2, the network's own extra launches included (the bias Broadcast of
a Conv+bias+Relu, on both sides).

An op runs on its own here: in the network BlockFusion may run its row beside others, which this does not see.

Status: 0 every op timed, no row slower than the library; 1 some row slower (leave-to-library acts on the file),
or some op not timed (each says why); 2 nothing measured (no GPU: everything is built, nothing run and no file
written; no op served by the DB; a tool missing; cancelled). The times file is written only from times measured
on the GPU, and only when the ops were run there.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.db.kernel_db import KernelDB
from core.db.library import write_times
from core.db.state import StateDB
from core.errors import InputError
from core.gpu.harness_run import (
    NO_GPU,
    Contender,
    HarnessOptions,
    Progress,
    RunTools,
    find_run_tools,
    fresh_empty_db,
    run_harness,
)
from core.kernels.ops import FUSED_OP_TYPES, ROW_ONLY_OP_TYPES
from core.nnfusion.build import build_network
from core.nnfusion.compile_job import CompileJob, compile_and_read, model_coverage
from core.nnfusion.compiler import find_compiler
from core.nnfusion.coverage import DB_KERNEL, CoverageEntry
from core.nnfusion.reference import make_inputs
from core.opconfigs.one_op_model import one_op_model
from core.opconfigs.onnx_extract import Extraction, read_model
from core.opconfigs.opconfig import OpConfig

if TYPE_CHECKING:
    from core.db.state_records import ModelEvent

OK, FAILED, COULD_NOT_RUN = 0, 1, 2
ROW, LIBRARY = "row", "library"
NO_OP_RUN = "no CUDA GPU: the ops were built but not run"
METHOD = ("each op alone (a one-op ONNX model compiled by NNFusion with a DB of only its rows, and with an empty DB), "
          "kdb's harness: kernel_entry between CUDA events, the median of the timed calls after the warm-ups")


@dataclass
class OpTiming:
    """One op the DB serves: its row's network and the library's, and their times."""

    identifier: str
    op_type: str
    key: str  # the row coverage says the compiler takes
    description: str
    count: int  # how often the network runs it
    config: OpConfig = field(repr=False)
    bias: bool = False  # a Conv+Add+Relu whose Add is the conv's bias
    row: Contender = field(default_factory=lambda: Contender(ROW))
    library: Contender = field(default_factory=lambda: Contender(LIBRARY))
    library_runs: str = ""  # what NNFusion runs for the op without the row
    problem: str = ""  # why it has no times

    @property
    def row_us(self) -> float | None:
        return _us(self.row)

    @property
    def library_us(self) -> float | None:
        return _us(self.library)

    @property
    def timed(self) -> bool:
        return self.row_us is not None and self.library_us is not None and not self.problem

    @property
    def ratio(self) -> float | None:
        """The row's time over the library's."""
        return self.row_us / self.library_us if self.timed and self.library_us else None  # type: ignore[operator]

    @property
    def name(self) -> str:
        """The op type, its row's Key (cut) and how many nodes of the model run it."""
        return f"{self.op_type} {self.key[:23] + '…' if len(self.key) > 24 else self.key} x{self.count}"

    def outcome(self) -> str:
        """Its row's and the library's times and their ratio, else why it has none."""
        return self.line().removeprefix(f"{self.name}: ")

    def line(self) -> str:
        """The op in one line: its row's and the library's times and their ratio, else why it has none."""
        name = self.name
        if self.timed:
            return (f"{name}: row {self.row_us:.2f} us, library {self.library_us:.2f} us ({self.library_runs}): "
                    f"{self.ratio:.2f}x")
        if self.problem:
            return f"{name}: {self.problem}"
        if self.row.build is not None and self.row.build.ok and self.library.build is not None \
                and self.library.build.ok:
            return f"{name}: built with its row and with the library ({self.library_runs})"
        return f"{name}: not reached"

    def as_dict(self) -> dict[str, Any]:
        return {"identifier": self.identifier, "op_type": self.op_type, "key": self.key,
                "description": self.description, "count": self.count, "library": self.library_runs,
                "row_us": self.row_us, "library_us": self.library_us, "ratio": self.ratio, "problem": self.problem,
                "contenders": [self.row.as_dict(), self.library.as_dict()]}


def _us(contender: Contender) -> float | None:
    return contender.timing["median_ms"] * 1000.0 if contender.timing else None


@dataclass
class LibraryTimes:
    job: CompileJob
    options: HarnessOptions
    workdir: Path
    times_file: Path | None
    device: str = ""
    no_device: str = ""
    arch: str = ""
    libraries: dict[str, str] = field(default_factory=dict)
    ops: list[OpTiming] = field(default_factory=list)
    others: int = 0  # the model's op configs the DB does not serve: nothing to set aside
    status: int = COULD_NOT_RUN
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    written: bool = False  # the times file was written
    seconds: float = 0.0

    def timed(self) -> list[OpTiming]:
        return [op for op in self.ops if op.timed]

    def slower(self) -> list[OpTiming]:
        """Ops whose row ran slower than the library, the most time lost first."""
        return sorted((op for op in self.timed() if (op.ratio or 0) > 1.0),
                      key=lambda op: -((op.row_us or 0) - (op.library_us or 0)) * op.count)

    def times_document(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(the times file's ops, what it says about them at the top)."""
        ops = [{"identifier": op.identifier, "library_us": op.library_us, "row_us": op.row_us, "key": op.key,
                "op_type": op.op_type, "count": op.count, "ratio": op.ratio, "library": op.library_runs,
                "description": op.description} for op in self.timed()]
        about = {"method": METHOD, "model": str(self.job.model), "db": str(self.job.db),
                 "flags": list(self.job.flags), "product_name": self.job.product_name, "arch": self.arch,
                 "warmup": self.options.warmup, "iterations": self.options.iterations, "seed": self.options.seed,
                 "not_timed": [{"identifier": op.identifier, "key": op.key, "op_type": op.op_type, "why": op.problem}
                               for op in self.ops if not op.timed]}
        return ops, about

    def event(self) -> ModelEvent:
        """These op times as a step of the model's story (the console's Network view)."""
        timed, slower = self.timed(), self.slower()
        said = (f"{len(timed)} of {len(self.ops)} op(s) timed on {self.device}, {len(slower)} slower than the library"
                if self.device else f"{len(self.ops)} op(s) built, not run")
        from core.db.state_records import ModelEvent

        return ModelEvent(model=str(self.job.model.resolve()), db_path=str(self.job.db), kind="op-times",
                          ok=self.status == 0, headline=f"op times: {said}" + (
                              f"; written to {self.times_file}" if self.written else ""),
                          detail=json.dumps({"times_file": str(self.times_file) if self.written else None,
                                             "ratios": {op.identifier: op.ratio for op in timed},
                                             "status": self.status}))

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "findings": self.findings, "notes": self.notes, "model": str(self.job.model),
                "db": str(self.job.db), "workdir": str(self.workdir),
                "times_file": str(self.times_file) if self.times_file else None, "written": self.written,
                "device": self.device or None, "no_device": self.no_device or None, "arch": self.arch,
                "libraries": self.libraries, "method": METHOD, "seed": self.options.seed,
                "warmup": self.options.warmup, "iterations": self.options.iterations, "others": self.others,
                "ops": [op.as_dict() for op in self.ops], "seconds": round(self.seconds, 3)}


def measure_library_times(job: CompileJob, options: HarnessOptions | None = None, *,
                          times_file: Path | None = None, workers: int = 0, on_progress: Progress | None = None,
                          should_cancel: Callable[[], bool] | None = None,
                          state: StateDB | None = None) -> LibraryTimes:
    """Time each op the job's DB serves for its model with its row and with the library (the module's docstring),
    and write `times_file` when they ran on a GPU. `workers`: ops compiled and built at once (0: one per CPU).
    KdbError (status 2) when a tool is missing, the model or the DB cannot be read, or the times file cannot be
    written where asked; everything else is in the report."""
    started = time.monotonic()
    options = options or HarnessOptions()
    say = on_progress or (lambda stage, detail: None)
    cancelled = should_cancel or (lambda: False)
    if times_file is not None and not times_file.parent.is_dir():  # said now, not after an hour of builds
        raise InputError("no such folder to write the times file in", where=str(times_file))
    if not job.db.is_file():
        raise InputError("no kernel DB there: no row to time", where=str(job.db))
    find_compiler(job.binary, job.nnfusion_path)
    run = LibraryTimes(job, options, job.workdir().resolve(), times_file)
    tools = find_run_tools(job, say)
    run.libraries, run.arch, run.device, run.no_device = tools.libraries.found, tools.arch, tools.device, \
        tools.no_device
    run.notes += tools.notes
    try:
        _measure(run, tools, workers or os.cpu_count() or 1, say, cancelled)
    finally:
        run.seconds = time.monotonic() - started
    if state is not None and not cancelled():  # a step of the model's story (the console's Network view)
        state.record_model_event(run.event())
    return run


def served_ops(extraction: Extraction, entries: list[CoverageEntry]) -> tuple[list[OpTiming], int, list[str]]:
    """(one OpTiming per identifier the compiler looks up and the DB serves, in model order; how many op configs are
    left: not served by the DB, or served by a row NNFusion has no kernel of its own to put in its place; the op types
    of those: a Resize, a ConvTranspose, never left to the library). A fused conv whose pattern is not substituted runs
    the plain Convolution row: that op is the plain convolution."""
    ops: dict[str, OpTiming] = {}
    on_rows = [e for e in entries if e.row is not None and e.runs.startswith(DB_KERNEL)]
    row_only = sorted({e.config.op_type for e in on_rows if e.config.op_type in ROW_ONLY_OP_TYPES})
    served = [e for e in on_rows if e.config.op_type not in ROW_ONLY_OP_TYPES]
    for entry in served:
        assert entry.row is not None
        config = replace(entry.config, op_type="Convolution") if entry.lookup else entry.config
        identifier = entry.lookup or entry.identifier
        runs = entry.count - entry.fused_away
        if identifier in ops:
            ops[identifier].count += runs
            continue
        occurrences = extraction.nodes.get(entry.config.key, [])
        bias = config.op_type == FUSED_OP_TYPES[1] and bool(occurrences) and len(occurrences[0]) == 2
        ops[identifier] = OpTiming(identifier, config.op_type, entry.row.key, config.describe(), runs, config, bias)
    return list(ops.values()), len(entries) - len(served), row_only


def _measure(run: LibraryTimes, tools: RunTools, workers: int, say: Progress, cancelled: Callable[[], bool]) -> None:
    say("ops", f"which ops of {run.job.model.name} the DB serves")
    extraction, entries = model_coverage(run.job)
    run.ops, run.others, only_rows = served_ops(extraction, entries)
    if only_rows:
        run.notes.append(f"not timed: the {' and '.join(only_rows)} rows, since NNFusion has no kernel of its own to "
                         "run in their place (without a row the compile aborts): there is no library to leave them to")
    if not run.ops:
        run.findings.append(f"the DB serves none of {run.job.model.name}'s ops: nothing to time")
        return
    header = read_model(run.job.model, external_data=False)  # the one-op models speak the model's opset
    opset = next((o.version for o in header.opset_import if o.domain in ("", "ai.onnx")), 17)
    version = (opset, header.ir_version)
    interrupted = threading.Event()

    def stop() -> bool:
        return interrupted.is_set() or cancelled()

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        try:
            futures = [pool.submit(_prepare, run, tools, i, op, version, say, stop) for i, op in enumerate(run.ops)]
            for future in futures:
                future.result()
        except BaseException:  # Ctrl-C or an error: the other ops' compilers and nvcc are stopped, not waited for
            interrupted.set()
            pool.shutdown(cancel_futures=True)
            raise
    if cancelled():
        return _cancelled(run)
    if not run.device:
        built = sum(1 for op in run.ops if not op.problem)
        run.findings.append(f"{NO_OP_RUN} ({run.no_device}): {built} of {len(run.ops)} op(s) with their row and with "
                            "the library; no times file written")
        return None
    for i, op in enumerate(run.ops):
        if op.problem:
            continue
        if cancelled():
            return _cancelled(run)
        _time_op(run, tools, i, op, say, cancelled)
        if any(c.problem.startswith(NO_GPU) for c in (op.row, op.library)):
            run.no_device = "the harness found no CUDA GPU"
            run.findings.append(f"{NO_OP_RUN} ({run.no_device}): no times file written")
            return None
    if cancelled():
        return _cancelled(run)
    _judge(run)
    return None


def _folder(run: LibraryTimes, index: int, op: OpTiming) -> Path:
    return run.workdir / "ops" / f"{index + 1:03d}-{re.sub(r'[^A-Za-z0-9_]', '_', op.op_type)}"


def _prepare(run: LibraryTimes, tools: RunTools, index: int, op: OpTiming, version: tuple[int, int], say: Progress,
             stop: Callable[[], bool]) -> None:
    """The op's one-op model, compiled with its rows and with the empty DB, both built; or op.problem says why not."""
    stage = f"op {index + 1}/{len(run.ops)}"
    folder = _folder(run, index, op)
    try:
        model = one_op_model(op.config, bias=op.bias, opset=version[0], ir_version=version[1], seed=run.options.seed)
    except InputError as exc:
        op.problem = f"cannot be rebuilt as a one-op model: {exc}"
        return
    folder.mkdir(parents=True, exist_ok=True)
    model_path = folder / "model.onnx"
    model_path.write_bytes(model.SerializeToString())
    row_db = folder / "rows.db"
    row_db.unlink(missing_ok=True)
    with KernelDB.open(run.job.db) as source, KernelDB.open(row_db, create=True) as rows:
        rows.put_back([op.identifier], list(source.iter_op_rows([op.identifier])))
    jobs = {ROW: replace(run.job, model=model_path, db=row_db, out=folder / ROW, arch=run.arch),
            LIBRARY: replace(run.job, model=model_path, db=fresh_empty_db(folder / LIBRARY), out=folder / LIBRARY,
                             arch=run.arch)}
    for contender in (op.row, op.library):
        if stop():
            op.problem = "cancelled"
            return
        say(stage, f"compile ({contender.label}): {op.description}")
        contender.compile = compile_and_read(jobs[contender.label], should_cancel=stop)
        if problem := _compile_problem(op, contender):
            op.problem = contender.problem = problem
            return
    assert op.library.compile is not None and op.library.compile.usage is not None
    op.library_runs = " + ".join(dict.fromkeys(p.runs for p in op.library.compile.usage.parts()))
    for contender in (op.row, op.library):
        say(stage, f"nvcc ({contender.label}): {op.description}")
        try:
            contender.build = built = build_network(contender.project(), arch=run.arch, nvcc=tools.nvcc,
                                                    libraries=tools.libraries,
                                                    timeout_s=run.options.build_timeout_s, should_cancel=stop)
        except InputError as exc:  # a generated project kdb cannot read
            op.problem = contender.problem = f"{contender.label}: {exc}"
            return
        if not built.ok:
            op.problem = contender.problem = "cancelled" if stop() else f"{contender.label}: nvcc failed: {built.error}"
            return
    if op.row.build and op.library.build and op.row.build.signature != op.library.build.signature:
        op.problem = "the two compiles take different kernel_entry arguments"


def _compile_problem(op: OpTiming, contender: Contender) -> str:
    """Why this compile does not stand for what it should ('' when it does): the row's network must run the op's
    row, the library's no row at all, and each must compile and pass the launch check."""
    report = contender.compile
    assert report is not None
    if not report.ok:
        return f"{contender.label}: NNFusion failed: {report.reason}"
    if problems := report.problems():
        return f"{contender.label}: {problems[0]}"
    assert report.usage is not None
    used = report.usage.used_keys()
    if contender.label == ROW and op.key not in used:
        looked_up = report.result is not None and any(x.identifier == op.identifier for x in report.result.lookups)
        return (f"the one-op model's compile did not run row {op.key} (rows in its code: "
                f"{', '.join(sorted(used)) or 'none'}; NNFusion {'did' if looked_up else 'did not'} look up the "
                "op's identifier)")
    if contender.label == LIBRARY and used:
        return f"the empty DB's compile ran DB rows {', '.join(sorted(used))}"
    return ""


def _time_op(run: LibraryTimes, tools: RunTools, index: int, op: OpTiming, say: Progress,
             cancelled: Callable[[], bool]) -> None:
    build = op.row.build
    assert build is not None and build.signature is not None
    stage = f"op {index + 1}/{len(run.ops)}"
    inputs = _folder(run, index, op) / "inputs"
    make_inputs(build.signature, inputs, run.options.seed)
    for contender in (op.library, op.row):  # one at a time, each holding the GPU
        run_harness(contender, inputs, run.options, tools.libraries,
                    lambda what, detail: say(f"{stage} {what}", detail), cancelled)
        if contender.problem:
            op.problem = "cancelled" if cancelled() else f"{contender.label}: {contender.problem}"
            return


def _judge(run: LibraryTimes) -> None:
    timed, slower = run.timed(), run.slower()
    untimed = [op for op in run.ops if not op.timed]
    if slower:
        run.findings.append(f"{len(slower)} of {len(timed)} op(s) ran slower with their row than with the library on "
                            f"{run.device}: `kdb nnfusion MODEL --run --never-slower TIMES.json` lets the network "
                            "decide which to leave to the library")
    if untimed:
        run.findings.append(f"{len(untimed)} op(s) not timed: " + "; ".join(f"{op.op_type} {op.key}: {op.problem}"
                                                                            for op in untimed[:3])
                            + ("; ..." if len(untimed) > 3 else ""))
    if run.times_file is not None:
        ops, about = run.times_document()
        write_times(run.times_file, run.device, ops, about)
        run.written = True
    run.status = FAILED if slower or untimed else OK


def _cancelled(run: LibraryTimes) -> None:
    run.findings.append("cancelled: no times file written")
    run.status = COULD_NOT_RUN

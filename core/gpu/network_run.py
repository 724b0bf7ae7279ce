"""Run a model's network as NNFusion compiled it with the DB, check its output and time it against the same model
compiled with an empty DB (`kdb nnfusion MODEL --run`, and the console's compile dialog).

Steps: compile with the DB (making rows standalone where a BlockFusion kernel cannot launch, unless told not to)
and with an empty DB; build both projects with nvcc (core/nnfusion/build.py) while ONNX Runtime computes the
reference on the seeded input (core/nnfusion/reference.py); then, on a CUDA GPU, run both harnesses in interleaved
rounds (each run its own process holding the GPU, which goes first swapping every round), timed the same way, and
compare their outputs with the reference. Slower or faster is judged from the rounds (core/gpu/verdict.py). A network
NNFusion compiles only with the DB (a Resize or a ConvTranspose: no kernel of its own, so the empty DB's compile
aborts) is built, checked and timed alone, and said to have nothing to compare with.

Status: 0 the network with the DB is right (error within the bound) and not slower than with the empty DB (faster,
or within noise); 1 it is wrong or slower outside the noise, or it could not be compiled, built or run; 2 nothing
could be measured (no GPU: the networks are built but not run; a tool missing; the empty DB's network failing;
cancelled).
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.errors import KdbError
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
from core.gpu.verdict import SLOWER, Spread, Verdict, judge
from core.nnfusion.build import RUN_EXTRA, CudaLibraries, Signature, build_network, read_signature
from core.nnfusion.compile_job import CompileJob, compile_and_read, compile_fitting_launches
from core.nnfusion.cuda_graph import GRAPH_KEYS, GRAPH_SUFFIX
from core.nnfusion.reference import (
    Reference,
    largest_error,
    make_inputs,
    onnx_runtime_reference,
    random_inputs,
    read_outputs,
)

if TYPE_CHECKING:
    from core.db.state_records import ModelEvent

OK, FAILED, COULD_NOT_RUN = 0, 1, 2
DEFAULT_MAX_ERROR = 1e-4
# An fp16 network (a half input or output) against ONNX Runtime's run of the same model (which widens half to
# float inside most CPU kernels): each half op rounds to 2^-11 and its reductions accumulate in half (NNFusion's
# cuDNN/cuBLAS half calls, and kdb's rows: core/codegen/reference.tolerance), so a network's error is of the order
# of its deepest reduction's bound (0.02-0.07 for a 3x3x512 conv alone). A stated default, not yet calibrated on a
# GPU; --max-error sets another.
HALF_MAX_ERROR = 5e-2
# An fp32 network some of whose DB rows compute in TF32 (operands read with 10 bits of mantissa, sums in fp32, every
# tensor between ops fp32): between fp32's bound and half's.
TF32_MAX_ERROR = 1e-2
ERROR_FORMULA = "max |out - ref| / max |ref| per output (float64), the largest over the outputs"
WITH_DB, EMPTY_DB = "with-db", "empty-db"
LIBRARY_MATH = "fp32: cuDNN and cuBLAS with TF32 off (NVIDIA_TF32_OVERRIDE=0)"


DEFAULT_ROUNDS = 5  # 5 v 5 rounds: "slower" at the exact Mann-Whitney p = 0.008 (core/gpu/verdict.py)


@dataclass(frozen=True)
class RunOptions(HarnessOptions):
    max_error: float | None = None  # None: by the network's element types (error_bound)
    fit_launches: bool = True  # rows fused into a kernel that cannot launch are made standalone (writes the DB)
    rounds: int = DEFAULT_ROUNDS  # runs of each network, interleaved; `iterations` timed calls in each

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_error is not None and not self.max_error > 0:
            raise KdbError(f"the error bound must be above 0, got {self.max_error}")
        if self.rounds < 1:
            raise KdbError(f"rounds {self.rounds}: need >= 1")


@dataclass
class NetworkRun:
    job: CompileJob
    options: RunOptions
    workdir: Path
    device: str = ""  # the GPU's name ('' without one)
    no_device: str = ""  # why there is no GPU
    arch: str = ""
    libraries: dict[str, str] = field(default_factory=dict)
    reference: Reference | None = None
    with_db: Contender = field(default_factory=lambda: Contender(WITH_DB))
    empty_db: Contender = field(default_factory=lambda: Contender(EMPTY_DB))
    status: int = COULD_NOT_RUN
    max_error: float | None = None  # the bound the DB's output is judged by (error_bound), once the signature is read
    findings: list[str] = field(default_factory=list)  # what the status is for, in words
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    verdict: Verdict | None = None  # the DB's network against the empty DB's, from the rounds

    @property
    def ratio(self) -> float | None:
        """The network's median time with the DB over that with the empty DB."""
        a, b = self.with_db.timing, self.empty_db.timing
        return a["median_ms"] / b["median_ms"] if a and b and b["median_ms"] > 0 else None

    @property
    def judged_by(self) -> str:
        """The round statistic the verdict compares: the CUDA graph's median where it was asked for and every round
        of both networks has one (a graph removes the launches' CPU cost, which can change which DB is faster),
        else kernel_entry's."""
        rounds = [*self.with_db.rounds, *self.empty_db.rounds]
        return "graph_median_ms" if self.options.cuda_graph and rounds and all(
            "graph_median_ms" in r for r in rounds) else "median_ms"

    @property
    def graph_ratio(self) -> float | None:
        """The same in a CUDA graph (RunOptions.cuda_graph), where both networks have its times."""
        a, b = self.with_db.timing or {}, self.empty_db.timing or {}
        if "graph_median_ms" in a and b.get("graph_median_ms", 0) > 0:
            return a["graph_median_ms"] / b["graph_median_ms"]
        return None

    def verdicts(self) -> list[str]:
        """What the status is for, in words: the findings, else that the network is right and (where the empty DB
        compiled too) not slower."""
        if self.findings:
            return self.findings
        if self.empty_db.timing is None:
            return ["right (nothing to compare its time with: the empty DB's network does not compile)"]
        return ["right, and not slower than with the empty DB"]

    def event(self) -> ModelEvent:
        """This run as a step of the model's story (the console's Network view)."""
        with_db, empty = (c.timing["median_ms"] if c.timing else None for c in (self.with_db, self.empty_db))
        ratio = self.ratio
        said = (f"{with_db:.3f} ms with the DB, {empty:.3f} ms with the empty DB ({ratio:.2f}x)" if ratio is not None
                else "not timed")
        verdict = "; ".join(self.verdicts())
        where = f" on {self.device}" if self.device else ""
        from core.db.state_records import ModelEvent

        return ModelEvent(model=str(self.job.model.resolve()), db_path=str(self.job.db), kind="run",
                          ok=self.status == 0, headline=f"run{where}: {said}; {verdict}",
                          detail=json.dumps({"with_db_ms": with_db, "empty_db_ms": empty, "device": self.device,
                                             "max_error": self.max_error, "status": self.status,
                                             "verdict": self.verdict.verdict if self.verdict else None}))

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "findings": self.findings, "notes": self.notes,
                "model": str(self.job.model), "db": str(self.job.db), "workdir": str(self.workdir),
                "device": self.device or None, "no_device": self.no_device or None, "arch": self.arch,
                "libraries": self.libraries, "max_error_allowed": self.max_error,
                "error_formula": ERROR_FORMULA, "seed": self.options.seed, "library_math": LIBRARY_MATH,
                "reference": None if self.reference is None else {"runtime": self.reference.runtime,
                                                                  "seconds": round(self.reference.seconds, 3),
                                                                  "input_sensitivity": self.reference.sensitivity},
                "warmup": self.options.warmup, "iterations": self.options.iterations, "rounds": self.options.rounds,
                "verdict": self.verdict.as_dict() if self.verdict else None,
                "fit_launches": self.options.fit_launches,
                "median_ms": {c.label: c.timing["median_ms"] if c.timing else None
                              for c in (self.with_db, self.empty_db)},
                "ratio": self.ratio, "seconds": round(self.seconds, 3), "cuda_graph": self.options.cuda_graph,
                "graph_median_ms": {c.label: (c.timing or {}).get("graph_median_ms")
                                    for c in (self.with_db, self.empty_db)} if self.options.cuda_graph else None,
                "graph_ratio": self.graph_ratio,
                "contenders": [self.with_db.as_dict(), self.empty_db.as_dict()]}


def error_bound(options: RunOptions, signature: Signature, *, tf32: bool = False) -> float:
    """The largest relative error the DB's output may have: the one asked for, else HALF_MAX_ERROR for a network
    with a half input or output, TF32_MAX_ERROR for one that runs a TF32 row (`tf32`), else DEFAULT_MAX_ERROR."""
    if options.max_error is not None:
        return options.max_error
    half = any(t.dtype == "float16" for t in (*signature.inputs, *signature.outputs))
    return HALF_MAX_ERROR if half else TF32_MAX_ERROR if tf32 else DEFAULT_MAX_ERROR


def runs_tf32_rows(report: Any, db_path: Path) -> bool:
    """Whether the compiled code runs a DB row that computes in TF32 (its Attributes say math: tf32)."""
    if report is None or report.usage is None:
        return False
    with KernelDB.open(db_path) as db:
        for key in report.usage.used_keys():
            for row in db.find(key):
                try:
                    if json.loads(row.attributes).get("math") == "tf32":
                        return True
                except (ValueError, AttributeError):
                    continue
    return False


def run_network(job: CompileJob, options: RunOptions = RunOptions(), *, state: StateDB | None = None,
                on_progress: Progress | None = None,
                should_cancel: Callable[[], bool] | None = None) -> NetworkRun:
    """Compile, build, check and time the network (see the module's docstring). KdbError (status 2) when a tool
    it needs is missing or the model cannot be read; everything else is in the report."""
    started = time.monotonic()
    say = on_progress or (lambda stage, detail: None)
    cancelled = should_cancel or (lambda: False)
    run = NetworkRun(job, options, job.workdir().resolve())
    tools = find_run_tools(job, say)
    run.libraries, run.arch, run.device, run.no_device = tools.libraries.found, tools.arch, tools.device, \
        tools.no_device
    run.notes += tools.notes
    run.workdir.mkdir(parents=True, exist_ok=True)
    try:
        _measure(run, tools, state, say, cancelled)
    finally:
        run.seconds = time.monotonic() - started
    if state is not None and not cancelled():
        state.record_model_event(run.event())
    return run


def _measure(run: NetworkRun, tools: RunTools, state: StateDB | None, say: Progress,
             cancelled: Callable[[], bool]) -> None:
    job, options = run.job, run.options
    nvcc, libraries = tools.nvcc, tools.libraries
    db_job = replace(job, out=run.workdir / WITH_DB, arch=run.arch)
    empty_path = fresh_empty_db(run.workdir / EMPTY_DB)  # a fresh empty DB each run
    empty_job = replace(job, db=empty_path, out=run.workdir / EMPTY_DB, arch=run.arch)

    for contender, contender_job, fit in ((run.with_db, db_job, options.fit_launches),
                                          (run.empty_db, empty_job, False)):
        stage = f"compile ({contender.label})"
        say(stage, "starting NNFusion")

        def on_line(line: str, stage: str = stage) -> None:
            say(stage, line)

        if fit:
            contender.compile, contender.made_standalone = compile_fitting_launches(
                contender_job, state=state, on_line=on_line, should_cancel=cancelled)
        else:  # the empty DB's compile is kdb's own baseline: its failure is no failure record of the user's
            contender.compile = compile_and_read(contender_job, state=state if contender is run.with_db else None,
                                                 on_line=on_line, should_cancel=cancelled)
        if not contender.compile.ok:
            contender.problem = f"NNFusion failed: {contender.compile.reason}"
            if contender is run.with_db or cancelled():
                return _stop(run, contender, cancelled())
    # A network NNFusion compiles only with the DB (a Resize or a ConvTranspose: no kernel of its own) is still
    # checked against ONNX Runtime and timed, alone: there is nothing to compare its time with
    contenders = [c for c in (run.with_db, run.empty_db) if c.compile is not None and c.compile.ok]
    if len(contenders) == 1:
        run.notes.append(f"no comparison: with the empty DB {run.empty_db.problem}; the network with the DB is "
                         "checked against ONNX Runtime and timed alone")
    projects = [c.project() for c in contenders]
    signatures = [read_signature(p) for p in projects]
    if any(s != signatures[0] for s in signatures):
        raise KdbError(f"the two compiles of {job.model} take different kernel_entry arguments")
    run.max_error = error_bound(options, signatures[0], tf32=runs_tf32_rows(run.with_db.compile, job.db))
    inputs_dir = run.workdir / "inputs"
    say("reference", f"seed {options.seed}: inputs, ONNX Runtime on the CPU; nvcc builds both networks")
    arrays = make_inputs(signatures[0], inputs_dir, options.seed)
    interrupted = threading.Event()

    def stop() -> bool:
        return interrupted.is_set() or cancelled()

    # Without onnxruntime both networks are still built (what needs no GPU), and nothing is run: no reference
    no_reference = "" if importlib.util.find_spec("onnxruntime") else (
        f"onnxruntime is not installed: it computes the reference output ({RUN_EXTRA})")
    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            others = random_inputs(signatures[0], options.seed + 1)
            reference = None if no_reference else pool.submit(onnx_runtime_reference, job.model, signatures[0],
                                                              arrays, others)
            builds = {c.label: pool.submit(build_network, p, arch=run.arch, nvcc=nvcc, libraries=libraries,
                                           timeout_s=options.build_timeout_s, should_cancel=stop,
                                           cuda_graph=options.cuda_graph)
                      for c, p in zip(contenders, projects, strict=True)}
            for contender in contenders:
                contender.build = built = builds[contender.label].result()
                say(f"build ({contender.label})", "done" if built.ok else built.error)
            run.reference = reference.result() if reference is not None else None
            if run.reference is not None and run.reference.insensitive():
                run.notes.append(run.reference.insensitive())
        except BaseException:  # Ctrl-C or an error: the other builds' nvcc are stopped, not waited for
            interrupted.set()
            raise
    for contender in contenders:
        if contender.build is not None and not contender.build.ok:
            contender.problem = f"nvcc failed: {contender.build.error}"
            if not run.device and not cancelled():  # (what built is not run either: said first, as when all build)
                run.findings.append(f"{NO_GPU} ({run.no_device})")
            return _stop(run, contender, cancelled())
    if not run.device or no_reference:  # each thing missing said
        run.findings += [f"{NO_GPU} ({run.no_device})"] * (not run.device) + [f"not run: {no_reference}"] * bool(
            no_reference)
        run.status = COULD_NOT_RUN
        return None
    for turn in range(options.rounds):  # one at a time, each holding the GPU; who goes first swaps every round
        for contender in contenders[::-1] if turn % 2 == 0 else contenders:
            if cancelled():
                return _stop(run, contender, True)
            say(f"round {turn + 1}/{options.rounds}", contender.label)
            _run_one(run, contender, inputs_dir, libraries, say, cancelled)
            if contender.problem:
                return _stop(run, contender, cancelled())
    for contender in contenders:
        contender.timing = _over_rounds(contender.rounds)
    _judge(run)
    return None


def _over_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
    """A contender's timing over its rounds: the median of each statistic's round values (the least of the minima);
    a statistic only some rounds have (a CUDA graph captured in some) is left out."""
    import statistics

    merged = {key: statistics.median(r[key] for r in rounds) for key in rounds[0] if all(key in r for r in rounds)}
    for key in ("min_ms", "graph_min_ms"):
        if key in merged:
            merged[key] = min(r[key] for r in rounds)
    return merged


def _run_one(run: NetworkRun, contender: Contender, inputs_dir: Path, libraries: CudaLibraries, say: Progress,
             cancelled: Callable[[], bool]) -> None:
    run_harness(contender, inputs_dir, run.options, libraries, say, cancelled)
    if contender.problem.startswith(NO_GPU):
        run.no_device = "the harness found no CUDA GPU"
    if contender.timing is None:
        return
    contender.rounds.append(contender.timing)
    build = contender.build
    assert build is not None and build.signature is not None and run.reference is not None
    contender.error, contender.output_errors = largest_error(read_outputs(build.signature, build.project / "outputs"),
                                                             run.reference.outputs)
    if "graph_median_ms" in contender.timing:  # the graph's output judged as the plain one is, else no graph times
        graph_error, _ = largest_error(read_outputs(build.signature, build.project / "outputs", GRAPH_SUFFIX),
                                       run.reference.outputs)
        contender.graph_error = graph_error
        assert run.max_error is not None
        if not graph_error <= run.max_error:
            contender.graph_problem = f"the CUDA graph's output is wrong: max relative error {graph_error:.2e}"
            for key in GRAPH_KEYS:
                contender.timing.pop(key)


def _judge(run: NetworkRun) -> None:
    db, empty = run.with_db, run.empty_db
    assert db.error is not None and db.timing is not None
    bound = run.max_error
    assert bound is not None  # set with the signature, before any run
    wrong = not db.error <= bound  # a NaN error is wrong too
    key = run.judged_by
    how = " in a CUDA graph" if key != "median_ms" else ""
    verdict = None if empty.timing is None else judge([r[key] for r in db.rounds], [r[key] for r in empty.rounds])
    run.verdict = verdict
    slower = verdict is not None and verdict.verdict == SLOWER
    if wrong:
        run.findings.append(f"the output is wrong: max relative error {db.error:.2e} > {bound:g}")
        if empty.error is not None and not empty.error <= bound:
            run.notes.append(f"with the empty DB (cuDNN/cuBLAS) the error is {empty.error:.2e}, also above {bound:g}")
    elif empty.error is not None and not empty.error <= bound:  # (NNFusion's own code can be wrong: SkippedCopy)
        run.notes.append(f"right with the DB; with the empty DB the output is wrong: max relative error "
                         f"{empty.error:.2e} > {bound:g}")
    if verdict is None:
        run.notes.append(f"with the DB {Spread(tuple(r[key] for r in db.rounds)).text()}; no time of the "
                         "empty DB's to compare with")
    elif slower:
        run.findings.append(f"slower with the DB{how}: "
                            f"{verdict.first.text()} against {verdict.second.text()} with the empty DB, every round "
                            f"of {len(db.rounds)} slower")
    else:
        run.notes.append(f"{verdict.verdict} against the empty DB{how}: "
                         f"ratio {verdict.ratio:.3f}x; with the DB {verdict.first.text()}, empty DB "
                         f"{verdict.second.text()}")
    if run.options.cuda_graph:
        run.notes.append(graph_note(run))
    if db.compile is not None:  # the compile's own problems (a launch check that could not run, too) ride along
        run.notes += db.compile.problems()
    run.status = FAILED if wrong or slower else OK


def graph_note(run: NetworkRun) -> str:
    """Both networks' times with kernel_entry captured in a CUDA graph, or why a network has none."""
    said = []
    for contender in (run.with_db, run.empty_db):
        timing = contender.timing or {}
        said.append(f"{contender.label} {timing['graph_median_ms']:.4f} ms" if "graph_median_ms" in timing else
                    f"{contender.label} {contender.graph_problem or 'not timed'}")
    ratio = f" ({run.graph_ratio:.3f}x)" if run.graph_ratio is not None else ""
    return ("in a CUDA graph (kernel_entry captured once, then replayed; median of the rounds): " + ", ".join(said)
            + ratio)


def _stop(run: NetworkRun, contender: Contender, cancelled: bool) -> None:
    if cancelled:
        contender.problem = "cancelled"
        run.findings.append("cancelled")
        run.status = COULD_NOT_RUN
        return
    baseline = contender is run.empty_db
    if contender.problem.startswith(NO_GPU):
        run.status = COULD_NOT_RUN
    else:  # the DB's network failing is a finding about the DB; the empty DB's leaves nothing to compare with
        run.status = COULD_NOT_RUN if baseline else FAILED
    run.findings.append(f"{contender.label}: {contender.problem}")

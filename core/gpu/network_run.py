"""Run a model's network as NNFusion compiled it with the DB, check its output and time it against the same model
compiled with an empty DB (`kdb nnfusion MODEL --run`, and the console's compile dialog).

Steps: compile with the DB (making rows standalone where a BlockFusion kernel cannot launch, unless told not to)
and with an empty DB; build both projects with nvcc (core/nnfusion/build.py) while ONNX Runtime computes the
reference on the seeded input (core/nnfusion/reference.py); then, on a CUDA GPU, run both harnesses one after
the other, each holding the GPU, timed the same way, and compare their outputs with the reference.

Status: 0 the network with the DB is right (error within the bound) and not slower than with the empty DB;
1 it is wrong or slower, or it could not be compiled, built or run; 2 nothing could be measured (no GPU: the
networks are built but not run; a tool missing; the empty DB's network failing; cancelled).
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.cuda.nvcc import find_nvcc
from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.errors import KdbError, ToolError
from core.gpu.exclusive import gpu_exclusive
from core.gpu.inventory import detect_devices
from core.nnfusion.build import (
    HARNESS_NO_DEVICE,
    Build,
    CudaLibraries,
    Signature,
    Step,
    build_network,
    find_cuda_libraries,
    parse_timing,
    read_signature,
    run_environment,
    run_step,
)
from core.nnfusion.compile_job import CompileJob, CompileReport, compile_and_read, compile_fitting_launches
from core.nnfusion.reference import (
    DEFAULT_SEED,
    Reference,
    largest_error,
    make_inputs,
    onnx_runtime_reference,
    random_inputs,
    read_outputs,
    tensor_file,
)

OK, FAILED, COULD_NOT_RUN = 0, 1, 2
DEFAULT_MAX_ERROR = 1e-4
# An fp16 network (a half input or output) against ONNX Runtime's run of the same model (which widens half to
# float inside most CPU kernels): each half op rounds to 2^-11 and its reductions accumulate in half (NNFusion's
# cuDNN/cuBLAS half calls, and kdb's rows: core/codegen/reference.tolerance), so a network's error is of the order
# of its deepest reduction's bound (0.02-0.07 for a 3x3x512 conv alone). A stated default, not yet calibrated on a
# GPU; --max-error sets another.
HALF_MAX_ERROR = 5e-2
NO_GPU = "no CUDA GPU: the network was built but not run"
ERROR_FORMULA = "max |out - ref| / max |ref| per output (float64), the largest over the outputs"
WITH_DB, EMPTY_DB = "with-db", "empty-db"
LIBRARY_MATH = "fp32: cuDNN and cuBLAS with TF32 off (NVIDIA_TF32_OVERRIDE=0)"


@dataclass(frozen=True)
class RunOptions:
    max_error: float | None = None  # None: by the network's element types (error_bound)
    fit_launches: bool = True  # rows fused into a kernel that cannot launch are made standalone (writes the DB)
    seed: int = DEFAULT_SEED
    warmup: int = 100
    iterations: int = 1000
    build_timeout_s: float = 1800.0
    run_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_error is not None and not self.max_error > 0:
            raise KdbError(f"the error bound must be above 0, got {self.max_error}")
        if self.warmup < 0 or self.iterations < 1:
            raise KdbError(f"warm-up {self.warmup} and iterations {self.iterations}: need >= 0 and >= 1")


@dataclass
class Contender:
    """The network compiled with one DB: its compile, build, run and result."""

    label: str
    compile: CompileReport | None = None
    made_standalone: list[str] = field(default_factory=list)
    build: Build | None = None
    run: Step | None = None
    timing: dict[str, float] | None = None
    error: float | None = None  # the largest relative error against the reference
    output_errors: list[float] = field(default_factory=list)
    problem: str = ""  # why it has no result

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "problem": self.problem, "made_standalone": self.made_standalone,
                "compile": self.compile.as_dict() if self.compile else None,
                "build": self.build.as_dict() if self.build else None,
                "run": self.run.as_dict() if self.run else None,
                "timing": self.timing, "max_rel_error": self.error, "output_errors": self.output_errors}


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

    @property
    def ratio(self) -> float | None:
        """The network's median time with the DB over that with the empty DB."""
        a, b = self.with_db.timing, self.empty_db.timing
        return a["median_ms"] / b["median_ms"] if a and b and b["median_ms"] > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "findings": self.findings, "notes": self.notes,
                "model": str(self.job.model), "db": str(self.job.db), "workdir": str(self.workdir),
                "device": self.device or None, "no_device": self.no_device or None, "arch": self.arch,
                "libraries": self.libraries, "max_error_allowed": self.max_error,
                "error_formula": ERROR_FORMULA, "seed": self.options.seed, "library_math": LIBRARY_MATH,
                "reference": None if self.reference is None else {"runtime": self.reference.runtime,
                                                                  "seconds": round(self.reference.seconds, 3),
                                                                  "input_sensitivity": self.reference.sensitivity},
                "warmup": self.options.warmup, "iterations": self.options.iterations,
                "fit_launches": self.options.fit_launches,
                "median_ms": {c.label: c.timing["median_ms"] if c.timing else None
                              for c in (self.with_db, self.empty_db)},
                "ratio": self.ratio, "seconds": round(self.seconds, 3),
                "contenders": [self.with_db.as_dict(), self.empty_db.as_dict()]}


def error_bound(options: RunOptions, signature: Signature) -> float:
    """The largest relative error the DB's output may have: the one asked for, else HALF_MAX_ERROR for a network
    with a half input or output, else DEFAULT_MAX_ERROR."""
    if options.max_error is not None:
        return options.max_error
    half = any(t.dtype == "float16" for t in (*signature.inputs, *signature.outputs))
    return HALF_MAX_ERROR if half else DEFAULT_MAX_ERROR


Progress = Callable[[str, str], None]  # (stage, detail)


def run_network(job: CompileJob, options: RunOptions = RunOptions(), *, state: StateDB | None = None,
                on_progress: Progress | None = None,
                should_cancel: Callable[[], bool] | None = None) -> NetworkRun:
    """Compile, build, check and time the network (see the module's docstring). KdbError (status 2) when a tool
    it needs is missing or the model cannot be read; everything else is in the report."""
    started = time.monotonic()
    say = on_progress or (lambda stage, detail: None)
    cancelled = should_cancel or (lambda: False)
    run = NetworkRun(job, options, job.workdir().resolve())
    say("tools", "nvcc, cuDNN, cuBLAS, ONNX Runtime")
    nvcc = find_nvcc(job.nvcc)
    libraries = find_cuda_libraries(nvcc)
    run.libraries = libraries.found
    if importlib.util.find_spec("onnxruntime") is None:
        raise ToolError("onnxruntime is not installed: it computes the reference output "
                        "(`pip install 'kernel-db-console[run]'`)")
    say("device", "looking for a CUDA GPU")
    devices, run.no_device = detect_devices()
    run.arch = devices[0].arch if devices else job.arch
    run.device = devices[0].name if devices else ""
    if devices and run.arch != job.arch:
        run.notes.append(f"built for the GPU's {run.arch}, not {job.arch}")
    if devices and job.product_name != run.device:  # NNFusion reads the rows' profiles for the product name
        run.notes.append(f"compiled for the product name {job.product_name or '(none)'!r}, the GPU is "
                         f"{run.device!r}: rows chosen by their profile were chosen for the other")
    run.workdir.mkdir(parents=True, exist_ok=True)
    try:
        _measure(run, nvcc, libraries, state, say, cancelled)
    finally:
        run.seconds = time.monotonic() - started
    return run


def _measure(run: NetworkRun, nvcc: str, libraries: CudaLibraries, state: StateDB | None, say: Progress,
             cancelled: Callable[[], bool]) -> None:
    job, options = run.job, run.options
    db_job = replace(job, out=run.workdir / WITH_DB, arch=run.arch)
    shutil.rmtree(run.workdir / EMPTY_DB, ignore_errors=True)  # kdb's own folder: a fresh empty DB each run
    empty_path = run.workdir / EMPTY_DB / "empty.db"
    KernelDB.open(empty_path, create=True).close()
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
            return _stop(run, contender, cancelled())
    projects = [_project(c) for c in (run.with_db, run.empty_db)]
    signatures = [read_signature(p) for p in projects]
    if signatures[0] != signatures[1]:
        raise KdbError(f"the two compiles of {job.model} take different kernel_entry arguments")
    run.max_error = error_bound(options, signatures[0])
    inputs_dir = run.workdir / "inputs"
    say("reference", f"seed {options.seed}: inputs, ONNX Runtime on the CPU; nvcc builds both networks")
    arrays = make_inputs(signatures[0], inputs_dir, options.seed)
    interrupted = threading.Event()

    def stop() -> bool:
        return interrupted.is_set() or cancelled()

    with ThreadPoolExecutor(max_workers=3) as pool:
        try:
            reference = pool.submit(onnx_runtime_reference, job.model, signatures[0], arrays,
                                    random_inputs(signatures[0], options.seed + 1))
            builds = {c.label: pool.submit(build_network, p, arch=run.arch, nvcc=nvcc, libraries=libraries,
                                           timeout_s=options.build_timeout_s, should_cancel=stop)
                      for c, p in zip((run.with_db, run.empty_db), projects, strict=True)}
            for contender in (run.with_db, run.empty_db):
                contender.build = built = builds[contender.label].result()
                say(f"build ({contender.label})", "done" if built.ok else built.error)
            run.reference = reference.result()
            if run.reference.insensitive():
                run.notes.append(run.reference.insensitive())
        except BaseException:  # Ctrl-C or an error: the other builds' nvcc are stopped, not waited for
            interrupted.set()
            raise
    for contender in (run.with_db, run.empty_db):
        if contender.build is not None and not contender.build.ok:
            contender.problem = f"nvcc failed: {contender.build.error}"
            return _stop(run, contender, cancelled())
    if not run.device:
        run.findings.append(f"{NO_GPU} ({run.no_device})")
        run.status = COULD_NOT_RUN
        return None
    for contender in (run.empty_db, run.with_db):  # one at a time, each holding the GPU
        if cancelled():
            return _stop(run, contender, True)
        _run_one(run, contender, inputs_dir, libraries, say, cancelled)
        if contender.problem:
            return _stop(run, contender, cancelled())
    _judge(run)
    return None


def _run_one(run: NetworkRun, contender: Contender, inputs_dir: Path, libraries: CudaLibraries, say: Progress,
             cancelled: Callable[[], bool]) -> None:
    build = contender.build
    assert build is not None and build.signature is not None
    signature = build.signature
    outputs_dir = build.project / "outputs"
    outputs_dir.mkdir(exist_ok=True)
    for i, tensor in enumerate(signature.outputs):
        tensor_file(outputs_dir, i, tensor).unlink(missing_ok=True)
    command = [str(build.harness), str(run.options.warmup), str(run.options.iterations),
               *(str(tensor_file(inputs_dir, i, t)) for i, t in enumerate(signature.inputs)),
               *(str(tensor_file(outputs_dir, i, t)) for i, t in enumerate(signature.outputs))]
    stage = f"run ({contender.label})"
    say(stage, f"waiting for the GPU, then {run.options.warmup} warm-ups and {run.options.iterations} timed calls")
    with gpu_exclusive():
        say(stage, f"{run.options.warmup} warm-ups and {run.options.iterations} timed calls of kernel_entry")
        # The working directory is the project: cuda_init reads the weights from ./Constant/.
        contender.run = step = run_step(stage, command, cwd=build.project, timeout_s=run.options.run_timeout_s,
                                        env=run_environment(libraries), should_cancel=cancelled)
    if step.returncode == HARNESS_NO_DEVICE:
        run.no_device = "the harness found no CUDA GPU"
        contender.problem = f"{NO_GPU} ({run.no_device})"
        return
    if not step.ok:
        contender.problem = f"the network failed: {step.reason()}"
        return
    contender.timing = parse_timing(step)
    assert run.reference is not None
    contender.error, contender.output_errors = largest_error(read_outputs(signature, outputs_dir),
                                                             run.reference.outputs)


def _project(contender: Contender) -> Path:
    result = contender.compile.result if contender.compile else None
    assert result is not None and result.project is not None  # a compile that is ok has its project
    return result.project


def _judge(run: NetworkRun) -> None:
    db, empty = run.with_db, run.empty_db
    assert db.error is not None and db.timing is not None and empty.timing is not None
    bound = run.max_error
    assert bound is not None  # set with the signature, before any run
    wrong = not db.error <= bound  # a NaN error is wrong too
    ratio = run.ratio
    slower = ratio is None or ratio > 1.0
    if wrong:
        run.findings.append(f"the output is wrong: max relative error {db.error:.2e} > {bound:g}")
        if empty.error is not None and not empty.error <= bound:
            run.notes.append(f"with the empty DB (cuDNN/cuBLAS) the error is {empty.error:.2e}, also above {bound:g}")
    if slower:
        run.findings.append(f"slower with the DB: {db.timing['median_ms']:.4f} ms against "
                            f"{empty.timing['median_ms']:.4f} ms with the empty DB")
    if db.compile is not None:  # the compile's own problems (a launch check that could not run, too) ride along
        run.notes += db.compile.problems()
    run.status = FAILED if wrong or slower else OK


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

"""What every run of NNFusion's generated code on the GPU shares: the tools and the GPU it runs with, the network
compiled with one DB (a Contender), and kdb's harness timing kernel_entry between CUDA events while it holds the GPU.

`kdb nnfusion MODEL --run` (core/gpu/network_run.py) runs a whole network this way, `kdb nnfusion MODEL --op-times`
(core/gpu/library_times.py) each op of it on its own: both time the same way.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.cuda.nvcc import find_nvcc
from core.db.kernel_db import KernelDB
from core.errors import KdbError
from core.gpu.exclusive import gpu_exclusive
from core.gpu.inventory import detect_devices
from core.nnfusion.build import (
    HARNESS_NO_DEVICE,
    Build,
    CudaLibraries,
    Step,
    find_cuda_libraries,
    parse_timing,
    run_environment,
    run_step,
)
from core.nnfusion.compile_job import CompileJob, CompileReport
from core.nnfusion.cuda_graph import parse_graph
from core.nnfusion.reference import DEFAULT_SEED, tensor_file

NO_GPU = "no CUDA GPU: the network was built but not run"

Progress = Callable[[str, str], None]  # (stage, detail)


@dataclass(frozen=True)
class HarnessOptions:
    """How the harness is fed and how long each step may take."""

    seed: int = DEFAULT_SEED
    warmup: int = 100
    iterations: int = 1000
    build_timeout_s: float = 1800.0
    run_timeout_s: float = 600.0
    cuda_graph: bool = False  # also time kernel_entry captured in a CUDA graph (core/nnfusion/cuda_graph.py)

    def __post_init__(self) -> None:
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
    rounds: list[dict[str, float]] = field(default_factory=list)  # each round's timing (network_run's rounds)
    error: float | None = None  # the largest relative error against the reference
    output_errors: list[float] = field(default_factory=list)
    problem: str = ""  # why it has no result
    graph_error: float | None = None  # that of the CUDA graph's output (asked for: HarnessOptions.cuda_graph)
    graph_problem: str = ""  # why the timing has no CUDA graph's times (when asked for)

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "problem": self.problem, "made_standalone": self.made_standalone,
                "compile": self.compile.as_dict() if self.compile else None,
                "build": self.build.as_dict() if self.build else None,
                "run": self.run.as_dict() if self.run else None,
                "timing": self.timing, "round_medians_ms": [r["median_ms"] for r in self.rounds],
                "max_rel_error": self.error, "output_errors": self.output_errors,
                "graph_max_rel_error": self.graph_error, "graph_problem": self.graph_problem or None}

    def project(self) -> Path:
        """The generated project of a compile that is ok."""
        result = self.compile.result if self.compile else None
        assert result is not None and result.project is not None  # a compile that is ok has its project
        return result.project


@dataclass
class RunTools:
    """nvcc, cuDNN and cuBLAS to build with, and the GPU to run on ('' and why not, without one)."""

    nvcc: str
    libraries: CudaLibraries
    arch: str  # the GPU's, else the job's
    device: str = ""
    no_device: str = ""
    notes: list[str] = field(default_factory=list)


def find_run_tools(job: CompileJob, say: Progress) -> RunTools:
    """nvcc, the libraries (ToolError saying what to install when one is missing) and the first CUDA GPU, with a
    note where the GPU is not what the job was compiled for."""
    say("tools", "nvcc, cuDNN, cuBLAS")
    nvcc = find_nvcc(job.nvcc)
    libraries = find_cuda_libraries(nvcc)
    say("device", "looking for a CUDA GPU")
    devices, no_device = detect_devices()
    tools = RunTools(nvcc, libraries, devices[0].arch if devices else job.arch,
                     devices[0].name if devices else "", no_device)
    if devices and tools.arch != job.arch:
        tools.notes.append(f"built for the GPU's {tools.arch}, not {job.arch}")
    if devices and job.product_name != tools.device:  # NNFusion reads the rows' profiles for the product name
        tools.notes.append(f"compiled for the product name {job.product_name or '(none)'!r}, the GPU is "
                           f"{tools.device!r}: rows chosen by their profile were chosen for the other")
    return tools


def fresh_empty_db(folder: Path) -> Path:
    """An empty kernel DB (NNFusion's table) in a folder of kdb's own, emptied first: the library's baseline."""
    shutil.rmtree(folder, ignore_errors=True)
    path = folder / "empty.db"
    KernelDB.open(path, create=True).close()
    return path


def run_harness(contender: Contender, inputs_dir: Path, options: HarnessOptions, libraries: CudaLibraries,
                say: Progress, cancelled: Callable[[], bool]) -> None:
    """Run the contender's built harness on the GPU, holding it: its step, then its timing, or its problem (NO_GPU
    first when the harness found no GPU). The outputs of the last call are in the project's outputs/."""
    build = contender.build
    assert build is not None and build.signature is not None
    signature = build.signature
    outputs_dir = build.project / "outputs"
    outputs_dir.mkdir(exist_ok=True)
    for i, tensor in enumerate(signature.outputs):
        tensor_file(outputs_dir, i, tensor).unlink(missing_ok=True)
    command = [str(build.harness), str(options.warmup), str(options.iterations),
               *(str(tensor_file(inputs_dir, i, t)) for i, t in enumerate(signature.inputs)),
               *(str(tensor_file(outputs_dir, i, t)) for i, t in enumerate(signature.outputs))]
    stage = f"run ({contender.label})"
    say(stage, f"waiting for the GPU, then {options.warmup} warm-ups and {options.iterations} timed calls")
    with gpu_exclusive():
        say(stage, f"{options.warmup} warm-ups and {options.iterations} timed calls of kernel_entry")
        # The working directory is the project: cuda_init reads the weights from ./Constant/.
        contender.run = step = run_step(stage, command, cwd=build.project, timeout_s=options.run_timeout_s,
                                        env=run_environment(libraries), should_cancel=cancelled)
    if step.returncode == HARNESS_NO_DEVICE:
        contender.problem = f"{NO_GPU} (the harness found no CUDA GPU)"
    elif not step.ok:
        contender.problem = f"the network failed: {step.reason()}"
    else:
        contender.timing = parse_timing(step)
        if options.cuda_graph:  # (its times join the timing; why there are none is said instead)
            times, contender.graph_problem = parse_graph(step.output)
            contender.timing.update(times)

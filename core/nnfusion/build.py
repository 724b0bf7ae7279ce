"""Build the CUDA project NNFusion generated (`nnfusion_rt/cuda_codegen/`) into a program that kdb runs and times.

NNFusion's CMakeLists uses the old FindCUDA module and sm_60-75, so nvcc is called directly: nnfusion_rt.cu
becomes libnnfusion_naive_rt.so (against cuDNN and cuBLAS), and a harness of kdb's own links it. The harness
(not NNFusion's main_test.cpp, which times the input's host-to-device copy with the network) reads the inputs from
files, copies them to the GPU once, calls kernel_entry for warm-up and then for the timed iterations, each between
its own pair of CUDA events, and writes the outputs of the last call and one JSON line with the median.

The network reads its weights from `./Constant/` (a relative path in cuda_init): it runs with the project as its
working directory. cuDNN and cuBLAS come from their Python wheels (found by import), the CUDA toolkit's as a
fallback. Compiling and linking need no GPU.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError, ToolError
from core.nnfusion import cuda_graph as graph_harness
from core.processes import kill_group

# How the `run` extra is installed in a checkout (the README's set-up: .venv from pyproject.toml)
RUN_EXTRA = "`.venv/bin/pip install -e '.[run]'`, the `run` extra"

HARNESS_SOURCE = "kdb_harness.cu"
HARNESS = "kdb_harness"
LIBRARY = "libnnfusion_naive_rt.so"
# The harness's exit statuses besides 0 (its stderr says more).
HARNESS_BAD_INPUT, HARNESS_NO_DEVICE, HARNESS_CUDA_ERROR = 2, 3, 4

# C types NNFusion writes in kernel_entry's signature (element_type::c_type_string), as numpy dtypes.
C_TYPES = {"float": "float32", "double": "float64", "half": "float16", "int8_t": "int8", "uint8_t": "uint8",
           "int16_t": "int16", "uint16_t": "uint16", "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64",
           "uint64_t": "uint64", "char": "int8"}
_ENTRY = re.compile(r'extern\s+"C"\s+int\s+kernel_entry\s*\(([^)]*)\)')
_PARAM = re.compile(r"^\s*(?:const\s+)?(\w+)\s*(\*{1,2})\s*(\w+)\s*$")
_INDEX = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class Tensor:
    """One argument of kernel_entry: the graph's input or output it stands for."""

    name: str  # NNFusion's (Parameter_2_0, Result_10_0)
    onnx_name: str  # the model's
    c_type: str
    shape: tuple[int, ...]
    by_pointer: bool = False  # an output kernel_entry points at (T**), not one it writes into (T*)

    @property
    def dtype(self) -> str:
        return C_TYPES[self.c_type]

    @property
    def elements(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "onnx_name": self.onnx_name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Signature:
    """kernel_entry's inputs and outputs, in its argument order."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


def read_signature(project: Path) -> Signature:
    """kernel_entry's arguments (nnfusion_rt.h), with the model's names and shapes (para_info.json).
    InputError naming the file and the argument when they cannot be read or disagree."""
    header, info_file = project / "nnfusion_rt.h", project / "para_info.json"
    try:
        text = header.read_text(encoding="utf-8", errors="replace")
        info = json.loads(info_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the generated project: {exc}", where=str(project)) from exc
    match = _ENTRY.search(text)
    if match is None:
        raise InputError('no extern "C" int kernel_entry(...) declaration', where=str(header))
    params = []
    for text_param in (p for p in match.group(1).split(",") if p.strip()):
        m = _PARAM.match(text_param)
        if m is None or m.group(1) not in C_TYPES:
            raise InputError(f"kernel_entry argument {text_param.strip()!r}: not a pointer to one of "
                             f"{', '.join(sorted(C_TYPES))}", where=str(header))
        params.append((m.group(1), len(m.group(2)) == 2, m.group(3)))
    declared = {}
    for kind in ("input", "output"):
        entries = info.get(kind) if isinstance(info, dict) else None
        if not isinstance(entries, dict):
            raise InputError(f"no {kind!r} table", where=str(info_file))
        for onnx_name, entry in entries.items():
            try:  # "id": "((float32*)(inputs[0]))": the argument's position among the inputs (outputs)
                position = int(_INDEX.findall(entry["id"])[-1])
                declared[entry["name"]] = (kind, position, onnx_name, tuple(int(n) for n in entry["shape"]))
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise InputError(f"{kind} {onnx_name!r}: unreadable entry {entry!r} ({exc})",
                                 where=str(info_file)) from exc
    tensors: dict[str, list[Tensor]] = {"input": [], "output": []}
    for c_type, by_pointer, name in params:
        if name not in declared:
            raise InputError(f"kernel_entry argument {name} is not in {info_file.name}", where=str(header))
        kind, position, onnx_name, shape = declared[name]
        if position != len(tensors[kind]) or (kind == "input" and tensors["output"]):
            raise InputError(f"kernel_entry argument {name} is {kind} {position} of {info_file.name}, out of order",
                             where=str(header))
        if kind == "input" and by_pointer:
            raise InputError(f"kernel_entry input {name} is a pointer to a pointer", where=str(header))
        tensors[kind].append(Tensor(name, onnx_name, c_type, shape, by_pointer))
    if len(params) != len(declared) or not tensors["output"]:
        raise InputError(f"kernel_entry has {len(params)} arguments, {info_file.name} lists {len(declared)}",
                         where=str(header))
    return Signature(tuple(tensors["input"]), tuple(tensors["output"]))


def harness_source(signature: Signature, graph: str = "") -> str:
    """The harness for one kernel_entry signature. argv: WARMUP ITERATIONS, then one file per input (read), then
    one per output (written). `graph`: cuda_graph.graph_section's code, which also times kernel_entry captured in a
    CUDA graph."""
    n_in = len(signature.inputs)
    args = [f"({t.c_type}*)device[{i}]" for i, t in enumerate(signature.inputs)]
    for j, t in enumerate(signature.outputs):
        k = n_in + j
        args.append(f"({t.c_type}**)&device[{k}]" if t.by_pointer else f"({t.c_type}*)device[{k}]")
    values = {
        "N_IN": str(n_in), "N_OUT": str(len(signature.outputs)),
        "SIZES": ", ".join(f"{t.elements}ull * sizeof({t.c_type})" for t in (*signature.inputs, *signature.outputs)),
        "BY_POINTER": ", ".join("true" if t.by_pointer else "false" for t in signature.outputs),
        "CALL": f"kernel_entry({', '.join(args)})", "BAD_INPUT": str(HARNESS_BAD_INPUT),
        "NO_DEVICE": str(HARNESS_NO_DEVICE), "CUDA_ERROR": str(HARNESS_CUDA_ERROR), "GRAPH": graph,
        "GRAPH_CALL": "if (int bad = time_graph(device.data(), warmup, iterations, argv + 3 + N_IN)) return bad;"
                      if graph else "",
    }
    return re.sub(r"@(\w+)@", lambda m: values[m.group(1)], _HARNESS)


# kernel_entry's outputs of the default form (T**) point into NNFusion's memory pool: the harness allocates
# nothing for them and reads them where kernel_entry points.
_HARNESS = r"""// kdb's harness around NNFusion's kernel_entry (written by core/nnfusion/build.py).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>
#include <cuda_runtime.h>
#include "nnfusion_rt.h"

enum { KDB_BAD_INPUT = @BAD_INPUT@, KDB_NO_DEVICE = @NO_DEVICE@, KDB_CUDA_ERROR = @CUDA_ERROR@ };

static const int N_IN = @N_IN@, N_OUT = @N_OUT@;
static const size_t BYTES[N_IN + N_OUT] = {@SIZES@};
static const bool BY_POINTER[N_OUT] = {@BY_POINTER@};

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "kdb harness: %s: %s\n", #x, cudaGetErrorString(e_)); return KDB_CUDA_ERROR; } } while (0)

static int entry(void** device) { return @CALL@; }

static int checked_call(void** device, const char* what) {
    int status = entry(device);
    cudaError_t launched = cudaGetLastError();  // a kernel that could not launch says so only here
    cudaError_t done = cudaDeviceSynchronize();
    if (status != 0 || launched != cudaSuccess || done != cudaSuccess) {
        fprintf(stderr, "kdb harness: %s: kernel_entry returned %d; launch: %s; run: %s\n", what, status,
                cudaGetErrorString(launched), cudaGetErrorString(done));
        return KDB_CUDA_ERROR;
    }
    return 0;
}
@GRAPH@
static int run(int argc, char** argv) {
    if (argc != 3 + N_IN + N_OUT) {
        fprintf(stderr, "usage: %s WARMUP ITERATIONS INPUT... OUTPUT... (%d inputs, %d outputs)\n", argv[0], N_IN,
                N_OUT);
        return KDB_BAD_INPUT;
    }
    int warmup = atoi(argv[1]), iterations = atoi(argv[2]);
    if (warmup < 0 || iterations < 1) {
        fprintf(stderr, "kdb harness: bad WARMUP or ITERATIONS\n");
        return KDB_BAD_INPUT;
    }
    std::vector<std::vector<char>> host(N_IN);
    for (int i = 0; i < N_IN; ++i) {  // each file holds exactly its tensor: one byte more is an error too
        host[i].resize(BYTES[i] + 1);
        FILE* f = fopen(argv[3 + i], "rb");
        size_t got = f ? fread(host[i].data(), 1, BYTES[i] + 1, f) : 0;
        if (f) fclose(f);
        if (got != BYTES[i]) {
            fprintf(stderr, "kdb harness: %s: expected %zu bytes, read %zu\n", argv[3 + i], BYTES[i], got);
            return KDB_BAD_INPUT;
        }
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "kdb harness: no CUDA GPU\n");
        return KDB_NO_DEVICE;
    }
    std::vector<void*> device(N_IN + N_OUT, nullptr);
    for (int i = 0; i < N_IN; ++i) {
        CHECK(cudaMalloc(&device[i], BYTES[i]));
        CHECK(cudaMemcpy(device[i], host[i].data(), BYTES[i], cudaMemcpyHostToDevice));
    }
    cuda_init();  // loads the weights from ./Constant/
    for (int j = 0; j < N_OUT; ++j)
        if (!BY_POINTER[j]) CHECK(cudaMalloc(&device[N_IN + j], BYTES[N_IN + j]));
    CHECK(cudaDeviceSynchronize());
    if (int bad = checked_call(device.data(), "first call")) return bad;
    for (int i = 0; i < warmup; ++i) entry(device.data());
    CHECK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> events(2 * iterations);
    for (auto& e : events) CHECK(cudaEventCreate(&e));
    for (int i = 0; i < iterations; ++i) {
        cudaEventRecord(events[2 * i], 0);
        entry(device.data());
        cudaEventRecord(events[2 * i + 1], 0);
    }
    if (int bad = checked_call(device.data(), "after the timed iterations")) return bad;
    std::vector<float> ms(iterations);
    for (int i = 0; i < iterations; ++i) CHECK(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
    for (int j = 0; j < N_OUT; ++j) {
        std::vector<char> host(BYTES[N_IN + j]);
        CHECK(cudaMemcpy(host.data(), device[N_IN + j], BYTES[N_IN + j], cudaMemcpyDeviceToHost));
        FILE* f = fopen(argv[3 + N_IN + j], "wb");
        if (!f || fwrite(host.data(), 1, host.size(), f) != host.size()) {
            fprintf(stderr, "kdb harness: cannot write %s\n", argv[3 + N_IN + j]);
            return KDB_BAD_INPUT;
        }
        fclose(f);
    }
    @GRAPH_CALL@
    std::sort(ms.begin(), ms.end());
    printf("{\"median_ms\": %.6f, \"p10_ms\": %.6f, \"p90_ms\": %.6f, \"min_ms\": %.6f, \"warmup\": %d, "
           "\"iterations\": %d}\n", iterations % 2 ? ms[iterations / 2] : 0.5f * (ms[iterations / 2 - 1] +
           ms[iterations / 2]), ms[iterations / 10], ms[(iterations * 9) / 10], ms[0], warmup, iterations);
    cuda_free();
    return 0;
}

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {  // NNFusion's CUDA_SAFE_CALL throws
        fprintf(stderr, "kdb harness: %s\n", e.what());
        return KDB_CUDA_ERROR;
    }
}
"""


@dataclass(frozen=True)
class CudaLibraries:
    """Where cuDNN and cuBLAS (headers and libraries) and the CUDA runtime are, and where each was found."""

    include_dirs: tuple[Path, ...]
    lib_dirs: tuple[Path, ...]
    link: tuple[str, ...]  # -l:libcudnn.so.9 ...
    found: dict[str, str] = field(default_factory=dict)  # library -> where it came from


def _package_dirs(module: str) -> list[Path]:
    try:
        package = importlib.import_module(module)
    except ImportError:
        return []
    return [Path(p) for p in getattr(package, "__path__", [])]


def _versioned(lib_dir: Path, stem: str) -> str | None:
    """The library's file with the fewest version parts (libcudnn.so.9 before libcudnn.so.9.1.0): the wheels ship
    no unversioned name to link with -l."""
    names = sorted((p.name for p in lib_dir.glob(f"{stem}.so*")), key=lambda n: (n.count("."), n))
    return names[0] if names else None


def _find(stem: str, header: str, packages: Iterable[str], toolkit: Path) -> tuple[Path, Path, str, str] | None:
    """(include dir, lib dir, file name, origin) of one library: its wheels first, then the toolkit."""
    places = [(d, f"Python package {module}") for module in packages for d in _package_dirs(module)]
    places.append((toolkit, f"the CUDA toolkit at {toolkit}"))
    for root, origin in places:
        for lib_dir in (root / "lib", root / "lib64", root / "targets" / "x86_64-linux" / "lib"):
            name = _versioned(lib_dir, stem) if lib_dir.is_dir() else None
            include = next((d for d in (root / "include", root / "targets" / "x86_64-linux" / "include")
                            if (d / header).is_file()), None)
            if name and include:
                return include, lib_dir, name, origin
    return None


@functools.lru_cache(maxsize=4)
def toolkit_root(nvcc: str) -> Path:
    """The CUDA toolkit nvcc belongs to, as nvcc itself says (`--dryrun` prints TOP=): nvcc may be a wrapper
    script elsewhere."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60, check=False).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"cannot run {nvcc}: {exc}") from exc
    top = re.search(r"^#\$ TOP=(.+)$", out, re.MULTILINE)
    return Path(top.group(1).strip()).resolve() if top else Path(nvcc).resolve().parent.parent


def find_cuda_libraries(nvcc: str) -> CudaLibraries:
    """cuDNN (nvidia-cudnn-cu13 / -cu12: `nvidia.cudnn`) and cuBLAS (nvidia-cublas: `nvidia.cu13`; -cu12:
    `nvidia.cublas`), else nvcc's toolkit; the runtime's folder from the toolkit. ToolError saying what
    to install when one is missing."""
    toolkit = toolkit_root(nvcc)
    include_dirs: list[Path] = []
    lib_dirs: list[Path] = []
    link, found = [], {}
    for stem, header, packages, wheel in (
            ("libcudnn", "cudnn.h", ("nvidia.cudnn",), "nvidia-cudnn-cu13"),
            ("libcublas", "cublas_v2.h", ("nvidia.cu13", "nvidia.cublas", "nvidia.cu12"), "nvidia-cublas")):
        hit = _find(stem, header, packages, toolkit)
        if hit is None:
            raise ToolError(f"{stem} not found (headers and library): install the {wheel} wheel ({RUN_EXTRA}) or put "
                            f"it in the CUDA toolkit at {toolkit}")
        include, lib_dir, name, origin = hit
        include_dirs += [include] if include not in include_dirs else []
        lib_dirs += [lib_dir] if lib_dir not in lib_dirs else []
        link.append(f"-l:{name}")
        found[stem] = f"{lib_dir / name} ({origin})"
    for runtime in (toolkit / "lib64", toolkit / "targets" / "x86_64-linux" / "lib"):
        if (runtime / "libcudart.so").exists() and runtime not in lib_dirs:
            lib_dirs.append(runtime)  # -cudart shared: the harness loads libcudart.so.N from here
            break
    return CudaLibraries(tuple(include_dirs), tuple(lib_dirs), tuple(link), found)


@dataclass
class Step:
    """One command of a build or a run: what it was, how it ended."""

    what: str
    command: list[str]
    returncode: int | None = None  # None: cancelled or timed out
    seconds: float = 0.0
    output: str = ""  # its stdout and stderr (the end of them)
    timed_out: bool = False
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reason(self) -> str:
        if self.cancelled:
            return f"{self.what}: cancelled"
        if self.timed_out:
            return f"{self.what}: no result in {self.seconds:.0f} s, stopped"
        lines = [line for line in self.output.splitlines() if line.strip()]
        errors = [line for line in lines if " error" in line or "error:" in line] or lines
        return f"{self.what}: exit status {self.returncode}" + (f": {errors[0].strip()}" if errors else "")

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "command": self.command, "returncode": self.returncode,
                "seconds": round(self.seconds, 3), "ok": self.ok, "output_tail": self.output[-4000:]}


def run_step(what: str, command: list[str], *, cwd: Path, timeout_s: float, env: dict[str, str] | None = None,
             should_cancel: Callable[[], bool] | None = None) -> Step:
    """Run one command (an argv list, in its own process group); a cancel or the time limit kills the group.
    Never raises for a failing command; ToolError when it cannot start."""
    step = Step(what, command)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    except OSError as exc:
        raise ToolError(f"{what}: cannot run {command[0]}: {exc.strerror or exc}") from exc
    try:
        while True:  # poll: a cancel or the time limit stops it while it is silent too
            try:
                out, _ = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                step.cancelled = bool(should_cancel and should_cancel())
                step.timed_out = not step.cancelled and time.monotonic() - start > timeout_s
                if step.cancelled or step.timed_out:
                    kill_group(proc, timeout_s=5)
                    out = ""
                    break
    except BaseException:  # Ctrl-C: the child is in its own session and would outlive us
        kill_group(proc, timeout_s=5)
        raise
    step.seconds = time.monotonic() - start
    step.output = (out or "")[-20_000:]
    step.returncode = None if (step.cancelled or step.timed_out) else proc.returncode
    return step


@dataclass
class Build:
    """The built network of one project: its library and the harness, or the step that failed."""

    project: Path
    signature: Signature | None = None
    steps: list[Step] = field(default_factory=list)
    error: str = ""  # why it is not built ('' when it is)

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.steps) and all(s.ok for s in self.steps)

    @property
    def harness(self) -> Path:
        return self.project / HARNESS

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "project": str(self.project), "seconds": round(self.seconds, 3),
                "harness": str(self.harness) if self.ok else None,
                "inputs": [t.as_dict() for t in self.signature.inputs] if self.signature else [],
                "outputs": [t.as_dict() for t in self.signature.outputs] if self.signature else [],
                "steps": [s.as_dict() for s in self.steps]}


def build_network(project: Path, *, arch: str, nvcc: str, libraries: CudaLibraries, timeout_s: float = 1800.0,
                  should_cancel: Callable[[], bool] | None = None, cuda_graph: bool = False) -> Build:
    """nnfusion_rt.cu -> libnnfusion_naive_rt.so, then kdb's harness linked with it, for one SM arch; `cuda_graph`:
    the harness also times kernel_entry captured in a CUDA graph (core/nnfusion/cuda_graph.py). A failing step is
    reported (Build.error); a project that cannot be read raises InputError."""
    project = project.resolve()
    build = Build(project, read_signature(project))
    assert build.signature is not None
    handles = graph_harness.library_handles(project) if cuda_graph else []
    (project / HARNESS_SOURCE).write_text(
        harness_source(build.signature, graph_harness.graph_section(handles) if cuda_graph else ""), encoding="utf-8")
    number = arch.removeprefix("sm_")
    common = ["-O2", f"-gencode=arch=compute_{number},code=sm_{number}", "--expt-relaxed-constexpr",
              *(graph_harness.NVCC_FLAGS if cuda_graph else ()), *(f"-I{d}" for d in libraries.include_dirs)]
    # The libraries' folders are written into the programs (rpath): they run without LD_LIBRARY_PATH.
    rpath = ":".join(str(d) for d in libraries.lib_dirs)
    linked = [*(f"-L{d}" for d in libraries.lib_dirs), *libraries.link]
    # (the graph's harness sets the handles' stream itself: it links the libraries too)
    harness_libraries = linked if handles else []
    commands = [
        ("nvcc nnfusion_rt.cu", [nvcc, *common, "-Xcompiler", "-fPIC", "-shared", "-cudart", "shared",
                                 "nnfusion_rt.cu", "-o", LIBRARY, *linked, f"-Xlinker=-rpath={rpath}"]),
        (f"nvcc {HARNESS_SOURCE}", [nvcc, *common, "-std=c++17", HARNESS_SOURCE, "-o", HARNESS, "-L.",
                                    f"-l:{LIBRARY}", *harness_libraries, "-cudart", "shared",
                                    f"-Xlinker=-rpath=$ORIGIN:{rpath}", f"-Xlinker=-rpath-link={rpath}"]),
    ]
    deadline = time.monotonic() + timeout_s
    for what, command in commands:
        step = run_step(what, command, cwd=project, timeout_s=max(deadline - time.monotonic(), 1.0),
                        should_cancel=should_cancel)
        build.steps.append(step)
        if not step.ok:
            build.error = step.reason()
            break
    return build


# The networks are fp32, and so is the bound their output is judged by. On Ampere and later, cuDNN's default math
# lets its algorithm search pick TF32 tensor-core kernels (sessions 10-14's empty DB: error 2.0-2.8e-04, above the
# bound): with TF32 off the library runs what the model says, and the DB's rows are timed against fp32, not TF32.
TF32_OFF = {"NVIDIA_TF32_OVERRIDE": "0"}


def run_environment(libraries: CudaLibraries) -> dict[str, str]:
    """The harness's environment: cuDNN loads its engine libraries by name at run time, from LD_LIBRARY_PATH;
    TF32 off (TF32_OFF)."""
    paths = [str(d) for d in libraries.lib_dirs]
    if os.environ.get("LD_LIBRARY_PATH"):
        paths.append(os.environ["LD_LIBRARY_PATH"])
    return {**os.environ, **TF32_OFF, "LD_LIBRARY_PATH": ":".join(paths)}


_TIMING_KEYS = ("median_ms", "p10_ms", "p90_ms", "min_ms", "warmup", "iterations")


def parse_timing(step: Step) -> dict[str, float]:
    """The harness's last line: its JSON timing. InputError when it is not there."""
    lines = [line for line in step.output.splitlines() if line.startswith("{")]
    try:
        timing = json.loads(lines[-1])
        return {k: float(timing[k]) for k in _TIMING_KEYS}
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{step.what}: no timing line in its output ({exc})") from exc

"""Compile checks with nvcc: does the row NNFusion will emit build for this SM arch, and at what cost?

The translation unit is rebuilt from the row itself (signature + function_body, and the block form
with its shared arrays re-declared from the shared_memory table), so a mistake in renaming or hoisting
shows up here rather than inside the compiler. nvcc runs from an argv list in its own process group;
on timeout the whole group is killed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ToolError
from core.processes import kill_group

MAX_LOG_CHARS = 20_000
SPILL_LIMIT_BYTES = 256  # spill stores per thread over which a kernel is probably far slower than it was tuned
MAX_THREADS_PER_BLOCK = 1024
REGISTER_UNIT = 8  # registers per thread are allocated in steps of 8 (256 per warp)
WARP_GRANULARITY = 4  # a block's warps get registers 4 at a time
SMALL_REGISTER_FILES = {"sm_53": 32768, "sm_62": 32768}  # per block; 65536 on every other arch
_ERROR_LINE = re.compile(r"kernel\.cu\((\d+)\): (?:error|catastrophic error)[^:]*: ?(.*)")
_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
# "Used 72 registers, used 1 barriers, 16 bytes cumulative stack size, 5120 bytes smem" (the stack part: nvcc 13)
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, \d+ bytes cumulative stack size)?"
                         r"(?:, (\d+) bytes smem)?")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def max_threads_per_block(registers: int, arch: str) -> int:
    """The most threads a block of a kernel using `registers` per thread may have on `arch` (what CUDA reports
    as the function's maxThreadsPerBlock; on the H200: 150 registers -> 384, 185 -> 256, 128 -> 512)."""
    per_warp = -(-max(registers, 1) // REGISTER_UNIT) * REGISTER_UNIT * 32
    warps = SMALL_REGISTER_FILES.get(arch, 65536) // per_warp // WARP_GRANULARITY * WARP_GRANULARITY
    return min(MAX_THREADS_PER_BLOCK, warps * 32)


@dataclass
class KernelResources:
    registers: int | None = None
    shared_bytes: int | None = None
    stack_bytes: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None


@dataclass
class CompileResult:
    arch: str
    ok: bool
    seconds: float = 0.0
    error: str = ""
    error_line: int | None = None  # line in `source`
    log: str = ""
    source: str = ""
    kernels: dict[str, KernelResources] = field(default_factory=dict)
    # The built cubin: GPU jobs load it instead of compiling the same source a second time.
    cubin: bytes = field(default=b"", repr=False)

    def spill_bytes(self) -> int:
        """The most spill stores per thread ptxas reported for any kernel of the unit."""
        return max((k.spill_stores or 0 for k in self.kernels.values()), default=0)

    def summary(self) -> dict[str, Any]:
        """What goes into the row's Miscs: resources of the standalone kernel and the block form."""
        return {name: {k: v for k, v in asdict(res).items() if v is not None} for name, res in self.kernels.items()}


def find_nvcc(configured: str = "") -> str:
    if configured:
        if not Path(configured).is_file():
            raise ToolError(f"nvcc not found at {configured}")
        return configured
    found = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file()
                                     else None)
    if not found:
        raise ToolError("nvcc not found (set nvcc_path in the GPU & SM settings, or put nvcc on PATH)")
    return found


@dataclass(frozen=True)
class NvccProbe:
    """What one nvcc_path setting resolves to: the nvcc and the SM archs it builds, or why there is none."""

    configured: str
    nvcc: str = ""
    archs: tuple[str, ...] = ()
    problem: str = ""

    def unbuilt(self, archs: Iterable[str]) -> list[str]:
        """Those of `archs` this nvcc does not build (none while it is unknown); sm_90a and the like build wherever
        their base arch does."""
        if not self.archs:
            return []
        return [a for a in archs if a not in self.archs and a.rstrip("abcdefghijklmnopqrstuvwxyz") not in self.archs]


def probe_nvcc(configured: str) -> NvccProbe:
    """Resolve nvcc and ask it for its archs (a subprocess: from a worker in the console). A missing nvcc is an
    answer (NvccProbe.problem), not an error."""
    try:
        nvcc = find_nvcc(configured.strip())
        return NvccProbe(configured, nvcc, supported_archs(nvcc))
    except ToolError as exc:
        return NvccProbe(configured, problem=exc.reason)


@functools.lru_cache(maxsize=8)
def supported_archs(nvcc: str) -> tuple[str, ...]:
    """The sm_XX this nvcc can build for (`nvcc --list-gpu-arch`)."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"cannot run {nvcc} --list-gpu-arch: {exc}") from exc
    archs = sorted({"sm_" + a.split("_", 1)[1] for a in out.stdout.split() if a.startswith("compute_")},
                   key=lambda a: int(re.sub(r"\D", "", a)))
    if not archs:
        raise ToolError(f"{nvcc} --list-gpu-arch listed no architectures")
    return tuple(archs)


def standalone_source(function: dict[str, Any], name: str = "kdb_kernel") -> str:
    """The row's kernel exactly as NNFusion compiles it, under `name` (what GPU jobs launch).

    The compiler emits every External row through its CacheBlockCudaEmitter, also when the kernel runs
    alone: the shared arrays re-declared from `shared_memory`, then `block_function_body`. Verifying the
    original `function_body` instead would pass kernels that break in place (a dropped alignment, a
    missing alias)."""
    sig = str(function["function_signature"])
    head = _headers(function)
    return f"{head}{sig.replace('void (', f'void {name}(', 1)}\n{{\n{_shared_declarations(function)}{{\n" \
           f"{function['block_function_body']}\n}}\n}}\n"


def _headers(function: dict[str, Any]) -> str:
    """What NNFusion's generated file gives a row's kernel before it: half (through cuBLAS's header, which includes
    cuda_fp16.h) and the fixed-width integer types its typedefs name (a half shared array is declared uint16_t)."""
    sm = function.get("shared_memory") or {}
    fixed_width = any(str(t).endswith("_t") for t in sm.get("dtype", []) or [])
    return half_header(str(function["function_signature"])) + ("#include <cstdint>\n" if fixed_width else "")


def half_header(code: str) -> str:
    """The include that gives a kernel `half` (NNFusion's generated file has it through cuBLAS's header), or ''."""
    return "#include <cuda_fp16.h>\n" if re.search(r"\bhalf\b", code) else ""


def _shared_declarations(function: dict[str, Any]) -> str:
    """`__shared__ <dtype> <symbol>[<size>];` for each entry, as NNFusion's emit_alloc_shared writes them."""
    sm = function.get("shared_memory") or {}
    return "".join(f"__shared__ {t} {s}[{n}];\n"
                   for s, t, n in zip(sm.get("symbol", []), sm.get("dtype", []), sm.get("size", []), strict=False))


def translation_unit(function: dict[str, Any]) -> str:
    """The source nvcc checks: the row's kernel as NNFusion emits it, standalone and in block form."""
    sig = str(function["function_signature"])
    head = _headers(function)
    standalone = sig.replace("void (", "void kdb_kernel(", 1)
    block = sig.replace("void (", "void kdb_block_kernel(", 1)
    return (f"{head}{standalone}\n{{\n{function['function_body']}\n}}\n\n"
            f"{block}\n{{\n{_shared_declarations(function)}{function['block_function_body']}\n}}\n")


# In the cubin of translation_unit, the kernel GPU jobs launch: NNFusion's block form, the same code as
# standalone_source (which only adds a pair of braces around the body).
BLOCK_KERNEL = "kdb_block_kernel"


def compile_check(function: dict[str, Any], arch: str, *, nvcc: str, flags: list[str] | tuple[str, ...],
                  timeout_s: float, workdir: Path, cancel: threading.Event | None = None) -> CompileResult:
    """Compile the row's kernel for one arch; never raises for a bad kernel (see CompileResult.ok)."""
    return compile_source(translation_unit(function), arch, nvcc=nvcc, flags=flags, timeout_s=timeout_s,
                          workdir=workdir, cancel=cancel)


def compile_archs(function: dict[str, Any], archs: Iterable[str], *, nvcc: str, flags: list[str] | tuple[str, ...],
                  timeout_s: float, workdir: Path, cancel: threading.Event | None = None) -> list[CompileResult]:
    """compile_check for each arch in turn, up to the first that fails (its result is the last)."""
    results = []
    for arch in archs:
        results.append(compile_check(function, arch, nvcc=nvcc, flags=flags, timeout_s=timeout_s, workdir=workdir,
                                     cancel=cancel))
        if not results[-1].ok:
            break
    return results


def compile_source(source: str, arch: str, *, nvcc: str, flags: list[str] | tuple[str, ...] = (),
                   timeout_s: float = 120.0, workdir: Path, cancel: threading.Event | None = None) -> CompileResult:
    """Compile one translation unit to a cubin; never raises for bad code (see CompileResult.ok)."""
    import time

    workdir = workdir.resolve()  # nvcc runs inside the temporary folder: a relative path would point elsewhere
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nvcc-", dir=workdir) as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source, encoding="utf-8")
        argv = [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", *flags, "-o", str(Path(tmp) / "kernel.cubin"),
                str(src)]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp,
                                start_new_session=True, env={**os.environ, "TMPDIR": tmp})
        out = ""
        while True:  # poll so that a cancel or the timeout kills nvcc's whole process group promptly
            try:
                out, _ = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.perf_counter() - start
                if elapsed > timeout_s or (cancel is not None and cancel.is_set()):
                    kill_group(proc, timeout_s=5)
                    why = "cancelled" if elapsed <= timeout_s else f"nvcc timed out after {timeout_s:g} s"
                    return CompileResult(arch, False, elapsed, error=f"{why} (killed)", source=source)
        elapsed = time.perf_counter() - start
        cubin_path = Path(tmp) / "kernel.cubin"
        cubin = cubin_path.read_bytes() if proc.returncode == 0 and cubin_path.is_file() else b""
    log = out[-MAX_LOG_CHARS:]
    if proc.returncode != 0:
        m = _ERROR_LINE.search(out)
        lines = out.strip().splitlines()
        # ptxas's own errors ("uses too much shared data") have no source line; else the last line says most
        error = m.group(2).strip() if m else next((ln.strip() for ln in lines if " error " in f" {ln} "), None) \
            or (lines or ["nvcc failed"])[-1]
        return CompileResult(arch, False, elapsed, error=f"nvcc ({arch}): {error}",
                             error_line=int(m.group(1)) if m else None, log=log, source=source)
    return CompileResult(arch, True, elapsed, log=log, source=source, kernels=_resources(out), cubin=cubin)



def _resources(ptxas: str) -> dict[str, KernelResources]:
    out: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    for line in ptxas.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = out.setdefault(m.group(1), KernelResources())
        elif current is not None and (m := _PTXAS_SPILL.search(line)):
            current.stack_bytes, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
        elif current is not None and (m := _PTXAS_USED.search(line)):
            current.registers = int(m.group(1))
            current.shared_bytes = int(m.group(2) or 0)
    return out

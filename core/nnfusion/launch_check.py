"""Can every kernel launch of a generated project start on the GPU? NNFusion never checks.

A BlockFusion kernel runs each fused kernel's block function in blocks of the group's largest block size, and
it has no `__launch_bounds__`: ptxas gives it as many registers per thread as its hungriest member wants. When
that many registers times the launch's threads exceed what one block may hold, the launch fails, kernel_entry
does not look at the error, and the network computes wrong numbers without a word. Seen on the H200: a
64-thread convolution at 150 registers fused with a 448-thread one (150 registers allow 384 threads).

A kernel with `__launch_bounds__(N)` (every kdb row, and NNFusion's own kernels) launches with up to N threads:
ptxas keeps its registers to fit them, so its launch is held against N. The rest (BlockFusion kernels) are compiled
with nvcc for the arch, device code only (the host code needs cuDNN's and cuBLAS's headers), and each launch's block
is held against the registers ptxas gave the kernel. NNFusion's own kernels are compiled with them (`also_compile`):
kdb's rows compiled when they were injected, NNFusion's never did (its half depthwise kernel is no valid CUDA), and
the build would fail on them later without naming them. Compiling every row too would cost the most: every row of a
tuned ResNet-18 took 14.6 s on the H200's host, ten times NNFusion's own compile. It needs no GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from core.cuda.nvcc import compile_source, max_threads_per_block
from core.nnfusion.generated import Generated

LAUNCH_ADVICE = ("NNFusion does not check its launches: this network would run without that kernel and compute wrong "
                 "numbers without an error. Run the rows named on their own launch (`kdb db standalone KEY... "
                 "--apply`, or `kdb nnfusion --fit-launches` chooses them and compiles again), or compile with "
                 "-fblockfusion_level=0 (BlockFusion off).")
_LINE_COMMENT = re.compile(r"//[^\n]*")
_LAUNCH = re.compile(r"\b(\w+)_Call\(\s*dim3\((\d+),\s*(\d+),\s*(\d+)\),\s*dim3\((\d+),\s*(\d+),\s*(\d+)\)")


class WidestLaunch(NamedTuple):
    """How kernel_entry launches one kernel: the launch with the most threads per block, and how many launches."""

    blocks: int
    threads: int
    launches: int = 1


@dataclass(frozen=True)
class LaunchedKernel:
    """One distinct kernel kernel_entry launches (once or many times: NNFusion emits one function for nodes of
    the same kernel), its widest launch, and what ptxas gave it."""

    kernel: str
    blocks: int
    threads: int
    registers: int | None  # None: not compiled (a bounded kernel), or ptxas said nothing about it
    members: tuple[str, ...] = ()  # a BlockFusion kernel's block functions
    bounds: int | None = None  # the kernel's __launch_bounds__ (then it was not compiled)
    launches: int = 1  # how many statements of kernel_entry launch it

    def max_threads(self, arch: str) -> int | None:
        if self.bounds is not None:
            return self.bounds
        return None if self.registers is None else max_threads_per_block(self.registers, arch)

    def fits(self, arch: str) -> bool:
        limit = self.max_threads(arch)
        return limit is None or self.threads <= limit


@dataclass
class LaunchReport:
    arch: str
    kernels: list[LaunchedKernel] = field(default_factory=list)  # each distinct kernel launched
    error: str = ""  # why the check could not run ('' when it ran)
    seconds: float = 0.0
    cached: bool = False  # the registers came from an earlier compile of the same device code (no nvcc run)
    own_compiled: int = 0  # NNFusion's own bounded kernels compiled with them: they build

    @property
    def launch_count(self) -> int:
        """Kernel launches in kernel_entry (library calls are none)."""
        return sum(k.launches for k in self.kernels)

    def failing(self) -> list[LaunchedKernel]:
        return [kernel for kernel in self.kernels if not kernel.fits(self.arch)]

    def reasons(self) -> list[str]:
        return [f"{k.kernel} cannot launch on {self.arch}: "
                + (f"its __launch_bounds__ allow {k.bounds} threads per block" if k.bounds is not None
                   else f"{k.registers} registers per thread allow {k.max_threads(self.arch)} threads per block")
                + f", and kernel_entry launches it with {k.threads}"
                + (f" ({k.launches} launches of it)" if k.launches > 1 else "") for k in self.failing()]

    @property
    def compiled(self) -> int:
        """Distinct kernels nvcc compiled for the check (those without launch bounds)."""
        return sum(1 for kernel in self.kernels if kernel.bounds is None)

    def summary(self) -> str:
        """One line on what was checked: launches and distinct kernels, each named as what it is."""
        if self.error:
            return f"not checked: {self.error}"
        failing = self.failing()
        head = (f"{len(failing)} of the {_kernels(len(self.kernels))} cannot launch" if failing else
                f"all {self.launch_count} kernel launch{'es' * (self.launch_count != 1)} "
                f"({_kernels(len(self.kernels))}) fit")
        how = ("from the cache: this device code was compiled before" if self.cached
               else f"nvcc {self.seconds:.1f} s" if self.compiled or self.own_compiled else "nothing compiled")
        own = f"; NNFusion's own {self.own_compiled} compiled: they build" if self.own_compiled else ""
        return (f"{head}; {len(self.kernels) - self.compiled} kernels held to their launch bounds, {self.compiled} "
                f"to the registers nvcc gave them{own} ({how})")

    def as_dict(self) -> dict[str, object]:
        return {"arch": self.arch, "error": self.error, "seconds": self.seconds, "cached": self.cached,
                "launches": self.launch_count, "distinct_kernels": len(self.kernels), "own_compiled": self.own_compiled,
                "kernels": [{"kernel": x.kernel, "launches": x.launches, "blocks": x.blocks, "threads": x.threads,
                             "registers": x.registers, "launch_bounds": x.bounds,
                             "max_threads": x.max_threads(self.arch), "fits": x.fits(self.arch),
                             "members": list(x.members)} for x in self.kernels],
                "failing": self.reasons()}


def _kernels(count: int) -> str:
    return f"{count} distinct kernel{'s' * (count != 1)}"


def kernel_launches(generated: Generated) -> dict[str, WidestLaunch]:
    """Each kernel kernel_entry launches: (blocks, threads per block) of its launch with the most threads per
    block (were it launched two ways, the wider one is the one at risk), and its number of launches."""
    entry = generated.functions.get("kernel_entry")
    launches: dict[str, WidestLaunch] = {}
    # "// eliminated: F_Call(...)" is a launch NNFusion removed (an in-place reshape, a broadcast): it never runs
    for m in _LAUNCH.finditer(_LINE_COMMENT.sub("", entry.body) if entry else ""):
        gx, gy, gz, bx, by, bz = (int(g) for g in m.groups()[1:])
        known = launches.get(m.group(1), WidestLaunch(0, 0, 0))
        wider = bx * by * bz > known.threads
        launches[m.group(1)] = WidestLaunch(gx * gy * gz if wider else known.blocks,
                                            bx * by * bz if wider else known.threads, known.launches + 1)
    return launches


# Headers only the host code needs (and a build machine may lack): their includes stay out of the device unit.
_HOST_ONLY_HEADER = re.compile(r'^\s*#\s*include\s*(?:"|<(?:cudnn|cublas|curand|cusparse|cufft|nccl|mpi))')
# File-scope declarations device code may use: constants (GPU_WARP_SIZE), types, device and constant variables.
_DEVICE_VISIBLE = re.compile(r"^(?:template\s*<.*?>\s*)?(?:(?:static|inline|extern)\s+)*"
                             r"(?:typedef|using|const|constexpr|__device__|__constant__|struct|class|union|enum)\b",
                             re.DOTALL)
_TYPE_HEAD = re.compile(r"\b(?:struct|class|union|enum)\b[^()]*$")


def device_source(source: str, kernels: set[str]) -> str:
    """A translation unit of the project's device code, in the source's order: its preprocessor lines (macros and
    conditionals; not the library headers), every file-scope declaration device code can see (constants such as
    GPU_WARP_SIZE, typedefs, types, `__device__` variables), every `__device__` function and type (the helpers
    NNFusion writes for reductions, softmax and layer norm; the block functions), and the `__global__` kernels
    named. Host code stays out: it needs cuDNN's and cuBLAS's headers."""
    parts = ["#include <cstdint>", "#include <cuda_fp16.h>", "#include <mma.h>"]
    for piece in _top_level(source):
        if piece.kind == "directive":
            if not _HOST_ONLY_HEADER.match(piece.text):
                parts.append(piece.text)
        elif piece.kind == "statement":
            if _DEVICE_VISIBLE.match(piece.text):
                parts.append(piece.text)
        elif _keeps(piece.head, kernels):
            parts.append(f"{piece.head}{{{piece.body}}}{piece.tail}")
    return "\n".join(parts) + "\n"


def _keeps(head: str, kernels: set[str]) -> bool:
    """Whether a braced top-level item belongs to the device unit: device functions and variables, types (their
    members may be device code), and the kernels named."""
    if "__global__" in head:
        name = re.search(r"(\w+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*$", head)
        return name is not None and name.group(1) in kernels
    return "__device__" in head or "__constant__" in head or _TYPE_HEAD.search(head) is not None


class _Piece(NamedTuple):
    kind: str  # "directive" (a preprocessor line), "statement" (ends with ;) or "item" (braced)
    text: str = ""  # a directive's or statement's text
    head: str = ""  # an item's text before its brace
    body: str = ""  # between its braces
    tail: str = ""  # ";" when one closes it (a struct, an initialised variable)


def _top_level(source: str) -> list[_Piece]:
    """The file-scope pieces of a CUDA source in order, comments left out (a directive between a head's lines
    becomes a piece of its own, before it). Strings, characters and comments are skipped while braces are
    counted; preprocessor lines and comments inside bodies stay in the bodies."""
    pieces: list[_Piece] = []
    depth, start, opened, i, n = 0, 0, 0, 0, len(source)
    cuts: list[tuple[int, int]] = []  # comments and directives at file scope since `start`: not part of a text
    pending: _Piece | None = None  # an item whose closing ';' may follow

    def text(begin: int, end: int) -> str:
        kept, at = [], begin
        for cut_begin, cut_end in cuts:
            if cut_begin >= begin and cut_end <= end:
                kept.append(source[at:cut_begin])
                at = cut_end
        return "".join(kept) + source[at:end]

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            pieces.append(pending)
            pending = None

    while i < n:
        c = source[i]
        if source.startswith(("//", "/*"), i) or (c == "#" and not source[source.rfind("\n", 0, i) + 1:i].strip()):
            begin = i
            if source.startswith("/*", i):
                end = source.find("*/", i + 2)
                i = n if end < 0 else end + 2
            else:
                while i < n and source[i] != "\n":  # a line comment, or a preprocessor line (with continuations)
                    i += 2 if source.startswith("\\\n", i) else 1
            if depth == 0:
                cuts.append((begin, i))
                if c == "#":
                    flush()
                    pieces.append(_Piece("directive", source[begin:i]))
            continue
        if c in "\"'":
            i += 1
            while i < n and source[i] != c:
                i += 2 if source[i] == "\\" else 1
        elif c == ";" and depth == 0:
            statement = text(start, i).strip()
            if pending is not None and not statement:
                pieces.append(pending._replace(tail=";"))
                pending = None
            else:
                flush()
                if statement:
                    pieces.append(_Piece("statement", statement + ";"))
            start, cuts = i + 1, []
        elif c == "{":
            if depth == 0:
                flush()
                opened = i
            depth += 1
        elif c == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                pending = _Piece("item", head=text(start, opened).strip() + "\n", body=source[opened + 1:i])
                start, cuts = i + 1, []
        elif depth == 0 and pending is not None and not c.isspace():
            flush()  # no ';' closed the item: what follows is a piece of its own
        i += 1
    flush()
    return pieces


def _top_level_items(source: str) -> list[tuple[str, str]]:
    """(head, body) of each top-level braced item (the head is the statement before the brace)."""
    return [(p.head, p.body) for p in _top_level(source) if p.kind == "item"]


def check_launches(source: str, generated: Generated, arch: str, *, nvcc: str, workdir: Path,
                   flags: tuple[str, ...] = (), timeout_s: float = 600.0,
                   cache_dir: Path | None = None, also_compile: frozenset[str] = frozenset()) -> LaunchReport:
    """Check every launch's block: against its kernel's launch bounds, or, for a kernel without them, against the
    registers ptxas gives it (those kernels' device code compiled for `arch`). Never raises for code nvcc
    rejects: the report says why it could not check. With `cache_dir`, the registers of device code compiled
    before (same code, arch, flags and nvcc) are read from there instead of compiling again. `also_compile`: kernels
    compiled with those whatever their bounds (NNFusion's own: the check then says which one nvcc rejects)."""
    launches = kernel_launches(generated)
    kernels = {name: f for name in launches if (f := generated.functions.get(name)) is not None and f.kind == "global"}
    members = {step.function: step.members for step in generated.steps}  # a BlockFusion kernel's block functions
    report = LaunchReport(arch)
    unbounded = {name for name, f in kernels.items() if f.launch_bounds is None}
    compiled = unbounded | (also_compile & kernels.keys())
    registers: dict[str, int | None] = {}
    if compiled and not nvcc:
        report.error = (f"no nvcc to compile the {len(unbounded)} kernel(s) without launch bounds, whose registers "
                        f"decide how many threads they can launch with, and NNFusion's own {len(compiled - unbounded)}")
        return report
    if compiled:
        report.own_compiled = len(compiled - unbounded)
        unit, all_flags = device_source(source, compiled), ("--expt-relaxed-constexpr", *flags)
        cached = _cache_path(cache_dir, unit, arch, all_flags, nvcc) if cache_dir is not None else None
        if cached is not None and (known := _read_cache(cached, unbounded)) is not None:
            registers, report.cached = known, True
        else:
            result = compile_source(unit, arch, nvcc=nvcc, flags=all_flags, timeout_s=timeout_s, workdir=workdir)
            report.seconds = result.seconds
            if not result.ok:
                culprit = _function_at(unit, result.error_line) if result.error_line else ""
                whose = (f"NNFusion's own kernel {culprit} does not compile (no DB row: NNFusion's kernel emitter "
                         "wrote it)" if culprit in also_compile else f"the device code did not compile (in {culprit})"
                         if culprit else "the device code did not compile")
                report.error = f"{whose}: {result.error}"
                return report
            registers = {name: r.registers if (r := result.kernels.get(name)) else None for name in unbounded}
            if cached is not None:
                _write_cache(cached, registers)
    for name, function in kernels.items():
        widest = launches[name]
        report.kernels.append(LaunchedKernel(name, widest.blocks, widest.threads, registers.get(name),
                                             members.get(name, ()), function.launch_bounds, widest.launches))
    return report


_FUNCTION_HEAD = re.compile(r"(?:__global__|__device__)[^;{]*?\b(\w+)\s*\(")


def _function_at(unit: str, line: int) -> str:
    """The `__global__` or `__device__` function whose text holds 1-based `line` of the unit ('' when none does)."""
    head = "\n".join(unit.splitlines()[:line])
    found = list(_FUNCTION_HEAD.finditer(head))
    return found[-1].group(1) if found else ""


def _cache_path(cache_dir: Path, unit: str, arch: str, flags: tuple[str, ...], nvcc: str) -> Path | None:
    """Where the registers of this device code are kept: named by a hash of the code, the arch, the flags and the
    nvcc binary (its path, size and time: another toolkit gives other registers). None when nvcc is not there."""
    try:
        binary = Path(nvcc).resolve()
        stat = binary.stat()
    except OSError:
        return None
    digest = hashlib.sha256("\0".join([unit, arch, *flags, str(binary), str(stat.st_size), str(stat.st_mtime_ns)])
                            .encode("utf-8", "surrogatepass")).hexdigest()
    return cache_dir / f"{digest}.json"


def _read_cache(path: Path, kernels: set[str]) -> dict[str, int | None] | None:
    try:
        registers = json.loads(path.read_text(encoding="utf-8"))["registers"]
    except (OSError, ValueError, KeyError, TypeError):  # absent, or torn: compile again
        return None
    if not isinstance(registers, dict) or set(registers) != kernels:
        return None
    return {name: registers[name] if isinstance(registers[name], int) else None for name in kernels}


def _write_cache(path: Path, registers: dict[str, int | None]) -> None:
    """Written whole or not at all (a temporary file renamed), so a reader never sees half of it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(json.dumps({"registers": registers}), encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        pass  # a cache that cannot be written costs a compile next time, nothing else

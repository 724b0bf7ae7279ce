"""TVM's CUDA compile without libcu++: the same kernel, a fifth of the NVRTC time.

Every tuning candidate is one NVRTC compile. TVM 0.27 puts `<cuda/std/cstdint>`, `<cuda/std/type_traits>` and
`<cuda/std/limits>` in front of every kernel, only for the fixed-width integer names, a few `std::` aliases
for its templates, and INFINITY. Parsing those headers (type_traits above all) costs about 0.7 CPU s per
compile on this CPU, while the kernel itself, a 3x3 convolution, costs 0.1-0.5 s (bench/bench_nvrtc.py). The
convolution, pooling and matrix kernels we tune use none of libcu++, so the compile here gives NVRTC the
program without those headers, the integer names and INFINITY defined directly, and otherwise TVM's own
options. The kernel's PTX comes out the same, instruction for instruction (tests/test_nvrtc.py). A program
that uses `std::` itself is left as it is; if NVRTC rejects the lighter program, TVM's own compile runs
instead, so at worst a candidate costs what it did.

`install()` registers the compile as TVM's `tvm_callback_cuda_compile` in the process that compiles: the
build workers and the measuring runner's worker take it as their pool initializer. KDB_NVRTC_FULL=1 in the
environment compiles TVM's own program instead (the workers inherit it): the switch for a comparison.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LIBCUXX = re.compile(r"^\s*#\s*include\s*<cuda/std/[\w/.]+>\s*$")
USING_LIBCUXX = re.compile(r"^\s*using\s+(?:::)?cuda::std::\w+\s*;\s*$")
# TVM's NVRTC preamble defines INFINITY through libcu++ when nothing else has: dropped with it. Defined below
# by its bits (NVRTC has no __builtin_huge_valf; libcu++ bit-casts the same bits); in a constant expression
# that fails to compile, and TVM's own program is compiled instead.
INFINITY_FROM_LIBCUXX = re.compile(
    r"^\s*#\s*define\s+INFINITY\s+\(::cuda::std::numeric_limits<float>::infinity\(\)\)\s*$")
LIGHT_PREAMBLE = """typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY (__int_as_float(0x7f800000))
"""

# TVM writes inline PTX (ldmatrix, mma.sync) as GNU's `__asm__ __volatile__`, which nvcc takes and NVRTC does not
# ("identifier __asm__ is undefined"): every program NVRTC compiles gets the standard spellings.
ASM_KEYWORDS = "#define __asm__ asm\n#define __volatile__ volatile\n"
FULL_PROGRAM_ENV = "KDB_NVRTC_FULL"  # "1": compile TVM's own program, libcu++ and all (to compare, or to rule out)
_lock = threading.Lock()
fallbacks = 0  # compiles in this process that needed TVM's own program (bench_nvrtc reports it)


def light_source(program: str) -> str | None:
    """The NVRTC program without libcu++, or None when it uses libcu++ beyond what LIGHT_PREAMBLE gives."""
    kept: list[str] = []
    in_std = False
    for line in program.splitlines():
        stripped = line.strip()
        if in_std:  # TVM's `namespace std { using cuda::std::is_same; ... }` for its templates
            if stripped == "}":
                in_std = False
            elif not USING_LIBCUXX.match(line):
                return None
            continue
        if stripped == "namespace std {":
            in_std = True
            continue
        if LIBCUXX.match(line) or USING_LIBCUXX.match(line) or INFINITY_FROM_LIBCUXX.match(line):
            continue
        kept.append(line)
    body = "\n".join(kept)
    if re.search(r"\bstd::", body):
        return None  # the kernel (or a helper TVM added) needs libcu++ after all
    return LIGHT_PREAMBLE + body + "\n"


@contextmanager
def lighter_programs() -> Iterator[None]:
    """While it is open, the NVRTC programs TVM creates in this process are light_source's."""
    from cuda.bindings import nvrtc

    create = nvrtc.nvrtcCreateProgram

    def create_light(src: bytes, name: bytes, *rest: Any) -> Any:
        light = light_source(src.decode("utf-8", "surrogateescape"))
        return create(src if light is None else light.encode("utf-8", "surrogateescape"), name, *rest)

    with _lock:  # one compile at a time swaps the function (a build worker compiles one candidate anyway)
        nvrtc.nvrtcCreateProgram = create_light
        try:
            yield
        finally:
            nvrtc.nvrtcCreateProgram = create


def compile_cuda(code: str, *_: Any) -> bytes:
    """TVM's NVRTC compile to a cubin, on the light program first (TVM's `tvm_callback_cuda_compile`)."""
    from tvm.support import nvcc

    global fallbacks
    code = ASM_KEYWORDS + code if "__asm__" in code else code
    if os.environ.get(FULL_PROGRAM_ENV) == "1" or os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc").lower() != "nvrtc":
        return nvcc.tvm_callback_cuda_compile(code)
    try:
        with lighter_programs():
            return nvcc.compile_cuda(code, target_format="cubin", compiler="nvrtc")
    except (RuntimeError, ImportError):  # NVRTC rejected the light program (or is missing): TVM's own compile,
        fallbacks += 1  # which says what is wrong in its own words
    return nvcc.compile_cuda(code, target_format="cubin", compiler="nvrtc")


def install() -> None:
    """Make compile_cuda TVM's CUDA compile in this process (after TVM's own registration, which it replaces)."""
    import tvm.support.nvcc  # noqa: F401  (registers TVM's callback: ours must come after it)
    import tvm_ffi

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)

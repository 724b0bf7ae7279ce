"""TVM's CUDA compile without libcu++ (core/tuning/nvrtc.py): the same kernel for a fifth of the NVRTC time.

The kernels are the H200's own tuning candidates for ResNet-18 (session 10's records, bench/results), rebuilt
here by TVM on the CPU: for each, the light program must give NVRTC's PTX of the kernel unchanged."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from core.tuning.nvrtc import LIGHT_PREAMBLE, light_source

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_nvrtc import STATE, candidate_sources, kernel_ptx  # noqa: E402

TVM_PROGRAM = """#include <cuda/std/cstdint>
using cuda::std::uint8_t;
using cuda::std::int64_t;
#include <cuda/std/limits>
#ifndef INFINITY
#define INFINITY (::cuda::std::numeric_limits<float>::infinity())
#endif
#ifdef __CUDACC_RTC__
  #include <cuda/std/type_traits>
  namespace std {
    using cuda::std::is_same;
    using cuda::std::conditional;
  }
#endif
extern "C" __global__ void __launch_bounds__(64) main_kernel(float* __restrict__ out) {
  out[threadIdx.x] = -INFINITY;
}
"""


def test_the_light_program_drops_libcuxx_and_keeps_the_kernel():
    light = light_source(TVM_PROGRAM)
    assert light is not None and light.startswith(LIGHT_PREAMBLE)
    assert "cuda/std" not in light and "cuda::std" not in light and "namespace std" not in light
    assert "out[threadIdx.x] = -INFINITY;" in light and "#ifdef __CUDACC_RTC__" in light


@pytest.mark.parametrize("use", ["std::is_same<float, T>::value", "cuda::std::numeric_limits<float>::max()"])
def test_a_kernel_that_uses_libcuxx_itself_keeps_tvms_program(use: str):
    assert light_source(TVM_PROGRAM.replace("-INFINITY", use)) is None


def test_anything_but_aliases_in_tvms_std_namespace_keeps_tvms_program():
    assert light_source(TVM_PROGRAM.replace("using cuda::std::conditional;", "template <class T> struct X {};")) is None


# -- with NVRTC -------------------------------------------------------------------------------------


@pytest.fixture
def nvrtc(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    pytest.importorskip("tvm")
    try:
        from cuda.bindings import nvrtc as bindings

        bindings.nvrtcVersion()
    except Exception as exc:  # ImportError, or cuda-pathfinder finding no libnvrtc
        pytest.skip(f"needs NVRTC (cuda-bindings and nvidia-cuda-nvrtc, the tvm extra): {type(exc).__name__}: {exc}")
    # TVM looks for the CUDA headers at CUDA_PATH, else two levels above the nvcc on PATH (here a wrapper in
    # /usr/local/bin, so it must be told)
    home = os.environ.get("CUDA_PATH") or next((p for p in ("/usr/local/cuda",) if Path(p, "include").is_dir()), "")
    if not home:
        pytest.skip(f"needs the CUDA headers (CUDA_PATH, or /usr/local/cuda); nvcc on PATH: {shutil.which('nvcc')}")
    monkeypatch.setenv("CUDA_PATH", home)
    from tvm.support import nvcc as tvm_nvcc

    return tvm_nvcc


@pytest.mark.slow
@pytest.mark.tvm
def test_every_kind_of_tuned_kernel_compiles_to_the_same_ptx_without_libcuxx(nvrtc, tmp_path: Path):  # type: ignore[no-untyped-def]
    from core.tuning.nvrtc import lighter_programs

    sources = candidate_sources(STATE, tmp_path, per_op=1)  # one candidate of each of ResNet-18's 18 ops
    sources["infinity"] = ('extern "C" __global__ void __launch_bounds__(32) main_kernel(float* out, float* in) '
                           '{ out[threadIdx.x] = fmaxf(-INFINITY, in[threadIdx.x]) + (in[0] < INFINITY); }\n')
    assert {name.rsplit("-", 1)[0] for name in sources} == {
        "convolution", "fused_convolution_add_relu", "maxpool", "avgpool", "dot", "infinity"}
    for name, code in sources.items():
        full = nvrtc.compile_cuda(code, target_format="ptx", arch="sm_90", compiler="nvrtc")
        with lighter_programs():
            light = nvrtc.compile_cuda(code, target_format="ptx", arch="sm_90", compiler="nvrtc")
        assert kernel_ptx(light) == kernel_ptx(full), name
        assert ".version" in bytes(full).decode() and "cuda::std" not in kernel_ptx(light)


@pytest.mark.tvm
def test_the_installed_callback_compiles_and_falls_back_to_tvms_program(nvrtc):  # type: ignore[no-untyped-def]
    import tvm

    from core.tuning import nvrtc as light

    light.install()
    compile_ = tvm.get_global_func("tvm_callback_cuda_compile")
    kernel = 'extern "C" __global__ void __launch_bounds__(32) main_kernel(float* out) { out[threadIdx.x] = %s; }\n'
    before = light.fallbacks
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90"}):  # the arch: the loading GPU's, or the target's
        cubin = bytes(compile_(kernel % "-INFINITY"))
        assert cubin[:4] == b"\x7fELF" and light.fallbacks == before
        # uint_least32_t comes from <cuda/std/cstdint> only: the light program fails, TVM's own compiles it
        cubin = bytes(compile_(kernel % "(float)(uint_least32_t)7"))
        assert cubin[:4] == b"\x7fELF" and light.fallbacks == before + 1
    assert re.search(r"\bstd::", json.dumps(LIGHT_PREAMBLE)) is None


@pytest.mark.tvm
def test_kdb_nvrtc_full_compiles_tvms_own_program(nvrtc, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    import tvm

    from core.tuning import nvrtc as light

    light.install()
    monkeypatch.setenv(light.FULL_PROGRAM_ENV, "1")
    before = light.fallbacks
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90"}):
        cubin = bytes(tvm.get_global_func("tvm_callback_cuda_compile")(
            'extern "C" __global__ void main_kernel(float* out) { out[threadIdx.x] = (float)(uint_least32_t)7; }\n'))
    assert cubin[:4] == b"\x7fELF" and light.fallbacks == before, "the light program was not even tried"

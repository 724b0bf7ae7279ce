"""The launch check: a BlockFusion kernel whose registers cannot hold its launch's block is found on the CPU.

NNFusion launches a BlockFusion kernel with the group's largest block and no __launch_bounds__; on the H200
(2026-12-04) such a kernel at 150 registers was launched with 448 threads, did not run, and ResNet-18 came out
90% wrong without an error. bench/results/h200/session9 holds that generated project.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from core.cuda.nvcc import find_nvcc
from core.errors import ToolError
from core.nnfusion.generated import parse_generated
from core.nnfusion.launch_check import (
    _top_level_items,
    check_launches,
    device_source,
    kernel_launches,
    max_threads_per_block,
)

REPO = Path(__file__).resolve().parents[1]
SESSION9 = REPO / "bench" / "results" / "h200" / "session9" / "7-network-results.tgz"
SESSION10 = REPO / "bench" / "results" / "h200" / "session10" / "4-network-results.tgz"
BROKEN_PROJECT = "net/nnfusion-tuned-best/nnfusion_rt/cuda_codegen/nnfusion_rt.cu"


def nvcc_or_skip() -> str:
    try:
        return find_nvcc("")
    except ToolError as exc:
        pytest.skip(f"the launch check compiles with nvcc: {exc}")


@pytest.mark.parametrize(("registers", "threads"), [(150, 384), (185, 256), (128, 512), (16, 1024), (72, 896),
                                                    (255, 256), (97, 512)])
def test_max_threads_per_block_is_what_the_h200_reported(registers: int, threads: int):
    """maxThreadsPerBlock that cudaFuncGetAttributes gave on the H200 for kernels without launch bounds
    (150, 185 and 128 registers; the rest follow the same rule: 256 registers per warp, 4 warps at a time)."""
    assert max_threads_per_block(registers, "sm_90") == threads


def test_small_register_files_allow_half_the_threads():
    assert max_threads_per_block(64, "sm_62") == 512
    assert max_threads_per_block(64, "sm_80") == 1024


def program(threads: int, helper_after_kernels: bool = False) -> str:
    """An nnfusion_rt.cu in NNFusion's layout: library and project headers, host macros with braces, a helper,
    a register-hungry block function fused with a small one, and kernel_entry launching the fusion."""
    helper = "__device__ __forceinline__ float twice(float x) { return x + x; }\n"
    return f"""#include <cuda.h>
#include <cudnn.h>
#include <cublas_v2.h>
#include "nnfusion_rt.h"
#define CUDA_SAFE_CALL(x) do {{ cudaError_t r = (x); if (r != cudaSuccess) {{ throw 1; }} }} while (0)
{"" if helper_after_kernels else helper}
cudnnHandle_t cudnn_handle_0;  // host state the device code must not see: {{ unbalanced in a comment
__device__ __noinline__ void Hungry_block_kernel(float* input0, float* output0, int thread_id, int block_id, char *shared_buffer)
{{
    if (thread_id >= 64) {{ return; }}
    float acc[96];
    #pragma unroll
    for (int i = 0; i < 96; ++i) acc[i] = input0[block_id * 6144 + i * 64 + thread_id];
    #pragma unroll
    for (int k = 0; k < 8; ++k) {{
        #pragma unroll
        for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + k + 1) % 96] + twice(acc[(i * 7 + k) % 96]);
    }}
    #pragma unroll
    for (int i = 0; i < 96; ++i) output0[block_id * 6144 + i * 64 + thread_id] = acc[i];
}}
__device__ __noinline__ void Small_block_kernel(float* input0, float* output0, int thread_id, int block_id, char *shared_buffer)
{{
    if (thread_id >= {threads}) {{ return; }}
    output0[block_id * {threads} + thread_id] = input0[block_id * {threads} + thread_id] * 2.0f;
}}
{helper if helper_after_kernels else ""}
extern "C" __global__  void BlockFusionKernel_float_float_cuda_Hungry_Small_0(float* input0, float* output0, float* output1)
{{
    __shared__ char shared_buffer[16];
    if ((int)blockIdx.x <= 9) {{ Hungry_block_kernel(input0, output0, threadIdx.x, blockIdx.x, shared_buffer); }}
    else {{ Small_block_kernel(input0, output1, threadIdx.x, blockIdx.x - 10, shared_buffer); }}
}}
extern void BlockFusionKernel_float_float_cuda_Hungry_Small_0_Call(const dim3 &grids, const dim3 &blocks, unsigned mem, cudaStream_t stream, float* input0, float* output0, float* output1) {{
    BlockFusionKernel_float_float_cuda_Hungry_Small_0<<<grids, blocks, mem, stream>>>(input0, output0, output1);
}}
extern "C" int kernel_entry(float* input0, float* output0, float* output1)
{{
 // name=blockfusion_kernel_7
BlockFusionKernel_float_float_cuda_Hungry_Small_0_Call(dim3(20, 1, 1), dim3({threads}, 1, 1), 0, 0, input0, output0, output1);
    printf("{{ not a block }}\\n");
    return 0;
}}
"""


def test_a_fusion_launched_with_more_threads_than_its_registers_allow_is_found(tmp_path: Path):
    nvcc = nvcc_or_skip()
    source = program(1024)
    report = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path)
    assert not report.error, report.error
    (launch,) = report.kernels
    assert launch.kernel == "BlockFusionKernel_float_float_cuda_Hungry_Small_0"
    assert (launch.blocks, launch.threads) == (20, 1024)
    assert launch.members == ("Hungry_block_kernel", "Small_block_kernel")
    assert launch.registers is not None and launch.registers > 64, "the hungry member must need more than 64"
    assert report.failing() == [launch]
    (reason,) = report.reasons()
    assert f"{launch.registers} registers per thread allow {max_threads_per_block(launch.registers, 'sm_90')}" \
        in reason and "launches it with 1024" in reason


def test_the_same_fusion_at_a_block_its_registers_hold_passes(tmp_path: Path):
    nvcc = nvcc_or_skip()
    source = program(64)
    report = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path)
    assert not report.error and len(report.kernels) == 1 and report.failing() == []


def test_device_code_that_does_not_compile_is_reported_not_raised(tmp_path: Path):
    nvcc = nvcc_or_skip()
    source = program(64).replace("twice(acc", "undefined_helper(acc")
    report = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path)
    assert report.error.startswith("the device code did not compile") and "undefined_helper" in report.error
    assert report.failing() == []


def test_device_source_keeps_device_code_and_leaves_host_code_out():
    source = program(64, helper_after_kernels=True)
    unit = device_source(source, {"BlockFusionKernel_float_float_cuda_Hungry_Small_0"})
    for kept in ("Hungry_block_kernel(", "Small_block_kernel(", "float twice(float x)",
                 "BlockFusionKernel_float_float_cuda_Hungry_Small_0("):
        assert kept in unit, kept
    for left_out in ("cudnn", "cublas", "nnfusion_rt.h", "kernel_entry", "_Call(", "printf"):
        assert left_out not in unit, left_out
    assert "#pragma unroll" in unit, "preprocessor lines inside bodies stay"
    assert "#define CUDA_SAFE_CALL" in unit, "file-scope macros stay (device code may use them); host code's calls go"


FILE_SCOPE_HELPERS = """#include <cuda.h>
#include <cudnn.h>
#include "nnfusion_rt.h"
// Check compute capability
const int GPU_WARP_SIZE = 32;
static const float kScale = 0.5f;
typedef float acc_float;
#define SQUARE(x) ((x) * (x))
__device__ int launched_blocks;
__constant__ float bias_table[4] = {1.0f, 2.0f, 3.0f, 4.0f};
cudnnHandle_t cudnn_handle_0;
template <typename T>
__device__ __forceinline__ T WARP_SHFL_XOR(T value, int laneMask, int width = GPU_WARP_SIZE, unsigned int mask = 0xffffffff)
{
#if CUDA_VERSION >= 9000
    return __shfl_xor_sync(mask, value, laneMask, width);
#else
    return __shfl_xor(value, laneMask, width);
#endif
}
template <typename T>
struct Add {
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
inline int log2_ceil(int value) { int n = 0; while ((1 << n) < value) ++n; return n; }
__device__ __noinline__ void Reduce_block_kernel(float* input0, float* output0, int thread_id, int block_id, char *shared_buffer)
{
    acc_float sum = SQUARE(input0[block_id * GPU_WARP_SIZE + thread_id]) * kScale + bias_table[thread_id % 4];
    for (int offset = GPU_WARP_SIZE / 2; offset > 0; offset /= 2) sum = Add<float>()(sum, WARP_SHFL_XOR(sum, offset));
    if (thread_id == 0) { output0[block_id] = sum; atomicAdd(&launched_blocks, 1); }
}
extern "C" __global__  void BlockFusionKernel_float_float_cuda_Reduce_0(float* input0, float* output0)
{
    __shared__ char shared_buffer[16];
    Reduce_block_kernel(input0, output0, threadIdx.x, blockIdx.x, shared_buffer);
}
extern void BlockFusionKernel_float_float_cuda_Reduce_0_Call(const dim3 &grids, const dim3 &blocks, unsigned mem, cudaStream_t stream, float* input0, float* output0) {
    BlockFusionKernel_float_float_cuda_Reduce_0<<<grids, blocks, mem, stream>>>(input0, output0);
}
extern "C" int kernel_entry(float* input0, float* output0)
{
 // name=blockfusion_kernel_3
BlockFusionKernel_float_float_cuda_Reduce_0_Call(dim3(8, 1, 1), dim3(32, 1, 1), 0, 0, input0, output0);
 // name=blockfusion_kernel_4
BlockFusionKernel_float_float_cuda_Reduce_0_Call(dim3(8, 1, 1), dim3(32, 1, 1), 0, 0, output0, input0);
    return 0;
}
"""


def test_file_scope_helpers_that_device_code_uses_are_kept(tmp_path: Path):
    """What NNFusion writes at file scope for its reductions, softmax and layer norm (BERT's project: a constant
    GPU_WARP_SIZE used as a default argument of a template __device__ helper), plus the other file-scope things
    device code may use: a typedef, a macro, a __device__ and a __constant__ variable, a type with __device__
    members. The unit compiles; host state (the cuDNN handle, a host helper) stays out."""
    nvcc = nvcc_or_skip()
    unit = device_source(FILE_SCOPE_HELPERS, {"BlockFusionKernel_float_float_cuda_Reduce_0"})
    for kept in ("const int GPU_WARP_SIZE = 32;", "static const float kScale", "typedef float acc_float;",
                 "#define SQUARE", "__device__ int launched_blocks;", "__constant__ float bias_table[4] =",
                 "struct Add", "#if CUDA_VERSION >= 9000"):
        assert kept in unit, kept
    assert "cudnn" not in unit and "log2_ceil" not in unit and "kernel_entry" not in unit
    report = check_launches(FILE_SCOPE_HELPERS, parse_generated(FILE_SCOPE_HELPERS), "sm_90", nvcc=nvcc,
                            workdir=tmp_path)
    assert not report.error, report.error
    (kernel,) = report.kernels
    assert kernel.registers is not None and kernel.fits("sm_90")
    assert (kernel.launches, report.launch_count, len(report.kernels)) == (2, 2, 1)
    assert report.summary().startswith("all 2 kernel launches (1 distinct kernel) fit")


def test_top_level_items_skip_braces_in_strings_comments_and_macros():
    items = _top_level_items('#define M do { } while (0)\n// {\nint f() { return "}"[0] + \'{\'; /* } */ }\n'
                             'struct S { int a; };\nvoid g()\n{\n}\n')
    assert [head.strip() for head, _ in items] == ["int f()", "struct S", "void g()"]


def test_kernel_launches_reads_grid_and_block_and_keeps_the_widest_launch():
    generated = parse_generated(program(448))
    assert kernel_launches(generated) == {"BlockFusionKernel_float_float_cuda_Hungry_Small_0": (20, 448, 1)}
    call = "BlockFusionKernel_float_float_cuda_Hungry_Small_0_Call(dim3(20, 1, 1), dim3(448, 1, 1)"
    twice = program(448).replace(call, call.replace("(20, 1, 1), dim3(448", "(7, 1, 1), dim3(64") + ", 0, 0, input0, "
                                 "output0, output1);\n" + call, 1)
    assert kernel_launches(parse_generated(twice)) == {"BlockFusionKernel_float_float_cuda_Hungry_Small_0": (20, 448, 2)}
    eliminated = program(448).replace(call, "// eliminated: " + call.replace("dim3(448", "dim3(1024") + ", 0, 0, "
                                      "input0, output0, output1);\n" + call, 1)  # NNFusion removed it: never runs
    assert kernel_launches(parse_generated(eliminated)) == {"BlockFusionKernel_float_float_cuda_Hungry_Small_0":
                                                            (20, 448, 1)}


def test_the_project_that_computed_wrong_numbers_on_the_h200_is_caught(tmp_path: Path):
    """ResNet-18 compiled by NNFusion with session 9's tuned rows: max rel err 0.90 with BlockFusion, 8.3e-7
    without; cudaFuncGetAttributes on the H200 gave the fused kernel 150 registers and 384 threads at most."""
    nvcc = nvcc_or_skip()
    with tarfile.open(SESSION9) as tar:
        member = tar.extractfile(BROKEN_PROJECT)
        assert member is not None
        source = member.read().decode()
    report = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path)
    assert not report.error, report.error
    assert len(report.kernels) == 19
    (failing,) = report.failing()
    assert failing.kernel == "BlockFusionKernel_float_float_float_float_float_float_cuda_Matched_Pattern_Convolution_1"
    assert (failing.threads, failing.max_threads("sm_90")) == (448, 384)
    assert failing.members == ("Matched_Pattern_float_float_float_float_cuda_Matched_Pattern_138_block_kernel",
                               "Convolution_float_float_float_cuda_Convolution_73_block_kernel")


def bounded_program(bounds: int, threads: int) -> str:
    """A kernel with launch bounds (as every kdb row and NNFusion's own kernels have them) whose body nvcc would
    reject: the check must hold it to its bounds without compiling it."""
    return f"""#include "nnfusion_rt.h"
extern "C" __launch_bounds__({bounds}) __global__ void Convolution_float_float_cuda_Convolution_3(float* input0, float* output0)
{{
    output0[threadIdx.x] = undefined_helper(input0[threadIdx.x]);
}}
extern void Convolution_float_float_cuda_Convolution_3_Call(const dim3 &grids, const dim3 &blocks, unsigned mem, cudaStream_t stream, float* input0, float* output0) {{
    Convolution_float_float_cuda_Convolution_3<<<grids, blocks, mem, stream>>>(input0, output0);
}}
extern "C" int kernel_entry(float* input0, float* output0)
{{
 // name=Convolution_3
Convolution_float_float_cuda_Convolution_3_Call(dim3(8, 1, 1), dim3({threads}, 1, 1), 0, 0, input0, output0);
    return 0;
}}
"""


def test_a_kernel_with_launch_bounds_is_held_to_them_without_compiling_it(tmp_path: Path):
    """ptxas keeps a bounded kernel's registers to fit its bounds, so only the bounds can be broken; compiling it
    (what made the check cost ten times NNFusion's compile on the H200's tuned ResNet-18) would tell nothing."""
    source = bounded_program(64, 64)
    report = check_launches(source, parse_generated(source), "sm_90", nvcc="/nonexistent/nvcc", workdir=tmp_path)
    (launch,) = report.kernels
    assert (report.error, report.seconds, report.compiled) == ("", 0.0, 0)
    assert (launch.bounds, launch.registers, launch.max_threads("sm_90"), launch.fits("sm_90")) == (64, None, 64, True)
    source = bounded_program(64, 128)
    report = check_launches(source, parse_generated(source), "sm_90", nvcc="/nonexistent/nvcc", workdir=tmp_path)
    assert report.reasons() == ["Convolution_float_float_cuda_Convolution_3 cannot launch on sm_90: its "
                                "__launch_bounds__ allow 64 threads per block, and kernel_entry launches it with 128"]
    assert report.as_dict()["kernels"][0]["launch_bounds"] == 64  # type: ignore[index]


def test_the_tuned_resnet18_that_ran_right_on_the_h200_compiles_only_its_blockfusion_kernels(tmp_path: Path):
    """Session 10's tuned ResNet-18 (BlockFusion on, max rel err 6.6e-07 on the H200): 19 launches, of which the
    four BlockFusion kernels have no launch bounds and are the only ones compiled; every launch fits."""
    nvcc = nvcc_or_skip()
    with tarfile.open(SESSION10) as tar:
        member = tar.extractfile(BROKEN_PROJECT)  # the same path in the archive; this one ran right
        assert member is not None
        source = member.read().decode()
    report = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path)
    assert not report.error, report.error
    assert len(report.kernels) == 19 and report.failing() == []
    fused = [launch for launch in report.kernels if launch.bounds is None]
    assert report.compiled == 4 and all(launch.kernel.startswith("BlockFusionKernel") for launch in fused)
    assert all(launch.registers for launch in fused)
    assert all(launch.threads <= launch.bounds for launch in report.kernels if launch.bounds is not None)


def test_the_registers_of_device_code_compiled_before_come_from_the_cache(tmp_path: Path):
    """`kdb nnfusion` run again on the same DB and model compiles the same device code: the second check reads
    the registers it kept (no nvcc at all), and other device code is compiled, not taken from the cache."""
    nvcc = nvcc_or_skip()
    cache = tmp_path / "cache"
    source = program(1024)
    first = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path, cache_dir=cache)
    assert not first.error and not first.cached and len(list(cache.glob("*.json"))) == 1
    again = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path, cache_dir=cache)
    assert again.cached and again.seconds == 0.0 and again.kernels == first.kernels
    assert again.failing() == first.failing() != []  # the 1,024-thread fusion is still caught
    other = program(64)
    miss = check_launches(other, parse_generated(other), "sm_90", nvcc=nvcc, workdir=tmp_path, cache_dir=cache)
    assert not miss.cached and miss.seconds > 0 and len(list(cache.glob("*.json"))) == 2
    # a torn cache file is compiled again, not trusted
    for path in cache.glob("*.json"):
        path.write_text('{"registers": {', encoding="utf-8")
    torn = check_launches(source, parse_generated(source), "sm_90", nvcc=nvcc, workdir=tmp_path, cache_dir=cache)
    assert not torn.cached and torn.kernels == first.kernels

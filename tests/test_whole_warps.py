"""A partial last warp is padded in the schedule (core/codegen/whole_warps.py), not in the row's text.

The records are real: ResNet-18's Conv+Add+Relu 256x14² -> 512, stride 2, as the H200 tuned it in session 12
(bench/results/h200/session12/7-state.tgz). Its best record runs 49 threads with shared memory; the row the
text padding made of it ran 3x the record on the H200. Padded in the schedule, TVM guards each store with
`threadIdx.x < 49` and keeps every barrier outside the guards, where all 64 threads reach it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import session12_job
from test_kernel_row import NVCC

from core.codegen.schedule import launch_dims
from core.codegen.whole_warps import _CannotPad, pad_threads, partial_warp_threads, whole_warp_module
from core.cuda.source import mask
from core.cuda.warps import NON_ALIGNED_BARRIER, unpad_body
from core.opconfigs.opconfig import parse_line
from core.tuning.harvest import scored_records
from core.tuning.job import TuneJob

CONV = "cudnn_convolution_op_float|i+1_256_14_14|w+512_256_3_3|o+1_512_7_7|ws+2_2|wd+1_1|p+1_1|fuse+add_relu"
AVGPOOL = "cudnn_avgpool_op_float|i+1_512_7_7|o+1_512_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0"
GUARD = re.compile(r"if \(\(\(int\)threadIdx\.x\) < 49\) \{")

pytestmark = [pytest.mark.tvm]


@pytest.fixture(scope="module")
def conv(tmp_path_factory: pytest.TempPathFactory) -> tuple[TuneJob, Any]:
    """The conv's job and its best record's scheduled module (49 threads, shared memory)."""
    job = session12_job(CONV, tmp_path_factory.mktemp("conv"))
    best = min(scored_records(job, job.work_dir), key=lambda s: s[0])
    return job, best[2]


def cuda_source(mod: Any) -> str:
    import tvm

    from core.codegen.generate import cuda_target

    return tvm.compile(mod, target=cuda_target("sm_90")).mod.imports[0].inspect_source()


def barriers_inside_guards(source: str) -> int:
    """How many `__syncthreads()` sit inside an `if (threadIdx.x < 49) {` block (brace depth, comments masked)."""
    text, inside, stack = mask(source), 0, []
    for token in re.finditer(r"\{|\}|__syncthreads\s*\(\s*\)", text):
        if token.group() == "{":
            stack.append(GUARD.search(text[max(0, token.start() - 40):token.end()]) is not None)
        elif token.group() == "}":
            stack.pop()
        else:
            inside += any(stack)
    return inside


def test_the_best_record_is_padded_to_two_whole_warps_with_each_store_guarded(conv: tuple[TuneJob, Any]):
    _job, scheduled = conv
    assert launch_dims(scheduled)[1] == (49, 1, 1)
    assert partial_warp_threads(scheduled) == 49
    padded = whole_warp_module(scheduled)
    assert launch_dims(padded)[1] == (64, 1, 1)
    assert launch_dims(padded)[0] == launch_dims(scheduled)[0]  # the same grid: the same work per block
    plain, source = cuda_source(scheduled), cuda_source(padded)
    assert "__launch_bounds__(64)" in source
    # TVM inserted the same barriers, and none of them inside a guard: all 64 threads reach each one
    assert source.count("__syncthreads()") == plain.count("__syncthreads()") == 2
    assert len(GUARD.findall(source)) > 0
    assert barriers_inside_guards(source) == 0
    assert NON_ALIGNED_BARRIER not in source


def test_the_guard_scanner_finds_a_barrier_inside_a_guard():
    source = "for (;;) {\n  if (((int)threadIdx.x) < 49) {\n    a[0] = 1;\n    __syncthreads();\n  }\n  __syncthreads();\n}\n"
    assert barriers_inside_guards(source) == 1


def test_generated_kernel_and_row_are_whole_warps_without_text_padding(conv: tuple[TuneJob, Any]):
    from core.codegen.generate import generate
    from core.inject.prepare import prepare

    job, scheduled = conv
    generated = generate(job.config, job.arch, scheduled=scheduled, check=False)
    assert generated.error == "", generated.error
    item = generated.item
    assert item["blockDim"] == [64, 1, 1]
    prepared = prepare("whole-warps.json", 0, item)
    assert prepared.row is not None, prepared.failure
    import json

    function = json.loads(prepared.row.function)
    assert function["block_dim"] == [64, 1, 1] and function["num_syncthreads"] > 0
    body = function["block_function_body"]
    assert unpad_body(body) is None  # no guard of the text padding
    assert NON_ALIGNED_BARRIER not in body and "__syncthreads()" in body


@pytest.mark.skipif(not NVCC, reason="nvcc not found: the row's PTX is read")
def test_the_rows_ptx_has_only_aligned_barriers(conv: tuple[TuneJob, Any], tmp_path: Path):
    import json
    import subprocess

    from core.codegen.generate import generate
    from core.cuda.nvcc import standalone_source
    from core.inject.prepare import prepare

    job, scheduled = conv
    row = prepare("whole-warps.json", 0, generate(job.config, job.arch, scheduled=scheduled, check=False).item).row
    (tmp_path / "k.cu").write_text(standalone_source(json.loads(row.function)))
    subprocess.run([NVCC, "-arch=sm_90", "-ptx", "-O3", "-w", "-o", str(tmp_path / "k.ptx"), str(tmp_path / "k.cu")],
                   check=True, capture_output=True, timeout=300)
    ptx = (tmp_path / "k.ptx").read_text()
    assert re.findall(r"\bbarrier\.sync\s", ptx) == []  # no non-aligned barrier
    assert len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\.aligned\b", ptx)) >= 2


def test_the_tuners_build_times_the_padded_form(conv: tuple[TuneJob, Any]):
    import tvm

    from core.codegen.generate import cuda_target
    from core.tuning.pipeline import build_candidate

    _job, scheduled = conv
    built = build_candidate(scheduled, tvm.target.Target(cuda_target("sm_90")), None)
    assert "__launch_bounds__(64)" in built.imports[0].inspect_source()


def test_a_module_it_cannot_pad_safely_is_left_as_it_is(conv: tuple[TuneJob, Any], tmp_path: Path):
    _job, scheduled = conv
    with pytest.raises(_CannotPad, match=r"threadIdx\.x loop of 49 iterations, not 48"):
        pad_threads(scheduled, 48)
    # A reduction across threads (the AvgPool's 16 threads sum a window together): its lowering counts threads
    # on its own, so it is never padded; it has no shared memory in TIR, so no padding is due either.
    pool = session12_job(AVGPOOL, tmp_path)
    reducing = min(scored_records(pool, pool.work_dir), key=lambda s: s[0])[2]
    threads = launch_dims(reducing)[1][0]
    assert threads % 32 != 0
    assert partial_warp_threads(reducing) is None
    assert whole_warp_module(reducing) is reducing
    with pytest.raises(_CannotPad, match="reduces across threads"):
        pad_threads(reducing, threads)


def test_whole_warp_blocks_and_blocks_without_shared_memory_need_no_padding():
    from core.codegen.generate import prim_func_module
    from core.codegen.schedule import default_schedule

    mod, _ = prim_func_module(parse_line(CONV))
    scheduled = default_schedule(mod)  # 128 threads, one output each, no shared memory
    assert partial_warp_threads(scheduled) is None
    assert whole_warp_module(scheduled) is scheduled
    odd = default_schedule(mod, threads=49)  # a partial warp, but no barrier to split
    assert launch_dims(odd)[1] == (49, 1, 1)
    assert partial_warp_threads(odd) is None


def _gpu() -> tuple[bool, str]:
    from core.gpu.jobs import gpu_available

    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu()[0], reason=f"needs a CUDA GPU and pycuda: {_gpu()[1]}")
def test_the_whole_warp_row_computes_the_op_on_the_gpu(conv: tuple[TuneJob, Any]):
    """The padding threads compute and store nothing: the row matches the op's reference on the GPU."""
    from core.codegen.generate import generate
    from core.gpu.jobs import GpuSession, job_for_row
    from core.inject.prepare import prepare

    job, scheduled = conv
    row = prepare("whole-warps.json", 0, generate(job.config, job.arch, scheduled=scheduled, check=False).item).row
    with GpuSession(timeout_s=120) as session:
        verified = session.run(job_for_row(row, "verify"))
    assert verified.ok, verified.reason


def test_scored_records_count_the_threads_the_row_launches(conv: tuple[TuneJob, Any]):
    """Runner-ups pick "another block size" first: the size the padded row launches (64), not TVM's 49."""
    job, _scheduled = conv
    scored = scored_records(job, job.work_dir)
    assert scored and all(threads % 32 == 0 for _s, _r, _m, threads in scored), [s[3] for s in scored]

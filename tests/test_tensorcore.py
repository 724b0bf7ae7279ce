"""Tensor-core rows (issue 38) on the CPU: fp16 Dots and convolutions generate mma.sync kernels by default, every
tiling of their design space builds into a row that lints clean and that nvcc compiles, the ops the tensor cores do
not take say why, and the lint rules catch what breaks such a row. Their numbers are checked on a GPU
(bench/bench_tensorcore.py rows; tests/test_gpu.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tvm")

from core.codegen import tensorcore
from core.codegen.generate import generate, on_tensor_cores
from core.cuda.nvcc import find_nvcc
from core.kernels.lint import lane_indexed_fragments, lint_row
from core.opconfigs.opconfig import parse_line

BERT = [f"cublas_dot_op_half|a+1_128_{k}|b+{k}_{n}|o+1_128_{n}|ta+0|tb+0" for k, n in
        ((768, 768), (768, 3072), (3072, 768))]
RESNET50 = [  # the stem (K = 147, padded), a strided 3x3 with Relu, a 1x1 with the residual, a strided 1x1, 7x7 maps
    "cudnn_convolution_op_half|i+1_3_224_224|w+64_3_7_7|o+1_64_112_112|ws+2_2|wd+1_1|p+3_3|fuse+relu",
    "cudnn_convolution_op_half|i+1_256_28_28|w+256_256_3_3|o+1_256_14_14|ws+2_2|wd+1_1|p+1_1|fuse+relu",
    "cudnn_convolution_op_half|i+1_256_14_14|w+1024_256_1_1|o+1_1024_14_14|ws+1_1|wd+1_1|p+0_0|fuse+add_relu",
    "cudnn_convolution_op_half|i+1_1024_14_14|w+2048_1024_1_1|o+1_2048_7_7|ws+2_2|wd+1_1|p+0_0",
    "cudnn_convolution_op_half|i+1_512_7_7|w+512_512_3_3|o+1_512_7_7|ws+1_1|wd+1_1|p+1_1|fuse+relu",
]
ODD = [  # transposed operands, a padded M (ViT's 197 tokens), a batch of 2 with dilation
    "cublas_dot_op_half|a+64_512|b+1000_512|o+64_1000|ta+0|tb+1",
    "cublas_dot_op_half|a+512_48|b+200_512|o+48_200|ta+1|tb+1",
    "cublas_dot_op_half|a+1_197_768|b+768_768|o+1_197_768|ta+0|tb+0",
    "cudnn_convolution_op_half|i+2_32_20_20|w+48_32_3_3|o+2_48_10_10|ws+2_2|wd+2_2|p+2_2",
]
ATTENTION = [  # BatchMatMuls: BERT's Q.K^T and P.V (12 heads), a ViT's with 197 tokens (padded), two batch axes
    "cublas_batch_matmul_op_half|a+1_12_128_64|b+1_12_64_128|o+1_12_128_128",
    "cublas_batch_matmul_op_half|a+1_12_128_128|b+1_12_128_64|o+1_12_128_64",
    "cublas_batch_matmul_op_half|a+6_197_197|b+6_197_64|o+6_197_64",
    "cublas_batch_matmul_op_half|a+2_3_40_24|b+2_3_24_36|o+2_3_40_36",
]


def rows_of(items: list[dict], db_path: Path, *, compile: bool) -> tuple[list, object]:  # type: ignore[type-arg]
    from core.db.kernel_db import KernelDB
    from core.inject.pipeline import InjectOptions, Injector

    kernels = db_path.with_suffix(".json")
    kernels.write_text(json.dumps(items), encoding="utf-8")
    with KernelDB.open(db_path, create=True) as db:
        report = Injector(db, InjectOptions(compile=compile, archs=("sm_90",)), state=None).run([kernels])
        return [r for r in db.iter_rows() if r.device_type == "CUDA_GPU"], report


def assert_tensor_core_row(code: str) -> None:
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in code and "ldmatrix.sync.aligned" in code
    assert "extern __shared__" not in code and "nvcuda" not in code and "#include" not in code
    assert not lane_indexed_fragments(code), "fragments indexed by the lane: a warp buffer was not lowered"


@pytest.mark.parametrize("line", BERT + RESNET50 + ODD + ATTENTION)
def test_fp16_dots_and_convolutions_generate_tensor_core_kernels_by_default(line: str):
    config = parse_line(line)
    assert on_tensor_cores(config)
    generated = generate(config, "sm_90")
    assert generated.item is not None, generated.error
    assert generated.notes == ["tensor cores (mma.sync, fp32 accumulation)"]
    assert generated.max_rel_error is not None and generated.max_rel_error < 2e-3  # the padded GEMM's own math
    assert_tensor_core_row(generated.item["code"])
    assert generated.item["dtype"] == "half" and generated.item["blockDim"][0] == 32


def test_a_half_tensor_core_op_is_checked_on_the_cpu_as_its_fp32_definition_and_a_wrong_one_is_caught(
        monkeypatch: pytest.MonkeyPatch):
    """Issue 39 #9: LLVM emulates half on the CPU, so the check of a half GEMM made an fp16 VGG's codegen 12x slower
    than fp32's. The check runs the same padded GEMM in fp32 (its index math is what can be wrong); a definition
    that reads the wrong patch is still caught."""
    from dataclasses import replace

    config = parse_line(ODD[3])  # dilated, strided, batch 2: every index of the patches matters
    generated = generate(config, "sm_90")
    assert generated.cpu_check == "fp32 definition" and generated.max_rel_error < 1e-5, generated.error
    undilated = {**config.params, "window_dilation_strides": [1, 1]}  # the definition reads undilated patches
    monkeypatch.setattr(tensorcore, "planar", lambda c: replace(c, params=undilated))
    wrong = generate(config, "sm_90")
    assert wrong.item is None and wrong.stage == "check" and "differs from numpy" in wrong.error


def test_every_tensor_core_row_lints_clean_and_nvcc_builds_it(tmp_path: Path):
    items = [generate(parse_line(line), "sm_90", check=False).item for line in BERT + RESNET50 + ODD + ATTENTION]
    nvcc = bool(find_nvcc(""))
    rows, report = rows_of(items, tmp_path / "tc.db", compile=nvcc)  # type: ignore[arg-type]
    assert report.failed == 0, [f.reason for f in report.failures]  # type: ignore[attr-defined]
    assert len(rows) == len(items)
    for row in rows:
        assert [f.check for f in lint_row((1, *row.values()))] == []
        function = json.loads(row.function)
        sizes = dict(zip(function["shared_memory"]["symbol"], function["shared_memory"]["size"], strict=True))
        assert sum(sizes.values()) * 2 <= 48 * 1024 and set(function["shared_memory"]["dtype"]) == {"uint16_t"}
        if nvcc:  # the nvcc check's registers: fragments are registers, not a lane-indexed array in local memory
            block = json.loads(row.miscs)["kdb"]["compile"]["sm_90"]["kdb_block_kernel"]
            # (ptxas gives a one-warp block 72 registers under its __launch_bounds__(32) and spills a few bytes)
            assert block["spill_stores"] <= 16 and block["registers"] <= 128, block


@pytest.mark.parametrize("line", [BERT[1], RESNET50[0], RESNET50[2], ODD[1], ATTENTION[1]])
def test_every_sampled_tiling_of_the_design_space_builds_into_a_row(tmp_path: Path, line: str):
    """What tuning tries: random tilings (warps, tiles per warp, k chunk, copy widths) of the op's space, each one
    generated and injected as its row would be; VerifyGPUCode drops those over a block's limits."""
    import tvm.s_tir as s_tir
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.tuning.space import cuda_space

    config = parse_line(line)
    mod, _ = prim_func_module(config)
    context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=cuda_space(config), task_name="t")
    designs = context.space_generator.generate_design_space(mod)
    assert len(designs) == 6  # two or three buffers or not pipelined, k sliced across warps or not
    items, tilings = [], set()
    for seed in range(1, 200):
        sch = s_tir.Schedule(mod, seed=seed)
        design = designs[seed % len(designs)]
        design.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda *_: None)
        if not all(p.apply(sch) for p in context.space_generator.postprocs):
            continue
        generated = generate(config, "sm_90", scheduled=sch.mod, check=False)
        assert generated.item is not None, generated.error
        assert_tensor_core_row(generated.item["code"])
        tilings.add((tuple(generated.item["gridDim"]), tuple(generated.item["blockDim"])))
        items.append(generated.item)
        if len(items) == 8:
            break
    assert len(items) == 8 and len(tilings) >= 3  # different tilings, not one drawn six times
    rows, report = rows_of(items, tmp_path / "s.db", compile=bool(find_nvcc("")))
    assert report.failed == 0, [f.reason for f in report.failures]  # type: ignore[attr-defined]
    for row in rows:  # a tiling of many accumulators in a big block may spill (a warning: tuning times it slow)
        assert [f.check for f in lint_row((1, *row.values())) if f.check != "register-spill"] == []


@pytest.mark.parametrize(("line", "reason"), [
    ("cublas_dot_op_half|a+1_2048|b+1000_2048|o+1_1000|ta+0|tb+1", "a matrix-vector product"),
    ("cudnn_convolution_op_half|i+1_64_1_1|w+256_64_1_1|o+1_256_1_1|ws+1_1|wd+1_1|p+0_0", "a matrix-vector product"),
    ("cublas_dot_op_half|a+8_64|b+64_64|o+8_64|ta+0|tb+0", "a product with M = 8"),
])
def test_an_op_the_tensor_cores_do_not_take_gets_a_cuda_core_row_saying_why(line: str, reason: str):
    config = parse_line(line)
    assert not on_tensor_cores(config) and tensorcore.refusal(config).startswith(reason)
    generated = generate(config, "sm_90", check=False)
    assert generated.item is not None and "mma.sync" not in generated.item["code"]
    assert generated.notes[-1].startswith("CUDA cores") and reason in generated.notes[-1]


def test_each_product_of_a_batch_matmul_reads_its_own_operands_and_a_shared_one_is_caught(
        monkeypatch: pytest.MonkeyPatch):
    """A BatchMatMul is a batch of GEMMs, each with its own A and B (a convolution's images share one filter): the
    CPU check of its definition catches one that reads the first product's A for every product."""
    config = parse_line(ATTENTION[3])
    g = tensorcore.gemm_of(config)
    assert (g.kind, g.batch, g.m, g.n, g.k, g.mp) == ("bmm", 6, 40, 36, 24, 48)
    assert generate(config, "sm_90").max_rel_error < 1e-5
    real_pad = tensorcore._pad

    def first_product_a(tensor, shape, name, k_axis):  # type: ignore[no-untyped-def]
        from tvm import te

        padded = real_pad(tensor, shape, name, k_axis)
        if name != "A_pad":
            return padded
        return te.compute(padded.shape, lambda b, i, k: padded[0, i, k], name=name)

    monkeypatch.setattr(tensorcore, "_pad", first_product_a)
    wrong = generate(config, "sm_90")
    assert wrong.item is None and wrong.stage == "check" and "differs from numpy" in wrong.error


@pytest.mark.parametrize("line", [RESNET50[0], RESNET50[4], ATTENTION[2]])
def test_a_half_operand_copied_element_by_element_loads_behind_no_branch(line: str):
    """A gathered patch (3x3, 7x7) or an operand padded along K (P.V of 197 tokens) is copied one half at a time: each
    element read at an
    index clamped inside the tensor and selected, with no branch around its load. Behind one (TVM's if_then_else:
    `if (...) condval = input0[...]`), nvcc stored each element before it issued the next load: a global load's
    latency per element (SASS of the 3x3 convolution: LDG, STS, LDG, STS... in the k loop; 32 LDGs, then 32 STSs,
    now)."""
    code = generate(parse_line(line), "sm_90").item["code"]  # type: ignore[index]
    gather = code[:code.index("ldmatrix")]
    # the element loaded whole, then its bits ANDed with all ones or none
    assert "condval" not in gather and "? (ushort)65535 : (ushort)0" in gather
    assert re.search(r"half v_\w* = input\d\[", gather)


@pytest.mark.parametrize("line", [RESNET50[0], RESNET50[4], ATTENTION[2]])
def test_metaschedule_can_tune_an_op_whose_operand_is_copied_element_by_element(line: str):
    """Held on an H100 in session 27: every gathered-patch convolution failed to tune ('Do not have a default for
    prim.Let': the selected element was a Let, which MetaSchedule's flop estimate, run as each task starts, cannot
    read). The workload's flops and a sampled candidate's features come out now."""
    import tvm.s_tir as s_tir
    from tvm.s_tir import analysis
    from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate
    from tvm.s_tir.meta_schedule.tune_context import TuneContext
    from tvm.target import Target

    from core.codegen.generate import prim_func_module

    config = parse_line(line)
    mod = prim_func_module(config)[0]
    assert analysis.estimate_tir_flops(mod) > 0
    sch = s_tir.Schedule(mod, seed=1)
    tensorcore.schedule(sch, config)
    context = TuneContext(mod=mod, target=Target("cuda"))
    features = PerStoreFeature().extract_from(context, [MeasureCandidate(sch, [])])
    assert features and features[0].numpy().size


@pytest.mark.parametrize("line", [ODD[2], ODD[1]])
def test_an_operand_padded_along_m_or_n_only_is_copied_in_16_bytes(line: str):
    """ViT's 197 tokens pad M to 208. The padded rows reach only output rows the output stage drops, so the copy
    clamps the row index and tests nothing: each row of K is whole, and moves 8 halves at a time (one cp.async of 16
    bytes), where each half was copied alone behind a test (the Dot ran 6.07x cuBLAS on an H100, session 25). The
    numbers are checked as ever against numpy (generate's check)."""
    config = parse_line(line)
    assert tensorcore.vector_widths(config, "A")[0] == tensorcore.vector_widths(config, "B")[0] == 8
    generated = generate(config, "sm_90")
    code = generated.item["code"]  # type: ignore[index]
    gather = code[:code.index("ldmatrix")]
    assert set(re.findall(r'"n"\((\d+)\)', gather)) == {"16"}  # (each copy: in the pipeline's prologue and loop)
    assert "(ushort)65535" not in gather and "predicate" not in gather
    assert generated.max_rel_error is not None and generated.max_rel_error < 2e-3


def test_a_float_op_stays_on_the_cuda_cores():
    config = parse_line("cublas_dot_op_float|a+128_64|b+64_64|o+128_64|ta+0|tb+0")
    assert tensorcore.refusal(config).startswith("float op: the tensor cores take fp16 ops, and fp32 ops in TF32")
    assert generate(config, "sm_90", check=False).notes == ["CUDA cores (float)"]


def test_the_padding_to_whole_tiles_leaves_tilings_to_choose_from():
    assert tensorcore.padded(196) == 224 and tensorcore.padded(49) == 64 and tensorcore.padded(128) == 128
    assert tensorcore.padded(1000) == 1008  # 63 tiles = 7 x 9
    config = parse_line(RESNET50[4])  # 512 x 49 pixels x 4608: the pixels pad to 64
    g = tensorcore.gemm_of(config)
    assert (g.m, g.n, g.k, g.np_) == (512, 49, 4608, 64)


@pytest.mark.parametrize("line", RESNET50 + BERT)
def test_the_untuned_tiling_gives_every_multiprocessor_a_block_where_it_can(line: str):
    """A 3x3 convolution on a 7x7 map had 16 blocks of 4 sliced warps for the H100's 132 multiprocessors: 158.6 us
    against cuDNN's 35.6. Each warp's tile halved until the grid fills the GPU (or a warp holds one 16x16 tile): 87.3
    us, and the 33 ops' geomean 1.653x -> 1.452x (session 25). The tiling must still fit 48 KB of shared memory."""
    config = parse_line(line)
    d = tensorcore.default_decisions(config)
    g = tensorcore.gemm_of(config)
    blocks = d.m[0] * d.n[0] * g.batch
    assert blocks >= tensorcore.SMS or (d.m[2], d.n[2]) == (1, 1) or d.m[1] * d.n[1] > 1, (line, d)
    assert tensorcore.shared_bytes(config, d) <= tensorcore.STATIC_SHARED
    assert d.m[0] * d.m[1] * d.m[2] * tensorcore.TILE == g.mp and d.n[0] * d.n[1] * d.n[2] * tensorcore.TILE == g.np_


@pytest.mark.parametrize("line", [BERT[2], RESNET50[1]])
def test_a_three_stage_pipeline_keeps_two_rounds_in_flight_and_builds_into_a_row(tmp_path: Path, line: str):
    """The third design space's pipeline (issue 38: BERT's long-k Dots over few blocks): three pairs of shared
    buffers, the main loop waits until two rounds' copies are left in flight, and the last rounds' waits, counted by
    their loop variable in TVM's pipeline, become immediates PTX takes (TVM refused to generate it otherwise)."""
    from dataclasses import replace

    import tvm.s_tir as s_tir

    from core.codegen.generate import prim_func_module

    config = parse_line(line)
    mod, _ = prim_func_module(config)
    items, shared, budget = [], [], []
    for stages in (2, 3):
        decisions = replace(tensorcore.default_decisions(config), stages=stages)
        sch = s_tir.Schedule(mod)
        tensorcore.schedule(sch, config, decisions)
        generated = generate(config, "sm_90", scheduled=sch.mod, check=False)
        assert generated.item is not None, generated.error
        code = generated.item["code"]
        assert_tensor_core_row(code)
        assert f"cp.async.wait_group {stages - 1}" in code and "cp.async.wait_group 0" in code
        shared.append(sum(int(n) for n in re.findall(r"__shared__[^;]*_pad_shared\w*\[(\d+)\]", code)))
        items.append(generated.item)
        budget.append(tensorcore.shared_bytes(config, decisions))
    assert shared[1] * 2 == shared[0] * 3 and budget[1] - budget[0] == (shared[1] - shared[0]) * 2  # (halves)
    rows, report = rows_of(items, tmp_path / "stages.db", compile=bool(find_nvcc("")))
    assert report.failed == 0 and len(rows) == 2, [f.reason for f in report.failures]  # type: ignore[attr-defined]


# -- what breaks a tensor-core row ------------------------------------------------------------------------------------

LANE_INDEXED = """extern "C" __global__ void k(half* __restrict__ input0) {
  alignas(64) half A_warp[512];
  unsigned int addr = __cvta_generic_to_shared(input0 + threadIdx.x);
  __asm__ __volatile__(
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
    "{%0, %1, %2, %3}, [%4];\\n"
    : "=r"(((unsigned *)(A_warp + ((ax0 * 256) + (((int)threadIdx.x) * 8))))[0]), "=r"(((unsigned *)(A_warp + 8))[1])
    : "r"(addr)
  );
}"""


def test_lint_names_mma_fragments_indexed_by_the_lane():
    """TVM 0.27 left two of a kernel's three warp buffers unlowered (core/codegen/mma.py): the fragments were arrays of
    the whole warp's tile in every thread, indexed by threadIdx.x, in local memory."""
    assert lane_indexed_fragments(LANE_INDEXED)
    assert not lane_indexed_fragments(LANE_INDEXED.replace("(((int)threadIdx.x) * 8)", "8"))  # the address may use it
    assert not lane_indexed_fragments(LANE_INDEXED.replace("ldmatrix", "ld.shared"))  # only tensor-core PTX


def test_lint_names_a_row_whose_registers_do_not_allow_its_block(tmp_path: Path):
    item = generate(parse_line(BERT[0]), "sm_90", check=False).item
    [row], _ = rows_of([item], tmp_path / "r.db", compile=False)  # type: ignore[list-item]
    values = list(row.values())
    miscs = json.loads(row.miscs)
    miscs.setdefault("kdb", {})["compile"] = {"sm_90": {"kdb_block_kernel": {"registers": 255}}}
    function = json.loads(row.function)
    function["block_dim"] = [32, 16, 1]  # 512 threads: 255 registers a thread allow 256 (a 64K register file)
    names = ("Key", "Identifier", "OpType", "Attributes", "Source", "DeviceType", "Function", "Tags", "Miscs")
    values[names.index("Miscs")] = json.dumps(miscs)
    values[names.index("Function")] = json.dumps(function)
    [finding] = [f for f in lint_row((1, *values)) if f.check == "launch-registers"]
    assert "255 registers a thread allow 256 threads a block, and the row launches 512" in finding.message
    function["block_dim"] = [32, 8, 1]
    values[names.index("Function")] = json.dumps(function)
    assert not [f for f in lint_row((1, *values)) if f.check == "launch-registers"]


def test_nvrtc_gets_the_standard_asm_spelling(monkeypatch: pytest.MonkeyPatch):
    """Tuning compiles candidates with NVRTC, which refused TVM's `__asm__ __volatile__` on the device (nvcc takes it)."""
    from tvm.support import nvcc

    from core.tuning import nvrtc

    seen = []
    monkeypatch.setattr(nvcc, "compile_cuda", lambda code, **_: seen.append(code) or b"cubin")
    code = generate(parse_line(BERT[0]), "sm_90", check=False).item["code"]  # type: ignore[index]
    nvrtc.compile_cuda(code)
    assert seen and seen[0].startswith(nvrtc.ASM_KEYWORDS)
    seen.clear()
    nvrtc.compile_cuda("extern \"C\" __global__ void k() {}")
    assert seen == ['extern "C" __global__ void k() {}']  # nothing added to a program without inline PTX


def _tensor_core_work_dir(config: Any, work: Path) -> None:
    """A tuning work dir of two valid tensor-core candidates of `config`, recorded as tuning records them (the
    postprocessors passed), at 20 and 10 us."""
    import tvm.s_tir as s_tir
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.tuning.records import RECORDS, WORKLOADS
    from core.tuning.space import cuda_space

    mod, _ = prim_func_module(config)
    context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=cuda_space(config), task_name="t")
    design = context.space_generator.generate_design_space(mod)[0]
    work.mkdir()
    database = ms.database.JSONDatabase(path_workload=str(work / WORKLOADS), path_tuning_record=str(work / RECORDS))
    workload = database.commit_workload(mod)
    committed, seed = 0, 0
    while committed < 2:
        seed += 1
        sch = s_tir.Schedule(mod, seed=seed)
        design.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda *_: None)
        if all(p.apply(sch) for p in context.space_generator.postprocs):
            seconds = 2e-5 if not committed else 1e-5
            database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [seconds],
                                                                   cuda_target("sm_90")))
            committed += 1


def test_a_tuned_half_record_becomes_a_kernel(tmp_path: Path):
    """The harvest of a tuning run: the fastest record of the work dir, replayed, generated and compiled on its own as
    NNFusion holds it. Every half kernel failed that compile ('incomplete type "void"': no cuda_fp16.h), so no fp16
    tuning on the H100 gave a row."""
    if not find_nvcc(""):
        pytest.skip("needs nvcc (the harvest compiles each kernel on its own)")
    from core.tuning.harvest import best_kernels
    from core.tuning.job import TuneJob

    config = parse_line(BERT[1])
    _tensor_core_work_dir(config, tmp_path / "work")
    result = best_kernels(TuneJob(config, trials=2), tmp_path / "work", check=False)
    assert set(result.kernels) == {"best"}, result.errors
    assert result.best_seconds == 1e-5
    assert_tensor_core_row(result.kernels["best"]["code"])


@pytest.mark.parametrize("reader, expected", [("database", "2"), ("model", "(2, 0)")])
def test_a_tensor_core_work_dir_reopens_in_a_fresh_process(tmp_path: Path, reader: str, expected: str):
    """`kdb tune` resuming a tensor-core op (session 32, on the H100: every resumed op failed at once with "TensorIntrin
    'kdb_mma_store_f32_shared' is not registered"): TVM reads each record's trace as it opens the work dir, and those
    traces name kdb's intrinsics, registered only once a schedule was built. A fresh process opens it, as a resumed
    run (its database) and the cost model's reading of it (no record it cannot rebuild) do."""
    _tensor_core_work_dir(parse_line(BERT[1]), tmp_path / "work")
    opened = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from core.tuning.records import open_database; from core.tuning.costmodel import recorded_trials; "
         "from core.codegen.generate import cuda_target; work = Path(sys.argv[1]); "
         "trials = recorded_trials(work, cuda_target('sm_90')) if sys.argv[2] == 'model' else None; "
         "print(len(open_database(work)) if trials is None else (trials.count, trials.bad))", str(tmp_path / "work"),
         reader], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert opened.returncode == 0, opened.stderr[-2000:]
    assert opened.stdout.strip() == expected


# -- TF32: fp32 Dots and convolutions on the tensor cores, asked for ----------------------------------------------------

FP32 = [line.replace("_op_half|", "_op_float|") for line in (BERT[0], RESNET50[0], RESNET50[2], ODD[0], ODD[1])]


def test_tf32_is_asked_for_and_gives_tensor_core_rows_that_say_so(tmp_path: Path):
    from dataclasses import replace

    from core.opconfigs.opconfig import with_math

    pool = parse_line("cudnn_maxpool_op_float|i+1_64_112_112|o+1_64_56_56|win+3_3|ws+2_2|pb+1_1|pa+1_1")
    assert with_math(pool, "tf32") == pool and not with_math(pool, "tf32").math  # no tensor cores for a pool
    configs = [with_math(parse_line(line), "tf32") for line in FP32]
    assert all(c.math == "tf32" and on_tensor_cores(c) for c in configs)
    assert not on_tensor_cores(replace(configs[0], math=""))  # fp32 stays on the CUDA cores unless asked
    items = []
    for config in configs:
        generated = generate(config, "sm_90")
        assert generated.item is not None, generated.error
        assert generated.notes == ["tensor cores (mma.sync tf32, fp32 accumulation)"]
        code = generated.item["code"]
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in code and "float* __restrict__ input0" in code
        assert not lane_indexed_fragments(code) and "extern __shared__" not in code
        assert generated.item["math"] == "tf32" and "dtype" not in generated.item
        items.append(generated.item)
    rows, report = rows_of(items, tmp_path / "tf32.db", compile=bool(find_nvcc("")))
    assert report.failed == 0, [f.reason for f in report.failures]  # type: ignore[attr-defined]
    for row in rows:
        assert json.loads(row.attributes)["math"] == "tf32" and row.identifier.endswith(
            ("floatfloatfloat", "floatfloat", "}")) and "tf32" not in row.identifier  # NNFusion fetches a float op
        assert [f.check for f in lint_row((1, *row.values()))] == []


def test_a_tf32_row_is_verified_and_run_by_tf32s_bound(tmp_path: Path):
    from core.codegen.reference import tolerance
    from core.gpu.jobs import job_for_row
    from core.gpu.network_run import DEFAULT_MAX_ERROR, TF32_MAX_ERROR, RunOptions, error_bound
    from core.kernels.export import row_to_item
    from core.nnfusion.build import Signature
    from core.opconfigs.opconfig import with_math

    config = with_math(parse_line(FP32[0]), "tf32")
    [row], _ = rows_of([generate(config, "sm_90", check=False).item], tmp_path / "t.db", compile=False)
    job = job_for_row(row, "verify")
    assert job["dtype"] == "float" and job["tolerance"] == tolerance("tf32", 768) > 100 * tolerance("float", 768)
    assert row_to_item(row)["math"] == "tf32"  # exported and injected again, a TF32 row stays one
    fp32 = Signature((), ())
    assert error_bound(RunOptions(), fp32) == DEFAULT_MAX_ERROR
    assert error_bound(RunOptions(), fp32, tf32=True) == TF32_MAX_ERROR


def test_kernel_json_takes_tf32_only_for_a_float_dot_batch_matmul_or_convolution():
    from core.errors import InputError
    from core.kernels.kernel_json import validate_item
    from core.opconfigs.opconfig import with_math

    item = generate(parse_line(BERT[0]), "sm_90", check=False).item
    assert item is not None
    with pytest.raises(InputError, match="tf32 is a way to compute a float Dot, BatchMatMul or convolution, not a "
                                         "half Dot"):
        validate_item({**item, "math": "tf32"})
    attention = with_math(parse_line(ATTENTION[0].replace("_half", "_float")), "tf32")
    generated = generate(attention, "sm_90", check=False)
    assert generated.notes == ["tensor cores (mma.sync tf32, fp32 accumulation)"] and generated.item is not None
    assert validate_item(generated.item) is not None
    with pytest.raises(InputError, match="math"):
        validate_item({**item, "dtype": "float", "math": "bf16"})


@pytest.mark.parametrize("line", [FP32[0], FP32[2], FP32[4]])
def test_every_sampled_tf32_tiling_builds_into_a_row(tmp_path: Path, line: str):
    import tvm.s_tir as s_tir
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.opconfigs.opconfig import with_math
    from core.tuning.space import cuda_space

    config = with_math(parse_line(line), "tf32")
    mod, _ = prim_func_module(config)
    context = ms.TuneContext(mod=mod, target=cuda_target("sm_90"), space_generator=cuda_space(config), task_name="t")
    designs = context.space_generator.generate_design_space(mod)
    items = []
    for seed in range(1, 300):
        sch = s_tir.Schedule(mod, seed=seed)
        designs[seed % len(designs)].trace.apply_to_schedule(sch, remove_postproc=True,
                                                             decision_provider=lambda *_: None)
        if not all(p.apply(sch) for p in context.space_generator.postprocs):
            continue
        generated = generate(config, "sm_90", scheduled=sch.mod, check=False)
        assert generated.item is not None, generated.error
        assert "tf32" in generated.item["code"] and not lane_indexed_fragments(generated.item["code"])
        items.append(generated.item)
        if len(items) == 6:
            break
    assert len(items) == 6
    _, report = rows_of(items, tmp_path / "s.db", compile=bool(find_nvcc("")))
    assert report.failed == 0, [f.reason for f in report.failures]  # type: ignore[attr-defined]


def test_kdb_codegen_says_which_ops_run_on_the_tensor_cores_and_why_the_others_do_not(tmp_path: Path):
    from conftest import run_kdb

    (tmp_path / "ops.txt").write_text("\n".join([BERT[0], "cublas_dot_op_half|a+1_2048|b+1000_2048|o+1_1000|ta+0|tb+1",
                                                 "cudnn_maxpool_op_half|i+1_64_112_112|o+1_64_56_56|win+3_3|ws+2_2|"
                                                 "pb+1_1|pa+1_1", FP32[3]]) + "\n")
    proc = run_kdb("codegen", "ops.txt", "-o", "k.json", "--arch", "sm_90", "--db", "k.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 on the tensor cores, 3 on the CUDA cores" in proc.stderr
    assert "Dot 1x2048 x 1000x2048 (tB) half: CUDA cores: a matrix-vector product" in proc.stderr
    assert "  codegen 1/4: Dot 1x128x768 x 768x768 half\n" in proc.stderr  # a line as each op starts (issue 39 #9)
    said = proc.stderr.split("kernels generated")[1]
    assert "MaxPool" not in said  # no tensor cores for a pool: nothing to explain
    tf32 = run_kdb("codegen", "ops.txt", "--math", "tf32", "-o", "t.json", "--json", "--db", "k.db", cwd=tmp_path)
    kernels = {k["op"]: k["math"] for k in json.loads(tf32.stdout)["kernels"]}
    assert kernels["Dot 64x512 x 1000x512 (tB) tf32"] == "tensor cores (mma.sync tf32, fp32 accumulation)"
    assert json.loads((tmp_path / "t.json").read_text())[-1]["math"] == "tf32"

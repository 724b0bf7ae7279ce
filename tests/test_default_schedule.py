"""The default schedule on the ops real CNNs have: each case is generated for CUDA (one kernel, a launch that
covers every output) and the schedule's own math is checked on the CPU against numpy (its thread loops left
serial). Shapes are small, but each keeps the feature it is named for."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("tvm")

from core.codegen.generate import generate
from core.codegen.reference import TOLERANCE
from core.codegen.schedule import COLUMN_SPLIT, MAX_THREADS, THREADS, reduction_threads
from core.opconfigs.opconfig import parse_line

CONV = "cudnn_convolution_op_float"
CASES = {
    # The ResNet stem on a pre-padded input, full size: the bindings compute_at derived for it were not affine.
    "stem 7x7 s2 pre-padded": f"{CONV}|i+1_3_230_230|w+64_3_7_7|o+1_64_112_112|ws+2_2|wd+1_1|p+0_0",
    "stem 7x7 s2 padded": f"{CONV}|i+1_3_32_32|w+8_3_7_7|o+1_8_16_16|ws+2_2|wd+1_1|p+3_3",
    "3x3 s1 padded": f"{CONV}|i+1_16_14_14|w+16_16_3_3|o+1_16_14_14|ws+1_1|wd+1_1|p+1_1",
    "1x1 s1": f"{CONV}|i+2_32_7_7|w+16_32_1_1|o+2_16_7_7|ws+1_1|wd+1_1|p+0_0",
    "1x1 s2 projection": f"{CONV}|i+1_16_14_14|w+32_16_1_1|o+1_32_7_7|ws+2_2|wd+1_1|p+0_0",
    "5x5 s1 padded": f"{CONV}|i+1_8_12_12|w+8_8_5_5|o+1_8_12_12|ws+1_1|wd+1_1|p+2_2",
    "11x11 s4 pre-padded": f"{CONV}|i+1_3_39_39|w+16_3_11_11|o+1_16_8_8|ws+4_4|wd+1_1|p+0_0",
    "11x11 s4 padded": f"{CONV}|i+1_3_35_35|w+8_3_11_11|o+1_8_8_8|ws+4_4|wd+1_1|p+2_2",
    "3x3 dilation 2 s2": f"{CONV}|i+1_8_17_17|w+8_8_3_3|o+1_8_9_9|ws+2_2|wd+2_2|p+2_2",
    "3x3 dilation 2 s1": f"{CONV}|i+1_8_12_12|w+8_8_3_3|o+1_8_12_12|ws+1_1|wd+2_2|p+2_2",
    "3x3 s2 pad above only": f"{CONV}|i+1_8_9_9|w+8_8_3_3|o+1_8_4_4|ws+2_2|wd+1_1|p+0_0|pa+1_1",
    "batch 8 3x3 s2": f"{CONV}|i+8_8_10_10|w+8_8_3_3|o+8_8_5_5|ws+2_2|wd+1_1|p+1_1",
    "batch 64 3x3": f"{CONV}|i+64_4_6_6|w+8_4_3_3|o+64_8_6_6|ws+1_1|wd+1_1|p+1_1",
    "fuse relu 3x3": f"{CONV}|i+1_16_14_14|w+16_16_3_3|o+1_16_14_14|ws+1_1|wd+1_1|p+1_1|fuse+relu",
    "fuse relu 7x7 s2 pre-padded": f"{CONV}|i+1_3_38_38|w+8_3_7_7|o+1_8_16_16|ws+2_2|wd+1_1|p+0_0|fuse+relu",
    "fuse add_relu 3x3 batch 2": f"{CONV}|i+2_8_8_8|w+8_8_3_3|o+2_8_8_8|ws+1_1|wd+1_1|p+1_1|fuse+add_relu",
    "fuse add_relu 1x1 batch 4": f"{CONV}|i+4_16_7_7|w+32_16_1_1|o+4_32_7_7|ws+1_1|wd+1_1|p+0_0|fuse+add_relu",
    "maxpool 3x3 s2 padded": "cudnn_maxpool_op_float|i+1_8_16_16|o+1_8_8_8|win+3_3|ws+2_2|pb+1_1|pa+1_1",
    "maxpool 3x3 s2 pad above only": "cudnn_maxpool_op_float|i+1_8_15_15|o+1_8_7_7|win+3_3|ws+2_2|pb+0_0|pa+1_1",
    "maxpool 2x2 s2 batch 2": "cudnn_maxpool_op_float|i+2_8_8_8|o+2_8_4_4|win+2_2|ws+2_2|pb+0_0|pa+0_0",
    "maxpool 3x3 s1 batch 64": "cudnn_maxpool_op_float|i+64_2_5_5|o+64_2_5_5|win+3_3|ws+1_1|pb+1_1|pa+1_1",
    "avgpool 3x3 s1 padded": "cudnn_avgpool_op_float|i+1_8_10_10|o+1_8_10_10|win+3_3|ws+1_1|pb+1_1|pa+1_1",
    "avgpool 2x2 s2 padded": "cudnn_avgpool_op_float|i+1_4_9_9|o+1_4_5_5|win+2_2|ws+2_2|pb+1_1|pa+1_1",
    "avgpool global 7x7 batch 4": "cudnn_avgpool_op_float|i+4_16_7_7|o+4_16_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0",
    "dot": "cublas_dot_op_float|a+8_32|b+32_16|o+8_16|ta+0|tb+0",
    "dot transpose A": "cublas_dot_op_float|a+32_8|b+32_16|o+8_16|ta+1|tb+0",
    "dot transpose B": "cublas_dot_op_float|a+8_32|b+16_32|o+8_16|ta+0|tb+1",
    "dot transpose A and B": "cublas_dot_op_float|a+32_8|b+16_32|o+8_16|ta+1|tb+1",
    "dot fc batch 1": "cublas_dot_op_float|a+1_512|b+10_512|o+1_10|ta+0|tb+1",
    "dot fc batch 64": "cublas_dot_op_float|a+64_64|b+64_100|o+64_100|ta+0|tb+0",
    "relu 4-d": "elementwise_relu_op_float|i+1_16_14_14|o+1_16_14_14",
    "add 4-d batch 8": "elementwise_add_op_float|i+8_8_7_7|i+8_8_7_7|o+8_8_7_7",
    "add 1000": "elementwise_add_op_float|i+1000|i+1000|o+1000",
    "multiply": "elementwise_multiply_op_float|i+4_100|i+4_100|o+4_100",
    "sigmoid": "elementwise_sigmoid_op_float|i+4096|o+4096",
    "tanh": "elementwise_tanh_op_float|i+2_300|o+2_300",
    # Few outputs, long reductions (issue 39: a global AvgPool over 112x112 ran 161x cuDNN's time): a block each
    "avgpool global 112x112": "cudnn_avgpool_op_float|i+1_32_112_112|o+1_32_1_1|win+112_112|ws+1_1|pb+0_0|pa+0_0",
    # ... and a pool's short one over its innermost axis where a thread per output would give few blocks (ResNet's)
    "avgpool global 7x7 2048 channels": "cudnn_avgpool_op_float|i+1_2048_7_7|o+1_2048_1_1|win+7_7|ws+1_1|pb+0_0|pa+0_0",
    "maxpool global 32x32": "cudnn_maxpool_op_float|i+1_64_32_32|o+1_64_1_1|win+32_32|ws+1_1|pb+0_0|pa+0_0",
    "dot gemv 1x768 by 768x3072": "cublas_dot_op_float|a+1_768|b+768_3072|o+1_3072|ta+0|tb+0",
    "dot gemv classifier 1x2048 by 1000x2048": "cublas_dot_op_float|a+1_2048|b+1000_2048|o+1_1000|ta+0|tb+1",
    "conv 1x1 small map add_relu": f"{CONV}|i+1_512_7_7|w+128_512_1_1|o+1_128_7_7|ws+1_1|wd+1_1|p+0_0|fuse+add_relu",
    "dot gemv 1x3000 by 3000x700 (a partial column block)": "cublas_dot_op_float|a+1_3000|b+3000_700|o+1_700|ta+0|tb+0",
    # Two reductions over the same rows (the max, the sum of exponentials): a block of threads per row
    "softmax attention 1x2x8x8": "cudnn_softmax_op_float|i+1_2_8_8|o+1_2_8_8",
    "softmax attention 1x3x197x197": "cudnn_softmax_op_float|i+1_3_197_197|o+1_3_197_197",
    "softmax classifier 2x1000": "cudnn_softmax_op_float|i+2_1000|o+2_1000",
    "softmax 1-D": "cudnn_softmax_op_float|i+7|o+7",
    # NNFusion's Sum of a ReduceMean: a LayerNorm's row sums (few outputs, long rows), a batch's column sums
    "sum layer norm 1x64x256": "cudnn_reduce_sum_op_float|i+1_64_256|o+1_64",
    "sum over the batch 8x1000": "cudnn_reduce_sum_op_float|i+8_1000|o+1000",
    # NNFusion's Concat where it copies (an axis of size > 1 before the joined one): each output from its input
    "concat last axis 1x8x16 + 1x8x8": "concat_op_float|i+1_8_16|i+1_8_8|o+1_8_24",
    "concat three on the middle axis of a batch": "concat_op_half|i+2_3_40|i+2_5_40|i+2_1_40|o+2_9_40",
}
# rows, and the threads each row's block has (whole warps; a long row's as a long reduction's)
ROWS = {"softmax attention 1x2x8x8": (16, 32), "softmax attention 1x3x197x197": (591, THREADS),
        "softmax classifier 2x1000": (2, reduction_threads(1000)), "softmax 1-D": (1, 32)}
# The cases with at most CROSS_THREAD_MAX_OUTPUTS outputs and a reduction of CROSS_THREAD_MIN_REDUCTION or more
BLOCK_PER_OUTPUT = {"dot fc batch 1", "11x11 s4 pre-padded", "11x11 s4 padded", "avgpool global 112x112",
                    "avgpool global 7x7 2048 channels", "avgpool global 7x7 batch 4",
                    "maxpool global 32x32", "dot gemv 1x768 by 768x3072", "dot gemv classifier 1x2048 by 1000x2048",
                    "conv 1x1 small map add_relu", "sum layer norm 1x64x256"}
# ... of fewer outputs than an H100's multiprocessors: blocks of up to MAX_THREADS (a global pool of 32 channels)
WIDE = {"avgpool global 112x112": MAX_THREADS, "maxpool global 32x32": THREADS, "avgpool global 7x7 batch 4": 32,
        "avgpool global 7x7 2048 channels": 32}
# ... whose largest operand has an output axis innermost (x·B, B [K, N]): warps of 32 neighbouring outputs
COLUMNS = {"dot gemv 1x768 by 768x3072", "dot gemv 1x3000 by 3000x700 (a partial column block)"}


def output_elements(line: str) -> int:
    field = next(f for f in line.split("|") if f.startswith("o+"))
    return math.prod(int(d) for d in field[2:].split("_"))


@pytest.mark.parametrize("name", CASES)
def test_default_schedule_generates_one_kernel_whose_math_matches_numpy(name: str):
    line = CASES[name]
    result = generate(parse_line(line, "case"), "sm_90")
    assert result.item is not None, f"{result.stage}: {result.error}"
    assert result.max_rel_error is not None and result.max_rel_error <= TOLERANCE  # checked, not skipped
    grid, block = result.item["gridDim"], result.item["blockDim"]
    assert grid[1:] == [1, 1]
    if name in ROWS:  # each row's max and sum across its block (warp shuffles), the row written by the same block
        assert (grid[0], block) == (ROWS[name][0], [ROWS[name][1], 1, 1])
        assert "__shfl_down_sync" in result.item["code"]
    elif name in COLUMNS:  # a warp per 32 outputs, COLUMN_SPLIT warps split the reduction: a sum in shared memory
        assert block == [32, COLUMN_SPLIT, 1] and grid == [math.ceil(output_elements(line) / 32), 1, 1]
        assert "threadIdx.y" in result.item["code"]
    elif name in BLOCK_PER_OUTPUT:  # a block per output; its whole warps share the reduction
        assert grid[0] == output_elements(line) and block[1:] == [1, 1]
        assert block[0] == WIDE.get(name, block[0]) and block[0] in (32, 64, THREADS, MAX_THREADS)
        assert "__shfl_down_sync" in result.item["code"]
    else:
        assert block == [THREADS, 1, 1]
        assert (grid[0] - 1) * THREADS < output_elements(line) <= grid[0] * THREADS  # every output, no idle block
        assert "__shfl_down_sync" not in result.item["code"]


def test_several_reductions_that_are_not_each_over_the_rows_are_refused_by_name():
    """A block per row holds only reductions over the output's last axis (a softmax's); a column max beside a row
    sum would be computed wrong there, so the schedule says it cannot."""
    import tvm
    from tvm import te

    from core.codegen.schedule import default_schedule
    from core.errors import InputError

    x = te.placeholder((8, 16), "float32", name="input0")
    k, j = te.reduce_axis((0, 8), name="k"), te.reduce_axis((0, 16), name="j")
    column_max = te.compute((16,), lambda c: te.max(x[k, c], axis=k), name="column_max")
    row_sum = te.compute((8,), lambda r: te.sum(x[r, j], axis=j), name="row_sum")
    out = te.compute((8, 16), lambda r, c: x[r, c] - column_max[c] + row_sum[r], name="output0")
    with pytest.raises(InputError, match="not each over the output's last axis"):
        default_schedule(tvm.IRModule({"main": te.create_prim_func([x, out])}))


def test_a_half_softmax_sums_in_float_and_lands_within_the_half_bound():
    """ONNX Runtime's half softmax (NNFusion's own) accumulates in float; so does kdb's, its output rounded once."""
    from core.codegen.reference import tolerance_for

    config = parse_line("cudnn_softmax_op_half|i+2_4_64_64|o+2_4_64_64", "case")
    result = generate(config, "sm_90")
    assert result.item is not None, f"{result.stage}: {result.error}"
    assert result.max_rel_error is not None and result.max_rel_error <= tolerance_for(config)
    code = result.item["code"]
    assert "half* __restrict__ input0" in code and "float red_buf0" in code.replace("alignas(64) ", "")


@pytest.mark.parametrize("length, outputs, threads", [(256, 1000, 32), (511, 1000, 32), (512, 1000, 64),
                                                      (1023, 1000, 64), (1024, 1000, 128), (12544, 1000, 128),
                                                      (12544, 32, 1024), (4096, 64, 512), (49, 2048, 32)])
def test_a_reductions_threads_are_whole_warps_each_summing_at_least_8_terms(length: int, outputs: int, threads: int):
    """Up to THREADS; up to MAX_THREADS where the outputs, a block each, are fewer than an H100's multiprocessors."""
    assert reduction_threads(length, outputs) == threads


def test_a_half_global_max_pool_generates_with_a_thread_per_output():
    """A max of halves is a reducer of our own (a Select), which TVM cannot lower across threads ("No matched reducer":
    a PointNet's half global MaxPool failed its codegen in session 25's review); a float one keeps a block per output."""
    line = "cudnn_maxpool_op_{}|i+1_128_1024_1|o+1_128_1_1|win+1024_1|ws+1_1|pb+0_0|pa+0_0"
    from core.codegen.reference import tolerance_for

    configs = [parse_line(line.format(t)) for t in ("half", "float")]
    half, single = (generate(c, "sm_90") for c in configs)
    assert half.item is not None, half.error
    assert half.item["gridDim"] == [1, 1, 1] and half.item["blockDim"] == [128, 1, 1]
    assert half.max_rel_error is not None and half.max_rel_error <= tolerance_for(configs[0])
    assert single.item is not None and single.item["gridDim"] == [128, 1, 1]

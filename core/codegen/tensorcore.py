"""fp16 Dots and convolutions on the tensor cores: one GEMM definition per op and its mma.sync schedule.

Every op here is a (batched) GEMM C[b, m, n] = sum_k A[m, k] B[b, k, n], padded to whole 16x16x16 tiles:
- a Dot is A x B of its 2-D operands (a left operand of rank > 2 gives its leading axes as rows); a transposed
  operand stays as it lies in memory and is read with ldmatrix's transposing forms;
- a BatchMatMul (attention's Q.K^T and P.V) is `batch` products each of its own A and B: A[b, m, k] too;
- a convolution is an implicit GEMM: A is the weight [Cout, Cin*KH*KW] as it lies in memory, B the input's patches
  (im2col) gathered straight into shared memory, n the output pixel: C[b] is the NCHW output of image b.
The padding is part of the definition (zero operands outside the op), the bounds are the epilogue's: the output
stage reads the fp32 accumulator in registers, adds the residual (Fused_Convolution_Add_Relu's input2), applies the
Relu, rounds to half once and stores only what lies inside the output.

The schedule (`schedule`) is MetaSchedule design space and default schedule at once: its decisions (the M, N and K
tilings, the copy vector widths) are sampled instructions of the trace, so the search mutates them as it does its
own; `DefaultDecisions` fixes them for an untuned kernel. Operands are staged in static shared memory (NNFusion
gives a kernel no dynamic shared memory), read into warp fragments with ldmatrix, multiplied with mma.sync
m16n8k16 (core/codegen/mma.py), accumulated in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from core.codegen.mma import FILL, K_STEP, TILE, WARP, ldmatrix_name, mma_name, operand_layout, tile_fragment
from core.kernels.ops import BATCH_MATMUL, CONV_FAMILY, CONV_TRANSPOSE, MATRIX_OP_TYPES
from core.opconfigs.opconfig import OpConfig, planar

MIN_SIDE = 16  # an M or N below one fragment tile leaves most of each mma idle: the CUDA cores take such an op
MAX_WARP_TILES = 4  # 16x16 accumulator tiles a warp holds along M (and along N): 8 fp32 registers each
MAX_WARPS = 4  # warps of a block along M (and along N)
MAX_K_CHUNK = 4  # 16-deep k steps staged in shared memory per round (per slice)
SLICES = (2, 4)  # warps a sliced schedule splits each round's k among
SHARED_ALIGN = (32, 8)  # shared rows padded to a multiple of 32 halves plus 8: ldmatrix's rows fall in distinct banks


def shared_align(config: OpConfig, operand: str, transposed: bool) -> tuple[int, int]:
    """storage_align's (factor, offset), in elements, for an operand's shared rows: half as SHARED_ALIGN; tf32 so
    that the 32 lanes' 4-byte loads of a fragment fall in 32 banks (a row stride of 4 mod 32 where lanes 4g + t read
    row g, 8 mod 32 where they read row t)."""
    if element_type(config) == "float16":
        return SHARED_ALIGN
    rows_by_group = (operand == "A") != transposed  # A [m, k] and B [n, k]: row g of lane 4g + t
    return 32, 4 if rows_by_group else 8


@dataclass(frozen=True)
class Gemm:
    """An op as the GEMM the tensor cores compute (sizes before and after padding to whole tiles)."""

    kind: str  # "dot" | "bmm" (a BatchMatMul: A batched too) | "conv"
    batch: int
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False

    @property
    def batched(self) -> bool:
        """Whether the GEMM has a batch axis (blockIdx.y): a convolution's images, a BatchMatMul's products."""
        return self.kind != "dot"

    @property
    def mp(self) -> int:
        return padded(self.m)

    @property
    def np_(self) -> int:
        return padded(self.n)

    @property
    def kp(self) -> int:
        return -(-self.k // TILE) * TILE


def padded(size: int) -> int:
    """`size` rounded up to whole 16-tiles, then on to a count of tiles the tilings can split (not a prime above 8:
    a GEMM of 13 tiles could only be cut 1 x 13; 196 -> 224, 14 tiles)."""
    tiles = -(-size // TILE)
    while tiles > 8 and all(tiles % f for f in range(2, 9)):
        tiles += 1
    return tiles * TILE


def refusal(config: OpConfig) -> str:
    """Why the tensor cores do not take this op ('' when they do): said where the user sees its CUDA-core row."""
    if config.dtype == "float" and config.math != "tf32":
        return "float op: the tensor cores take fp16 ops, and fp32 ops in TF32 when asked (--math tf32)"
    if config.dtype not in ("half", "float"):
        return f"{config.dtype} op: the tensor-core rows are fp16 (or TF32)"
    if config.op_type == CONV_TRANSPOSE:
        return "kdb's ConvTranspose kernels are TVM's direct ones (no implicit GEMM of it yet)"
    if config.op_type not in MATRIX_OP_TYPES:
        return f"{config.op_type} is no matrix product"
    if config.groups != 1:
        return "a grouped convolution"
    if config.op_type in CONV_FAMILY and len(planar(config).params["input_shape"]) != 4:
        return "a 3-D convolution"  # (te_ops.define says kdb generates none)
    g = gemm_of(config)
    if g.m < MIN_SIDE or g.n < MIN_SIDE:
        side, size = ("M", g.m) if g.m < MIN_SIDE else ("N", g.n)
        what = "a matrix-vector product" if size == 1 else f"a product with {side} = {size}"
        return (f"{what}: an mma.sync tile is 16 x 16, so {16 - size} of its 16 {'rows' if side == 'M' else 'columns'} "
                "would carry nothing (memory-bound: the CUDA cores do as well)")
    return ""


def element_type(config: OpConfig) -> str:
    """TVM's type of the op's tensors on the tensor cores: float16, or float32 read as tf32."""
    return "float16" if config.dtype == "half" else "float32"


def gemm_of(config: OpConfig) -> Gemm:
    config = planar(config)
    p = config.params
    if config.op_type == "Dot":
        m, k, n = config.matrix_dims()
        return Gemm("dot", 1, m, n, k, bool(p.get("transpose_A")), bool(p.get("transpose_B")))
    if config.op_type == BATCH_MATMUL:  # (an ONNX MatMul's: never transposed, kernel_json._batch_matmul)
        m, k, n = config.matrix_dims()
        return Gemm("bmm", config.batch, m, n, k)
    nb, cin, _, _ = p["input_shape"]
    cout, _, kh, kw = p["filter_shape"]
    _, _, oh, ow = p["output_shape"]
    return Gemm("conv", nb, cout, oh * ow, cin * kh * kw)


def define(config: OpConfig) -> tuple[list[Any], Any]:
    """(inputs, output) tensors of the op's padded GEMM; the output is C in GEMM form ([M, N], or [batch, Cout,
    pixels] for a convolution: the same bytes as NCHW)."""
    from tvm import te, tirx

    config = planar(config)
    g = gemm_of(config)
    f16, f32 = element_type(config), "float32"  # (f16: the operands' type, half or fp32 for TF32)
    kk = te.reduce_axis((0, g.kp), name="k")
    if g.kind == "dot":
        a = te.placeholder((g.k, g.m) if g.trans_a else (g.m, g.k), f16, name="input0")
        b = te.placeholder((g.n, g.k) if g.trans_b else (g.k, g.n), f16, name="input1")
        a_pad = _pad(a, (g.kp, g.mp) if g.trans_a else (g.mp, g.kp), "A_pad", k_axis=0 if g.trans_a else 1)
        b_pad = _pad(b, (g.np_, g.kp) if g.trans_b else (g.kp, g.np_), "B_pad", k_axis=1 if g.trans_b else 0)

        def product(i: Any, j: Any) -> Any:
            x = a_pad[kk, i] if g.trans_a else a_pad[i, kk]
            y = b_pad[j, kk] if g.trans_b else b_pad[kk, j]
            return te.sum(x.astype(f32) * y.astype(f32), axis=kk)

        c = te.compute((g.mp, g.np_), product, name="gemm")
        out = te.compute((g.m, g.n), lambda i, j: c[i, j].astype(f16), name="output0")
        return [a, b], out
    if g.kind == "bmm":  # the batch axes as one (the kernel's buffers are flat)
        a = te.placeholder((g.batch, g.m, g.k), f16, name="input0")
        b = te.placeholder((g.batch, g.k, g.n), f16, name="input1")
        a_pad, b_pad = _pad(a, (g.mp, g.kp), "A_pad", k_axis=1), _pad(b, (g.kp, g.np_), "B_pad", k_axis=0)
        c = te.compute((g.batch, g.mp, g.np_),
                       lambda bi, i, j: te.sum(a_pad[bi, i, kk].astype(f32) * b_pad[bi, kk, j].astype(f32), axis=kk),
                       name="gemm")
        return [a, b], te.compute((g.batch, g.m, g.n), lambda bi, i, j: c[bi, i, j].astype(f16), name="output0")
    p = config.params
    # A 1x1, stride-1, unpadded convolution reads each patch row as it lies in the input: the input is taken flat
    # ([N, C, H*W], the same bytes), and so is the filter: their loads are a linear index TVM can vectorize.
    flat = plain_patches(config)
    nb, cin, *_ = p["input_shape"]
    data = te.placeholder((nb, cin, g.n) if flat else tuple(p["input_shape"]), f16, name="input0")
    weight = te.placeholder((g.m, g.k), f16, name="input1")  # [Cout, Cin*KH*KW]: the filter's bytes, a row per output
    h, w = p["input_shape"][2:]
    kh, kw = p["filter_shape"][2:]
    oh, ow = p["output_shape"][2:]
    (sh, sw), (dh, dw) = p["window_movement_strides"], p["window_dilation_strides"]
    pt, pl = p["padding_below_diff"]
    window = kh * kw

    def weight_at(m: Any, k: Any) -> Any:
        if (g.mp, g.kp) == (g.m, g.k):
            return weight[m, k]
        return _selected(weight[tirx.min(m, g.m - 1), tirx.min(k, g.k - 1)], [m < g.m, k < g.k])

    def patch_at(bi: Any, k: Any, n: Any) -> Any:
        y = n // ow * sh + k % window // kw * dh - pt
        x = n % ow * sw + k % kw * dw - pl
        conditions = [k < g.k] if g.kp != g.k else []
        conditions += [n < g.n] if g.np_ != g.n else []
        conditions += [y >= 0] if pt else []
        conditions += [x >= 0] if pl else []
        conditions += [y < h] if (oh - 1) * sh + (kh - 1) * dh - pt >= h else []
        conditions += [x < w] if (ow - 1) * sw + (kw - 1) * dw - pl >= w else []
        if not conditions:
            return data[bi, k, n] if flat else data[bi, k // window, y, x]

        def inside(index: Any, size: int) -> Any:
            return tirx.max(tirx.min(index, size - 1), 0)

        if flat:
            return _selected(data[bi, inside(k, g.k), inside(n, g.n)], conditions)
        return _selected(data[bi, tirx.min(k, g.k - 1) // window, inside(y, h), inside(x, w)], conditions)

    a_pad = te.compute((g.mp, g.kp), weight_at, name="A_pad")
    b_pad = te.compute((g.batch, g.kp, g.np_), patch_at, name="B_pad")
    c = te.compute((g.batch, g.mp, g.np_),
                   lambda bi, i, j: te.sum(a_pad[i, kk].astype(f32) * b_pad[bi, kk, j].astype(f32), axis=kk),
                   name="gemm")
    inputs = [data, weight]
    if config.op_type == "Fused_Convolution_Add_Relu":
        residual = te.placeholder(tuple(p["output_shape"]), f16, name="input2")
        inputs.append(residual)

    def epilogue(bi: Any, i: Any, j: Any) -> Any:
        value = c[bi, i, j]
        if config.op_type == "Fused_Convolution_Add_Relu":
            value = value + inputs[2][bi, i, j // ow, j % ow].astype(f32)
        if config.op_type != "Convolution":
            value = tirx.max(value, tirx.const(0, f32))
        return value.astype(f16)

    return inputs, te.compute((g.batch, g.m, g.n), epilogue, name="output0")


def plain_patches(config: OpConfig) -> bool:
    """A convolution whose patches are the input's own rows: 1x1, stride 1, no padding."""
    p = planar(config).params
    return (config.op_type in CONV_FAMILY and list(p["filter_shape"][2:]) == [1, 1]
            and list(p["window_movement_strides"]) == [1, 1] and list(p["padding_below_diff"]) == [0, 0]
            and list(p.get("padding_above_diff", [0, 0])) == [0, 0])


def _pad(tensor: Any, shape: tuple[int, int], name: str, k_axis: int) -> Any:
    """A matrix (or a batch of them: the leading axis kept) padded to `shape`: with zeros along K (axis `k_axis` of
    the two), which the sums run over. Along M or N, a padded row is a copy of the last one: it reaches only output
    rows (columns) the output stage drops, so it needs no test, and a row of K stays one vector (ViT's 197 tokens:
    16-byte copies)."""
    from tvm import te, tirx

    *batch, rows, cols = (int(d) for d in tensor.shape)
    if (rows, cols) == shape:
        return te.compute((*batch, *shape), lambda *at: tensor[at], name=name)
    k_padded = (rows, cols)[k_axis] != shape[k_axis]

    def value(*at: Any) -> Any:
        *b, i, j = at
        read = tensor[(*b, tirx.min(i, rows - 1) if rows != shape[0] else i,
                       tirx.min(j, cols - 1) if cols != shape[1] else j)]
        if not k_padded:
            return read
        return _selected(read, [i < rows] if k_axis == 0 else [j < cols])

    return te.compute((*batch, *shape), value, name=name)


def _selected(read: Any, conditions: list[Any]) -> Any:
    """An operand's element where `conditions` hold, else zero, from `read`: a load at an index clamped inside the
    tensor. A half's is behind no branch, the zero a select: behind a branch (if_then_else) each element of a
    gathered patch was a basic block of its own, and nvcc issued each load only after the store of the one before
    to shared memory waited for it (a global load's latency per element, 32 a thread in each round of k). A 4-byte
    element (TF32) keeps if_then_else: TVM copies it with a predicated cp.async, which waits for nothing."""
    from tvm import tirx

    zero = tirx.const(0, read.dtype)
    if read.dtype != "float16":
        return tirx.if_then_else(tirx.all(*conditions), read, zero)
    # the element's bits ANDed with all ones or none: an operand of the AND, the load is always issued (a Let did
    # the same, but MetaSchedule's flop estimate and features know no Let: tuning failed on every gathered patch)
    mask = tirx.Select(tirx.all(*conditions), tirx.const(0xFFFF, "uint16"), tirx.const(0, "uint16"))
    return tirx.reinterpret("float16", tirx.reinterpret("uint16", read) & mask)


# -- the schedule ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decisions:
    """A tiling: tiles of 16 along M and N as (blocks, warps, per warp), k steps of 16 as (rounds, per round), and
    the vector widths of A's and B's copies into shared memory (in halves)."""

    m: tuple[int, int, int]
    n: tuple[int, int, int]
    k: tuple[int, int]
    vector_a: int
    vector_b: int
    stages: int = 2  # shared buffers the rounds of k cycle through (1: not pipelined; 2: double; 3: triple)
    slices: int = 1  # warps a k round is split among (1: not sliced)


def vector_widths(config: OpConfig, operand: str) -> list[int]:
    """Halves an operand's copy into shared memory may move at once. A vector stays inside one row of the operand as
    it lies in memory, aligned: a row of K halves takes 8 only when K % 8 == 0. An operand padded along K or along
    its rows is copied one half at a time (its bounds test or clamp is per element), and so are a convolution's
    patches unless they are the input's own rows (a 1x1, stride-1, unpadded convolution)."""
    g = gemm_of(config)
    if g.kind == "conv" and operand == "B":
        row, padded_sizes = (g.n if plain_patches(config) else 1), ((g.k, g.kp), (g.n, g.np_))
    elif g.kind == "conv":
        row, padded_sizes = g.k, ((g.m, g.mp), (g.k, g.kp))
    elif operand == "A":  # (padded along M only, its rows are whole: `_pad` clamps the row index)
        row, padded_sizes = (g.m, ((g.m, g.mp), (g.k, g.kp))) if g.trans_a else (g.k, ((g.k, g.kp),))
    else:
        row, padded_sizes = (g.k, ((g.k, g.kp),)) if g.trans_b else (g.n, ((g.k, g.kp), (g.n, g.np_)))
    if any(size != padded_size for size, padded_size in padded_sizes):
        return [1]
    widths = (8, 2, 1) if element_type(config) == "float16" else (4, 2, 1)  # (4 halves: TVM's half4, not NNFusion's)
    return [w for w in widths if row % w == 0]


STAGES = (2, 3, 1)  # the design spaces' pipelines: double and triple buffered (cp.async), and none
SMS = 132  # an H100's (and H200's) multiprocessors: what the untuned tiling tries to keep busy
STATIC_SHARED = 48 * 1024  # bytes a block may declare (NNFusion gives no dynamic shared memory)


def default_decisions(config: OpConfig) -> Decisions:
    """An untuned tiling, from the H100's samples of ResNet-50's convolutions and BERT's Dots (docs/BENCHMARKS.md):
    warps of 2x2 tiles (32x32; 4x2 where the patches are gathered one by one); one warp a block unless the grid then
    holds several warps for every multiprocessor;
    k sliced among 2 or 4 warps when k is long (64 steps or more) and the tiles alone give fewer than two warps a
    multiprocessor (a 3x3 convolution on a 14x14 map: 4x faster sliced); rounds of 32 (each slice); pipelined; the
    widest copies. Where that grid has fewer blocks than the GPU has multiprocessors, each warp's tile is halved until
    it has one for each (_filling)."""
    first = _first_tiling(config)
    return _filling(config, first) or first


def _filling(config: OpConfig, d: Decisions) -> Decisions | None:
    """`d` with each warp's tile halved (the longer side first) until the grid has a block for every multiprocessor
    or a warp holds one 16x16 tile, one warp a block along M and N, the k slices kept; None where `d` fills the GPU
    already or the smaller tiling needs more than 48 KB. On an H100 (session 25, 19 of session 19's 33 fp16 ops
    concerned): a 3x3 convolution on a 7x7 map 158.6 -> 87.3 us, on 14x14 87.4 -> 46.2; the 33 ops' geomean over
    cuDNN/cuBLAS 1.653x -> 1.452x."""
    g = gemm_of(config)
    mt, nt, kt = g.mp // TILE, g.np_ // TILE, g.kp // K_STEP[element_type(config)]
    tm, tn = d.m[2], d.n[2]
    if (mt // tm) * (nt // tn) * g.batch >= SMS:
        return None
    while (mt // tm) * (nt // tn) * g.batch < SMS and (tm, tn) != (1, 1):
        if tm >= tn and tm > 1:
            tm = max(f for f in range(1, tm) if tm % f == 0 and mt % f == 0)
        else:
            tn = max(f for f in range(1, tn) if tn % f == 0 and nt % f == 0)
    steps = kt // d.slices
    chunk = _largest_divisor(steps, 2)
    filled = replace(d, m=(mt // tm, 1, tm), n=(nt // tn, 1, tn), k=(steps // chunk, chunk))
    return filled if filled != d and shared_bytes(config, filled) <= STATIC_SHARED else None


def _first_tiling(config: OpConfig) -> Decisions:
    g = gemm_of(config)
    mt, nt, kt = g.mp // TILE, g.np_ // TILE, g.kp // K_STEP[element_type(config)]
    gathered = vector_widths(config, "B") == [1]  # each patch gathered: more rows a warp reuse it (64 x 32)
    tm, tn = _largest_divisor(mt, 4 if gathered else 2), _largest_divisor(nt, 2)
    warps = mt // tm * (nt // tn) * g.batch
    slices = next((c for c in sorted(slice_counts(config), reverse=True) if kt // c >= 16), 1) \
        if kt >= 64 and warps < 2 * SMS else 1
    wm = _largest_divisor(mt // tm, 2) if warps >= 4 * SMS else 1
    wn = _largest_divisor(nt // tn, 2) if warps >= 2 * SMS else 1
    while True:
        steps = kt // slices
        chunk = _largest_divisor(steps, 2)
        decisions = Decisions((mt // tm // wm, wm, tm), (nt // tn // wn, wn, tn), (steps // chunk, chunk),
                              vector_widths(config, "A")[0], vector_widths(config, "B")[0], stages=2,
                              slices=slices)
        if shared_bytes(config, decisions) <= STATIC_SHARED or (tm, slices) == (1, 1):
            return decisions
        tm, slices = (tm // 2, slices) if tm > 2 or slices == 1 else (tm, slices // 2)  # over 48 KB: smaller


def shared_bytes(config: OpConfig, d: Decisions) -> int:
    """The static shared memory a tiling declares: A's and B's rounds (once a pipeline stage; rows padded as
    SHARED_ALIGN pads them) and, sliced, each slice's fp32 sums of the block's tile."""
    g = gemm_of(config)
    dtype = element_type(config)
    rows, cols, depth = TILE * d.m[1] * d.m[2], TILE * d.n[1] * d.n[2], K_STEP[dtype] * d.k[1] * d.slices

    def padded_row(elements: int, operand: str, transposed: bool) -> int:
        factor, offset = shared_align(config, operand, transposed)
        return -(-(elements - offset) // factor) * factor + offset if elements > offset else elements

    a = (depth * padded_row(rows, "A", True)) if g.trans_a else rows * padded_row(depth, "A", False)
    b = (cols * padded_row(depth, "B", True)) if g.trans_b else depth * padded_row(cols, "B", False)
    sums = d.slices * rows * cols * 4 if d.slices > 1 else 0
    return (a + b) * (2 if dtype == "float16" else 4) * d.stages + sums


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, cap + 1) if n % d == 0)


def design_space(sch: Any, config: OpConfig) -> list[Any]:
    """The op's design spaces: its schedule with the shared-memory stage pipelined (two or three buffers; cp.async
    where a copy moves 4 or 16 bytes at a time) or not, and with k sliced across warps or not."""
    spaces = []
    for stages in STAGES:
        for sliced in (False, True) if slice_counts(config) else (False,):
            each = sch.copy()
            schedule(each, config, stages=stages, sliced=sliced)
            spaces.append(each)
    return spaces


def schedule(sch: Any, config: OpConfig, decisions: Decisions | None = None, *, stages: int | None = None,
             sliced: bool | None = None) -> None:
    """Schedule the op's GEMM (`sch` of define()'s function) for mma.sync; decisions sampled unless given.

    Pipelined, each round of k copies a chunk ahead into the next of `stages` pairs of shared buffers
    (asynchronously where it can: cp.async) while the warps multiply the current one: with three, two rounds' loads
    are in flight behind the mma (a long k over few blocks: BERT's Dots). Sliced, the warps of a block split each
    round's k among them (`rfactor`): a product of few tiles and a long k (BERT's Dots, a 3x3 convolution on a 7x7
    map) gets more warps at work, and the slices' sums meet in shared memory, where the output stage adds them."""
    from core.codegen import mma

    mma.register()
    d = decisions
    stages = d.stages if stages is None and d is not None else (stages or 1)
    sliced = d.slices > 1 if sliced is None and d is not None else bool(sliced)
    g = gemm_of(config)
    gemm, out = sch.get_sblock("gemm"), sch.get_sblock("output0")
    a_pad, b_pad = sch.get_sblock("A_pad"), sch.get_sblock("B_pad")
    loops = sch.get_loops(gemm)
    batch, (i, j, k) = (loops[0] if g.batched else None), loops[-3:]
    i, i16 = sch.split(i, [None, TILE])
    j, j16 = sch.split(j, [None, TILE])
    dtype = element_type(config)
    k, k16 = sch.split(k, [None, K_STEP[dtype]])
    (bm, wm, tm), warps_m = _tiling(sch, i, d and d.m)
    (bn, wn, tn), warps_n = _tiling(sch, j, d and d.n)
    ks = []
    if sliced:  # at least two slices: one would change the loop structure a trace replays
        counts = slice_counts(config)
        slices = sch.sample_categorical(counts, [1 / len(counts)] * len(counts),
                                        decision=None if d is None else counts.index(d.slices))
        k, slice_loop = sch.split(k, [None, slices])
        ks = [slice_loop]
    k_tiles = sch.sample_perfect_tile(k, n=2, max_innermost_factor=MAX_K_CHUNK, decision=d and list(d.k))
    ko, ki = sch.split(k, k_tiles)
    sch.reorder(bm, bn, wm, wn, ko, *ks, ki, tm, tn, i16, j16, k16)
    if sliced:
        slice_sums = gemm
        gemm = sch.rfactor(ks[0], 0)  # gemm_rf[slice, i, j]: each slice's sum; the old block adds them up
        loops = sch.get_loops(gemm)  # rfactor gives the slices' block a loop nest of its own
        batch = loops[0] if batch is not None else None
        bm, bn, wm, wn, ko, *ks, ki, tm, tn, i16, j16, k16 = loops[-12:]
        sch.reorder(*ks, wm, wn, ko)
    block = sch.fuse(bm, bn)
    sch.bind(block, "blockIdx.x")
    if batch is not None:
        sch.bind(batch, "blockIdx.y")
    warp = sch.fuse(*ks, wm, wn)
    sch.bind(warp, "threadIdx.y")
    warps = [*([slices] if sliced else []), warps_m, warps_n]

    if sliced:  # fragments -> each slice's sums in shared memory -> the output stage adds the slices
        sch.set_scope(gemm, 0, "shared")
        store = sch.cache_write(gemm, 0, "warp")
        sch.transform_layout(gemm, ("write", 0), _sliced(tile_fragment, g))
        sch.reverse_compute_at(store, warp)
        _fragment_store(sch, store)
        _slices_added(sch, slice_sums, out, block, warps)
    else:
        sch.set_scope(gemm, 0, "warp")  # the accumulator lives in fragments; the output stage reads them
        sch.reverse_compute_at(out, warp)
        _fragment_epilogue(sch, out)

    for index, (pad, widths, chosen, operand) in enumerate(
            ((a_pad, vector_widths(config, "A"), d and d.vector_a, "A"),
             (b_pad, vector_widths(config, "B"), d and d.vector_b, "B"))):
        shared = sch.cache_read(gemm, index, "shared")
        sch.compute_inline(pad)
        sch.compute_at(shared, ko)
        width = sch.sample_categorical(widths, [1 / len(widths)] * len(widths),
                                       decision=None if chosen is None else widths.index(chosen))
        copy = sch.fuse(*sch.get_loops(shared)[-2:])
        _, *ys, tx, vec = sch.split(copy, [None, *warps, WARP, width])
        sch.bind(sch.fuse(*ys), "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        transposed = g.trans_a if operand == "A" else g.trans_b
        factor, offset = shared_align(config, operand, transposed)
        sch.storage_align(shared, 0, axis=-2, factor=factor, offset=offset)
        fragments = sch.cache_read(gemm, index, "warp")
        sch.compute_at(fragments, ki)
        layout = operand_layout(dtype, operand, transposed)
        r, c = sch.get_loops(fragments)[-2:]
        ro, ri = sch.split(r, [None, layout.rows])
        co, ci = sch.split(c, [None, layout.cols])
        sch.reorder(ro, co, ri, ci)
        batched = g.kind == "bmm" or (g.kind == "conv" and operand == "B")  # (a convolution's filter is shared)
        sch.transform_layout(fragments, ("write", 0), _batched(layout.tiled, g) if batched else layout.tiled)
        sch.tensorize(ri, ldmatrix_name(operand, transposed, dtype))
        _unroll(sch, ro, co)

    if stages > 1:  # (A's copy, B's copy, the k round's mma: the mma `stages - 1` rounds behind)
        sch.annotate(ko, "software_pipeline_stage", [0, 0, stages - 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
        sch.annotate(ko, "software_pipeline_async_stages", [0])
    if not sliced:  # (after the output stage is placed: its reads are then rewritten in the fragment layout)
        sch.transform_layout(gemm, ("write", 0), _batched(tile_fragment, g))
    init = sch.decompose_reduction(gemm, ko)
    _unroll(sch, *sch.get_loops(init)[-4:-2])
    sch.tensorize(sch.get_loops(init)[-2], FILL)
    _unroll(sch, ki, tm, tn)
    sch.tensorize(i16, mma_name(g.trans_a, g.trans_b, dtype))


def _tiling(sch: Any, loop: Any, decision: tuple[int, int, int] | None) -> tuple[list[Any], Any]:
    """A loop of 16-tiles split into (blocks, warps, tiles a warp holds): the tiles a warp holds sampled first, then
    the warps of a block, each at most MAX_WARP_TILES (a block of at most 16 x 16 warps along M and N, not the
    thousands of threads an unbounded middle factor gave: 52 of 59 samples of a BERT Dot were over the limits)."""
    per_warp = sch.sample_perfect_tile(loop, n=2, max_innermost_factor=MAX_WARP_TILES,
                                       decision=decision and [decision[0] * decision[1], decision[2]])
    outer, inner = sch.split(loop, per_warp)
    warps = sch.sample_perfect_tile(outer, n=2, max_innermost_factor=MAX_WARPS,
                                    decision=decision and [decision[0], decision[1]])
    blocks, warp = sch.split(outer, warps)
    return [blocks, warp, inner], warps[1]


def slice_counts(config: OpConfig) -> list[int]:
    """How many slices a sliced schedule may split k into: counts that divide its mma steps (16 deep, tf32's 8)."""
    steps = gemm_of(config).kp // K_STEP[element_type(config)]
    return [c for c in SLICES if steps % c == 0]


def _unroll(sch: Any, *loops: Any) -> None:
    """Unroll loops over fragments: a register array indexed by a loop nvcc keeps rolled lives in local memory."""
    for loop in loops:
        sch.unroll(loop)


def _batched(layout: Any, g: Gemm) -> Any:
    if not g.batched:
        return layout
    return lambda b, i, j: (b, *layout(i, j))


def _sliced(layout: Any, g: Gemm) -> Any:
    """The layout of a sliced accumulator: one fragment tile set per slice (and image or product)."""
    if not g.batched:
        return lambda s, i, j: (s, *layout(i, j))
    return lambda s, b, i, j: (s, b, *layout(i, j))


def _slices_added(sch: Any, slice_sums: Any, out: Any, block: Any, warps: list[Any]) -> None:
    """The block's threads add the slices' sums of each output element (kept in a register) and apply the output
    stage to it: one element a thread at a time, consecutive threads on consecutive columns."""
    from core.codegen.schedule import loop_kinds

    sch.set_scope(slice_sums, 0, "local")
    sch.reverse_compute_at(slice_sums, block)
    kinds = loop_kinds(sch, slice_sums)
    inner = next(n for n, (loop, _) in enumerate(kinds) if sch.get(loop).same_as(sch.get(block))) + 1
    spatial = [loop for loop, kind in kinds[inner:] if kind == "S"]
    reduce = [loop for loop, kind in kinds[inner:] if kind == "R"]
    sch.reorder(*spatial, *reduce)
    *_, ty, tx = sch.split(sch.fuse(*spatial), [None, *warps, WARP])
    threads = sch.get_loops(slice_sums)[-2 - len(warps):-1]
    sch.bind(sch.fuse(*threads[:-1]), "threadIdx.y")
    sch.bind(threads[-1], "threadIdx.x")
    sch.reverse_compute_at(out, threads[-1])
    _unroll(sch, *reduce)
    del ty, tx


def _fragment_store(sch: Any, store: Any) -> None:
    """The copy of a slice's fragments to its sums in shared memory, one 16x16 tile per store intrinsic."""
    from core.codegen.mma import STORE_SHARED

    rows, cols = sch.get_loops(store)[-2:]
    ro, ri = sch.split(rows, [None, TILE])
    co, ci = sch.split(cols, [None, TILE])
    sch.reorder(ro, co, ri, ci)
    sch.tensorize(ri, STORE_SHARED)
    _unroll(sch, ro, co)


def _fragment_epilogue(sch: Any, out: Any) -> None:
    """Loop the output stage (computed at the warp) over each 16x16 tile as lane x element of its fragment, so each
    thread reads only its own accumulator registers: row 8h + l, column 8h' + 2q + p of a tile is lane 4l + q,
    element 4h' + 2h + p (mma.fragment)."""
    rows, cols = sch.get_loops(out)[-2:]
    _, row_half, row_lane = sch.split(rows, [None, 2, 8])
    _, col_half, col_quad, col_pair = sch.split(cols, [None, 2, 4, 2])
    tiles = sch.get_loops(out)[-7:]
    sch.reorder(tiles[0], tiles[3], row_lane, col_quad, col_half, row_half, col_pair)
    sch.bind(sch.fuse(row_lane, col_quad), "threadIdx.x")
    for loop in (tiles[0], tiles[3], sch.fuse(col_half, row_half, col_pair)):
        sch.unroll(loop)

"""Tensor-core building blocks for TVM 0.27: kdb's own mma.sync intrinsics and the lowering that makes them fit a row.

The intrinsics (registered once per process, under kdb's names) are the warp-level ones a schedule of
core/codegen/tensorcore.py tensorizes with. Half: `ldmatrix` from *static* shared memory into warp fragments and
`mma.sync` m16n8k16 with an fp32 accumulator. TF32 (fp32 data, the tensor cores reading 19 bits of each value, as
cuDNN's default TF32 convolutions do): each lane loads its four fp32 operands from shared memory (ldmatrix moves
16-bit elements, and cannot transpose 32-bit ones) and rounds them to TF32, then `mma.sync` m16n8k8 .tf32.
Both: the accumulator's zero fill, and its store to shared memory for a sliced k. TVM registers the same kinds in
`tvm.s_tir.tensor_intrin.cuda`, but importing that module parses every intrinsic of every target (13 s here, 19 s
on the H200 host); these few parse in well under a second. A tensor-core kernel needs no store intrinsic: its
epilogue reads the accumulator fragment in registers (tensorcore.py), so the bias, Relu and bounds of the row are
applied before anything reaches memory.

`lowering()` is the compile every tensor-core kernel goes through (codegen, tuning builds): TVM 0.27's
LowerWarpMemory lowers only the first warp-scope buffer of a statement sequence (it breaks out after it), so a
kernel with three fragments kept two of them as a 32x larger array indexed by the lane (local memory); and its
common-subexpression pass hides ldmatrix's lane term in a let, where the warp pass cannot find it. The pipeline
here is TVM's own with CSE off, unrolling left to nvcc, and the warp pass run until no warp buffer is left.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

WARP = 32
TILE = 16  # the m and n of a fragment tile: two m16n8 mma.sync calls cover a 16x16 accumulator tile
K_STEP = {"float16": 16, "float32": 8}  # k of one mma.sync: m16n8k16 for half, m16n8k8 for tf32

PIPELINE = "kdb_tensorcore"


def fragment(i: Any, j: Any) -> tuple[Any, Any]:
    """(lane, element) of a 16x16 tile's (row, column) in an mma.sync fragment: the PTX ISA's m16n8k16 layout of
    the accumulator (and, as ldmatrix leaves them, of the A and B operands), two n8 halves side by side."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + 2 * (i // 8) + j % 2


def tile_fragment(i: Any, j: Any) -> tuple[Any, Any, Any, Any]:
    """A warp buffer's layout: (tile row, tile column, lane, element), for transform_layout."""
    return (i // TILE, j // TILE, *fragment(i % TILE, j % TILE))


def tf32_a(i: Any, k: Any) -> tuple[Any, Any]:
    """(lane, element) of A's (row, k) in a 16x8 tf32 fragment (PTX's m16n8k8 .tf32 A layout: a0..a3 at rows
    g, g+8 and k columns t%4, t%4+4 of lane 4g + t)."""
    return 4 * (i % 8) + k % 4, i // 8 + 2 * (k // 4)


def tf32_b(k: Any, j: Any) -> tuple[Any, Any]:
    """(lane, element) of B's (k, column) in an 8x16 tf32 fragment: two n8 halves, each b0, b1 at k rows t%4, t%4+4
    and column g of lane 4g + t."""
    return 4 * (j % 8) + k % 4, 2 * (j // 8) + k // 4


@dataclass(frozen=True)
class FragmentLayout:
    """How an operand's stored tile (in the order it lies in shared memory) sits in a warp fragment."""

    rows: int  # the stored tile's shape
    cols: int
    place: Any  # (stored row, stored column) -> (lane, element)
    elements: int  # per lane

    def tiled(self, r: Any, c: Any) -> tuple[Any, Any, Any, Any]:
        """A warp buffer's layout: (tile row, tile column, lane, element), for transform_layout."""
        return (r // self.rows, c // self.cols, *self.place(r % self.rows, c % self.cols))


def operand_layout(dtype: str, operand: str, transposed: bool) -> FragmentLayout:
    """The fragment layout of A or B (stored [m, k] / [k, n], or the other way round when transposed)."""
    if dtype == "float16":  # ldmatrix leaves a stored 16x16 tile as fragment() places it (TVM's convention)
        return FragmentLayout(TILE, TILE, fragment, 8)
    if operand == "A":
        return FragmentLayout(8, TILE, lambda k, i: tf32_a(i, k), 4) if transposed else FragmentLayout(
            TILE, 8, tf32_a, 4)
    return FragmentLayout(TILE, 8, lambda j, k: tf32_b(k, j), 4) if transposed else FragmentLayout(8, TILE, tf32_b, 4)


def ldmatrix_name(operand: str, transposed: bool, dtype: str = "float16") -> str:
    """The intrinsic that loads an operand's fragment: ldmatrix for half, lane loads for tf32."""
    kind = "ldmatrix_f16" if dtype == "float16" else "load_tf32"
    return f"kdb_{kind}_{operand.lower()}{'_t' if transposed else ''}"


def mma_name(trans_a: bool, trans_b: bool, dtype: str = "float16") -> str:
    kind = "f16f16f32" if dtype == "float16" else "tf32tf32f32"
    return f"kdb_mma_{kind}{'_ta' if trans_a else ''}{'_tb' if trans_b else ''}"


FILL = "kdb_mma_fill_f32"
STORE_SHARED = "kdb_mma_store_f32_shared"


@functools.cache
def register() -> None:
    """Register kdb's tensor intrinsics (once per process)."""
    from tvm.s_tir import TensorIntrin

    for operand in ("A", "B"):
        for transposed in (False, True):
            TensorIntrin.register(ldmatrix_name(operand, transposed), *_ldmatrix(operand, transposed), override=True)
    for trans_a in (False, True):
        for trans_b in (False, True):
            TensorIntrin.register(mma_name(trans_a, trans_b), *_mma(trans_a, trans_b), override=True)
            TensorIntrin.register(mma_name(trans_a, trans_b, "float32"), *_mma_tf32(trans_a, trans_b), override=True)
    for operand in ("A", "B"):
        for transposed in (False, True):
            TensorIntrin.register(ldmatrix_name(operand, transposed, "float32"), *_load_tf32(operand, transposed),
                                  override=True)
    TensorIntrin.register(FILL, *_fill(), override=True)
    TensorIntrin.register(STORE_SHARED, *_store_shared(), override=True)


def _ldmatrix(operand: str, transposed: bool) -> tuple[Any, Any]:
    """ldmatrix.x4 of one 16x16 half tile from static shared memory into a warp fragment.

    The shared tile is stored as the operand lies in memory: A as [m, k] ([k, m] transposed), B as [k, n] ([n, k]
    transposed). mma.sync takes A by rows and B by columns, so ldmatrix transposes an A stored [k, m] and a B
    stored [k, n] on the way (`.trans`). Each lane gives the address of one 8-half row of the four 8x8 matrices.
    A fragment is indexed as its operand is stored (fragment(row, column) of the stored tile, as TVM's own
    intrinsics index it); the mma intrinsic of the matching transposition reads it so (`_mma`)."""
    from tvm.script import tirx as T

    trans = transposed if operand == "A" else not transposed

    def row_address(tx: Any, stride: Any) -> Any:
        if transposed:  # rows 0-7 then 8-15 of each 8-column half: the order .trans / [n, k] want
            return stride * 8 * (tx // 16) + stride * (tx % 8) + 8 * ((tx % 16) // 8)
        return stride * (tx % 16) + 8 * (tx // 16)

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (16, 16), "float16", align=64, offset_factor=16, scope="shared")
        warp = T.match_buffer(warp_handle, (32, 8), "float16", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for ax0, ax1 in T.grid(16, 16):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    lane, element = T.meta_var(fragment(v0, v1))
                    T.reads(shared[v0, v1])
                    T.writes(warp[lane, element])
                    warp[lane, element] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (16, 16), "float16", align=64, offset_factor=16, scope="shared",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, 8), "float16", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:16])
            T.writes(warp[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(trans, 4, ".b16", warp.data, warp.elem_offset + 8 * tx,
                                                  shared.access_ptr("r"), row_address(tx, s0), dtype="float16"))

    return desc, impl


def _mma(trans_a: bool, trans_b: bool) -> tuple[Any, Any]:
    """C[16x16] += A[16x16] B[16x16] as two m16n8k16 mma.sync calls (half operands, fp32 accumulator)."""
    from tvm.script import tirx as T

    def a_at(i: Any, k: Any) -> tuple[Any, Any]:
        return fragment(*((k, i) if trans_a else (i, k)))

    def b_at(k: Any, j: Any) -> tuple[Any, Any]:
        return fragment(*((j, k) if trans_b else (k, j)))

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 8), "float16", align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (32, 8), "float16", align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:8], B[0:32, 0:8])
            T.writes(C[0:32, 0:8])
            for i, j, k in T.grid(16, 16, 16):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    c_lane, c_element = T.meta_var(fragment(vi, vj))
                    a_lane, a_element = T.meta_var(a_at(vi, vk))
                    b_lane, b_element = T.meta_var(b_at(vk, vj))
                    T.reads(C[c_lane, c_element], A[a_lane, a_element], B[b_lane, b_element])
                    T.writes(C[c_lane, c_element])
                    C[c_lane, c_element] = C[c_lane, c_element] + T.Cast("float32", A[a_lane, a_element]) * T.Cast(
                        "float32", B[b_lane, b_element])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 8), "float16", align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (32, 8), "float16", align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:8], B[0:32, 0:8])
            T.writes(C[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for half in T.unroll(2):  # the n8 halves of the tile: B's and C's elements 0-3, then 4-7
                    T.evaluate(T.ptx_legacy.mma(
                        "m16n8k16", "row", "col", "fp16", "fp16", "fp32",
                        A.data, A.elem_offset + tx * 8, B.data, B.elem_offset + tx * 8 + half * 4,
                        C.data, C.elem_offset + tx * 8 + half * 4, False, dtype="float32"))

    return desc, impl


def _load_tf32(operand: str, transposed: bool) -> tuple[Any, Any]:
    """A tf32 operand's fragment loaded from static shared memory: each lane its four fp32 values (32-bit loads)."""
    from tvm.script import tirx as T

    layout = operand_layout("float32", operand, transposed)
    rows, cols = layout.rows, layout.cols

    def stored(lane: Any, element: Any) -> tuple[Any, Any]:  # the inverse of layout.place
        if operand == "A":
            r, k = 8 * (element % 2) + lane // 4, 4 * (element // 2) + lane % 4
            return (k, r) if transposed else (r, k)
        k, c = 4 * (element % 2) + lane % 4, 8 * (element // 2) + lane // 4
        return (c, k) if transposed else (k, c)

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (rows, cols), "float32", align=64, offset_factor=1, scope="shared")
        warp = T.match_buffer(warp_handle, (32, 4), "float32", align=64, offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:32, 0:4])
            for ax0, ax1 in T.grid(rows, cols):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    lane, element = T.meta_var(layout.place(v0, v1))
                    T.reads(shared[v0, v1])
                    T.writes(warp[lane, element])
                    warp[lane, element] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_handle, (rows, cols), "float32", align=64, offset_factor=1, scope="shared",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (32, 4), "float32", align=64, offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:32, 0:4])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for element in T.unroll(4):
                    r, c = T.meta_var(stored(tx, element))
                    # rounded to TF32's 10 mantissa bits (cuDNN's cvt.rna): mma.sync truncates, and truncation's
                    # bias compounds over a network (ResNet-50: 1.6e-2 truncated)
                    warp[tx, element] = T.reinterpret("float32", (T.reinterpret("uint32", shared[r, c])
                                                                  + T.uint32(0x1000)) & T.uint32(0xFFFFE000))

    return desc, impl


def _mma_tf32(trans_a: bool, trans_b: bool) -> tuple[Any, Any]:
    """C[16x16] += A[16x8] B[8x16] as two m16n8k8 .tf32 mma.sync calls (fp32 operands read as tf32, fp32 sums)."""
    from tvm.script import tirx as T

    del trans_a, trans_b  # the lane loads placed a transposed operand's values as an untransposed one's

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 4), "float32", align=64, offset_factor=1, scope="warp")
        B = T.match_buffer(b, (32, 4), "float32", align=64, offset_factor=1, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:4], B[0:32, 0:4])
            T.writes(C[0:32, 0:8])
            for i, j, k in T.grid(16, 16, 8):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    c_lane, c_element = T.meta_var(fragment(vi, vj))
                    a_lane, a_element = T.meta_var(tf32_a(vi, vk))
                    b_lane, b_element = T.meta_var(tf32_b(vk, vj))
                    T.reads(C[c_lane, c_element], A[a_lane, a_element], B[b_lane, b_element])
                    T.writes(C[c_lane, c_element])
                    C[c_lane, c_element] = C[c_lane, c_element] + A[a_lane, a_element] * B[b_lane, b_element]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (32, 4), "float32", align=64, offset_factor=1, scope="warp")
        B = T.match_buffer(b, (32, 4), "float32", align=64, offset_factor=1, scope="warp")
        C = T.match_buffer(c, (32, 8), "float32", align=64, offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:32, 0:8], A[0:32, 0:4], B[0:32, 0:4])
            T.writes(C[0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for half in T.unroll(2):  # the n8 halves: B's elements 0-1 then 2-3, C's 0-3 then 4-7
                    T.evaluate(T.ptx_legacy.mma(
                        "m16n8k8", "row", "col", "tf32", "tf32", "fp32",
                        A.data, A.elem_offset + tx * 4, B.data, B.elem_offset + tx * 4 + half * 2,
                        C.data, C.elem_offset + tx * 8 + half * 4, False, dtype="float32"))

    return desc, impl


def _fill() -> tuple[Any, Any]:
    """A 16x16 fp32 accumulator tile set to zero."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (32, 8), "float32", scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:8])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("C_warp"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    lane, element = T.meta_var(fragment(i, j))
                    T.reads()
                    T.writes(C[lane, element])
                    C[lane, element] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (32, 8), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:32, 0:8])
            for _tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.cuda.mma_fill_legacy(8, C.data, C.elem_offset, dtype="float32"))

    return desc, impl


def uses_fragments(mod: Any) -> bool:
    """Whether a scheduled module keeps warp fragments (a buffer of scope "warp"), which need `lowering`."""
    import tvm_ffi
    from tvm import s_tir, tirx

    found = []

    def visit(block: Any) -> None:
        if any(buf.scope() == "warp" for buf in block.alloc_buffers):
            found.append(block)

    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)])
    return bool(found)


def _store_shared() -> tuple[Any, Any]:
    """A 16x16 fp32 accumulator tile stored to static shared memory, each lane its own 8 elements (a k slice's sums,
    which the block then adds up: core/codegen/tensorcore.py)."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def desc(c_warp: T.handle, c: T.handle) -> None:
        C_warp = T.match_buffer(c_warp, (32, 8), "float32", scope="warp")
        C = T.match_buffer(c, (16, 16), "float32", scope="shared")
        with T.sblock("root"):
            T.reads(C_warp[0:32, 0:8])
            T.writes(C[0:16, 0:16])
            for i0, i1 in T.grid(16, 16):
                with T.sblock("store"):
                    i, j = T.axis.remap("SS", [i0, i1])
                    lane, element = T.meta_var(fragment(i, j))
                    T.reads(C_warp[lane, element])
                    T.writes(C[i, j])
                    C[i, j] = C_warp[lane, element]

    @T.prim_func(s_tir=True)
    def impl(c_warp: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        C_warp = T.match_buffer(c_warp, (32, 8), "float32", scope="warp", offset_factor=1)
        C = T.match_buffer(c, (16, 16), "float32", scope="shared", offset_factor=1, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C_warp[0:32, 0:8])
            T.writes(C[0:16, 0:16])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                for element in T.unroll(8):  # fragment()'s inverse: the (row, column) of each lane's element
                    C[8 * (element % 4 // 2) + tx // 4, 8 * (element // 4) + tx % 4 * 2 + element % 2] = C_warp[
                        tx, element]

    return desc, impl


def _constant_async_waits(mod: Any) -> Any:
    """A pipeline of three or more stages ends in a loop whose cp.async wait counts groups still in flight by its
    loop variable ("1 - k"); PTX takes only an immediate, and that loop stays rolled (`#pragma unroll`, see below).
    Such a count becomes 0, wait for every group: the same result, only the last rounds overlap less."""
    import tvm_ffi
    from tvm import tirx

    def on_attr(node: Any, mutator: Any) -> Any:
        body = mutator.mutate(node.body)
        if node.attr_key == "async_wait_inflight_count" and not isinstance(node.value, tirx.IntImm):
            return tirx.AttrStmt(node.node, node.attr_key, tirx.IntImm("int32", 0), body)
        return node if body.same_as(node.body) else tirx.AttrStmt(node.node, node.attr_key, node.value, body)

    waited = mod.clone()
    for var, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            waited.update_func(var, func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.AttrStmt, on_attr)])))
    return waited


@functools.cache
def install_pipeline() -> str:
    """Register the tensor-core lowering as a named TVM pipeline (once per process); its name."""
    import tvm
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir import pipeline as s_tir_pipeline
    from tvm.tirx import compilation_pipeline

    def make() -> tuple[Any, Any, Any]:
        default, finalize_host, finalize_device = s_tir_pipeline.default_s_tir_pipeline()

        @tvm.transform.module_pass(opt_level=0)
        def lower(mod: Any, ctx: Any) -> Any:
            # Unrolled loops stay loops with `#pragma unroll` (nvcc unrolls them): unrolled in TIR, a fragment's
            # tile and element offsets fold into one constant the warp pass cannot split.
            config = {**ctx.config, "tirx.disable_cse_tir": True, "tirx.UnrollLoop": {"explicit_unroll": False},
                      "tirx.use_async_copy": True}
            with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config):
                return _constant_async_waits(default(mod))

        def finalize() -> Any:
            @tvm.transform.module_pass(opt_level=0)
            def every_warp_buffer(mod: Any, _ctx: Any) -> Any:
                for _ in range(8):  # one warp buffer a run (a kernel has three: A, B and the accumulator)
                    before, mod = mod, tirx.transform.LowerWarpMemory()(mod)
                    if tvm_ffi.structural_equal(before, mod):
                        break
                return finalize_device()(mod)

            return every_warp_buffer

        return lower, finalize_host, finalize

    compilation_pipeline.PIPELINE_MAP[PIPELINE] = make
    return PIPELINE

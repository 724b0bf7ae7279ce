"""A default GPU schedule that always yields exactly one kernel, for any op of te_ops.

Thread-per-output: every injective stage (padding, the ReLU/add tail) is inlined; the spatial loops of the
one reduction (of the output when there is none) are fused and split over blocks of threads; each thread
accumulates its output in a register over the reduction loops and writes it once through the epilogue.
Slow next to a tuned kernel, but correct, one kernel, and a valid starting point for tuning (see core/tuning).

Few outputs with a long reduction (a global pool, an M = 1 Dot, a conv on a small map) share each output's
reduction among several threads instead, summed across them by TVM's cross-thread reduction (_block_per_output): a
thread per output left the GPU nearly idle while each thread walked its whole reduction alone (issue 39: a global
AvgPool over 112x112 ran 161x cuDNN's time; measured on an H100 in bench/results/h100/session20).

Several reductions over the same rows (a softmax: each row's max, then its sum of exponentials, then the output)
take one block of threads per row (_block_per_row): each reduction is computed at the row, its value in shared
memory, the sum across the threads lowered by TVM; the element-wise stages between inline into their readers.

Loops are told apart by TVM's own block analysis: the iter type of the block var each loop feeds (data parallel or
reduction), read from the block's bindings.
"""

from __future__ import annotations

from typing import Any

from core.errors import InputError

THREADS = 128
# A reduction runs one output per block when it has at most this many outputs and a reduction this long or longer.
CROSS_THREAD_MAX_OUTPUTS = 16384
CROSS_THREAD_MIN_REDUCTION = 256
# An H100's multiprocessors: fewer blocks than this leave some idle. Fewer outputs than this take blocks of up to
# MAX_THREADS for their reductions; a pool's (or a sum's) short reduction over the innermost axis (a global pool of
# 7x7) still takes a warp per output where a thread per output would give fewer blocks of THREADS than this (issue
# 39, session 27 on an H100: a global AvgPool of 32x112x112 in blocks of 128 ran 5.31x PyTorch's mean, one of
# 2048x7x7 by thread 3.66x)
MULTIPROCESSORS = 132
MAX_THREADS = 1024
COLUMN_SPLIT = 8  # warps that split 32 neighbouring outputs' reductions (see _block_per_output)


def default_schedule(mod: Any, threads: int = THREADS, *, bind: bool = True) -> Any:
    """The scheduled IRModule (the function must be named main).

    bind=False leaves the block and thread loops serial: the same schedule, runnable on a CPU to check
    its math.
    """
    import tvm.s_tir as s_tir

    sch = s_tir.Schedule(mod)
    root = sch.get_sblock("root")
    outputs = list(sch.get_output_blocks(root))
    if len(outputs) != 1:
        raise InputError(f"the op writes {len(outputs)} outputs; a kernel-DB kernel has one")
    out = outputs[0]
    blocks = list(sch.get_child_blocks(root))
    reductions = [b for b in blocks if is_reduction(sch, b)]
    for block in reversed(blocks):  # consumers first, so each producer inlines into what is left
        if not _same(sch, block, out) and not any(_same(sch, block, r) for r in reductions):
            sch.compute_inline(block)
    if not reductions:  # (a scalar op has no loop: one of extent 1 to spread)
        _over_threads(sch, list(sch.get_loops(out)) or [sch.add_unit_loop(out)], threads, bind)
        return sch.mod
    if len(reductions) > 1:
        _block_per_row(sch, out, reductions, bind)
        return sch.mod
    red = reductions[0]
    if _same(sch, red, out):  # accumulate in a register; the new output block stores it once
        sch.cache_write(red, 0, "local")
        out = sch.get_output_blocks(root)[0]
    else:
        sch.set_scope(red, 0, "local")
    kinds = loop_kinds(sch, red)
    spatial = [loop for loop, kind in kinds if kind == "S"] or [sch.add_unit_loop(red)]
    reduce = [loop for loop, kind in kinds if kind == "R"]
    sch.reorder(*spatial, *reduce)
    if _few_long_reductions(sch, red, spatial, reduce) and _lowered_across_threads(sch, red):
        _block_per_output(sch, red, out, spatial, reduce, bind)
        return sch.mod
    thread_loop = _over_threads(sch, spatial, threads, bind)
    sch.reverse_compute_at(out, thread_loop)
    if reduce:
        sch.decompose_reduction(red, reduce[0])
    return sch.mod


def _extent(sch: Any, loops: list[Any]) -> int:
    extent = 1
    for loop in loops:
        extent *= int(sch.get(loop).extent)
    return extent


def _few_long_reductions(sch: Any, red: Any, spatial: list[Any], reduce: list[Any]) -> bool:
    outputs, length = _extent(sch, spatial), _extent(sch, reduce)
    if not reduce or outputs > CROSS_THREAD_MAX_OUTPUTS:
        return False
    return length >= CROSS_THREAD_MIN_REDUCTION or (
        length >= 32 and outputs < MULTIPROCESSORS * THREADS and len(sch.get(red).reads) == 1
        and _innermost_axis_is_reduced(sch, red))  # (a pool or a sum: one input; dots and convs are left as they are)


def _lowered_across_threads(sch: Any, block: Any) -> bool:
    """Whether TVM can lower this block's reduction across threads: it knows sum, product, min and max, not a
    reducer of our own (te_ops' max of halves, a Select: "No matched reducer", a half global MaxPool in session
    25's review), which keeps the thread-per-output schedule."""
    from tvm import tirx

    return not isinstance(sch.get(block).body.value, tirx.Select)


def reduction_threads(length: int, outputs: int = MULTIPROCESSORS) -> int:
    """Threads that share one output's reduction of `length`: whole warps, each thread summing at least 8 terms; up
    to THREADS, or MAX_THREADS where the outputs (a block each) are fewer than the GPU's multiprocessors."""
    limit = MAX_THREADS if outputs < MULTIPROCESSORS else THREADS
    threads = 32
    while threads < limit and threads * 2 * 8 <= length:
        threads *= 2
    return threads


def _block_per_output(sch: Any, red: Any, out: Any, spatial: list[Any], reduce: list[Any], bind: bool) -> None:
    """Few outputs, each summed by several threads, the sum across them lowered by TVM. Which threads share an
    output follows the layout of the largest operand, so that a warp reads consecutive elements: where its
    innermost axis is reduced (a global pool, x·Bᵀ), one output per block and the whole block walks the reduction
    (warp shuffles); where it is an output axis (x·B with B [K, N]), a warp takes 32 neighbouring outputs and
    COLUMN_SPLIT warps split the reduction (a sum in shared memory)."""
    outputs = sch.fuse(*spatial)
    reduction = sch.fuse(*reduce)
    if _innermost_axis_is_spatial(sch, red) and _extent(sch, [outputs]) >= 32:
        blocks, columns = sch.split(outputs, [None, 32])
        _, lanes = sch.split(reduction, [None, COLUMN_SPLIT])
        sch.reorder(blocks, columns, lanes)
        if bind:
            sch.bind(blocks, "blockIdx.x")
            sch.bind(columns, "threadIdx.x")
            sch.bind(lanes, "threadIdx.y")
        if not _same(sch, red, out):
            sch.reverse_compute_at(out, columns)
        return
    _, lanes = sch.split(reduction, [None, reduction_threads(_extent(sch, [reduction]), _extent(sch, [outputs]))])
    if bind:
        sch.bind(outputs, "blockIdx.x")
        sch.bind(lanes, "threadIdx.x")
    if not _same(sch, red, out):  # the epilogue (ReLU, the bias add) runs once per block, after the sum
        sch.reverse_compute_at(out, outputs)


def _block_per_row(sch: Any, out: Any, reductions: list[Any], bind: bool) -> None:
    """Rows (the output's leading axes) over blocks, the row's last axis over the block's threads; each reduction
    (a row's max, its sum) computed at the row by all its threads, kept in shared memory for the rest of the row."""
    loops = list(sch.get_loops(out))
    width = int(sch.get(loops[-1]).extent)
    for red in reductions:
        kinds = loop_kinds(sch, red)
        reduced, rows = ([loop for loop, kind in kinds if kind == want] for want in ("R", "S"))
        if kinds[-1][1] != "R" or _extent(sch, reduced) != width or _extent(sch, rows) != _extent(sch, loops[:-1]):
            raise InputError(f"{len(reductions)} reductions that are not each over the output's last axis: the "
                             "default schedule handles one reduction, or several over the same rows")
    row = sch.fuse(*loops[:-1]) if len(loops) > 1 else sch.add_unit_loop(out)
    threads = reduction_threads(width) if width >= CROSS_THREAD_MIN_REDUCTION else 32 * -(-min(width, THREADS) // 32)
    _, lanes = sch.split(loops[-1], [None, threads])
    if bind:
        sch.bind(row, "blockIdx.x")
        sch.bind(lanes, "threadIdx.x")
    for red in reversed(reductions):  # the last one first: compute_at needs its consumers placed
        sch.compute_at(red, row)
        sch.set_scope(red, 0, "shared")
        _, red_lanes = sch.split(sch.get_loops(red)[-1], [None, threads])
        if bind:
            sch.bind(red_lanes, "threadIdx.x")


def _innermost_axis_is_spatial(sch: Any, block: Any) -> bool:
    """Whether the largest buffer the block reads has, as its innermost axis of more than one element, one that
    only output (data-parallel) block vars index."""
    from tvm import tirx

    return _innermost_axis_only(sch, block, tirx.IterVar.DataPar)


def _innermost_axis_is_reduced(sch: Any, block: Any) -> bool:
    """... one that only reduction block vars index (a pool's window, x·Bᵀ's k; a conv's input row is indexed by
    both, and is neither)."""
    from tvm import tirx

    return _innermost_axis_only(sch, block, tirx.IterVar.CommReduce)


def _innermost_axis_only(sch: Any, block: Any, iter_type: Any) -> bool:
    from tvm.tirx.analysis import undefined_vars

    stmt = sch.get(block)
    kind = [iv.var for iv in stmt.iter_vars if iv.iter_type == iter_type]
    unit = [iv.var for iv in stmt.iter_vars if int(iv.dom.extent) == 1]  # (a global pool's output row and column)
    largest = max(stmt.reads, key=lambda r: _elements(r.source.shape))  # TVM 0.27: a region's buffer is .source
    for dim, axis in zip(reversed(list(largest.source.shape)), reversed(list(largest.region)), strict=True):
        if int(dim) == 1:
            continue
        used = [v for v in undefined_vars(axis.min) if not any(v.same_as(u) for u in unit)]
        return bool(used) and all(any(v.same_as(k) for k in kind) for v in used)
    return False


def _elements(shape: Any) -> int:
    n = 1
    for dim in shape:
        n *= int(dim)
    return n


def _over_threads(sch: Any, loops: list[Any], threads: int, bind: bool) -> Any:
    """Fuse the loops, split them over blocks of `threads` threads; the thread loop."""
    bx, tx = sch.split(sch.fuse(*loops), [None, threads])
    if bind:
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    return tx


def _same(sch: Any, a: Any, b: Any) -> bool:
    return bool(sch.get(a).same_as(sch.get(b)))


def is_reduction(sch: Any, block: Any) -> bool:
    from tvm import tirx

    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def loop_kinds(sch: Any, block: Any) -> list[tuple[Any, str]]:
    """Each loop above the block with its kind: "S" when it feeds only data-parallel block vars (or
    none), "R" when it feeds only reduction block vars. InputError for a loop that feeds both."""
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars
    from tvm_ffi import get_global_func

    realize = get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    feeds = [(iv.iter_type, undefined_vars(value))
             for iv, value in zip(sch.get(block).iter_vars, realize.iter_values, strict=True)]
    out = []
    for loop in sch.get_loops(block):
        var = sch.get(loop).loop_var
        types = {iter_type for iter_type, used in feeds if any(v.same_as(var) for v in used)}
        if types - {tirx.IterVar.DataPar, tirx.IterVar.CommReduce} or len(types) > 1:
            raise InputError(f"loop {var} of block {sch.get(block).name_hint} mixes spatial and reduction "
                             "axes (or feeds an opaque one): the default schedule cannot split it")
        out.append((loop, "R" if types == {tirx.IterVar.CommReduce} else "S"))
    return out


def launch_dims(mod: Any) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(gridDim, blockDim) of the scheduled function: the extents of its thread-bound loops and launches."""
    import tvm_ffi
    from tvm import tirx

    dims = {"blockIdx": [1, 1, 1], "threadIdx": [1, 1, 1]}

    def note(tag: str, extent: Any) -> None:
        kind, _, axis = tag.partition(".")
        if kind in dims and axis in ("x", "y", "z") and isinstance(extent, tirx.IntImm):
            i = "xyz".index(axis)
            dims[kind][i] = max(dims[kind][i], int(extent))

    def visit_for(node: Any) -> None:
        if node.kind == tirx.ForKind.THREAD_BINDING and node.thread_binding is not None:
            note(node.thread_binding.thread_tag, node.extent)

    def visit_attr(node: Any) -> None:
        if node.attr_key == "thread_extent":
            note(node.node.thread_tag, node.value)

    tvm_ffi.structural_walk(mod["main"].body, [(tirx.For, visit_for), (tirx.AttrStmt, visit_attr)])
    g, b = dims["blockIdx"], dims["threadIdx"]
    return (g[0], g[1], g[2]), (b[0], b[1], b[2])

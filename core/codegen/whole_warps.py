"""Pad a scheduled kernel's partial last warp in the schedule, so TVM writes the guards and the barriers stay aligned.

A row whose 1-D block ends in a partial warp and that has barriers must be padded to whole warps, or BlockFusion
can hang it (core/cuda/warps.py). Padding the CUDA text afterwards parks the padding threads in a guard and turns
every `__syncthreads()` into the non-aligned `barrier.sync`; ptxas then wraps the code between barriers in
collective regions, and on the H200 such a row ran 3x its tuning record (docs/BENCHMARKS-HISTORY.md, twelfth session).

Here the padding happens in TIR instead, before TVM lowers the module: every threadIdx.x loop of the block's
extent N gets the whole-warp extent, and every innermost block under it the predicate `threadIdx.x < N`. That is
the form TVM itself gives a loop split by a factor that does not divide it: each store is guarded, the barriers
TVM inserts stay outside the guards, reached by every thread of the block at the same instruction. The math is
unchanged: the padding threads compute and store nothing.

The same function serves the tuner's builds and the generation of the row, so a record is timed in the form its
row will have. Modules it cannot pad safely are returned as they are (the text padding then applies).
"""

from __future__ import annotations

from typing import Any

WARP = 32
THREAD_X = "threadIdx.x"
_SHARED = ("shared", "shared.dyn")
_COMM_REDUCE = 2  # IterVar.iter_type of a reduction axis


class _CannotPad(Exception):
    """The module has a shape this padding does not handle (the reason is the message)."""


def whole_warp_module(mod: Any) -> Any:
    """`mod` with its partial last warp padded in the schedule, or `mod` itself when it has no partial warp,
    no shared memory (hence no barriers) or a shape `pad_threads` cannot pad."""
    threads = partial_warp_threads(mod)
    if threads is None:
        return mod
    try:
        return pad_threads(mod, threads)
    except _CannotPad:
        return mod


def partial_warp_threads(mod: Any) -> int | None:
    """The block's thread count when a padding is due: a 1-D block that is not whole warps, in a kernel that
    stages data in shared memory (so TVM puts barriers in it). None otherwise."""
    from core.codegen.schedule import launch_dims

    if "main" not in mod:
        return None
    _grid, (x, y, z) = launch_dims(mod)
    if (y, z) != (1, 1) or x % WARP == 0 or not _uses_shared_memory(mod["main"]):
        return None
    return x


def pad_threads(mod: Any, threads: int) -> Any:
    """The module with every threadIdx.x loop of `threads` iterations run by whole warps, each innermost block
    under one guarded by `threadIdx.x < threads`. _CannotPad when a thread loop of another extent, a block
    outside every thread loop, or a reduction across threads (its lowering has its own thread count) is found."""
    import tvm_ffi
    from tvm import tirx
    from tvm.s_tir import SBlockRealize

    padded = -(-threads // WARP) * WARP
    enclosing: list[Any] = []  # the threadIdx.x loop vars around the node being mutated, innermost last
    # Why it cannot pad. Noted, not raised: an exception crossing TVM's FFI comes back as a RuntimeError.
    problems: list[str] = []

    def on_for(node: Any, mutator: Any) -> Any:
        binding = node.thread_binding
        if node.kind != tirx.ForKind.THREAD_BINDING or binding is None or binding.thread_tag != THREAD_X:
            return mutator.default_mutate(node)
        if not (isinstance(node.extent, tirx.IntImm) and node.extent.value == threads):
            problems.append(f"a {THREAD_X} loop of {node.extent} iterations, not {threads}")
            return node
        enclosing.append(node.loop_var)
        try:
            body = mutator.mutate(node.body)
        finally:
            enclosing.pop()
        return tirx.For(node.loop_var, node.min, tirx.IntImm(node.extent.ty, padded), node.kind, body, binding,
                        node.annotations)

    def on_realize(node: Any, mutator: Any) -> Any:
        if _has_child_block(node.block):
            return mutator.default_mutate(node)
        if not enclosing:
            problems.append(f"block {node.block.name_hint} runs outside every {THREAD_X} loop")
            return node
        thread = enclosing[-1]
        if _reduces_across(node, thread):
            problems.append(f"block {node.block.name_hint} reduces across threads")
            return node
        guard = thread < threads
        predicate = node.predicate
        always = isinstance(predicate, tirx.IntImm) and predicate.value == 1
        return SBlockRealize(node.iter_values, guard if always else tirx.And(predicate, guard), node.block)

    func = mod["main"]
    body = tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for), (SBlockRealize, on_realize)])
    if problems:
        raise _CannotPad(problems[0])
    padded_mod = mod.clone()
    padded_mod.update_func(mod.get_global_var("main"), func.with_body(body))
    return padded_mod


def _uses_shared_memory(func: Any) -> bool:
    import tvm_ffi
    from tvm.s_tir import SBlock

    scopes: list[str] = []
    tvm_ffi.structural_walk(func.body, [(SBlock, lambda b: scopes.extend(buf.scope() for buf in b.alloc_buffers))])
    return any(scope in _SHARED for scope in scopes)


def _has_child_block(block: Any) -> bool:
    import tvm_ffi
    from tvm.s_tir import SBlockRealize

    found: list[Any] = []
    tvm_ffi.structural_walk(block.body, [(SBlockRealize, found.append)])
    return bool(found)


def _reduces_across(realize: Any, thread: Any) -> bool:
    """Whether a reduction axis of the block is bound to the thread loop (a cross-thread reduction)."""
    import tvm_ffi
    from tvm import tirx

    used: list[Any] = []

    def note(var: Any) -> None:
        if var.same_as(thread):
            used.append(var)

    for axis, value in zip(realize.block.iter_vars, realize.iter_values, strict=True):
        if axis.iter_type == _COMM_REDUCE:
            tvm_ffi.structural_walk(value, [(tirx.Var, note)])
    return bool(used)

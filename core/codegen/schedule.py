"""A default GPU schedule that always yields exactly one kernel, for any op of te_ops.

Thread-per-output: every injective stage (padding, the ReLU/add tail) is inlined, the output's loops
are fused and split over blocks of threads, and the one reduction (if any) is computed per thread into
a register right where the output is written. Slow next to a tuned kernel, but correct, one kernel,
and a valid starting point for tuning (see core/tuning).
"""

from __future__ import annotations

import re
from typing import Any

from core.errors import InputError

THREADS = 128
# MetaSchedule's bindings carry annotations after the thread (`..., thread="blockIdx.x", annotations={...})`).
_BINDING = re.compile(r'T\.thread_binding\((?:\d+,\s*)?(\d+),\s*thread="(blockIdx|threadIdx)\.([xyz])"')
_LAUNCH = re.compile(r'T\.launch_thread\("(blockIdx|threadIdx)\.([xyz])",\s*(\d+)\)')


def default_schedule(mod: Any, threads: int = THREADS) -> Any:
    """The scheduled IRModule (the function must be named main)."""
    import tvm.s_tir as s_tir

    sch = s_tir.Schedule(mod)
    root = sch.get_sblock("root")
    blocks = list(sch.get_child_blocks(root))
    outputs = list(sch.get_output_blocks(root))
    if len(outputs) != 1:
        raise InputError(f"the op writes {len(outputs)} outputs; a kernel-DB kernel has one")
    out = outputs[0]
    reductions = [b for b in blocks if _is_reduction(sch, b)]
    if len(reductions) > 1:
        raise InputError(f"{len(reductions)} reductions: the default schedule handles one")
    for block in reversed(blocks):
        if not sch.get(block).same_as(sch.get(out)) and block not in reductions:
            sch.compute_inline(block)
    if reductions and sch.get(reductions[0]).same_as(sch.get(out)):
        sch.cache_write(out, 0, "local")  # accumulate in a register, then one store
        out = sch.get_output_blocks(root)[0]
    fused = sch.fuse(*sch.get_loops(out))
    bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    for red in reductions:
        sch.compute_at(red, tx)
        sch.set_scope(red, 0, "local")
        loops = sch.get_loops(red)
        first_reduce = next(i for i, lp in enumerate(loops) if _loop_is_reduction(sch, red, lp))
        sch.decompose_reduction(red, loops[first_reduce])
    return sch.mod


def _is_reduction(sch: Any, block: Any) -> bool:
    return any(iv.iter_type == 2 for iv in sch.get(block).iter_vars)  # 2: CommReduce


def _loop_is_reduction(sch: Any, block: Any, loop: Any) -> bool:
    """Whether the loop feeds a reduction axis of the block (a loop over a reduction iter var)."""
    realize_vars = {str(v) for v in _reduction_loop_vars(sch, block)}
    return str(sch.get(loop).loop_var) in realize_vars


def _reduction_loop_vars(sch: Any, block: Any) -> list[Any]:
    from tvm.s_tir import analysis  # noqa: F401 - keeps the TVM version check in one place

    script = sch.mod.script()
    name = sch.get(block).name_hint
    # In the script, the block's axis bindings read: v_rc, v_ry = T.axis.remap("RR", [rc, ry]) or
    # T.axis.reduce(extent, loop_var).
    chunk = script[script.index(f'T.sblock("{name}")'):]
    chunk = chunk[: chunk.index("T.reads") if "T.reads" in chunk else len(chunk)]
    out = []
    for kinds, names in re.findall(r'T\.axis\.remap\("([SR]+)",\s*\[([^\]]*)\]\)', chunk):
        for kind, var in zip(kinds, [n.strip() for n in names.split(",")], strict=False):
            if kind == "R":
                out.append(var)
    out += re.findall(r"T\.axis\.reduce\([^,]+,\s*([A-Za-z_]\w*)", chunk)
    return out


def launch_dims(mod: Any) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(gridDim, blockDim) of the scheduled function, read from its thread bindings."""
    script = mod.script()
    dims = {"blockIdx": [1, 1, 1], "threadIdx": [1, 1, 1]}
    axis = {"x": 0, "y": 1, "z": 2}
    for extent, tag, ax in _BINDING.findall(script):
        dims[tag][axis[ax]] = max(dims[tag][axis[ax]], int(extent))
    for tag, ax, extent in _LAUNCH.findall(script):
        dims[tag][axis[ax]] = max(dims[tag][axis[ax]], int(extent))
    g, b = dims["blockIdx"], dims["threadIdx"]
    return (g[0], g[1], g[2]), (b[0], b[1], b[2])

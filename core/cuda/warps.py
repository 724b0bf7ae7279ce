"""Blocks of whole warps, so a kernel with barriers survives NNFusion's BlockFusion.

In a BlockFusion group every block kernel runs with the group's largest blockDim. NNFusion parks a kernel's
extra threads at the top of its block function, `if (thread_id >= N) { for (K) __syncthreads(); return; }`.
When N is not a multiple of 32, threads N..(next 32) share a warp with real threads that meet their barriers
at other instructions. `__syncthreads()` is PTX's *aligned* barrier (every thread of a warp at the same
instruction), so this is undefined: on the H200 ResNet-18 compiled with tuned 56-thread kernels hung in the
first such group (bench/h200_network.sh, 2026-12-03; bench/cuda/partial_warp_barrier.cu isolates it).

The row therefore declares its block padded to whole warps (NNFusion's guard then parks only whole warps),
its own guard parks the padding threads, and every barrier of the row is the non-aligned `barrier.sync 0`,
which threads of one warp may reach at different instructions. The barrier count is unchanged.

Kernels our own tuner generates never get here: they are padded in the schedule, before TVM writes them
(core/codegen/whole_warps.py), which keeps the aligned barriers. This text padding is for kernels from elsewhere.
"""

from __future__ import annotations

import re

from core.cuda.source import mask

WARP = 32
NON_ALIGNED_BARRIER = 'asm volatile("barrier.sync 0;" ::: "memory")'
_SYNCTHREADS = re.compile(r"\b__syncthreads\s*\(\s*\)")
# The padding threads' guard, and the pattern that finds it again (one text: they cannot drift apart).
_GUARD_TEXT = ("if (threadIdx.x >= {threads}) {{ for (int kdb_b = 0; kdb_b < {barriers}; ++kdb_b) "
               + NON_ALIGNED_BARRIER.replace("{", "{{").replace("}", "}}") + "; return; }}\n")
_GUARD = re.compile(re.escape(_GUARD_TEXT.format(threads="THREADS", barriers="BARRIERS"))
                    .replace("THREADS", r"(\d+)").replace("BARRIERS", r"\d+"))


def warp_padded_block(block: tuple[int, int, int], barriers: int) -> tuple[int, int, int] | None:
    """The block padded to whole warps when the kernel needs it (barriers and a partial last warp), else None.

    Only 1-D blocks: padding x of a 2-D block would renumber its threads (lint reports those)."""
    x, y, z = block
    if barriers <= 0 or (y, z) != (1, 1) or x % WARP == 0:
        return None
    return (-(-x // WARP) * WARP, 1, 1)


def pad_body(body: str, threads: int, barriers: int) -> str:
    """`body` for a block padded past `threads`: the padding threads take the kernel's `barriers` barriers and
    leave; every `__syncthreads()` (outside comments and strings) becomes the non-aligned barrier."""
    masked = mask(body)
    pieces, pos = [], 0
    for m in _SYNCTHREADS.finditer(masked):
        pieces += [body[pos:m.start()], NON_ALIGNED_BARRIER]
        pos = m.end()
    pieces.append(body[pos:])
    return _GUARD_TEXT.format(threads=threads, barriers=barriers) + "".join(pieces)


def unpad_body(body: str) -> tuple[str, int] | None:
    """The kernel's own body and thread count back from a padded one (None if it is not padded), so an
    exported row injects again to the same row."""
    guard = _GUARD.search(body)
    if guard is None:
        return None
    plain = body[:guard.start()] + body[guard.end():]
    return plain.replace(NON_ALIGNED_BARRIER, "__syncthreads()"), int(guard.group(1))


def partial_warp_barriers(block: object, barriers: object, body: object) -> bool:
    """A stored row whose blockDim ends in a partial warp and whose body uses the aligned barrier: the kind of
    row that can hang inside a BlockFusion group."""
    if not (isinstance(block, list) and len(block) == 3 and all(isinstance(d, int) for d in block)):
        return False
    threads = block[0] * block[1] * block[2]
    return (isinstance(barriers, int) and barriers > 0 and threads % WARP != 0 and isinstance(body, str)
            and _SYNCTHREADS.search(mask(body)) is not None)

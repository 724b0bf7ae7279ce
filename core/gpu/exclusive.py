"""One timer on the GPU at a time, across processes.

Verification runs in several GPU children at once (its cost is the CPU's float64 reference), and a tuning
queue measures candidates while the previous op's kernels are verified. A kernel launched beside a timed one
shares its SMs and its memory bandwidth, so every launch that is timed, and every launch that could land beside
a timed one, holds this lock: an advisory `flock` on a file in the state dir, released by the kernel when the
holder dies. Work on the CPU (compiling, references, comparisons) runs outside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.processes import file_lock

LOCK_ENV = "KDB_GPU_LOCK"  # set by a parent for its GPU children and measuring processes
# A GPU child's phase message before it asks for the lock: its parent's clock for a hung kernel starts only
# once the lock is held (the child says "gpu").
WAITING = "waiting for the GPU"


def lock_path() -> Path:
    configured = os.environ.get(LOCK_ENV)
    if configured:
        return Path(configured)
    from core.db.state import state_dir

    return state_dir() / "gpu0.lock"


@contextmanager
def gpu_exclusive() -> Iterator[None]:
    """Hold the GPU for launches that must not overlap another process's timed ones."""
    with file_lock(lock_path()):
        yield

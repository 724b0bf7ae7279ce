"""One timer on the GPU at a time, across processes.

Verification runs in several GPU children at once (its cost is the CPU's float64 reference), and a tuning
queue measures candidates while the previous op's kernels are verified. A kernel launched beside a timed one
shares its SMs and its memory bandwidth, so every launch that is timed, and every launch that could land beside
a timed one, holds this lock: an advisory `flock` on a file in the state dir, released by the kernel when the
holder dies. Work on the CPU (compiling, references, comparisons) runs outside it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    path = lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

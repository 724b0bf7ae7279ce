"""Child processes started from any host, a terminal UI included."""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any


def _has_descriptor(stream: Any) -> bool:
    try:
        return stream is not None and stream.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        return False


def spawn_context() -> SpawnContext:
    """multiprocessing's spawn context, safe where sys.stderr has no file descriptor.

    The first spawn starts multiprocessing's resource tracker and hands it sys.stderr's descriptor. A host that
    replaced sys.stderr (Textual's capture answers -1) makes that, and so every process pool, fail with
    "bad value(s) in fds_to_keep". Start the tracker first, pointed at the process's real stderr (or devnull).
    """
    if not _has_descriptor(sys.stderr):
        from multiprocessing import resource_tracker

        host_stderr = sys.stderr
        fallback = sys.__stderr__ if _has_descriptor(sys.__stderr__) else open(os.devnull, "w")  # noqa: SIM115
        sys.stderr = fallback
        try:
            resource_tracker.ensure_running()
        finally:
            sys.stderr = host_stderr
            if fallback is not sys.__stderr__:
                fallback.close()
    return multiprocessing.get_context("spawn")


def exit_with_parent(parent_pid: int) -> None:
    """Pool worker initializer: the worker dies with the process that started it.

    Without it a `kdb inject --workers N` killed with SIGKILL leaves its workers blocked on the task queue for
    good (seen: still there minutes later). Linux's parent-death signal is tied to the thread that spawned the
    worker, so a pool using this must be fed from one thread (the injector's is).
    """
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os._exit(1)


def kill_group(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """Kill a child started with start_new_session=True and everything it started (nvcc's cicc and ptxas, an
    RPC server's workers), then reap it, draining its pipes so it cannot block on a full one."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=timeout_s)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory `flock` on `path` (created if missing) for the block, across processes; the
    kernel releases it if the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock

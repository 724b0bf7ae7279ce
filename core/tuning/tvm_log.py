"""TVM's own output, kept in a file: MetaSchedule's task tables and XGBoost lines (Python logging on stdout),
the C++ runtime's warnings ("Unknown schedule rule", on stderr) and whatever the build and measuring
processes print. They write to the process's file descriptors 1 and 2, below anything Python could redirect,
so the capture swaps the descriptors themselves: the caller prints to the streams it is handed, which are
the original ones.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from core.db.state import state_dir

ECHO_POLL_S = 0.2


def new_log_path(kind: str = "tune") -> Path:
    folder = state_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@dataclass
class Captured:
    path: Path
    stdout: TextIO  # the process's stdout and stderr as they were before the capture
    stderr: TextIO
    echo: Callable[[str], None] | None = None  # with echo on: gets each line of the log (default: to stderr)

    def show(self, line: str) -> None:
        if self.echo is not None:
            self.echo(line)
        else:
            print(line, file=self.stderr)


@contextlib.contextmanager
def capture_output(path: Path, *, echo: bool = False) -> Iterator[Captured]:
    """Send fds 1 and 2 to `path` (appending) until the block ends; with `echo`, each line also goes to the
    yielded Captured's `show` as it lands (set its `echo` to print it your way)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    stdout = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    stderr = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    captured = Captured(path, stdout, stderr)
    stop = threading.Event()
    follower = threading.Thread(target=_follow, args=(path, captured.show, stop), daemon=True) if echo else None
    if follower is not None:
        follower.start()
    try:
        yield captured
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        stop.set()
        if follower is not None:
            follower.join(timeout=5)
        stdout.close()
        stderr.close()


def _follow(path: Path, echo: Callable[[str], None], stop: threading.Event) -> None:
    """Hand each complete line written to the file to `echo` (like tail -f), until stopped and drained."""
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(0, os.SEEK_END)
        pending = ""
        while True:
            stopping = stop.is_set()
            pending += f.read()
            *lines, pending = pending.split("\n")
            for line in lines:
                if line.strip():
                    echo(line)
            if stopping:
                if pending.strip():
                    echo(pending)
                return
            stop.wait(ECHO_POLL_S)

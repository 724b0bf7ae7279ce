"""End to end: the real `kdb` command in a real terminal (tmux), driven by keys, read off the screen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO
from console_helpers import build_small_db

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


def screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def wait_until_screen(session: str, shows: Callable[[str], bool], what: str, timeout: float = 120.0) -> str:
    """Poll the screen until `shows` holds; the bound only ends a wait that never would (a loaded 2-core CI
    machine)."""
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        shown = screen(session)
        if shows(shown):
            return shown
        time.sleep(0.2)
    raise AssertionError(f"{what} never came; the screen shows:\n{shown}")


def wait_for(session: str, text: str) -> str:
    return wait_until_screen(session, lambda shown: text in shown, f"{text!r} on the screen")


def wait_gone(session: str, text: str) -> str:
    return wait_until_screen(session, lambda shown: text not in shown, f"{text!r} off the screen")


def keys(session: str, *sequence: str) -> None:
    """Send keys; a key whose effect the next one needs is followed by a wait for that effect on the screen,
    never by a pause (a lone Escape, say, is read as Alt+key if the next key reaches the app with it)."""
    for key in sequence:
        subprocess.run(["tmux", "send-keys", "-t", session, key], check=True)


def test_kdb_in_a_terminal(tmp_path: Path):
    db = build_small_db(tmp_path / "kernel_cache.db")
    session = f"kdb-e2e-{os.getpid()}"
    env = {"KDB_STATE_DIR": os.environ["KDB_STATE_DIR"], "KDB_CONFIG": os.environ["KDB_CONFIG"], "TERM": "xterm-256color"}
    command = " ".join([f"{k}={v}" for k, v in env.items()] + [sys.executable, "-m", "console.entry", "console",
                                                              "--db", str(db)])
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", "-c", str(REPO), command],
                   check=True)
    subprocess.run(["tmux", "resize-window", "-t", session, "-x", "200", "-y", "50"], capture_output=True)
    try:
        wait_for(session, "rows 1-11 of 11")  # the 10 demo kernels and the CUDA twin of the fused one
        keys(session, "/")
        wait_gone(session, "3 Failures")  # the filter has the focus: the footer shows its keys alone
        keys(session, "D", "o", "t")
        wait_for(session, "of 2 ")
        keys(session, "Escape")
        wait_for(session, "3 Failures")  # the table has the focus again
        keys(session, "3")  # the Failures view
        wait_for(session, "barriers")
        keys(session, "1")  # back to Kernels, its filter kept
        wait_for(session, "rows 1-2 of 2")
        keys(session, "?")  # help
        wait_for(session, "command palette")
        keys(session, "Escape")
        wait_gone(session, "command palette")
        keys(session, "q")
        deadline = time.monotonic() + 60
        while subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "kdb did not quit on q:\n" + screen(session)
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)

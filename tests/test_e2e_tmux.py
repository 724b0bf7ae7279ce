"""End to end: the real `kdb` command in a real terminal (tmux), driven by keys, read off the screen."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO
from console_helpers import build_small_db

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
# A tmux server of this run's own: two test runs at once (CI and a developer's) shared the default one, and one's
# windows took the other's size
TMUX = ["tmux", "-L", f"kdb-e2e-{os.getpid()}"]
# The window's size, said to the app too: a test process may carry COLUMNS=80 LINES=24 (set under pytest), which the
# pane inherits and the app would take over the window's own size
WINDOW = {"COLUMNS": "200", "LINES": "50"}


def screen(session: str) -> str:
    return subprocess.run([*TMUX, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


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
        subprocess.run([*TMUX, "send-keys", "-t", session, key], check=True)


@contextlib.contextmanager
def kdb_console(session: str, db: Path, state_dir: str, config: str) -> Iterator[None]:
    """`kdb console --db DB` in a tmux window of WINDOW's size, with this state dir and settings; killed at the end."""
    env = {"KDB_STATE_DIR": state_dir, "KDB_CONFIG": config, "TERM": "xterm-256color", **WINDOW}
    command = " ".join([f"{k}={v}" for k, v in env.items()] + [sys.executable, "-m", "console.entry", "console",
                                                              "--db", str(db)])
    subprocess.run([*TMUX, "new-session", "-d", "-s", session, "-x", WINDOW["COLUMNS"], "-y", WINDOW["LINES"],
                    "-c", str(REPO), command], check=True)
    subprocess.run([*TMUX, "resize-window", "-t", session, "-x", WINDOW["COLUMNS"], "-y", WINDOW["LINES"]],
                   capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*TMUX, "kill-session", "-t", session], capture_output=True)


EMPTY_DIALOG_FIELD = re.compile(r"█\s+▊\s+▎\s+█")


def clear_field(session: str) -> None:
    """ctrl+u in a dialog's text field until the field shows empty. Keys that come before the new dialog has mounted
    its field are lost (Textual forwards them to no widget), so typing waits for a sign that the field takes them."""
    deadline = time.monotonic() + 120
    while not EMPTY_DIALOG_FIELD.search(shown := screen(session)):
        assert time.monotonic() < deadline, "the dialog's field never cleared:\n" + shown
        keys(session, "C-u")
        time.sleep(0.2)


def quit_kdb(session: str) -> None:
    """q, and the window gone: kdb ended."""
    keys(session, "q")
    deadline = time.monotonic() + 60
    while subprocess.run([*TMUX, "has-session", "-t", session], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "kdb did not quit on q:\n" + screen(session)
        time.sleep(0.2)


def test_kdb_in_a_terminal(tmp_path: Path):
    db = build_small_db(tmp_path / "kernel_cache.db")
    session = f"kdb-e2e-{os.getpid()}"
    with kdb_console(session, db, os.environ["KDB_STATE_DIR"], os.environ["KDB_CONFIG"]):
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
        quit_kdb(session)


def test_a_model_through_the_network_view_in_a_terminal(tmp_path: Path):
    """One full pass of the Network view (8) in a real terminal: open a model by typing its path, see its ops, compile
    it from the view (c), close the dialog, and find the compile in the model's story."""
    from test_nnfusion_compiler import COMPILER, build_db, conv_bias_relu

    if not COMPILER.is_file():
        pytest.skip(f"needs the NNFusion compiler at {COMPILER} (../shared/nnfusion): absent on a fresh clone")
    pytest.importorskip("tvm")
    from onnx_models import write

    from core.settings import Settings, save_settings

    config = save_settings(Settings(workers=1, nnfusion_path=str(COMPILER)), tmp_path / "settings.toml")
    graph = conv_bias_relu(1)
    model = write(graph.model(graph.output, "cbr"), tmp_path / "cbr.onnx")
    db = build_db(model, tmp_path / "k.db", tmp_path)
    session = f"kdb-e2e-net-{os.getpid()}"
    with kdb_console(session, db, str(tmp_path / "state"), str(config)):
        wait_for(session, "rows 1-")  # the Kernels view, its first page shown
        keys(session, "8")
        wait_for(session, "o opens an ONNX model")
        keys(session, "o")
        wait_for(session, "Open which ONNX model?")
        clear_field(session)
        subprocess.run([*TMUX, "send-keys", "-t", session, "-l", str(model)], check=True)
        wait_for(session, f"{model.name} ")
        keys(session, "Enter")
        wait_for(session, "Fused_Convolution")  # its ops, with what each runs
        wait_for(session, "nothing yet: c compiles it")
        keys(session, "c")
        wait_for(session, "compiled in")  # the compile dialog's verdict
        keys(session, "Escape")
        wait_for(session, "compile   ")  # the compile, in the model's story (its step column)
        wait_for(session, "compiled: ")
        quit_kdb(session)

"""Read commands answer at once: `kdb ls` shows a page (with the Kernels view's filters) and streams plain lines
off a terminal; `kdb show` highlights only on a terminal; each command imports only what it uses."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_kdb

from core.db.kernel_db import KernelDB
from core.kernels.rowview import describe_row

sys.path.insert(0, str(REPO / "bench"))
from bench_browse import write_db
from bench_cli import run_on_pty

ROWS = 120


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "kernel_cache.db"  # KDB_DB points here (conftest)
    write_db(path, ROWS, progress=False)
    conn = sqlite3.connect(path)
    with conn:  # one row the compiler would crash on, whatever the generator planted
        conn.execute("UPDATE KernelCache SET Tags = 'KernelEmitter' WHERE rowid = 7")
    conn.close()
    # The state file as every machine has it after its first command (creating one imports SQLModel, once).
    from core.db.state import StateDB

    StateDB().close()
    return path


def keys(db: Path, where: str = "") -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute(f"SELECT Key FROM KernelCache {where} ORDER BY Key")]
    finally:
        conn.close()


def lines(proc: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines()]


def test_ls_shows_a_page_in_key_order_and_says_there_is_more(db: Path):
    proc = run_kdb("ls")
    page = lines(proc)
    assert [cells[2] for cells in page] == keys(db)[:50] and all(len(cells) == 9 for cells in page)
    assert "first 50 rows" in proc.stderr
    assert [cells[2] for cells in lines(run_kdb("ls", "--limit", "3"))] == keys(db)[:3]
    everything = run_kdb("ls", "--all")
    assert [cells[2] for cells in lines(everything)] == keys(db) and "first" not in everything.stderr


def test_ls_filters_as_the_kernels_view_does(db: Path):
    relu = lines(run_kdb("ls", "--all", "--op", "Relu"))
    assert relu and {cells[0] for cells in relu} == {"Relu"}
    assert [cells[2] for cells in relu] == keys(db, "WHERE OpType = 'Relu'")
    problems = lines(run_kdb("ls", "--lint", "problems", "--all"))
    assert keys(db, "WHERE rowid = 7")[0] in [cells[2] for cells in problems]
    text = lines(run_kdb("ls", "DOT", "--all"))  # any case, in the identifier, name or Key
    assert text and all("dot" in (cells[1] + cells[2]).lower() or cells[0] == "Dot" for cells in text)
    descending = lines(run_kdb("ls", "--sort", "key", "--desc", "--limit", "5"))
    assert [cells[2] for cells in descending] == keys(db)[::-1][:5]


def test_ls_json_is_one_object_and_jsonl_a_line_per_kernel(db: Path):
    page = json.loads(run_kdb("ls", "--json").stdout)
    assert len(page["kernels"]) == 50 and page["more"] is True and page["sort"] == "key"
    everything = json.loads(run_kdb("ls", "--json", "--all").stdout)
    assert [k["key"] for k in everything["kernels"]] == keys(db) and everything["more"] is False
    per_line = [json.loads(line) for line in run_kdb("ls", "--jsonl", "--limit", "7").stdout.splitlines()]
    assert [k["key"] for k in per_line] == keys(db)[:7]


def run_on_terminal(*args: str) -> str:
    """kdb on a pseudo-terminal (what a person sees), its output as text."""
    status, output = run_on_pty([sys.executable, "-m", "console.entry", *args],
                                {**os.environ, "COLUMNS": "200", "TERM": "xterm"}, timeout=120)
    assert status == 0, output[-2000:]
    return output.decode("utf-8", "replace")


def test_ls_on_a_terminal_is_a_table_of_one_page(db: Path):
    shown = run_on_terminal("ls")
    assert "more: --limit N or --all" in shown and "op type" in shown
    assert sum(key[:16] in shown for key in keys(db)) == 50


def test_show_highlights_only_on_a_terminal(db: Path):
    key = keys(db)[0]
    with KernelDB.open(db) as kdb:
        view = describe_row(kdb.find(key)[0])
    piped = run_kdb("show", key)
    assert piped.returncode == 0 and "\x1b[" not in piped.stdout
    assert view["signature"] + "\n{\n" + view["body"] + "\n}\n" in piped.stdout  # the source as it is, to copy
    assert "\x1b[" in run_on_terminal("show", key)


# What each read command may load: none of them needs the console, the inject pipeline, ONNX, TVM or numpy;
# off a terminal, ls and the JSON outputs do without Rich, and nothing highlights (Pygments).
HEAVY = ("textual", "rich", "pygments", "numpy", "onnx", "tvm", "sqlmodel", "sqlalchemy", "core.inject.pipeline")
LOADS = [
    (["ls"], set()),
    (["ls", "--json"], set()),
    (["show", "KEY", "--json"], set()),
    (["show", "KEY"], {"rich"}),
    (["lint", "--json"], set()),
    (["lint"], set()),
    (["failures", "--json"], set()),
    (["db", "check", "--json"], set()),
    (["settings", "--json"], set()),
]


@pytest.mark.parametrize(("argv", "allowed"), LOADS, ids=[" ".join(a) for a, _ in LOADS])
def test_read_commands_import_only_what_they_use(db: Path, argv: list[str], allowed: set[str]):
    argv = [keys(db)[0] if a == "KEY" else a for a in argv]
    code = ("import sys; from console.cli.parser import run; status = run(sys.argv[1:]); "
            f"print('LOADED', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr); sys.exit(status)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    loaded = set(proc.stderr.split("LOADED")[-1].split())
    assert loaded <= allowed, f"kdb {' '.join(argv)} imported {sorted(loaded - allowed)}"


def test_the_console_starts_with_the_kernels_view_alone():
    """The other views, and the engines behind them, load when first shown (they were 0.6 s of the first paint)."""
    later = ("console.screens.inject", "console.screens.failures", "console.screens.tuning",
             "console.screens.opconfigs", "console.screens.autotvm", "console.screens.settings",
             "console.screens.nnfusion", "console.screens.help", "core.inject.pipeline", "core.tuning",
             "core.nnfusion", "onnx", "numpy", "pygments", "sqlmodel", "sqlalchemy")
    code = f"import sys, console.app; print(*[m for m in {later!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []

"""Process pools of injection: they start under a host that replaced sys.stderr (as Textual does while the
console runs), and they die with a killed parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import REPO
from shared_data import project_kernels, write_corpus

# A fresh interpreter: in this one an earlier test may have started multiprocessing's resource tracker already,
# and then the bug cannot show.
SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from core.db.kernel_db import KernelDB
    from core.inject.pipeline import InjectOptions, Injector

    class NoDescriptor:  # what Textual puts in sys.stderr while an app runs
        def write(self, text): return len(text)
        def flush(self): pass
        def fileno(self): return -1

    if __name__ == "__main__":
        sys.stderr = NoDescriptor()
        try:
            with KernelDB.open(Path(sys.argv[1]), create=True) as db:
                report = Injector(db, InjectOptions(compile=False, workers=2)).run([Path(sys.argv[2])])
        except Exception as exc:
            sys.stdout.write(json.dumps({"error": repr(exc)}))
        else:
            sys.stdout.write(json.dumps({"injected": report.injected,
                                         "failures": [f.reason for f in report.failures]}))
""")


def test_a_pool_of_workers_starts_when_stderr_has_no_descriptor(tmp_path: Path):
    script = tmp_path / "inject_without_stderr.py"
    script.write_text(SCRIPT, encoding="utf-8")
    kernels = tmp_path / "demo.json"
    kernels.write_text(json.dumps(project_kernels()), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "k.db"), str(kernels)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout)
    assert "error" not in outcome, outcome["error"]
    assert outcome["failures"] == [] and outcome["injected"] > 0


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Live child processes of pid, from /proc (no psutil, no pgrep needed)."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
            and (fields := proc_stat(entry.name)) is not None and fields[0] != "Z" and int(fields[1]) == pid]


def pool_workers(pid: int) -> list[int]:
    def cmdline(child: int) -> bytes:
        try:
            return Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            return b""

    return [child for child in children_of(pid) if b"spawn_main" in cmdline(child)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_workers_die_with_a_killed_inject(tmp_path: Path):
    corpus = tmp_path / "corpus"
    write_corpus(2000, corpus)  # distinct names and bodies: every item is work, none is "unchanged"
    proc = subprocess.Popen([sys.executable, "-m", "console.entry", "inject", "--db", str(tmp_path / "k.db"),
                             "--no-compile", "--workers", "2", "--json", str(corpus)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers := pool_workers(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(workers) == 2, "the workers never started"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [w for w in workers if alive(w)]
        assert not survivors, f"workers {survivors} outlived their killed parent"
    finally:  # never leave strays behind, whatever failed (after the kill they belong to init)
        proc.kill()
        for w in workers + children_of(proc.pid):
            if alive(w):
                os.kill(w, signal.SIGKILL)

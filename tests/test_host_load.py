"""bench/host_load.py charges a process's CPU to its kind, told by its command line, and keeps the seconds of
processes that ended."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="host_load reads Linux's /proc")


def _cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds of a process, from /proc/PID/stat (fields 14 and 15, in clock ticks)."""
    import os

    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_host_load():  # type: ignore[no-untyped-def]
    """bench/host_load.py as a module (a script, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_load", REPO / "bench" / "host_load.py")
    assert spec is not None and spec.loader is not None
    host_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_load)
    return host_load


def test_a_busy_tuning_process_is_charged_to_tuning_processes(tmp_path: Path):
    load = tmp_path / "load.jsonl"
    # A busy loop whose command line names bench_tune.py, as a tuning process's does.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass", "bench_tune.py"])
    sampler = subprocess.Popen([sys.executable, str(REPO / "bench" / "host_load.py"), "sample", "--out", str(load),
                                "--every", "0.5"])
    try:
        # Wait for the event the assertion needs (the busy loop has used 1.5 CPU s, and the sampler has seen it
        # twice since), not for a time: on a loaded 2-core machine the loop gets far less than a core.
        busy_ticks = Path(f"/proc/{busy.pid}/stat")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _cpu_seconds(busy_ticks) < 1.5:
            time.sleep(0.1)
        seen = len(load.read_text().splitlines()) if load.exists() else 0
        while time.monotonic() < deadline and (not load.exists() or len(load.read_text().splitlines()) < seen + 2):
            time.sleep(0.1)
    finally:
        sampler.kill()
        busy.kill()
        sampler.wait()
        busy.wait()
    out = subprocess.run([sys.executable, str(REPO / "bench" / "host_load.py"), "summary", str(load), "--trials", "4"],
                         capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("tuning processes"))
    seconds, cores, per_trial = (float(x) for x in line.split()[-3:])
    assert seconds > 1.0 and cores > 0 and per_trial == pytest.approx(seconds / 4, abs=0.03), out


def test_a_process_that_ends_keeps_the_seconds_it_used_while_sampled():
    """The first version summed the live processes' totals by kind at the first and last sample: a tuning run
    that had ended by the last sample showed -23 CPU s for its tuning processes (session 8, on the H200)."""
    host_load = load_host_load()
    samples = [
        {"procs": {"10": ["tuning processes", 5.0], "12": ["other", 100.0]}},
        {"procs": {"10": ["tuning processes", 12.0], "11": ["build workers", 3.0], "12": ["other", 110.0]}},
        {"procs": {"10": ["tuning processes", 20.0], "11": ["build workers", 9.0], "12": ["other", 120.0]}},
        {"procs": {"12": ["other", 130.0]}},  # the tuning process and its build worker have ended
    ]
    assert host_load.by_kind(samples) == {"tuning processes": 15.0, "build workers": 9.0, "other": 30.0}


def test_a_process_that_ended_but_is_not_reaped_keeps_its_kind():
    """A process started with setsid and never waited for stays a zombie, with no command line: session 9's
    three finished tuning processes were charged to "other" (1,984 CPU s) while they waited to be reaped."""
    host_load = load_host_load()
    samples = [
        {"procs": {"12": ["other", 100.0]}},
        {"procs": {"10": ["tuning processes", 12.0], "12": ["other", 110.0]}},
        {"procs": {"10": ["other", 20.0], "12": ["other", 120.0]}},  # 10 ended: a zombie
        {"procs": {"10": ["other", 20.0], "12": ["other", 130.0], "13": ["other", 1.0]}},
    ]
    assert host_load.by_kind(samples) == {"tuning processes": 20.0, "other": 31.0}

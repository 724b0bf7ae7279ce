"""bench/host_load.py charges a process's CPU to its kind, told by its command line."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="host_load reads Linux's /proc")


def test_a_busy_tuning_process_is_charged_to_tuning_processes(tmp_path: Path):
    load = tmp_path / "load.jsonl"
    # A busy loop whose command line names bench_tune.py, as a tuning process's does.
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass", "bench_tune.py"])
    sampler = subprocess.Popen([sys.executable, str(REPO / "bench" / "host_load.py"), "sample", "--out", str(load),
                                "--every", "0.5"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not load.exists() or len(load.read_text().splitlines()) < 5):
            time.sleep(0.2)
    finally:
        sampler.kill()
        busy.kill()
        sampler.wait()
        busy.wait()
    out = subprocess.run([sys.executable, str(REPO / "bench" / "host_load.py"), "summary", str(load), "--trials", "4"],
                         capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("tuning processes"))
    seconds, cores, per_trial = (float(x) for x in line.split()[-3:])
    assert seconds > 0.5 and cores > 0.3 and per_trial == pytest.approx(seconds / 4, abs=0.01), out

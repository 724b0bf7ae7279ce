"""The GPU session's two clocks, on the CPU: a stand-in child speaks the worker's protocol (a "compiled"
phase line, then the answer), so compile time and launch time are bounded separately. nvcc on a tuned,
heavily unrolled kernel can take minutes; that must not read as a hung kernel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.gpu.jobs import GpuSession

CHILD = f"""#!{sys.executable}
import json, sys, time
for line in sys.stdin:
    job = json.loads(line)
    time.sleep(job["compile_s"])
    print(json.dumps({{"phase": "compiled"}}), flush=True)
    time.sleep(job["run_s"])
    print(json.dumps({{"ok": True, "kind": job["kind"], "reason": 'an answer may say "phase"'}}), flush=True)
"""


@pytest.fixture
def session(tmp_path: Path):
    child = tmp_path / "child"
    child.write_text(CHILD)
    child.chmod(0o755)
    with GpuSession(timeout_s=1.0, compile_timeout_s=2.5, python=str(child)) as s:
        yield s


def job(compile_s: float, run_s: float) -> dict:
    return {"kind": "verify", "compile_s": compile_s, "run_s": run_s}


def test_a_slow_compile_within_its_own_limit_is_not_a_hung_kernel(session: GpuSession):
    result = session.run(job(1.5, 0.1))  # longer than the launch limit, shorter than the compile one
    assert result.ok and "phase" in result.reason


def test_launches_past_their_limit_are_killed_as_a_hung_kernel_and_the_session_goes_on(session: GpuSession):
    result = session.run(job(0.0, 3.0))
    assert not result.ok and result.reason.startswith("timed out after 1 s (hung kernel?)")
    assert session.run(job(0.0, 0.0)).ok  # a fresh child took over


def test_a_compile_past_its_limit_says_so(session: GpuSession):
    result = session.run(job(4.0, 0.0))
    assert not result.ok and "compiling the kernel took over 2.5 s" in result.reason
    assert json.dumps(result.reason)  # a plain message, fit for the failures view

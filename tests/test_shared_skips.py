"""Skips for lack of ../shared say what they need, and the run ends with one line that counts them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, shared_need
from shared_data import SHARED_ENV, shared_dir


@pytest.mark.parametrize(("reason", "need"), [
    ("needs the kernels: ../shared/nnfusion-artifact/kernels (looked for at /x)", "../shared/nnfusion-artifact/kernels"),
    (f"{shared_dir()}/nnfusion/bin/nnfusion is not present", "../shared/nnfusion/bin/nnfusion"),  # by its real path
    ("../shared is not there", "../shared"),
    ("needs apache-tvm", None),
    (f"{shared_dir()}-old/kernels is not present", None),  # a neighbour of the shared dir is not it
])
def test_a_skip_reason_names_the_shared_path_it_needs(reason: str, need: str | None):
    assert shared_need(reason) == need


def test_a_run_without_shared_ends_with_the_count_of_what_it_skipped(tmp_path: Path):
    env = {**os.environ, SHARED_ENV: str(tmp_path / "no-shared")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "tests/test_artifact_inject.py", "-k", "not demo", "-rs"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-1] == "skipped for lack of ../shared: 3 tests (3 need ../shared/nnfusion-artifact/kernels)"
    reasons = [line for line in lines if line.startswith("SKIPPED")]
    assert reasons and all(f"the Rammer artifact's kernels: ../shared/nnfusion-artifact/kernels (looked for at "
                           f"{tmp_path / 'no-shared'}/nnfusion-artifact/kernels" in line for line in reasons), reasons

"""The python3 NNFusion's ONNX Runtime pre-pass runs with: a PATH whose python3 has onnxruntime (it rewrites the
model the compiler imports) and one whose python3 has not (the model is imported as given), for tests that hold
extraction against the compiler under each (core/opconfigs/ort_prepass.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OUR_BIN = str(Path(sys.executable).parent)  # the virtualenv of these tests: its python3 has the `run` extra's onnxruntime


def has_onnxruntime(python3: str) -> bool:
    return subprocess.run([python3, "-c", "import onnxruntime"], capture_output=True, timeout=120).returncode == 0


def path_with_onnxruntime() -> str:
    """A PATH whose python3 has onnxruntime (this virtualenv's bin first); skip when there is none."""
    python3 = Path(OUR_BIN) / "python3"
    if not python3.is_file() or not has_onnxruntime(str(python3)):
        pytest.skip(f"needs a python3 with onnxruntime beside {sys.executable} (the `run` extra installs it)")
    return os.pathsep.join([OUR_BIN, os.environ.get("PATH", "")])


def path_without_onnxruntime() -> str:
    """The PATH without this virtualenv (as CI has it); skip when its python3 has onnxruntime all the same."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != OUR_BIN)
    found = subprocess.run(["sh", "-c", "command -v python3"], env={**os.environ, "PATH": path},
                           capture_output=True, text=True).stdout.strip()
    if found and has_onnxruntime(found):
        pytest.skip(f"the python3 on PATH without {OUR_BIN} ({found}) has onnxruntime too")
    return path

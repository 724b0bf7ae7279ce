"""Op configs named on a command line: every good one is kept, every bad file or line logged as skipped."""

from __future__ import annotations

from pathlib import Path

from console.cli.output import log
from core.codegen.batch import load_configs
from core.errors import InputError
from core.opconfigs.opconfig import OpConfig


def read_op_configs(inputs: list[str]) -> tuple[list[OpConfig], list[InputError]]:
    """Op configs of files, ONNX models and directories, and what could not be read (already logged)."""
    configs, errors = load_configs([Path(p) for p in inputs])
    for e in errors:
        log(f"skipped: {e}")
    return configs, errors

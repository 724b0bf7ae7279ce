"""Op configs named on a command line: every good one is kept, every bad file or line logged as skipped."""

from __future__ import annotations

import argparse
from pathlib import Path

from console.cli.output import log
from core.codegen.batch import load_configs
from core.errors import InputError
from core.nnfusion.compiler import CompilerFlags, compiler_prepass
from core.opconfigs.opconfig import OpConfig
from core.opconfigs.ort_prepass import PrePass
from core.settings import load_settings


def lookup_flags(args: argparse.Namespace) -> tuple[list[str], CompilerFlags]:
    """The compiler flags a command works with (the settings' nnfusion_flags, then --flag): they decide which ops of
    a model the compiler looks up."""
    flags = [*load_settings().nnfusion_flags, *getattr(args, "flag", [])]
    return flags, CompilerFlags.parse(flags)


def model_prepass(args: argparse.Namespace) -> PrePass:
    """NNFusion's pre-pass as the compiler this command would run (--nnfusion, else the nnfusion_path setting, else
    PATH) runs it: models are extracted as that compiler imports them."""
    return compiler_prepass(getattr(args, "nnfusion", None) or "", load_settings().nnfusion_path)


def read_op_configs(inputs: list[str], flags: CompilerFlags | None, prepass: PrePass) -> tuple[list[OpConfig],
                                                                                         list[InputError]]:
    """Op configs of files, ONNX models (the ops looked up at `flags`) and directories, and what could not be read
    (already logged)."""
    configs, errors = load_configs([Path(p) for p in inputs], flags, prepass=prepass)
    for e in errors:
        log(f"skipped: {e}")
    return configs, errors

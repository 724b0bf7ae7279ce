"""kdb codegen: op configs (files or ONNX models) -> CUDA kernels as kernel JSON, generated with TVM; with --inject,
into the kernel DB as well, in memory (the Op configs view's `g`: core.inject.generate_run, the same run).

Every good op config is generated; every bad line or file is reported and skipped. Each op config TVM
fails on is kept in the state DB as a codegen failure of the kernel DB (--db), for `kdb failures` to show
and retry (a retry generates again and injects into that DB); with --inject, each kernel that fails injection too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape

from console.cli.cmd_inject import StageBars, print_report
from console.cli.interrupt import first_ctrl_c_cancels
from console.cli.opconfig_input import lookup_flags, model_prepass, read_op_configs
from console.cli.output import err, log, out, print_json
from core.codegen.batch import CodegenReport
from core.db.kernel_db import kernel_db_path
from core.errors import InputError
from core.inject import generate_run
from core.inject.generate_run import CodegenProgress, GenerateEvent, GenerateRequest
from core.inject.pipeline import InjectSnapshot
from core.kernels.ops import MATRIX_OP_TYPES
from core.settings import load_settings


def main(args: argparse.Namespace) -> int:
    if args.no_compile and not args.inject:
        raise InputError("--no-compile goes with --inject: generating alone runs no nvcc check")
    if missing := [p for p in args.inputs if not Path(p).exists()]:  # (a mistyped path: as inject and coverage say)
        raise InputError(f"no such file or directory: {', '.join(missing)}: nothing generated, nothing written")
    settings = load_settings()
    configs, errors = read_op_configs(args.inputs, lookup_flags(args)[1], model_prepass(args))
    if not configs and not errors:
        raise InputError(f"no op configs in {', '.join(args.inputs)}: no op-config files or ONNX models there, empty "
                         "files, or models of which the compiler looks up no op at these flags (`kdb opconfig "
                         "extract` shows what it fuses away)")
    request = GenerateRequest.from_settings(configs, kernel_db_path(args.db), settings, arch=args.arch,
                                           compile=not args.no_compile, check=not args.no_check, inject=args.inject,
                                           # (no op config read: no empty kernels file for `kdb inject` to take)
                                           kernels_file=Path(args.output) if args.output and configs else None,
                                           math=args.math)
    with _Bars(enabled=err.is_terminal and not args.json, total=len(configs), inject=args.inject,
               lines=not args.json) as bars, \
            first_ctrl_c_cancels("the op in progress" if not args.inject else "the op or kernel in progress") as cancel:
        report = generate_run.generate_and_inject(request, on_event=bars.show, should_cancel=cancel)
    codegen = report.codegen
    codegen.input_errors.extend(errors)
    if not args.inject and not args.output and not args.json:
        out.file.write(json.dumps(codegen.items, indent=1) + "\n")
    failed = len(codegen.failed) + len(errors)
    if args.json:
        print_json(report.as_json() if args.inject else codegen.as_json())
    else:
        where = (str(request.kernels_file) if request.kernels_file else "nothing written" if args.output
                 else "the kernel DB" if args.inject else "stdout")
        unreadable = f" ({len(errors)} op config(s) unreadable, skipped above)" if errors else ""
        cancelled = " (cancelled)" if codegen.cancelled else ""
        err.print(f"{len(codegen.items)} kernels generated for {request.arch}{cancelled} -> {escape(where)}; "
                  f"{failed} failed{unreadable}")
        _print_math(codegen)
        for g in codegen.failed:
            err.print(f"  [red]{g.stage}[/] {escape(g.config.source or g.config.describe())}: {escape(g.error)}")
        if codegen.failed:
            err.print(f"  kept as codegen failures of {escape(str(request.db_path))}: `kdb failures` shows them, "
                      "`kdb failures retry ID` generates and injects again")
        if report.inject is not None:
            print_report(report.inject, request.db_path, notes=report.notes)
        else:
            for note in report.notes:
                log(note)
    if report.cancelled:
        return 130
    return 1 if failed or (report.inject and report.inject.failed) else 0


def _print_math(codegen: CodegenReport) -> None:
    """How many kernels run on the tensor cores, and why each Dot or convolution that does not."""
    done = [g for g in codegen.generated if g.item is not None]
    tensor = sum(g.math.startswith("tensor cores") for g in done)
    if tensor:
        err.print(f"  {tensor} on the tensor cores, {len(done) - tensor} on the CUDA cores")
    for g in done:  # a matrix product the tensor cores did not take (pools and element-wise ops never would)
        if g.math.startswith("CUDA cores:") and g.config.op_type in MATRIX_OP_TYPES:
            err.print(f"  {escape(g.config.describe())}: {escape(g.math)}")


class _Bars:
    """On a terminal: the codegen bar, then (with --inject) one bar per injection stage. Elsewhere (a log, a pipe;
    not --json): a line as each op starts, so a long run is never silent."""

    def __init__(self, *, enabled: bool, total: int, inject: bool, lines: bool = False) -> None:
        self.enabled, self.total, self.lines = enabled, total, lines
        self.stages = StageBars(enabled=enabled and inject)
        self.injecting = False

    def __enter__(self) -> _Bars:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.codegen = Progress(TextColumn("  codegen"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.description}"), console=err)
            self.task = self.codegen.add_task("", total=self.total)
            self.codegen.start()
        return self

    def show(self, event: GenerateEvent) -> None:
        if not self.enabled:
            if self.lines and isinstance(event, CodegenProgress) and event.current:
                err.print(f"  codegen {event.done + 1}/{event.total}: {escape(event.current)}", highlight=False)
            return
        if isinstance(event, CodegenProgress):
            self.codegen.update(self.task, completed=event.done, description=event.current[:50])
        elif isinstance(event, InjectSnapshot):
            if not self.injecting:  # generating is over: the stages' bars take the terminal
                self.injecting = True
                self.codegen.stop()
                self.stages.__enter__()
            self.stages.update(event)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.codegen.stop()
        if self.injecting:
            self.stages.__exit__()

"""kdb codegen: op configs (files or ONNX models) -> CUDA kernels as kernel JSON, generated with TVM.

Every good op config is generated; every bad line or file is reported and skipped. Each op config TVM
fails on is kept in the state DB as a codegen failure of the kernel DB (--db), for `kdb failures` to show
and retry (a retry generates again and injects into that DB).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape

from console.cli.opconfig_input import lookup_flags, model_prepass, read_op_configs
from console.cli.output import err, out, print_json
from core.codegen.batch import generate_all
from core.db.kernel_db import default_db_path
from core.db.state import StateDB
from core.errors import InputError
from core.settings import load_settings


def main(args: argparse.Namespace) -> int:
    arch = args.arch or load_settings().archs[0]
    configs, errors = read_op_configs(args.inputs, lookup_flags(args)[1], model_prepass(args))
    if not configs and not errors:
        raise InputError(f"no op configs in {', '.join(args.inputs)}: no op-config files or ONNX models there, empty "
                         "files, or models of which the compiler looks up no op at these flags (`kdb opconfig "
                         "extract` shows what it fuses away)")
    db_path = Path(args.db).expanduser() if args.db else default_db_path()
    progress = None
    if err.is_terminal and not args.json:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        progress = Progress(TextColumn("codegen"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                            console=err)
        task = progress.add_task("", total=len(configs))
        progress.start()

    def on_result(result, done: int, total: int) -> None:  # type: ignore[no-untyped-def]
        if progress is not None:
            progress.update(task, completed=done, description=result.config.describe()[:50])

    state = StateDB()
    try:
        report = generate_all(configs, arch, check=not args.no_check, on_result=on_result, state=state,
                              db_path=db_path)
    finally:
        state.close()
        if progress is not None:
            progress.stop()
    report.input_errors.extend(errors)
    text = json.dumps(report.items, indent=1) + "\n"
    if args.output:
        path = Path(args.output)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    elif not args.json:
        out.file.write(text)
    failed = len(report.failed) + len(errors)
    if args.json:
        print_json(report.as_json())
    else:
        where = args.output or "stdout"
        unreadable = f" ({len(errors)} op config(s) unreadable, skipped above)" if errors else ""
        err.print(f"{len(report.items)} kernels generated for {arch} -> {escape(where)}; {failed} failed{unreadable}")
        for g in report.failed:
            err.print(f"  [red]{g.stage}[/] {escape(g.config.source or g.config.describe())}: {escape(g.error)}")
        if report.failed:
            err.print(f"  kept as codegen failures of {escape(str(db_path))}: `kdb failures` shows them, "
                      "`kdb failures retry ID` generates and injects again")
    return 1 if failed else 0

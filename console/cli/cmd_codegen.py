"""kdb codegen: op configs (files or ONNX models) -> CUDA kernels as kernel JSON, generated with TVM."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from console.cli.output import err, out, print_json
from core.codegen.batch import generate_all, load_configs
from core.errors import InputError
from core.settings import load_settings


def main(args: argparse.Namespace) -> int:
    arch = args.arch or load_settings().archs[0]
    configs, errors = load_configs([Path(p) for p in args.inputs])
    if not configs and errors:
        raise InputError(f"no op configs: {errors[0]}")
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

    try:
        report = generate_all(configs, arch, check=not args.no_check, on_result=on_result)
    finally:
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
    if args.json:
        print_json(report.as_json())
    else:
        where = args.output or "stdout"
        err.print(f"{len(report.items)} kernels generated for {arch} -> {where}; {len(report.failed)} failed")
        for g in report.failed:
            err.print(f"  [red]{g.stage}[/] {g.config.source or g.config.describe()}: {g.error}")
        for e in errors:
            err.print(f"  [red]read[/] {e}")
    return 1 if report.failed or errors else 0

"""kdb inject: kernel JSON files -> the kernel DB, with progress and every failure reported.

With --jsonl, stdout carries JSON lines as the run goes: {"event": "committed", "key", "file", "index"}
printed and flushed right after each kernel's transaction commits, {"event": "failed", ...} per failure,
and a final {"event": "summary", ...}. A script that kills the run knows exactly what was committed
(at most the kernel in flight may be committed and not yet reported).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

from console.cli.interrupt import first_ctrl_c_cancels
from console.cli.output import err, log, out, print_json, shorten
from core.cuda.nvcc import probe_nvcc
from core.errors import KdbError, ToolError
from core.gpu.jobs import require_gpu
from core.inject.pipeline import STAGES, Committed, InjectOptions, InjectProgress, InjectReport, InjectSnapshot
from core.inject.session import open_injector
from core.settings import archs_problem, load_settings


def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    archs = tuple(args.arch or settings.archs)
    compile_check = not args.no_compile
    probe = probe_nvcc(settings.nvcc_path) if compile_check else None
    if probe is not None and probe.problem:
        raise ToolError(probe.problem)
    if problem := archs_problem(archs, probe):  # as the Inject view checks them
        raise KdbError(problem)
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise KdbError(f"no such file or directory: {', '.join(missing)}")
    options = InjectOptions.from_settings(settings, archs=archs, compile=compile_check, replace=args.replace,
                                          workers=args.workers, verify=args.verify, profile=args.profile)
    if options.gpu:
        require_gpu()  # say so now, plainly, rather than fail every kernel
    with first_ctrl_c_cancels("the kernel in progress") as should_cancel:
        lines = _JsonLines() if args.jsonl else None
        with StageBars(enabled=err.is_terminal and not (args.json or args.jsonl), gpu=options.gpu) as progress, \
                open_injector(args.db, options, on_progress=lines.progress if lines else progress.update,
                              should_cancel=should_cancel, on_commit=lines.committed if lines else None) as injector:
            if lines:
                lines.report = injector.report
            report = injector.run(paths)
            db_path = injector.db.path
        if report.backup:
            log(f"backup of {db_path} before --replace: {report.backup}")
        if args.json:
            print_json({**report.as_json(), "cancelled": report.cancelled})
        elif args.jsonl:
            print_json({"event": "summary", **report.as_json(), "cancelled": report.cancelled,
                        "replaced_rows": report.replaced_rows, "backup": report.backup})
        else:
            print_report(report, db_path)
    return 130 if report.cancelled else 1 if report.failed else 0  # cancelled by Ctrl-C: interrupted


class _JsonLines:
    """--jsonl: each commit and each failure as one flushed JSON line, the moment it happens."""

    def __init__(self) -> None:
        self.report: InjectReport | None = None
        self.failures_shown = 0

    def committed(self, c: Committed) -> None:
        print_json({"event": "committed", **asdict(c)})

    def progress(self, p: InjectProgress) -> None:
        # Failures are appended to the report before each progress call: print the new ones.
        failures = self.report.failures if self.report is not None else []
        for f in failures[self.failures_shown:]:
            print_json({"event": "failed", **f.as_report()})
        self.failures_shown = len(failures)


class StageBars:
    """One Rich progress bar per stage, refreshed at most ten times a second."""

    def __init__(self, *, enabled: bool, gpu: bool = False) -> None:
        self.enabled = enabled
        self.gpu_enabled = gpu
        self.last = 0.0

    def __enter__(self) -> StageBars:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=err)
            self.tasks = {s: self.bar.add_task(s, total=None, note="") for s in STAGES}
            self.bar.start()
        return self

    def update(self, p: InjectProgress | InjectSnapshot) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.1 and p.current:
            return
        self.last = now
        for stage, task in self.tasks.items():
            note = f"[red]{p.failed_at[stage]} failed[/]" if p.failed_at[stage] else ""
            if stage == "gpu" and not (self.gpu_enabled):
                note = "not run (--verify/--profile run it)"
            self.bar.update(task, completed=p.passed[stage] + p.failed_at[stage], total=p.items_seen or None,
                            note=note)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()


def print_report(report: InjectReport, db_path: Path, *, notes: list[str] | None = None) -> None:
    from rich.table import Table

    status = "cancelled" if report.cancelled else "done"
    out.print(f"[bold]{status}[/]: {report.injected} injected, {report.unchanged} unchanged, "
              f"[{'red' if report.failed else 'green'}]{report.failed} failed[/] -> {db_path}")
    if not (report.injected or report.unchanged or report.failed or report.cancelled):
        out.print("[yellow]the input holds no kernels: nothing was injected (was codegen's output empty? `kdb "
                  "opconfig extract` lists why a model's ops give none)[/]")
    if report.replaced_rows:
        out.print(f"{report.replaced_rows} older rows replaced (backup: {report.backup})")
    for note in report.notes if notes is None else notes:
        out.print(f"[dim]{note}[/]")
    if report.failures:
        table = Table(title="failures", show_lines=False)
        for col in ("file", "item", "kernel", "stage", "reason"):
            table.add_column(col, overflow="fold")
        for f in report.failures:
            table.add_row(shorten(Path(f.file).name, 40), "-" if f.index is None else str(f.index),
                          shorten(f.name, 40), f.stage, f.reason)
        out.print(table)
        out.print("[dim]`kdb failures` lists them again; `kdb failures retry --all` retries them[/]")

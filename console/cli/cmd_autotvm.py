"""kdb autotvm summary: what an AutoTVM tuning log holds, workload by workload, and the op configs it tuned."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from console.cli.output import log, out, print_json
from core.errors import InputError
from core.opconfigs.autotvm_log import LogSummary, Workload, WorkloadSummary, match, read_log
from core.opconfigs.opconfig import OpConfig, read_opconfigs

MAX_SHOWN_BAD_LINES = 20


def main(args: argparse.Namespace) -> int:
    summary = read_log(Path(args.log))
    configs: list[OpConfig] = []
    for name in args.opconfigs:
        opconfig_file = read_opconfigs(Path(name))
        for exc in opconfig_file.errors:
            log(f"warning: {exc}")
        configs += opconfig_file.configs
    matched = match(summary, configs)
    if args.json:
        print_json({"log": str(summary.path),
                    "workloads": [{**w.as_dict(), "matched_op_config": _source(matched.get(w.workload))}
                                  for w in summary.workloads],
                    "bad_lines": [{"line": _line_number(exc), "reason": exc.reason} for exc in summary.bad_lines],
                    "bad_line_count": summary.bad_line_count})
    else:
        _print_table(summary, matched)
    return 1 if summary.bad_line_count else 0


def _print_table(summary: LogSummary, matched: dict[Workload, OpConfig]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(caption=f"{summary.path}: {summary.records} records, {len(summary.workloads)} workloads, "
                          f"{summary.bad_line_count} bad lines", caption_justify="left")
    for column in ("workload", "op config", "trials", "ok", "errors", "best µs", "at trial", "matched"):
        if column in ("trials", "ok", "best µs", "at trial"):
            table.add_column(column, justify="right", no_wrap=True)
        else:  # args and paths have no spaces to wrap at
            table.add_column(column, overflow="fold")
    for w in summary.workloads:
        config = w.op_config.describe() if w.op_config else f"[dim]{escape(w.op_config_note)}[/]"
        best = f"{w.best_seconds * 1e6:.2f}" if w.best_seconds is not None else "[red]none[/]"
        table.add_row(escape(_workload_text(w)), config, str(w.trials), str(w.successes), _errors_text(w), best,
                      str(w.best_trial or "-"), escape(_short_source(matched.get(w.workload))))
    out.print(table)
    for exc in summary.bad_lines[:MAX_SHOWN_BAD_LINES]:
        out.print(f"[red]{escape(str(exc))}[/]")
    if (hidden := summary.bad_line_count - min(len(summary.bad_lines), MAX_SHOWN_BAD_LINES)) > 0:
        out.print(f"[red]... and {hidden} more bad lines (--json lists up to {len(summary.bad_lines)})[/]")


def _workload_text(w: WorkloadSummary) -> str:
    task = w.task.removeprefix("tvm_").removesuffix("_tune_op")  # the artifact's tasks all say tvm_..._tune_op
    return f"{task} {json.dumps(w.args, separators=(',', ':'))}"


def _errors_text(w: WorkloadSummary) -> str:
    # Short names keep the column narrow; --json keeps AutoTVM's own.
    return "\n".join(f"{kind.lower().removesuffix('_error')} {n}" for kind, n in w.errors_by_kind.items()) or "-"


def _source(config: OpConfig | None) -> str | None:
    return config.source if config else None


def _short_source(config: OpConfig | None) -> str:
    return Path(config.source).name if config else "-"  # FILE:LINE; the caption and --json give whole paths


def _line_number(exc: InputError) -> int:
    return int(exc.where.rsplit(":", 1)[1])  # core names bad lines "PATH:LINE"

"""kdb nnfusion: compile a model with the user's NNFusion and the DB, and say what its code really runs."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from console.cli.cmd_coverage import compiler_setup, print_blockers, print_miscompiles
from console.cli.output import err, out, print_json, shorten
from core.db.kernel_db import kernel_db_path
from core.db.state import StateDB
from core.errors import InputError
from core.nnfusion.compile_job import Compiled, CompileJob, known_faults, run_compile_job
from core.nnfusion.launch_check import LAUNCH_ADVICE
from core.nnfusion.usage import DB_KERNEL
from core.settings import load_settings


def main(args: argparse.Namespace) -> int:
    flag_list, _, product = compiler_setup(args)
    given = {"arch": args.arch} if args.arch else {}
    job = CompileJob.from_settings(load_settings(), Path(args.model).expanduser(), kernel_db_path(args.db),
                                   flags=tuple(flag_list), product_name=product, binary=args.nnfusion or "",
                                   out=Path(args.out) if args.out else None, timeout_s=args.timeout,
                                   launch_check=not args.no_launch_check, **given)
    from console.cli.nnfusion_run import (
        OP_TIMES_OPTIONS,
        never_slower_command,
        op_times_command,
        run_network_command,
        run_options_given,
    )

    if args.op_times is not None:
        _refuse_with_op_times(args, run_options_given(args))
    elif args.workers is not None:
        raise InputError("--workers: only with --op-times")
    if args.never_slower is not None and not args.run:
        raise InputError("--never-slower: only with --run (it runs the network, with and without the candidates)")
    fit = args.run if args.fit_launches is None else args.fit_launches  # --run: on unless --no-fit-launches
    if fit and args.no_launch_check:
        raise InputError("--fit-launches needs the launch check: leave out --no-launch-check"
                         + (" (--run turns it on: --no-fit-launches turns it off)" if args.run else ""))
    if not args.run and (run_options := [o for o in run_options_given(args)
                                         if args.op_times is None or o not in OP_TIMES_OPTIONS]):
        also = " or --op-times" if all(o in OP_TIMES_OPTIONS for o in run_options) else ""
        raise InputError(f"{', '.join(run_options)}: only with --run{also}")
    blockers, miscompiles = known_faults(job) if not args.json else ([], [])
    print_miscompiles(job.model.name, miscompiles)
    if blockers:  # said before the compiler runs; it stays the judge
        print_blockers(job.model.name, blockers)
        out.print("compiling anyway: your NNFusion has the last word", highlight=False)
    if args.op_times is not None:
        return op_times_command(args, job)
    if args.run and args.never_slower is not None:
        return never_slower_command(args, job, fit_launches=fit)
    if args.run:
        return run_network_command(args, job, fit_launches=fit)

    def compile_once(on_line: Callable[[str], None] | None = None) -> Compiled:
        with closing(StateDB()) as state:
            return run_compile_job(job, fit_launches=fit, state=state, on_line=on_line)

    if args.json or not err.is_terminal:
        report = compile_once().report
    else:
        with err.status("compiling with NNFusion…") as status:
            started = time.monotonic()

            def on_line(line: str) -> None:
                status.update(f"NNFusion {time.monotonic() - started:5.1f} s: {shorten(line.strip(), 100)}")

            report = compile_once(on_line).report
    if args.json:
        print_json(report.as_dict())  # made_standalone and undo_files among its keys
        return 1 if report.problems() else 0
    if report.db_created:
        err.print(f"no kernel DB at {job.db} yet: created it, empty (NNFusion's table), as the compiler would",
                  highlight=False)
    result = report.result
    if not report.ok:
        out.print(f"[red]NNFusion failed[/]: {report.reason}", highlight=False)
        for line in report.decisive:
            out.print(f"  {line}", markup=False, highlight=False)
        out.print(f"log: {result.log_file if result else '-'} (recorded in `kdb failures`)", highlight=False)
        failed = result.importing_node() if result else None
        if report.blockers:
            said = "; ".join(f"node {b.node} ({b.op_type})" for b in report.blockers)
            if failed is None or failed in {n for b in report.blockers for n in (b.node, b.aborts_at)}:
                out.print(f"as kdb said before compiling: {said}", highlight=False)
            else:  # kdb's rules missed this one: say so, beside what they did find
                out.print(f"[yellow]kdb did not foresee this node[/] ({failed}); before compiling it named {said}",
                          highlight=False)
        elif report.miscompiles:  # (a shape kdb said comes out other than the model's may abort downstream)
            said = "; ".join(dict.fromkeys(f"node {w.node} ({w.kind})" for w in report.miscompiles))
            out.print(f"before compiling kdb said NNFusion compiles another network here ({said}), and where it may "
                      f"abort; it aborted at {failed or 'a node the log does not name'}", highlight=False)
        return 1
    from rich.table import Table

    usage = report.usage
    assert usage is not None and result is not None
    table = Table(caption=usage.summary(), caption_justify="left")
    for col in ("step", "node", "runs", "DB row"):
        table.add_column(col, overflow="fold")
    for i, step in enumerate(usage.steps, start=1):
        for j, part in enumerate(step.parts):
            label = f"{i}" if j == 0 else ""
            if step.kind == "blockfusion":
                label += f" BF[{j + 1}/{len(step.parts)}]"
            style = "green" if part.runs == DB_KERNEL else "yellow" if part.runs in ("cuDNN", "cuBLAS") else "dim"
            table.add_row(label, part.node, f"[{style}]{part.runs}[/]", ", ".join(shorten(k, 20) for k in part.rows))
    out.print(table)
    promised, used = report.promised(), usage.used_keys()
    nodes = sum(1 for part in usage.parts() if part.rows)
    out.print(f"DB rows in the code: {len(used)} of the {len(promised)} coverage promised, run by {nodes} "
              f"node{'s' * (nodes != 1)}"
              + (f"; promised but not in the code: {report.row_names(promised - used)}" if promised - used else "")
              + (f"; in the code but not promised: {', '.join(sorted(used - promised))}" if used - promised else ""),
              highlight=False)
    if report.prepass.get("applied") or report.prepass.get("bypassed"):  # node names: the rewritten model's / why not
        out.print(report.prepass["note"], markup=False, highlight=False)
    out.print(f"compiled in {result.seconds:.1f} s ({len(result.lookups)} DB lookups, "
              f"{len(result.substitutions)} patterns substituted); project {result.project}; log {result.log_file}",
              highlight=False)
    failures = report.launch_failures()
    launches = report.launches
    if launches is not None and launches.error:
        out.print(f"[red]launch check could not run[/] ({launches.arch}): {launches.error}", highlight=False)
    elif launches is not None:
        out.print(f"launch check ({launches.arch}): {report.launch_summary()}", highlight=False)
    else:
        out.print("launch check: skipped (--no-launch-check)", highlight=False)
    if note := report.standalone_note():
        out.print(note, markup=False, highlight=False)
    for line in failures:
        out.print(f"[red]cannot launch[/]: {line}", highlight=False)
    if failures:
        out.print(LAUNCH_ADVICE, highlight=False)
    problems = report.problems()
    shown = {f"cannot launch: {line}" for line in failures}
    for problem in problems:  # each reason for the exit status (wrong numbers: a row's, a Concat's, the importer's)
        if problem not in shown:
            out.print(problem, style="red", markup=False, highlight=False)
    return 1 if problems else 0



def _refuse_with_op_times(args: argparse.Namespace, run_options: list[str]) -> None:
    """What --op-times cannot honour: it runs no whole network, judges no output against a reference and writes
    nothing to the DB (each op compiles from a copy of its rows)."""
    if args.run:
        raise InputError("--run and --op-times: one at a time (the whole network, or each op alone)")
    if args.fit_launches is not None:
        raise InputError("--fit-launches / --no-fit-launches: not with --op-times (each op is compiled from a copy of "
                         "its rows; the DB is never written)")
    if "--max-error" in run_options:
        raise InputError("--max-error: not with --op-times (it times the ops; no output is judged)")
    if "--cuda-graph" in run_options:
        raise InputError("--cuda-graph: only with --run (each op alone is timed as NNFusion calls it)")

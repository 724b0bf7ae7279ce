"""kdb nnfusion: compile a model with the user's NNFusion and the DB, and say what its code really runs."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from console.cli.cmd_coverage import compiler_setup
from console.cli.output import err, out, print_json, shorten
from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.errors import InputError
from core.nnfusion.compile_job import CompileJob, CompileReport, compile_and_read, compile_fitting_launches
from core.nnfusion.launch_check import LAUNCH_ADVICE
from core.nnfusion.usage import DB_KERNEL
from core.settings import load_settings


def main(args: argparse.Namespace) -> int:
    flag_list, _, product = compiler_setup(args)
    settings = load_settings()
    with KernelDB.open(args.db) as db:  # the DB path as the other commands resolve it ($KDB_DB, the default)
        db_path = db.path
    job = CompileJob(model=Path(args.model).expanduser(), db=db_path, flags=tuple(flag_list),
                     product_name=product, binary=args.nnfusion or "", out=Path(args.out) if args.out else None,
                     timeout_s=args.timeout, arch=args.arch or settings.archs[0], nvcc=settings.nvcc_path,
                     launch_check=not args.no_launch_check)
    fit = args.run if args.fit_launches is None else args.fit_launches  # --run: on unless --no-fit-launches
    if fit and args.no_launch_check:
        raise InputError("--fit-launches needs the launch check: leave out --no-launch-check"
                         + (" (--run turns it on: --no-fit-launches turns it off)" if args.run else ""))
    from console.cli.nnfusion_run import run_network_command, run_options_given

    if args.run:
        return run_network_command(args, job, fit_launches=fit)
    if given := run_options_given(args):
        raise InputError(f"{', '.join(given)}: only with --run")
    made: list[str] = []

    def compile_once(on_line: Callable[[str], None] | None = None) -> CompileReport:
        nonlocal made
        if fit:
            report, made = compile_fitting_launches(job, state=StateDB(), on_line=on_line)
            return report
        return compile_and_read(job, state=StateDB(), on_line=on_line)

    if args.json or not err.is_terminal:
        report = compile_once()
    else:
        with err.status("compiling with NNFusion…") as status:
            started = time.monotonic()

            def on_line(line: str) -> None:
                status.update(f"NNFusion {time.monotonic() - started:5.1f} s: {shorten(line.strip(), 100)}")

            report = compile_once(on_line)
    if args.json:
        print_json({**report.as_dict(), "made_standalone": made})
        return 0 if report.ok and not report.broken_promises() and not report.launch_failures() else 1
    result = report.result
    if not report.ok:
        out.print(f"[red]NNFusion failed[/]: {report.reason}", highlight=False)
        for line in report.decisive:
            out.print(f"  {line}", markup=False, highlight=False)
        out.print(f"log: {result.log_file if result else '-'} (recorded in `kdb failures`)", highlight=False)
        return 1
    from rich.table import Table

    usage = report.usage
    assert usage is not None and result is not None
    table = Table(caption=f"{len(usage.steps)} kernel launches in kernel_entry; BlockFusion groups: "
                  f"{len(usage.blockfusion_groups())}; library calls: {usage.library_calls or 'none'}",
                  caption_justify="left")
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
    out.print(f"DB kernels used: {len(used)} of the {len(promised)} coverage promised"
              + (f"; promised but not in the code: {', '.join(sorted(promised - used))}" if promised - used else "")
              + (f"; in the code but not promised: {', '.join(sorted(used - promised))}" if used - promised else ""),
              highlight=False)
    out.print(f"compiled in {result.seconds:.1f} s ({len(result.lookups)} DB lookups, "
              f"{len(result.substitutions)} patterns substituted); project {result.project}; log {result.log_file}",
              highlight=False)
    failures = report.launch_failures()
    launches = report.launches
    if launches is not None and launches.error:
        out.print(f"[yellow]launch check[/]: {launches.error}", highlight=False)
    elif launches is not None and not failures:
        out.print(f"launch check ({launches.arch}): all {len(launches.launches)} kernel launches fit; "
                  f"{len(launches.launches) - launches.compiled} within their launch bounds, {launches.compiled} "
                  "within the registers nvcc gave them "
                  + ("(from the cache: this device code was compiled before)" if launches.cached
                     else f"({launches.seconds:.1f} s)"), highlight=False)
    if made:
        out.print(f"made standalone ({len(made)} row(s) of ops fused into a kernel that could not launch; they now run "
                  f"on their own launch, `kdb db standalone --undo` gives them back): {', '.join(made)}",
                  highlight=False)
    for line in failures:
        out.print(f"[red]cannot launch[/]: {line}", highlight=False)
    if failures:
        out.print(LAUNCH_ADVICE, highlight=False)
    return 0 if not report.broken_promises() and not failures else 1


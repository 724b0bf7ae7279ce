"""kdb nnfusion MODEL --run: the network with the DB built, run, checked and timed against the empty DB's
(core/gpu/network_run.py), with a status line while it works."""

from __future__ import annotations

import argparse
import time

from console.cli.output import err, out, print_json, shorten
from core.db.state import StateDB
from core.gpu.network_run import ERROR_FORMULA, Contender, NetworkRun, RunOptions, run_network
from core.nnfusion.compile_job import CompileJob

# The run's options on the command line, and RunOptions' fields they set (the parser leaves them None: unset).
RUN_OPTIONS = {"--max-error": "max_error", "--seed": "seed", "--warmup": "warmup", "--iterations": "iterations"}


def run_options_given(args: argparse.Namespace) -> list[str]:
    return [flag for flag, name in RUN_OPTIONS.items() if getattr(args, name) is not None]


def run_network_command(args: argparse.Namespace, job: CompileJob, *, fit_launches: bool) -> int:
    given = {name: getattr(args, name) for name in RUN_OPTIONS.values() if getattr(args, name) is not None}
    options = RunOptions(fit_launches=fit_launches, **given)
    state = StateDB()
    try:
        if args.json or not err.is_terminal:
            run = run_network(job, options, state=state)
        else:
            with err.status("running the network…") as status:
                started = time.monotonic()

                def on_progress(stage: str, detail: str) -> None:
                    status.update(f"{time.monotonic() - started:6.1f} s {stage}: {shorten(detail.strip(), 100)}")

                run = run_network(job, options, state=state, on_progress=on_progress)
    finally:
        state.close()
    if args.json:
        print_json(run.as_dict())
        return run.status
    _print(run)
    return run.status


def _print(run: NetworkRun) -> None:
    options = run.options
    where = f"{run.device} ({run.arch})" if run.device else f"no GPU (built for {run.arch})"
    out.print(f"network: {run.job.model.name} with {run.job.db} on {where}; seed {options.seed}; "
              f"{options.warmup} warm-ups, then {options.iterations} timed calls of kernel_entry (median)",
              highlight=False)
    for contender in (run.with_db, run.empty_db):
        out.print(f"  {_line(contender)}", highlight=False)
    if run.ratio is not None:
        out.print(f"  ratio {run.ratio:.3f}x (with the DB / with the empty DB)", highlight=False)
    if run.reference is not None:
        out.print(f"error: {ERROR_FORMULA}, against {run.reference.runtime} on the same input; allowed "
                  f"{run.max_error:g}", highlight=False)
    if run.with_db.made_standalone:
        out.print(f"made standalone (fused into a kernel that could not launch; `kdb db standalone --undo` gives "
                  f"them back): {', '.join(run.with_db.made_standalone)}", highlight=False)
    for library, found in run.libraries.items():
        out.print(f"[dim]{library}: {found}[/]", highlight=False)
    out.print(f"[dim]work folder: {run.workdir} ({run.seconds:.1f} s)[/]", highlight=False)
    for note in run.notes:
        out.print(f"[yellow]note[/]: {note}", highlight=False)
    style = "green" if run.status == 0 else "red" if run.status == 1 else "yellow"
    for finding in run.findings or ["right, and not slower than with the empty DB"]:
        out.print(f"[{style}]{finding}[/]", highlight=False)


def _line(contender: Contender) -> str:
    name = f"{contender.label:9s}"
    if contender.timing is not None:
        t = contender.timing
        error = f"{contender.error:.2e}" if contender.error is not None else "-"
        return (f"{name} {t['median_ms']:.4f} ms (p10 {t['p10_ms']:.4f}, p90 {t['p90_ms']:.4f}); max rel err "
                f"{error}")
    build = contender.build
    if build is not None and build.ok:
        return f"{name} built in {build.seconds:.1f} s: {build.harness}"
    return f"{name} {contender.problem or 'not reached'}"

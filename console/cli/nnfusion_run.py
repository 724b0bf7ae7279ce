"""kdb nnfusion MODEL --run: the network with the DB built, run, checked and timed against the empty DB's
(core/gpu/network_run.py); kdb nnfusion MODEL --op-times TIMES.json: each op the DB serves timed alone with its row
and with the library (core/gpu/library_times.py), for `kdb db leave-to-library`. A status line while they work."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from console.cli.output import err, out, print_json, shorten
from core.db.state import StateDB
from core.gpu.harness_run import Contender, HarnessOptions
from core.gpu.library_times import LibraryTimes, measure_library_times
from core.gpu.network_run import ERROR_FORMULA, NetworkRun, RunOptions, run_network
from core.nnfusion.compile_job import CompileJob

# The run's options on the command line, and RunOptions' fields they set (the parser leaves them None: unset).
RUN_OPTIONS = {"--max-error": "max_error", "--seed": "seed", "--warmup": "warmup", "--iterations": "iterations",
               "--rounds": "rounds", "--cuda-graph": "cuda_graph"}
# Those --op-times takes too (HarnessOptions' fields): it judges no output, so no --max-error (nor --cuda-graph).
OP_TIMES_OPTIONS = ("--seed", "--warmup", "--iterations")


def run_options_given(args: argparse.Namespace) -> list[str]:
    return [flag for flag, name in RUN_OPTIONS.items() if getattr(args, name) is not None]


def _given(args: argparse.Namespace, flags: tuple[str, ...]) -> dict[str, Any]:
    return {RUN_OPTIONS[f]: getattr(args, RUN_OPTIONS[f]) for f in flags if getattr(args, RUN_OPTIONS[f]) is not None}


@contextmanager
def _progress(args: argparse.Namespace, what: str) -> Iterator[Callable[[str, str], None] | None]:
    """A status line on a terminal; in a log, a line on stderr each time the work moves to another stage (a run cut
    off by a script's timeout still says how far it got); none with --json."""
    if args.json:
        yield None
        return
    started = time.monotonic()
    if not err.is_terminal:
        last_stage = ""

        def on_stage(stage: str, detail: str) -> None:
            nonlocal last_stage
            if stage != last_stage:  # (NNFusion's log lines come under one stage: the first is enough here)
                last_stage = stage
                err.print(f"{time.monotonic() - started:7.1f} s {stage}: {shorten(detail.strip(), 200)}",
                          markup=False, highlight=False, soft_wrap=True)

        yield on_stage
        return
    with err.status(what) as status:

        def on_progress(stage: str, detail: str) -> None:
            status.update(f"{time.monotonic() - started:6.1f} s {stage}: {shorten(detail.strip(), 100)}")

        yield on_progress


def run_network_command(args: argparse.Namespace, job: CompileJob, *, fit_launches: bool) -> int:
    options = RunOptions(fit_launches=fit_launches, **_given(args, tuple(RUN_OPTIONS)))
    state = StateDB()
    try:
        with _progress(args, "running the network…") as on_progress:
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
    where = _where(run.device, run.arch)
    out.print(f"network: {run.job.model.name} with {run.job.db} on {where}; seed {options.seed}; "
              f"{options.rounds} rounds, each network by turns: {options.warmup} warm-ups, then "
              f"{options.iterations} timed calls of kernel_entry (median)",
              highlight=False)
    for contender in (run.with_db, run.empty_db):
        out.print(f"  {_line(contender)}", highlight=False)
    if run.ratio is not None:
        out.print(f"  ratio {run.ratio:.3f}x (with the DB / with the empty DB)", highlight=False)
    if run.graph_ratio is not None:
        out.print(f"  in a CUDA graph: ratio {run.graph_ratio:.3f}x", highlight=False)
    if run.reference is not None:
        out.print(f"error measured as {ERROR_FORMULA}, against {run.reference.runtime} on the same input; allowed "
                  f"{run.max_error:g}", highlight=False)
    if run.with_db.compile is not None and (note := run.with_db.compile.standalone_note()):
        out.print(note, markup=False, highlight=False)
    for library, found in run.libraries.items():
        out.print(f"[dim]{library}: {found}[/]", highlight=False)
    out.print(f"[dim]work folder: {run.workdir} ({run.seconds:.1f} s)[/]", highlight=False)
    for note in run.notes:
        out.print(f"[yellow]note[/]: {note}", highlight=False)
    style = "green" if run.status == 0 else "red" if run.status == 1 else "yellow"
    for finding in run.verdicts():
        out.print(f"[{style}]{finding}[/]", highlight=False)


def _where(device: str, arch: str) -> str:
    """The GPU a run ran on, or that it found none."""
    return f"{device} ({arch})" if device else f"no GPU (built for {arch})"


def _line(contender: Contender) -> str:
    name = f"{contender.label:9s}"
    if contender.timing is not None:
        t = contender.timing
        error = f"{contender.error:.2e}" if contender.error is not None else "-"
        graph = f"; in a CUDA graph {t['graph_median_ms']:.4f} ms" if "graph_median_ms" in t else ""
        return (f"{name} {t['median_ms']:.4f} ms (p10 {t['p10_ms']:.4f}, p90 {t['p90_ms']:.4f}); max rel err "
                f"{error}{graph}")
    build = contender.build
    if build is not None and build.ok:
        return f"{name} built in {build.seconds:.1f} s: {build.harness}"
    if not contender.problem and contender.compile is not None and contender.compile.ok:
        return f"{name} compiled, not built"
    return f"{name} {contender.problem or 'not reached'}"


def never_slower_command(args: argparse.Namespace, job: CompileJob, *, fit_launches: bool) -> int:
    from core.gpu.never_slower import run_never_slower

    options = RunOptions(fit_launches=fit_launches, **_given(args, tuple(RUN_OPTIONS)))
    with _progress(args, "the network with and without each candidate…") as on_progress, closing(StateDB()) as state:
        result = run_never_slower(job, Path(args.never_slower).expanduser(), options, on_progress=on_progress,
                                  state=state)
    if args.json:
        print_json(result.as_dict())
        return result.status
    if result.baseline is not None:
        _print(result.baseline)
    for trial in result.trials:
        out.print(f"  {trial.line()}", markup=False, highlight=False, soft_wrap=True)
    if result.final is not None and result.final is not result.baseline:
        out.print("the network as the DB now is:", highlight=False)
        _print(result.final)
    style = "green" if result.status == 0 else "red" if result.status == 1 else "yellow"
    for finding in result.findings:
        out.print(f"[{style}]{finding}[/]", highlight=False)
    return result.status


def op_times_command(args: argparse.Namespace, job: CompileJob) -> int:
    options = HarnessOptions(**_given(args, OP_TIMES_OPTIONS))
    times_file = Path(args.op_times).expanduser().resolve()
    with _progress(args, "timing each op with its row and with the library…") as on_progress, \
            closing(StateDB()) as state:
        run = measure_library_times(job, options, times_file=times_file, workers=args.workers or 0,
                                    on_progress=on_progress, state=state)
    if args.json:
        print_json(run.as_dict())
    else:
        _print_op_times(run)
    return run.status


def _print_op_times(run: LibraryTimes) -> None:
    options = run.options
    where = _where(run.device, run.arch)
    out.print(f"op times: {run.job.model.name} with {run.job.db} on {where}; each op alone, {options.warmup} warm-ups "
              f"then {options.iterations} timed calls of kernel_entry (median); seed {options.seed}", highlight=False)
    for op in run.ops:
        out.print(f"  {op.line()}", markup=False, highlight=False)
    if run.others:
        out.print(f"  [dim]{run.others} other op config(s) of the model are not served by the DB: nothing to time[/]",
                  highlight=False)
    for library, found in run.libraries.items():
        out.print(f"[dim]{library}: {found}[/]", highlight=False)
    out.print(f"[dim]work folder: {run.workdir} ({run.seconds:.1f} s)[/]", highlight=False)
    for note in run.notes:
        out.print(f"[yellow]note[/]: {note}", highlight=False)
    if run.written:
        out.print(f"times written to {run.times_file}: `kdb nnfusion MODEL --run --never-slower {run.times_file}` "
                  "sets aside the rows the network runs faster without (undoable); `kdb db leave-to-library "
                  f"{run.times_file}` shows the slower ones op by op", markup=False, highlight=False)
    style = "green" if run.status == 0 else "red" if run.status == 1 else "yellow"
    for finding in run.findings or ["every op timed; no row slower than the library"]:
        out.print(f"[{style}]{finding}[/]", highlight=False)



"""kdb tune: MetaSchedule tuning, watched live; the best kernels verified, timed and injected.

Given a model (or --budget), the ops NNFusion looks up in the kernel DB are tuned as one network: the budget
spread by each op's share of the network's time, the predicted network time reported as trials come in.

TVM's own output (task tables, XGBoost lines, C++ warnings, its worker processes) goes to a log file in the
state dir; --verbose shows it here too. With --json, stdout carries JSON lines: {"event": "trial", ...} per
measured candidate as it is measured, {"event": "phase", ...} as a batch is searched, built and measured,
{"event": "job", ...} per job state change, {"event": "network", ...} per new prediction, and a final
{"event": "summary", ...}. The console's Tuning view gets the same events.
"""

from __future__ import annotations

import argparse
import signal
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from rich.console import Console

from console.cli.output import console_for, log, print_json
from core.db.kernel_db import kernel_db_path
from core.errors import InputError
from core.settings import Settings, load_settings
from core.tuning.job import PhaseEvent, TrialEvent
from core.tuning.network import Network, NetworkEvent
from core.tuning.queue import JobEvent, QueueReport, tuning_root
from core.tuning.request import (
    ChoiceError,
    TuneChoices,
    TuneRequest,
    check_choices,
    read_tune_inputs,
    run_request,
    tune_request,
)
from core.tuning.tvm_log import Captured, capture_output, new_log_path

LLVM_NOTE = ("target llvm: every trial is built and timed on this CPU. CPU kernels cannot enter a CUDA kernel "
             "DB: nothing is injected; the results stay in the tuning work dirs.")
# TuneChoices fields this command names otherwise (the rest: --field-name)
OPTIONS = {"builder_workers": "--workers", "transfer": "--no-transfer", "inject": "--no-inject"}


def choices_of(args: argparse.Namespace) -> TuneChoices:
    """The command line as core's tune choices: an option left out is None, core's default."""
    return TuneChoices(trials=args.trials, budget=args.budget, batch=args.batch, population=args.population,
                       max_per_op=args.max_per_op, target=args.target, arch=args.arch, rpc=args.rpc,
                       rpc_workers=args.rpc_workers, gpus=args.gpus, builder_workers=args.workers,
                       efficient=args.efficient, transfer=not args.no_transfer, runner_ups=args.runner_ups,
                       inject=not args.no_inject, join=args.join or "", math=args.math,
                       minutes=args.minutes)


def request_of(args: argparse.Namespace, settings: Settings, *, gpu: tuple[bool, str] | None = None) -> TuneRequest:
    """The run `kdb tune` with these arguments asks for, built by core (the Tuning view builds its own there too);
    a refused choice is named by its option."""
    choices = choices_of(args)
    try:
        check_choices(choices, settings)  # before the inputs are read: a model takes seconds
        inputs = read_tune_inputs([Path(p) for p in args.inputs], settings)
        for e in inputs.errors:
            log(f"skipped: {e}")
        return tune_request(inputs, choices, settings, db_path=kernel_db_path(args.db), gpu=gpu)
    except ChoiceError as exc:
        raise InputError(exc.reason, where=OPTIONS.get(exc.choice, "--" + exc.choice.replace("_", "-"))) from exc


def main(args: argparse.Namespace) -> int:
    request = request_of(args, load_settings())
    if request.target != "cuda":
        log(LLVM_NOTE)
    if request.network is not None:
        _tell_network(request.network, request.budget)
    log_path = new_log_path()
    log(f"TVM's log: {log_path}" + ("" if args.verbose else " (--verbose shows it here)"))
    cancel: dict[str, Any] = {"requested": False, "say": log}

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if cancel["requested"]:
            raise KeyboardInterrupt
        cancel["requested"] = True
        cancel["say"]("cancelling after the candidate in flight; the trials so far are kept (run again to resume)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with capture_output(log_path, echo=args.verbose) as captured:
            view = _Live(captured, console_for(captured.stderr), json_lines=args.json)
            cancel["say"] = view.say
            try:
                report = run_request(request, on_trial=view.trial, on_job=view.job, on_phase=view.phase,
                                     on_network=view.network, on_note=view.say,
                                     should_cancel=lambda: cancel["requested"])
            finally:
                view.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    # Ctrl-C may also end the job in flight as failed (TVM's task refuses to go on): interrupted all the same.
    report.cancelled = report.cancelled or cancel["requested"]
    if request.join and not report.results and not report.cancelled:
        log(f"--join {request.join}: the run's other processes had claimed every op, so this one tuned none "
            "(a run name used before? each run needs a new one)")
    if args.json:
        print_json(_summary(report, log_path))
    else:
        _tell_results(report, log_path, request.target, request.inject is not None)
    failed = bool(report.failures) or any(i.failed for i in report.injects)
    return 130 if report.cancelled else 1 if failed else 0


def _tell_network(network: Network, budget: int) -> None:
    tuned = sum(op.count for op in network.ops)
    log(f"network {network.name}: {len(network.ops)} distinct ops NNFusion looks up in the kernel DB "
        f"({tuned} nodes), {budget} trials spread by each op's share of the network's time")
    reasons: dict[str, int] = {}
    for _, count, why in network.skipped:
        reasons[why] = reasons.get(why, 0) + count
    for why, count in reasons.items():
        log(f"  not tuned: {count} node(s): {why}")


def _summary(report: QueueReport, log_path: Path) -> dict[str, Any]:
    return {"event": "summary", "cancelled": report.cancelled, "out_of_time": report.out_of_time,
            "failures": report.failures, "log": str(log_path),
            "network": asdict(report.network) if report.network else None,
            "jobs": [{"op": r.job.name, "trials": r.trials, "new_trials": r.new_trials, "reused": r.reused,
                      "best_us": r.best_seconds * 1e6 if r.best_seconds else None,
                      "trials_per_minute": round(r.trials_per_minute, 1), "errors": r.errors,
                      "work_dir": str(r.work_dir), "phases_s": {k: round(v, 2) for k, v in r.phases.items()},
                      "search": r.search, "model_trials": r.model_trials, "model_family_trials": r.model_family_trials,
                      "kernels": sorted(r.kernels)} for r in report.results]}


def _tell_results(report: QueueReport, log_path: Path, target: str, injecting: bool) -> None:
    if report.network is not None:
        log(f"network {report.network.text()}")
    if report.out_of_time:
        log("the time budget (--minutes) ran out: the op in flight kept its best so far; ops not started are "
            "left (the same command again goes on where this one stopped)")
    if target != "cuda":
        log("nothing injected: CPU (llvm) kernels cannot enter a CUDA kernel DB")
    elif not injecting:
        log("nothing injected (--no-inject)")
    dirs = sorted({str(r.work_dir) for r in report.results})
    if dirs:
        log(f"results: {len(dirs)} tuning work dir(s) under {tuning_root()} (database_tuning_record.json: every "
            "trial; logs/: MetaSchedule's per-task logs)")
        for d in dirs[:10]:
            log(f"  {d}")
    log(f"TVM's log: {log_path}")


class _Live:
    """A progress bar per job on a terminal; JSON lines for scripts; plain lines otherwise."""

    def __init__(self, captured: Captured, console: Console, *, json_lines: bool) -> None:
        self.json_lines = json_lines
        self.stdout: TextIO = captured.stdout
        self.console = console  # on the terminal's stderr, which the capture took from TVM
        captured.echo = lambda line: self.console.print(line, markup=False, highlight=False)
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.network_task: Any = None
        if self.console.is_terminal and not json_lines:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            # Rich would route sys.stdout/stderr through the bar: MetaSchedule's logging (bound to sys.stdout
            # each run) would reach the terminal. They stay on the captured descriptors, the log file.
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[best]}"), TextColumn("{task.fields[phase]}"),
                                TimeElapsedColumn(), console=self.console, redirect_stdout=False,
                                redirect_stderr=False)
            self.bar.start()

    def _task(self, job: str) -> Any:
        if job not in self.tasks:  # one bar per job, made once (its total comes with the first trial)
            self.tasks[job] = self.bar.add_task(job[:48], total=None, best="", phase="")
        return self.tasks[job]

    def trial(self, event: TrialEvent) -> None:
        if self.json_lines:
            print_json({"event": "trial", **asdict(event)}, self.stdout)
        elif self.bar is not None:
            best = f"best {event.best_seconds * 1e6:.2f} us" if event.best_seconds else "no success yet"
            self.bar.update(self._task(event.job), completed=event.trial, total=event.total, best=best)

    def phase(self, event: PhaseEvent) -> None:
        if self.json_lines:
            print_json({"event": "phase", **asdict(event)}, self.stdout)
        elif self.bar is not None:
            text = {"search": f"searching batch {event.batch}",
                    "build": f"batch {event.batch}: built {event.done}/{event.total}",
                    "measure": f"batch {event.batch}: measuring"}.get(event.phase, event.phase)
            self.bar.update(self._task(event.job), phase=text)

    def job(self, event: JobEvent) -> None:
        if self.json_lines:
            print_json({"event": "job", "job": event.job, "index": event.index, "of": event.of,
                        "stage": event.stage, "status": event.status, "detail": event.detail}, self.stdout)
            return
        if event.status == "tuning" and self.bar is not None:
            self.bar.update(self._task(event.job), total=event.trials)
        if event.status == "tuning" and event.detail:
            self.say(f"{event.job}: {event.detail}")
        elif event.status == "elsewhere":
            self.say(f"elsewhere: {event.job}: {event.detail}")
        elif event.status in ("done", "failed", "cancelled"):
            if self.bar is not None and event.job in self.tasks:
                self.bar.update(self.tasks[event.job], phase=event.status)
            self.say(f"{event.status}: {event.job}: {event.detail}")

    def network(self, event: NetworkEvent) -> None:
        if self.json_lines:
            print_json({"event": "network", **asdict(event)}, self.stdout)
        elif self.bar is not None:
            if self.network_task is None:
                self.network_task = self.bar.add_task("network", total=event.budget, best="", phase="")
            self.bar.update(self.network_task, completed=event.trials, total=event.budget,
                            description=event.text()[:100])

    def say(self, text: str) -> None:
        if self.json_lines:  # every line of the --json stream is an event, notes too
            print_json({"event": "message", "text": text}, self.stdout)
        elif self.bar is not None:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.stdout, flush=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()

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

from console.cli.opconfig_input import lookup_flags, model_prepass
from console.cli.output import console_for, log, print_json
from core.codegen.batch import read_inputs
from core.db.kernel_db import default_db_path
from core.errors import InputError, ToolError
from core.inject.pipeline import InjectOptions
from core.opconfigs.opconfig import OpConfig
from core.settings import load_settings
from core.tuning.claims import ClaimBoard
from core.tuning.job import PhaseEvent, RpcTarget, TrialEvent, TuneJob
from core.tuning.network import Network, NetworkEvent, network_of
from core.tuning.queue import JobEvent, QueueReport, run_network, run_queue, tuning_root
from core.tuning.tvm_log import Captured, capture_output, new_log_path

LLVM_NOTE = ("target llvm: every trial is built and timed on this CPU. CPU kernels cannot enter a CUDA kernel "
             "DB: nothing is injected; the results stay in the tuning work dirs.")


def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    for option, value in (("--trials", args.trials), ("--budget", args.budget), ("--batch", args.batch),
                          ("--workers", args.workers), ("--max-per-op", args.max_per_op)):
        if value is not None and value < 1:
            raise InputError(f"must be at least 1, not {value} (a tuning job measures at least one candidate)",
                             where=option)
    if args.population is not None and args.population < args.batch:
        raise InputError(f"a population of {args.population} cannot give batches of {args.batch} (the search picks "
                         "each batch from its population)", where="--population")
    inputs = read_inputs([Path(p) for p in args.inputs], lookup_flags(args)[1],  # a model: what NNFusion looks up
                         prepass=model_prepass(args))  # ... in the graph it imports (its pre-pass run)
    for e in inputs.errors:
        log(f"skipped: {e}")
    if not inputs.configs:
        raise InputError("no op configs to tune")
    network = None
    if inputs.models or args.budget:
        network = network_of("+".join(inputs.models) or "op configs", inputs.configs, inputs.count)
        if not network.ops:
            raise InputError(f"{network.name}: none of its {len(inputs.configs)} ops is one a kernel-DB row can "
                             "serve")
    if args.max_per_op is not None and network is None:
        raise InputError("only a network's budget is spread over its ops: give a model or --budget",
                         where="--max-per-op")
    board = None
    if args.join:
        if network is None:
            raise InputError("several processes share the ops of one network: give a model or --budget",
                             where="--join")
        board = ClaimBoard.for_run(args.join)
    rpc_text = args.rpc or (f"{settings.rpc_tracker}:{settings.rpc_key}" if settings.rpc_tracker else "")
    rpc = RpcTarget.parse(rpc_text) if rpc_text else None
    cluster = None
    if args.gpus:
        from core.tuning.rpc import local_gpu_cluster

        cluster = local_gpu_cluster(args.gpus, key=settings.rpc_key)
        rpc = RpcTarget(cluster.host, cluster.port, cluster.key)
        args.rpc_workers = len(cluster.servers)
        log(f"measuring on {len(cluster.servers)} GPU(s) through a local tracker at {cluster.host}:{cluster.port}")
    inject = None
    if args.target == "cuda":
        from core.gpu.jobs import gpu_available

        gpu, what = gpu_available()
        if not gpu and rpc is None:
            raise ToolError(f"CUDA tuning measures on a GPU: {what}; use --rpc to GPU servers, or --target llvm")
        if not args.no_inject:
            inject = InjectOptions.from_settings(settings, verify=gpu, profile=gpu)
    else:
        log(LLVM_NOTE)
    trials = args.trials or settings.tune_trials
    arch = args.arch or settings.archs[0]

    def make_job(config: OpConfig, n: int) -> TuneJob:
        return TuneJob(config, trials=n, target=args.target, arch=arch, rpc=rpc, rpc_workers=args.rpc_workers,
                       builder_timeout_s=settings.tune_builder_timeout_s, efficient=args.efficient,
                       transfer=not args.no_transfer, trials_per_batch=args.batch, population=args.population,
                       builder_workers=args.workers, runner_ups=max(0, args.runner_ups))

    if network is not None:
        budget = args.budget or trials * len(network.ops)
        _tell_network(network, budget)
    log_path = new_log_path()
    log(f"TVM's log: {log_path}" + ("" if args.verbose else " (--verbose shows it here)"))
    cancel: dict[str, Any] = {"requested": False, "say": log}

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if cancel["requested"]:
            raise KeyboardInterrupt
        cancel["requested"] = True
        cancel["say"]("cancelling after the candidate in flight; the trials so far are kept (run again to resume)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    db_path = Path(args.db).expanduser() if args.db else default_db_path()
    try:
        with capture_output(log_path, echo=args.verbose) as captured:
            view = _Live(captured, console_for(captured.stderr), json_lines=args.json)
            cancel["say"] = view.say
            try:
                callbacks: dict[str, Any] = dict(on_trial=view.trial, on_job=view.job, on_phase=view.phase,
                                                 should_cancel=lambda: cancel["requested"])
                if network is not None:
                    report = run_network(network, budget, make_job, db_path=db_path, inject_options=inject,
                                         on_network=view.network, board=board, cap=args.max_per_op, **callbacks)
                else:
                    report = run_queue([make_job(c, trials) for c in inputs.configs], db_path=db_path,
                                       inject_options=inject, **callbacks)
            finally:
                view.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
        if cluster is not None:
            cluster.stop()
    # Ctrl-C may also end the job in flight as failed (TVM's task refuses to go on): interrupted all the same.
    report.cancelled = report.cancelled or cancel["requested"]
    if board is not None and not report.results and not report.cancelled:
        log(f"--join {args.join}: the run's other processes had claimed every op, so this one tuned none "
            "(a run name used before? each run needs a new one)")
    if args.json:
        print_json(_summary(report, log_path))
    else:
        _tell_results(report, log_path, args.target, inject is not None)
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
    return {"event": "summary", "cancelled": report.cancelled, "failures": report.failures, "log": str(log_path),
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

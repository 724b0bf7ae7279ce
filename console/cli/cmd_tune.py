"""kdb tune: MetaSchedule tuning, watched live; the best kernels verified, timed and injected.

With --json, stdout carries JSON lines: {"event": "trial", ...} per measured trial, {"event": "job", ...}
per job state change, and a final {"event": "summary", ...}.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from types import FrameType

from console.cli.opconfig_input import read_op_configs
from console.cli.output import err, log, print_json
from core.db.kernel_db import default_db_path
from core.errors import InputError, ToolError
from core.inject.pipeline import InjectOptions
from core.settings import load_settings
from core.tuning.job import RpcTarget, TrialEvent, TuneJob
from core.tuning.queue import JobEvent, run_queue


def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    configs, _ = read_op_configs(args.inputs)
    if not configs:
        raise InputError("no op configs to tune")
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
    jobs = [TuneJob(c, trials=args.trials or settings.tune_trials, target=args.target,
                    arch=args.arch or settings.archs[0], builder_timeout_s=settings.tune_builder_timeout_s,
                    rpc=rpc, rpc_workers=args.rpc_workers) for c in configs]
    cancel = {"requested": False}

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if cancel["requested"]:
            raise KeyboardInterrupt
        cancel["requested"] = True
        log("cancelling after the batch in flight; the trials so far are kept (run again to resume)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    view = _Live(json_lines=args.json)
    try:
        # MetaSchedule logs its task tables to sys.stdout: they go to stderr so stdout stays ours (JSON lines).
        with contextlib.redirect_stdout(sys.stderr):
            report = run_queue(jobs, db_path=Path(args.db).expanduser() if args.db else default_db_path(),
                               inject_options=inject, on_trial=view.trial, on_job=view.job,
                               should_cancel=lambda: cancel["requested"])
    finally:
        signal.signal(signal.SIGINT, previous)
        view.stop()
        if cluster is not None:
            cluster.stop()
    # Ctrl-C may also end the job in flight as failed (TVM's task refuses to go on): interrupted all the same.
    cancelled = report.cancelled or cancel["requested"]
    summary = {"event": "summary", "cancelled": cancelled, "failures": report.failures,
               "jobs": [{"op": r.job.name, "trials": r.trials, "new_trials": r.new_trials,
                         "best_us": r.best_seconds * 1e6 if r.best_seconds else None,
                         "trials_per_minute": round(r.trials_per_minute, 1), "errors": r.errors,
                         "kernels": sorted(r.kernels)} for r in report.results]}
    if args.json:
        print_json(summary, view.stdout)
    failed = bool(report.failures) or any(i.failed for i in report.injects)
    return 130 if cancelled else 1 if failed else 0


class _Live:
    """A progress bar per job on a terminal; JSON lines for scripts; plain lines otherwise."""

    def __init__(self, *, json_lines: bool) -> None:
        self.json_lines = json_lines
        self.stdout = sys.stdout  # taken before tuning redirects sys.stdout
        self.bar = None
        self.tasks: dict[str, int] = {}
        if err.is_terminal and not json_lines:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[best]}"), TimeElapsedColumn(), console=err)
            self.bar.start()

    def trial(self, event: TrialEvent) -> None:
        if self.json_lines:
            print_json({"event": "trial", **asdict(event)}, self.stdout)
        elif self.bar is not None:
            task = self.tasks.setdefault(event.job, self.bar.add_task(event.job[:48], total=event.total, best=""))
            best = f"best {event.best_seconds * 1e6:.2f} us" if event.best_seconds else "no success yet"
            self.bar.update(task, completed=event.trial, best=best)

    def job(self, event: JobEvent) -> None:
        if self.json_lines:
            print_json({"event": "job", "job": event.job, "index": event.index, "status": event.status,
                        "detail": event.detail}, self.stdout)
        elif event.status in ("done", "failed", "cancelled"):
            line = f"{event.status}: {event.job}: {event.detail}"
            if self.bar is not None:
                err.print(line)
            else:
                print(line, file=self.stdout, flush=True)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()

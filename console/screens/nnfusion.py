"""Compile with NNFusion: run the user's compiler on a model with the open DB, live, then show what the generated
code really runs, step by step, against what coverage promised. Esc cancels a run, then closes. When a
BlockFusion kernel cannot launch, f makes the rows fused into it standalone (core/db/standalone.py) and
compiles again. r runs the network on the GPU (core/gpu/network_run.py): compiled with the DB (fitting the
launches, as `kdb nnfusion --run` does by default) and with an empty DB, both built with nvcc, checked against
ONNX Runtime and timed; without a GPU both are built and not run. t times each op alone with its row and with the
library (`kdb nnfusion --op-times`, writing the times file), n lets the network decide which rows stay
(`--never-slower`, reading it).

The compile runs in a thread worker that owns everything it touches and posts coalesced progress snapshots
(the log's tail); the result comes back as the worker's return value.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.markup import escape
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label, Log, Static
from textual.worker import Worker, WorkerState, get_current_worker

from console.widgets.dialogs import PathDialog, dialog_default
from console.widgets.ratio_bar import ratio_bar
from core.gpu.library_times import LibraryTimes
from core.gpu.network_run import ERROR_FORMULA, NetworkRun, RunOptions
from core.gpu.never_slower import NeverSlowerRun, run_never_slower
from core.nnfusion.compile_job import Compiled, CompileJob, CompileReport, standalone_note
from core.nnfusion.launch_check import LAUNCH_ADVICE
from core.nnfusion.usage import DB_KERNEL

if TYPE_CHECKING:
    from console.context import ConsoleContext

PROGRESS_INTERVAL_S = 0.1
RUNS_STYLE = {DB_KERNEL: "green", "cuDNN": "yellow", "cuBLAS": "yellow"}
TAIL_LINES = 200
RUN_FITS_LAUNCHES = True  # r fits the launches first, as `kdb nnfusion --run` does unless --no-fit-launches


def compile_screen(context: ConsoleContext, model: Path) -> CompileScreen:
    """The screen for compiling `model` with the console's DB, as the settings say (binary, flags, product)."""
    return CompileScreen(CompileJob.from_settings(context.settings, model, context.db_path))


@dataclass(frozen=True)
class RunProgress:
    seconds: float
    stage: str  # "compile (with-db)", "build (empty-db)", "run (with-db)", ...
    detail: str


@dataclass(frozen=True)
class CompileProgress:
    seconds: float
    lines: int  # log lines so far
    tail: tuple[str, ...]


class CompileScreen(ModalScreen[None]):
    """One compile of one model: its log while it runs, then the steps of kernel_entry and what each runs."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel_or_close", "Cancel / close"),
        Binding("f", "fit_launches", "Fit launches (standalone rows)"),
        Binding("r", "run_network", "Run on the GPU vs the empty DB"),
        Binding("n", "never_slower", "Never slower: the network decides (op times file)"),
        Binding("t", "op_times", "Time each op with its row and with the library (writes the op times file)"),
        Binding("g", "cuda_graph", "r and n: time the network in a CUDA graph, or not"),
    ]

    @dataclass
    class Progressed(Message):
        progress: CompileProgress

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, CompileScreen.Progressed)

    @dataclass
    class RunProgressed(Message):
        progress: RunProgress

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, CompileScreen.RunProgressed)

    def __init__(self, job: CompileJob) -> None:
        super().__init__()
        self.job = job
        self.cancel = threading.Event()
        self.shown_lines = 0
        self.report: CompileReport | None = None
        self.made_standalone: tuple[str, ...] = ()
        self.undo_files: tuple[Path, ...] = ()  # one per round of fitting the launches, this screen's presses of f
        self.network_run: NetworkRun | None = None
        self.report_summary = ""  # the shown report's summary (markup), which a run's verdict goes above
        self.cuda_graph = False  # r and n: the network timed (and judged) in a CUDA graph, as --cuda-graph does

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog dialog-wide", id="compile-dialog"):
            yield Label(f"NNFusion: {escape(self.job.model.name)} with {escape(self.job.db.name)}",
                        classes="dialog-title")
            yield Static("starting the compiler…", id="compile-status")
            yield Log(id="compile-log", max_lines=TAIL_LINES)
            yield DataTable(id="compile-steps", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="op-times", cursor_type="row", zebra_stripes=True)
            yield Static(id="compile-summary")

    def on_mount(self) -> None:
        table = self.query_one("#compile-steps", DataTable)
        table.add_columns("step", "node", "runs", "DB row")
        table.display = False
        times = self.query_one("#op-times", DataTable)
        times.add_columns("op", "row us", "library us", "row / library")
        times.display = False
        self.run_compile(self.job, self.cancel)

    @work(thread=True, exit_on_error=False, group="nnfusion", exclusive=True)
    def run_compile(self, job: CompileJob, cancel: threading.Event, fit: bool = False) -> Compiled:
        from core.db.state import StateDB
        from core.nnfusion.compile_job import run_compile_job

        worker = get_current_worker()
        started = last_post = time.monotonic()
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        count = 0

        def on_line(line: str) -> None:
            nonlocal last_post, count
            tail.append(line)
            count += 1
            if (now := time.monotonic()) - last_post >= PROGRESS_INTERVAL_S:
                last_post = now
                self.post_message(self.Progressed(CompileProgress(now - started, count, tuple(tail))))

        with closing(StateDB()) as state:
            compiled = run_compile_job(job, fit_launches=fit, state=state, on_line=on_line,
                                       should_cancel=lambda: cancel.is_set() or worker.is_cancelled)
        self.post_message(self.Progressed(CompileProgress(time.monotonic() - started, count, tuple(tail))))
        return compiled

    def _run_hooks(self, cancel: threading.Event) -> tuple[Callable[[str, str], None], Callable[[], bool]]:
        """A run worker's progress poster (coalesced by RunProgressed.can_replace) and its cancel test."""
        worker = get_current_worker()
        started = time.monotonic()

        def on_progress(stage: str, detail: str) -> None:
            self.post_message(self.RunProgressed(RunProgress(time.monotonic() - started, stage, detail)))

        return on_progress, lambda: cancel.is_set() or worker.is_cancelled

    @work(thread=True, exit_on_error=False, group="nnfusion", exclusive=True)
    def run_network(self, job: CompileJob, cancel: threading.Event, options: RunOptions) -> NetworkRun:
        from core.db.state import StateDB
        from core.gpu.network_run import run_network

        on_progress, cancelled = self._run_hooks(cancel)
        state = StateDB()
        try:
            return run_network(job, options, state=state, on_progress=on_progress, should_cancel=cancelled)
        finally:
            state.close()

    @work(thread=True, exit_on_error=False, group="nnfusion", exclusive=True)
    def run_never_slower(self, job: CompileJob, times: Path, cancel: threading.Event,
                         options: RunOptions) -> NeverSlowerRun:
        """`kdb nnfusion --run --never-slower`'s core use case (core/gpu/never_slower.py), its progress posted."""
        from core.db.state import StateDB

        on_progress, cancelled = self._run_hooks(cancel)
        with closing(StateDB()) as state:
            return run_never_slower(job, times, options, on_progress=on_progress, should_cancel=cancelled,
                                    state=state)

    @work(thread=True, exit_on_error=False, group="nnfusion", exclusive=True)
    def run_op_times(self, job: CompileJob, times: Path, cancel: threading.Event) -> LibraryTimes:
        """`kdb nnfusion --op-times TIMES.json`'s core use case (core/gpu/library_times.py), its progress posted."""
        from core.db.state import StateDB
        from core.gpu.library_times import measure_library_times

        on_progress, cancelled = self._run_hooks(cancel)
        with closing(StateDB()) as state:
            return measure_library_times(job, times_file=times, on_progress=on_progress, should_cancel=cancelled,
                                         state=state)

    def on_compile_screen_run_progressed(self, message: RunProgressed) -> None:
        p = message.progress
        note = " · cancelling…" if self.cancel.is_set() else " · esc cancels"
        self.query_one("#compile-status", Static).update(
            f"running the network: {p.seconds:.1f} s · {escape(p.stage)}: {escape(p.detail.strip()[:100])}{note}")

    def on_compile_screen_progressed(self, message: Progressed) -> None:
        p = message.progress
        log = self.query_one("#compile-log", Log)
        new = p.lines - self.shown_lines  # lines not shown yet (the tail may have dropped older ones)
        if new > 0:
            log.write_lines(p.tail[-min(new, len(p.tail)):])
            self.shown_lines = p.lines
        note = " · cancelling…" if self.cancel.is_set() else " · esc cancels"
        self.query_one("#compile-status", Static).update(f"compiling: {p.seconds:.1f} s, {p.lines} log lines{note}")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "nnfusion" or not event.worker.is_finished:
            return
        if event.state is WorkerState.SUCCESS and isinstance(event.worker.result, Compiled):
            self.made_standalone += event.worker.result.made_standalone
            self.undo_files += tuple(event.worker.result.report.undo_files)
            self.show_report(event.worker.result.report)
        elif event.state is WorkerState.SUCCESS and isinstance(event.worker.result, NetworkRun):
            self.show_run(event.worker.result)
        elif event.state is WorkerState.SUCCESS and isinstance(event.worker.result, NeverSlowerRun):
            self.show_never_slower(event.worker.result)
        elif event.state is WorkerState.SUCCESS and isinstance(event.worker.result, LibraryTimes):
            self.show_op_times(event.worker.result)
        elif event.state is WorkerState.ERROR:
            error = escape(str(event.worker.error))
            self.query_one("#compile-status", Static).update(f"[$error]could not run: {error}[/]")
            self.app.report_worker_failure(event)  # type: ignore[attr-defined]
        else:
            self.query_one("#compile-status", Static).update("cancelled")

    def show_report(self, report: CompileReport) -> None:
        self.report = report
        status = self.query_one("#compile-status", Static)
        summary = self.query_one("#compile-summary", Static)
        result = report.result
        if not report.ok or report.usage is None or result is None:
            lines = "\n".join(f"  {escape(line)}" for line in report.decisive)
            lines += "".join(f"\n[$error]kdb knew: node {escape(b.node)} ({escape(b.op_type)}): {escape(b.reason)}[/]"
                             for b in report.blockers)
            status.update(f"[$error]NNFusion failed: {escape(report.reason)}[/]")
            summary.update((lines + "\n" if lines else "") + (
                "[dim]kept in the Failures view (3) with the log[/]" if report.reason != "cancelled" else ""))
            return
        usage = report.usage
        table = self.query_one("#compile-steps", DataTable)
        with self.app.batch_update():
            self.query_one("#compile-log", Log).display = False
            self.query_one("#op-times", DataTable).display = False
            table.display = True
            for i, step in enumerate(usage.steps, start=1):
                for j, part in enumerate(step.parts):
                    label = str(i) if j == 0 else ""
                    if step.kind == "blockfusion":
                        label += f" BF {j + 1}/{len(step.parts)}"
                    style = RUNS_STYLE.get(part.runs, "dim")
                    table.add_row(label, part.node, Text(part.runs, style=style), ", ".join(part.rows))
        promised, used = report.promised(), usage.used_keys()
        status.update(f"compiled in {result.seconds:.1f} s: {len(used)} DB kernel(s) in the generated code, "
                      f"{len(promised)} promised by coverage")
        broken = report.broken_promises()
        text = [f"{escape(usage.summary())} · {len(result.substitutions)} patterns substituted",
                f"[dim]project[/] {escape(str(result.project))}",
                f"[dim]log[/] {escape(str(result.log_file))}"]
        if broken:
            text.insert(0, f"[$error]coverage and the compiler disagree on: {escape(report.row_names(broken))}[/]")
        launches = report.launches
        if launches is not None and launches.error:
            text.insert(0, f"[$error]launch check could not run ({launches.arch}): {escape(launches.error)}[/]")
        elif launches is not None:
            text.append(f"[dim]launch check ({launches.arch})[/] {escape(report.launch_summary())}")
        if note := standalone_note(self.made_standalone, self.undo_files):
            text.insert(0, f"[$success]{escape(note)}[/]")
        text[:0] = [f"[$error]wrong numbers: {escape(copy.describe())}[/]" for copy in usage.skipped]
        text[:0] = [f"[$error]{escape(w.describe())}[/]" for w in report.miscompiles]
        if failures := report.launch_failures():
            text[:0] = [f"[$error]cannot launch: {escape(line)}[/]" for line in failures] + [
                escape(LAUNCH_ADVICE) + " [b]f[/b] here makes them standalone and compiles again."]
        self.report_summary = "\n".join(text)
        summary.update(self.report_summary)
        self.refresh_bindings()

    def show_run(self, run: NetworkRun, first: tuple[str, ...] = ()) -> None:
        """The run's verdict above the compile's table and summary (of the compile with the DB it ran); `first`:
        lines (markup) above the run's own."""
        self.network_run = run
        self.made_standalone += tuple(k for k in run.with_db.made_standalone if k not in self.made_standalone)
        if run.with_db.compile is not None:
            self.undo_files += tuple(f for f in run.with_db.compile.undo_files if f not in self.undo_files)
        report = run.with_db.compile
        if report is not None and report.ok:
            self.query_one("#compile-steps", DataTable).clear()
            self.show_report(report)
        summary = self.query_one("#compile-summary", Static)
        lines = list(first)
        for contender in (run.with_db, run.empty_db):
            if contender.timing is not None:
                graph = contender.timing.get("graph_median_ms")
                lines.append(f"{contender.label}: {contender.timing['median_ms']:.4f} ms median, max rel err "
                             f"{contender.error:.2e}" + (f"; in a CUDA graph {graph:.4f} ms" if graph else ""))
            elif contender.build is not None and contender.build.ok:
                lines.append(f"{contender.label}: built ({escape(str(contender.build.harness))})")
            elif contender.problem:
                lines.append(f"{contender.label}: {escape(contender.problem)}")
        if run.ratio is not None:
            lines.append(f"ratio {run.ratio:.3f}x (with the DB / with the empty DB)")
        if run.graph_ratio is not None:
            lines.append(f"in a CUDA graph: ratio {run.graph_ratio:.3f}x")
        if run.reference is not None:
            lines.append(f"[dim]error: {escape(ERROR_FORMULA)}; reference {escape(run.reference.runtime)}; allowed "
                         f"{run.max_error:g}[/]")
        lines += [f"[$warning]{escape(note)}[/]" for note in run.notes]
        lines.append(f"[dim]work folder[/] {escape(str(run.workdir))}")
        summary.update("\n".join(lines) + ("\n" + self.report_summary if report is not None and report.ok else ""))
        style = "$success" if run.status == 0 else "$error" if run.status == 1 else "$warning"
        verdict = "; ".join(run.verdicts())
        where = f" on {run.device}" if run.device else ""
        self.query_one("#compile-status", Static).update(f"[{style}]network{escape(where)}: {escape(verdict)}[/]")
        self.refresh_bindings()

    def show_never_slower(self, result: NeverSlowerRun) -> None:
        """The network as the DB now is (or as it was, when nothing was kept), then each trial and the verdict."""
        trials = tuple(f"{'kept' if t.kept else 'put back'}: {escape(t.candidate.describe())}: {escape(t.why)}"
                       + (f" [dim](undo: kdb db undo {escape(str(t.undo_file))} --apply)[/]" if t.undo_file else "")
                       for t in result.trials)
        shown = result.final or result.baseline
        if shown is not None:
            self.show_run(shown, trials)
        style = "$success" if result.status == 0 else "$error" if result.status == 1 else "$warning"
        self.query_one("#compile-status", Static).update(
            f"[{style}]never slower: {escape('; '.join(result.findings))}[/]")
        self.refresh_bindings()

    def show_op_times(self, run: LibraryTimes) -> None:
        """Each op's row against the library, the slowest ratio first with a bar; what was not timed, and why."""
        table = self.query_one("#op-times", DataTable)
        table.clear()
        ordered = sorted(run.ops, key=lambda op: -(op.ratio or 0.0))
        for op in ordered:
            if op.timed:
                table.add_row(op.name, f"{op.row_us:.2f}", f"{op.library_us:.2f}", ratio_bar(op.ratio))
            else:
                table.add_row(op.name, "-", "-", Text(op.outcome(), style="dim"))
        table.display = True
        self.query_one("#compile-log", Log).display = False
        self.query_one("#compile-steps", DataTable).display = False
        lines = [*run.findings, *run.notes]
        if run.written:
            lines.append(f"times written to {run.times_file}: n (never slower) takes it")
        style = "$success" if run.status == 0 else "$error" if run.status == 1 else "$warning"
        self.query_one("#compile-summary", Static).update("\n".join(escape(line) for line in lines))
        self.query_one("#compile-status", Static).update(
            f"[{style}]op times: {len(run.timed())} of {len(run.ops)} op(s) timed"
            f"{escape(' on ' + run.device) if run.device else ' (no GPU: built, not run)'}[/]")
        self.refresh_bindings()

    def action_op_times(self) -> None:
        self._with_times_file("Write the op times file (kdb nnfusion --op-times TIMES.json) to:",
                              "op times: each op with its row and with the library…",
                              lambda times: self.run_op_times(self.job, times.resolve(), self.cancel))

    def action_never_slower(self) -> None:
        self._with_times_file("The op times file (kdb nnfusion --op-times TIMES.json)",
                              "never slower: the network as the DB is, first…",
                              lambda times: self.run_never_slower(self.job, times, self.cancel, self.run_options()))

    def _with_times_file(self, question: str, status: str, start: Callable[[Path], None]) -> None:
        """Ask for an op times file; once given, say `status` and start the run with it."""
        def chosen(path: str | None) -> None:
            if not path:
                return
            self.cancel.clear()
            self.report = None
            self.query_one("#compile-status", Static).update(status)
            self.refresh_bindings()
            start(Path(path).expanduser())

        settings = self.app.context.settings  # type: ignore[attr-defined]
        self.app.push_screen(PathDialog(question, dialog_default(settings, "times.json")), chosen)

    def action_run_network(self) -> None:
        self.cancel.clear()
        self.report = None
        self.query_one("#compile-status", Static).update("running the network: starting…")
        self.refresh_bindings()
        self.run_network(self.job, self.cancel, self.run_options())

    def run_options(self) -> RunOptions:
        """r's and n's options: the launches fitted, as `kdb nnfusion --run` does, in a CUDA graph where g asked."""
        return RunOptions(fit_launches=RUN_FITS_LAUNCHES, cuda_graph=self.cuda_graph)

    def action_cuda_graph(self) -> None:
        self.cuda_graph = not self.cuda_graph
        self.notify("r and n time the network in a CUDA graph (--cuda-graph): kernel_entry captured once, then "
                    "replayed, and judge it by that time" if self.cuda_graph else
                    "r and n time kernel_entry as NNFusion calls it (no CUDA graph)")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("run_network", "never_slower", "op_times"):  # offered whenever nothing runs
            return not any(w.group == "nnfusion" and w.is_running for w in self.workers)
        if action == "fit_launches":  # offered only when a fused kernel cannot launch and nothing runs
            running = any(w.group == "nnfusion" and w.is_running for w in self.workers)
            return self.report is not None and bool(self.report.launch_failures()) and not running
        return True

    def action_fit_launches(self) -> None:
        self.report = None
        self.shown_lines = 0
        with self.app.batch_update():
            table = self.query_one("#compile-steps", DataTable)
            table.clear()
            table.display = False
            log = self.query_one("#compile-log", Log)
            log.clear()
            log.display = True
            self.query_one("#compile-summary", Static).update("")
            self.query_one("#compile-status", Static).update("making the rows standalone, compiling again…")
        self.refresh_bindings()
        self.run_compile(self.job, self.cancel, fit=True)

    def action_cancel_or_close(self) -> None:
        running = any(w.group == "nnfusion" and w.is_running for w in self.workers)
        if running and not self.cancel.is_set():
            self.cancel.set()
            self.query_one("#compile-status", Static).update("cancelling…")
        elif not running:
            self.dismiss(None)

"""AutoTVM logs: the workloads of a tuning log (trials, errors by kind, best time), each one's best-so-far curve
and best knob config, and the lines that could not be read.

The log is parsed in a thread worker (the artifact's biggest is 3 MB) that posts the summary back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.markup import escape
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Label, Static
from textual.worker import Worker, WorkerState

from console.screens.base import KdbScreen
from console.widgets.best_so_far_plot import BestSoFarPlot, microseconds
from console.widgets.dialogs import PathDialog, dialog_default
from console.widgets.workload_table import WorkloadTable
from core.opconfigs.autotvm_log import LogSummary, WorkloadSummary

BAD_LINES_SHOWN = 200


class AutoTvmScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "open_log", "Open log"),
        Binding("l", "toggle_scale", "Log/linear scale"),
        Binding("r", "reload", "Reload log", show=False),
    ]

    @dataclass
    class LogLoaded(Message):
        summary: LogSummary

    def __init__(self) -> None:
        super().__init__()
        self.summary: LogSummary | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("o opens an AutoTVM tuning log (TVM JSON lines, one measured config a line)", id="log-status")
        yield WorkloadTable(id="workload-table")
        with Horizontal(id="autotvm-bottom"):
            yield BestSoFarPlot(id="curve")
            with VerticalScroll(id="workload-pane"):
                yield Label("Workload", classes="section")
                yield Static("[dim]nothing selected[/]", id="workload-detail")
                yield Label("Bad lines", classes="section", id="bad-lines-title")
                yield Static("[dim]no log read yet[/]", id="bad-lines")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(WorkloadTable).focus()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "reload":
            return self.summary is not None
        return True

    # -- loading -------------------------------------------------------------------------------

    def action_open_log(self) -> None:
        default = str(self.summary.path) if self.summary else dialog_default(self.app.context.settings)  # type: ignore[attr-defined]

        def chosen(path: str | None) -> None:
            if path:
                self.open_log(Path(path).expanduser())

        self.app.push_screen(PathDialog("Open an AutoTVM log:", default), chosen)

    def action_reload(self) -> None:
        if self.summary is not None:
            self.open_log(self.summary.path)

    def open_log(self, path: Path) -> None:
        self.query_one("#log-status", Static).update(f"reading {escape(str(path))}…")
        self.load_log(path)

    @work(thread=True, exit_on_error=False, group="log", exclusive=True)
    def load_log(self, path: Path) -> None:
        from core.opconfigs.autotvm_log import read_log

        self.post_message(self.LogLoaded(read_log(path)))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Failures are reported by KdbScreen's handler, which Textual calls too (each class's, along the MRO).
        if event.worker.group == "log" and event.state is WorkerState.ERROR:
            self.query_one("#log-status", Static).update(f"[$error]{escape(str(event.worker.error))}[/]")

    def on_auto_tvm_screen_log_loaded(self, message: LogLoaded) -> None:
        self.summary = summary = message.summary
        with self.app.batch_update():
            self.query_one(WorkloadTable).show(summary.workloads)
            bad = f"{summary.bad_line_count:,} bad lines" if summary.bad_line_count else "no bad lines"
            self.query_one("#log-status", Static).update(
                f"[b]{escape(str(summary.path))}[/b] · {len(summary.workloads)} workloads · "
                f"{summary.records:,} records · {bad}")
            self.query_one("#bad-lines-title", Label).update(f"Bad lines ({summary.bad_line_count:,})")
            self.query_one("#bad-lines", Static).update(bad_lines_text(summary))
            self._show_workload()
        self.refresh_bindings()

    # -- the selected workload -----------------------------------------------------------------

    def _current(self) -> WorkloadSummary | None:
        index = self.query_one(WorkloadTable).current_index()
        if self.summary is None or index is None:
            return None
        return self.summary.workloads[index]

    def _show_workload(self) -> None:
        workload = self._current()
        self.query_one(BestSoFarPlot).show(workload)
        self.query_one("#workload-detail", Static).update(
            workload_text(workload) if workload else "[dim]nothing selected[/]")

    @on(DataTable.RowHighlighted, "#workload-table")
    def row_highlighted(self) -> None:
        self._show_workload()

    def action_toggle_scale(self) -> None:
        plot = self.query_one(BestSoFarPlot)
        plot.log_scale = not plot.log_scale


def workload_text(w: WorkloadSummary) -> str:
    op = escape(w.op_config.describe()) if w.op_config else f"[$warning]no op config: {escape(w.op_config_note)}[/]"
    best = (f"best {microseconds(w.best_seconds)} at trial {w.best_trial:,}" if w.best_seconds is not None
            else "[$error]no successful trial[/]")
    lines = [f"[b]{escape(w.task)}[/b] {escape(json.dumps(w.args))}",
             f"[dim]op[/]  {op}",
             f"[dim]trials[/]  {w.trials:,} · [dim]ok[/] {w.successes:,} · {best}"]
    if w.errors_by_kind:
        lines.append("[dim]errors[/]  " + " · ".join(f"{kind} {n:,}" for kind, n in w.errors_by_kind.items()))
    if w.best_config:
        lines.append("[b]best config[/b]")
        knobs = [knob_parts(k) for k in w.best_config]
        width = max(len(name) for name, _, _ in knobs) + 2
        lines += [f"  {escape(name.ljust(width))}[dim]{escape(kind.ljust(3))}[/] {escape(value)}"
                  for name, kind, value in knobs]
    return "\n".join(lines)


def knob_parts(knob: object) -> tuple[str, str, str]:
    """(name, kind, value) of one knob as AutoTVM writes it, [name, kind, value]; anything else as it is."""
    if isinstance(knob, list) and len(knob) == 3:
        return str(knob[0]), str(knob[1]), json.dumps(knob[2])
    return json.dumps(knob), "", ""


def bad_lines_text(summary: LogSummary) -> str:
    if not summary.bad_line_count:
        return "[dim]none: every line is a record, a blank or a comment[/]"
    lines = []
    for error in summary.bad_lines[:BAD_LINES_SHOWN]:
        number = error.where.rpartition(":")[2]
        lines.append(f"line {escape(number)}: {escape(error.reason)}")
    if summary.bad_line_count > len(lines):
        lines.append(f"… and {summary.bad_line_count - len(lines):,} more")
    return "\n".join(lines)

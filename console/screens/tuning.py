"""Tuning: tune a list of op configs with MetaSchedule, watch every op's trials live, cancel and resume.

The list comes from the Op configs view (the context's list: taken whenever it changed there; o takes it
again) or from an op-config file or ONNX model (i). A model is tuned as one network: only the ops NNFusion
looks up in the kernel DB, the trials spread by each op's share of the network's time, the predicted network
time shown live (core/tuning/network.py). Start reads the options as TuneChoices and has core's tune_request
check them and build the request, as `kdb tune` does; the run is one thread worker around core's run_request:
it posts coalesced snapshots of every op's state (core/tuning/progress.py) and of MetaSchedule's log tail, and
returns the QueueReport; the CLI's --json stream carries the same events. Cancel sets a flag the engine reads
after each measured trial; the trials stay in each op's work dir, so starting again resumes. Ops not in a run
show what their work dir holds. The settings' RPC tracker is read in a worker every few seconds while the view
is shown.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.message import Message
from textual.reactive import var
from textual.widgets import Button, Checkbox, DataTable, Footer, Header, Input, Label, Select, Static
from textual.worker import Worker, WorkerState, get_current_worker

from console.context import ConsoleContext
from console.screens.base import KdbScreen
from console.widgets.dialogs import PathDialog, dialog_default
from console.widgets.log_tail import LogTail, LogTailView, MetaScheduleTap
from console.widgets.run_note import RunNote, next_step
from console.widgets.selected_op import SelectedOp
from console.widgets.tracker_panel import TrackerPanel
from console.widgets.tune_options import TuneOptions, label_of
from console.widgets.tune_table import TuneTable
from core.codegen.batch import Inputs
from core.errors import KdbError
from core.opconfigs.opconfig import OpConfig
from core.tuning.board import History, ImportFound, TuneBoard, read_history
from core.tuning.network import NetworkEvent
from core.tuning.progress import OpRun, RunProgress
from core.tuning.queue import QueueReport, tuning_root
from core.tuning.request import TuneRequest, list_inputs, read_tune_inputs, run_request, tune_request

TRACKER_REFRESH_S = 3.0
EMPTY_HINT = ("Nothing to tune yet. The list comes from the Op configs view (5; [b]o[/b] takes it again), "
              "or [b]i[/b] imports an op-config file (lines, .toml, .json) or an ONNX model.")


class TuningScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "start", "Start / resume"),
        Binding("escape", "cancel_run", "Cancel run"),
        Binding("i", "import", "Import"),
        Binding("o", "take_opconfigs", "Use Op configs list"),
        Binding("l", "toggle_scale", "Log/linear scale"),
        Binding("r", "refresh_tracker", "Refresh tracker", show=False),
    ]

    running: var[bool] = var(False)

    @dataclass
    class Imported(Message):
        path: Path
        inputs: Inputs  # a model's: the ops NNFusion looks up, with their counts

    @dataclass
    class HistoryLoaded(Message):
        generation: int  # a newer load supersedes this one
        runs: History  # what each op's work dir holds

    @dataclass
    class Progressed(Message):
        runs: Mapping[str, OpRun]  # every op of the run, by OpConfig.key
        network: NetworkEvent | None = None  # a network's prediction from the best kernels so far

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, TuningScreen.Progressed)

    @dataclass
    class Logged(Message):
        tail: LogTail

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, TuningScreen.Logged)

    @dataclass
    class GpuProbed(Message):
        available: bool
        what: str  # the device's name, or why there is none

    def __init__(self) -> None:
        super().__init__()
        self.board = TuneBoard()  # the ops shown, their runs and work dirs (core/tuning/board.py)
        self.taken: tuple[str, ...] = ()  # the Op configs view's list when it was last taken
        self.history_generation = 0
        self.report: QueueReport | None = None
        self.run_error = ""
        self.explanation = ""  # why Start refused, until an option changes
        self.gpu: tuple[bool, str] | None = None
        self.cancel_requested = threading.Event()

    @property
    def context(self) -> ConsoleContext:
        return self.app.context  # type: ignore[attr-defined]

    @property
    def configs(self) -> list[OpConfig]:
        return self.board.configs

    def compose(self) -> ComposeResult:
        settings = self.context.settings
        yield Header()
        with Horizontal(id="tuning-top"):
            with Vertical(id="tuning-left"):
                yield TuneTable(id="tune-table")
                yield Static(EMPTY_HINT, id="tuning-empty")
                yield Static(id="tuning-status")
            with VerticalScroll(id="tuning-right"):
                yield TuneOptions(settings, id="tune-options")
                yield Label("RPC tracker", classes="section", id="tracker-title")
                yield TrackerPanel(id="tracker")
                with Horizontal(id="tune-buttons"):
                    yield Button("Start (ctrl+r)", variant="primary", id="start")
                    yield Button("Cancel (esc)", variant="error", id="cancel", disabled=True)
                yield RunNote(id="run-note")
        with Horizontal(id="tuning-bottom"):
            yield SelectedOp(id="tune-curve-pane")
            with Vertical(id="tune-log-pane"):
                yield Label("Log (MetaSchedule and the queue, last 200 lines)", classes="section")
                yield LogTailView(id="tune-log")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.tracker_timer = self.set_interval(TRACKER_REFRESH_S, self.poll_tracker)
        self.probe_gpu()
        self.query_one(TuneTable).focus()

    def on_screen_resume(self) -> None:
        # The Op configs view may have a new list, the settings a new tracker, another run new trials.
        self.tracker_timer.resume()
        if not self.running:
            self.follow_opconfigs()
            self.load_history()
        self.poll_tracker()
        self.refresh_view()

    def on_screen_suspend(self) -> None:
        self.tracker_timer.pause()

    # -- the list ------------------------------------------------------------------------------

    @property
    def options(self) -> TuneOptions:
        return self.query_one(TuneOptions)

    def follow_opconfigs(self, *, force: bool = False) -> None:
        configs = list(self.context.opconfigs)
        if force and not configs:
            self.notify("the Op configs view (5) has no list yet", severity="warning")
            return
        keys = tuple(c.key for c in configs)
        if force or keys != self.taken:
            self.taken = keys
            self.set_inputs(list_inputs(configs), "the Op configs view")

    def set_inputs(self, inputs: Inputs, source: str) -> None:
        self.board.take(inputs, source)
        self.load_history()
        self.refresh_view()

    def action_take_opconfigs(self) -> None:
        if not self.running:
            self.follow_opconfigs(force=True)

    def action_import(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.import_file(Path(path).expanduser())

        self.app.push_screen(PathDialog("Tune the op configs of a file (lines, .toml, .json) or an ONNX model:",
                                        dialog_default(self.context.settings)), chosen)

    @work(thread=True, exit_on_error=False, group="import")
    def import_file(self, path: Path) -> None:
        self.post_message(self.Imported(path, read_tune_inputs([path], self.context.settings)))

    def on_tuning_screen_imported(self, message: Imported) -> None:
        found = ImportFound.of(message.inputs, message.path.name)
        if found.ops and self.running:
            self.notify("a run is on: the list changes once it ends", severity="warning")
            return
        if found.ops:
            self.set_inputs(message.inputs, message.path.name)
        severity = "error" if not found.ops else "warning" if found.refused else "information"
        self.notify(found.text, severity=severity, **({"timeout": 10} if severity == "error" else {}))

    # -- what each op's work dir holds ---------------------------------------------------------

    def load_history(self) -> None:
        self.history_generation += 1
        self.read_history(self.history_generation, list(self.configs), self.options.target, self.options.arch)

    @work(thread=True, exit_on_error=False, group="history", exclusive=True)
    def read_history(self, generation: int, configs: list[OpConfig], target: str, arch: str) -> None:
        self.post_message(self.HistoryLoaded(generation, read_history(configs, target, arch)))

    def on_tuning_screen_history_loaded(self, message: HistoryLoaded) -> None:
        if message.generation == self.history_generation:  # else a newer read is on its way
            self.board.history_read(message.runs, running=self.running)
            self.refresh_view()

    # -- showing -------------------------------------------------------------------------------

    def run_of(self, key: str) -> OpRun:
        return self.board.run_of(key)

    def refresh_view(self) -> None:
        table = self.query_one(TuneTable)
        shares = self._shares()
        with self.app.batch_update():
            table.show(self.configs, self.run_of, lambda key: shares.get(key, self.options.trials), self.board.count)
            table.display = bool(self.configs)
            self.query_one("#tuning-empty").display = not self.configs
            self._update_status()
            self._update_measure_note()
            self._update_run_note()
            self._update_selected()
        self.refresh_bindings()

    def _update_status(self) -> None:
        text = self.board.status(running=self.running, trials=self.options.trials, cap=self.options.cap)
        self.query_one("#tuning-status", Static).update(escape(text))

    def _shares(self) -> dict[str, int]:
        return self.board.shares(running=self.running, trials=self.options.trials, cap=self.options.cap)

    def _update_measure_note(self) -> None:
        self.options.show_measuring(self.context.settings.rpc_tracker, self.gpu, self.context.db_path.name)

    def _update_run_note(self) -> None:
        shares, budget = self._shares(), self.options.trials
        runs = [(self.run_of(c.key), shares.get(c.key, budget)) for c in self.configs]
        self.query_one(RunNote).show(self.explanation, running=self.running,
                                     cancelling=self.cancel_requested.is_set(), run_error=self.run_error,
                                     report=self.report, states=[run.status for run in self.board.live.values()],
                                     next_step=next_step(runs, budget, network=self.board.network is not None))

    def _current(self) -> OpConfig | None:
        key = self.query_one(TuneTable).current_key()
        return next((c for c in self.configs if c.key == key), None)

    def _update_selected(self) -> None:
        config = self._current()
        run = self.run_of(config.key) if config is not None else None
        planned = self._shares().get(config.key, self.options.trials) if config is not None else 0
        self.query_one(SelectedOp).show(config, run, planned)

    @on(DataTable.RowHighlighted, "#tune-table")
    def row_highlighted(self) -> None:
        self._update_selected()

    def action_toggle_scale(self) -> None:
        self.query_one(SelectedOp).toggle_scale()

    # -- options -------------------------------------------------------------------------------

    @on(Input.Changed, "#trials")
    @on(Input.Changed, "#cap")
    def trials_changed(self) -> None:
        self.options.clear_bad("trials", "max_per_op")
        self.explanation = ""
        self.refresh_view()

    @on(Input.Changed, "#batch")
    @on(Input.Changed, "#population")
    def search_changed(self) -> None:
        self.options.clear_bad("batch", "population")
        self.explanation = ""
        self._update_run_note()

    @on(Select.Changed, "#target")
    @on(Input.Changed, "#arch")
    def work_dirs_changed(self) -> None:
        # Another target or arch is another work dir per op: what the last run showed is not about it.
        self.options.clear_bad("arch")
        self.board.live, self.report, self.run_error, self.explanation = {}, None, "", ""
        self.load_history()
        self.refresh_view()

    @on(Checkbox.Changed, "#use-rpc")
    def use_rpc_changed(self) -> None:
        self.explanation = ""
        self.refresh_view()

    # -- the GPU and the tracker ---------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="gpu")
    def probe_gpu(self) -> None:
        from core.gpu.jobs import gpu_available

        self.post_message(self.GpuProbed(*gpu_available()))

    def on_tuning_screen_gpu_probed(self, message: GpuProbed) -> None:
        self.gpu = (message.available, message.what)
        self._update_measure_note()

    def poll_tracker(self) -> None:
        self.query_one(TrackerPanel).poll(self.context.settings.rpc_tracker, self.context.settings.rpc_key)

    def action_refresh_tracker(self) -> None:
        self.poll_tracker()

    # -- running -------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "start":
            return False if self.running else (True if self.configs else None)
        if action == "cancel_run":
            return self.running
        if action in ("import", "take_opconfigs"):
            return not self.running
        if action == "refresh_tracker":
            return bool(self.context.settings.rpc_tracker)
        return True

    def request(self) -> TuneRequest:
        """The run the options ask for, checked and built by core as `kdb tune` builds it (else a KdbError)."""
        return tune_request(self.board.inputs, self.options.choices(), self.context.settings,
                            db_path=self.context.db_path, gpu=self.gpu)

    @on(Button.Pressed, "#start")
    def action_start(self) -> None:
        if self.running:
            return
        if not self.configs:
            self.notify("nothing to tune: build a list in Op configs (5) or import one (i)", severity="warning")
            return
        if self.options.target == "cuda" and self.gpu is None:
            self.notify("still looking for a CUDA device: try again in a moment", severity="warning")
            return
        try:
            request = self.request()
        except KdbError as exc:  # refused: say which option and why until an option changes
            self.options.mark_bad(exc)
            label = label_of(exc)
            self.explanation = f"[$warning]{escape(f'{label}: {exc.reason}' if label else exc.reason)}[/]"
            self._update_run_note()
            self.notify(f"{label}: {exc.reason}" if label else exc.reason, severity="error")
            return
        self.cancel_requested = threading.Event()
        self.board.planned = self._shares()
        self.board.live, self.report, self.run_error, self.explanation = {}, None, "", ""
        self.query_one(LogTailView).reset()
        self.running = True
        self.tune(request, self.cancel_requested)
        self.refresh_view()

    @on(Button.Pressed, "#cancel")
    def action_cancel_run(self) -> None:
        if self.running and not self.cancel_requested.is_set():
            self.cancel_requested.set()
            self._update_run_note()

    @work(thread=True, exit_on_error=False, group="tune", exclusive=True)
    def tune(self, request: TuneRequest, cancel: threading.Event) -> QueueReport:
        worker = get_current_worker()
        with MetaScheduleTap(lambda tail: self.post_message(self.Logged(tail))) as tap:
            progress = RunProgress(request, tuning_root(),
                                   lambda runs, network: self.post_message(self.Progressed(runs, network)), tap.note)
            return run_request(request, on_trial=progress.trial, on_job=progress.job, on_phase=progress.phase,
                               on_network=progress.network, on_note=tap.note,
                               should_cancel=lambda: cancel.is_set() or worker.is_cancelled)

    def on_tuning_screen_progressed(self, message: Progressed) -> None:
        self.board.live = dict(message.runs)
        self.board.network_event = message.network
        self.refresh_view()

    def on_tuning_screen_logged(self, message: Logged) -> None:
        self.query_one(LogTailView).show(message.tail)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Failures are reported by KdbScreen's handler, which Textual calls too (each class's, along the MRO).
        if event.worker.group != "tune" or not event.worker.is_finished:
            return
        self.running = False
        if event.state is WorkerState.SUCCESS and isinstance(event.worker.result, QueueReport):
            self.report = event.worker.result
        elif event.state is WorkerState.ERROR:
            self.run_error = str(event.worker.error)
        self.load_history()
        self.refresh_view()

    def watch_running(self, running: bool) -> None:
        self.query_one("#tune-options").disabled = running
        self.query_one("#start", Button).disabled = running
        self.query_one("#cancel", Button).disabled = not running
        self.refresh_bindings()

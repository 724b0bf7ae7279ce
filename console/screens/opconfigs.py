"""Op configs: the list of ops to build kernels for; add, edit, delete, import (files or ONNX models), export,
check coverage against the open DB, and generate + inject kernels for all of them.

The list lives in the screen (it is not persisted: export keeps it). It starts empty, or on the demo DB
with the op configs of the network the demo was built from. Files, models and the
DB are read in thread workers that post messages back; the generate run is one worker around core's use case
(core.inject.generate_run.generate_and_inject, the one `kdb codegen --inject` runs): it posts the run's events and
returns its GenerateReport.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import var
from textual.widgets import Button, DataTable, Footer, Header, Label, Static
from textual.worker import Worker, WorkerState, get_current_worker

from console.context import ConsoleContext
from console.screens.base import KdbScreen
from console.widgets.dialogs import ConfirmDialog, PathDialog, dialog_default
from console.widgets.generate_panel import GeneratePanel
from console.widgets.model_convert import Conversion, ask_output, convert_and_notify
from console.widgets.opconfig_detail import ImportReport, OpConfigDetail
from console.widgets.opconfig_dialog import DEFAULT_TEMPLATE, OpConfigDialog
from console.widgets.opconfig_table import OpConfigTable, OpListStatus
from core.errors import InputError
from core.inject import generate_run
from core.inject.generate_run import (
    CodegenProgress,
    CompileCheckSkipped,
    GenerateEvent,
    GenerateReport,
    GenerateRequest,
)
from core.inject.pipeline import InjectSnapshot
from core.nnfusion.coverage import CoverageEntry
from core.nnfusion.oplist import list_coverage, read_op_list
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.opconfig import OpConfig, dedupe, format_line, write_opconfigs
from core.settings import Settings

EMPTY_HINT = ("No op configs yet. [b]a[/b] adds one (from a template, checked as you type), "
              "[b]i[/b] imports an op-config file (lines, .toml, .json) or an ONNX model.")
IMPORT_HINT = "i imports an op-config file or an ONNX model; unmapped ONNX nodes are listed here with the reason."


class OpConfigsScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "add", "Add"),
        Binding("e", "edit", "Edit", show=False),  # enter on a row edits it too
        Binding("d,delete", "delete", "Delete", show=False),  # the help (?) and ctrl+p list it
        Binding("i", "import", "Import"),
        Binding("x", "export", "Export"),
        Binding("c", "coverage", "Coverage"),
        Binding("g", "generate", "Generate", tooltip="Generate & inject"),
        Binding("n", "compile_with_nnfusion", "NNFusion", tooltip="Compile with NNFusion"),
        Binding("h", "convert('fp16')", "fp16", tooltip="Convert the model to fp16 and import it"),
        Binding("E", "convert('expand')", "Expand", show=False, tooltip="Write out the ops NNFusion cannot import "
                "(HardSwish, ...) as ONNX defines them, and import that model"),
        Binding("escape", "cancel_run", "Cancel", tooltip="Cancel the run"),
        Binding("f", "show_failures", "Failures", tooltip="Show the failures of the last run"),
        Binding("D", "clear", "Clear the list", show=False),
    ]

    running: var[bool] = var(False)

    @dataclass
    class Imported(Message):
        path: Path
        configs: list[OpConfig]
        errors: list[InputError]  # lines or entries of an op-config file that were refused
        extraction: Extraction | None  # set for an ONNX model

    @dataclass
    class Covered(Message):
        generation: int  # a newer check supersedes this one
        entries: list[CoverageEntry]

    @dataclass
    class RunEvent(Message):
        """An event of the generate run (core.inject.generate_run), posted from its worker."""

        event: GenerateEvent

        def can_replace(self, message: Message) -> bool:  # only the newest snapshot of a kind matters
            return (isinstance(message, OpConfigsScreen.RunEvent) and type(message.event) is type(self.event)
                    and not isinstance(self.event, CompileCheckSkipped))

    def __init__(self) -> None:
        super().__init__()
        self.configs: list[OpConfig] = []
        self.models: dict[Path, Extraction] = {}  # ONNX models imported, newest last: coverage reads their graphs
        self.coverage: dict[str, CoverageEntry] = {}  # by OpConfig.key, from the last check
        self.coverage_checked = False
        self.coverage_generation = 0
        self.result: GenerateReport | None = None
        self.cancel_requested = threading.Event()

    @property
    def context(self) -> ConsoleContext:
        return self.app.context  # type: ignore[attr-defined]

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="opconfigs-top"):
            yield OpConfigTable(id="opconfig-table")
            yield Static(EMPTY_HINT, id="opconfigs-empty")
            yield OpListStatus(id="opconfigs-status")
        with Horizontal(id="opconfigs-bottom"):
            with VerticalScroll(id="opconfig-detail-pane"):
                yield Label("Selected", classes="section")
                yield OpConfigDetail(id="opconfig-detail")
            with VerticalScroll(id="import-pane"):
                yield Label("Import", classes="section")
                yield ImportReport(IMPORT_HINT, id="import-report")
            with VerticalScroll(id="generate-pane"):
                yield Label("Generate and inject", classes="section")
                yield GeneratePanel(id="generate-panel")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._refresh()
        self.query_one(OpConfigTable).focus()
        if self.context.demo:
            # The demo DB was built from a network's op configs: list them, with what the DB holds of each.
            self.coverage_checked = True
            self.import_demo()

    def on_screen_resume(self) -> None:
        # Other views change the DB (Inject, Kernels deletes, retries): a coverage shown must be current.
        self._recheck_coverage()

    def _recheck_coverage(self) -> None:
        """Once coverage has been asked for (c), keep it current as the list or the DB changes."""
        if self.coverage_checked and self.configs:
            self.check_coverage()

    def _list_changed(self) -> None:
        self._refresh()
        self._recheck_coverage()

    # -- showing the list ----------------------------------------------------------------------

    def _refresh(self) -> None:
        table = self.query_one(OpConfigTable)
        with self.app.batch_update():
            table.show(self.configs, self.coverage)
            table.display = bool(self.configs)
            self.query_one("#opconfigs-empty").display = not self.configs
            self._update_status()
            self._update_detail()
        self.refresh_bindings()

    def _update_status(self) -> None:
        self.query_one(OpListStatus).show(self.configs, self.coverage, list(self.models.values()),
                                          self.context.db_path.name)

    def _current(self) -> OpConfig | None:
        key = self.query_one(OpConfigTable).current_key()
        return next((c for c in self.configs if c.key == key), None)

    def _update_detail(self) -> None:
        config = self._current()
        self.query_one(OpConfigDetail).show(config, self.coverage.get(config.key) if config else None)

    @on(DataTable.RowHighlighted, "#opconfig-table")
    def row_highlighted(self) -> None:
        self._update_detail()

    @on(DataTable.RowSelected, "#opconfig-table")
    def row_selected(self) -> None:
        self.action_edit()  # enter, or a click on the highlighted row

    # -- add, edit, delete ---------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("edit", "delete", "export", "coverage", "clear"):
            return True if self.configs else None
        if action == "generate":
            return False if self.running else (True if self.configs else None)
        if action == "cancel_run":
            return self.running
        if action in ("compile_with_nnfusion", "convert"):
            return True if self.models else None
        if action == "show_failures":
            return bool(self.result and self.result.failed)
        return True

    def _taken(self, skip: str | None = None) -> dict[str, int]:
        """Keys already listed and their row numbers (a duplicate is refused in the dialog, with the row)."""
        return {c.key: n for n, c in enumerate(self.configs, start=1) if c.key != skip}

    def _select(self, key: str) -> None:
        table = self.query_one(OpConfigTable)
        table.move_cursor(row=table.get_row_index(key))

    def action_add(self) -> None:
        current = self._current()
        template = format_line(current) if current else DEFAULT_TEMPLATE

        def added(config: OpConfig | None) -> None:
            if config is not None:
                self.configs.append(replace(config, source="typed in"))
                self._list_changed()
                self._select(config.key)

        self.app.push_screen(OpConfigDialog("Add an op config (the artifact's line format)", template,
                                            taken=self._taken()), added)

    def action_edit(self) -> None:
        current = self._current()
        if current is None:
            return

        def edited(config: OpConfig | None) -> None:
            if config is None or current not in self.configs:
                return
            source = current.source if current.source.endswith("(edited)") else f"{current.source} (edited)"
            self.configs[self.configs.index(current)] = replace(config, source=source.strip())
            self._list_changed()

        self.app.push_screen(OpConfigDialog(f"Edit op config {self.configs.index(current) + 1}", format_line(current),
                                            taken=self._taken(skip=current.key), save_label="Save"), edited)

    def action_delete(self) -> None:
        current = self._current()
        if current is None:
            return

        def confirmed(yes: bool | None) -> None:
            if yes and current in self.configs:
                self.configs.remove(current)
                self._refresh()

        self.app.push_screen(ConfirmDialog(f"Delete op config {self.configs.index(current) + 1}?",
                                           current.describe(), confirm_label="Delete"), confirmed)

    def action_clear(self) -> None:
        def confirmed(yes: bool | None) -> None:
            if yes:
                self.configs.clear()
                self._refresh()

        self.app.push_screen(ConfirmDialog(f"Clear the list of {len(self.configs)} op configs?",
                                           "The list is not saved anywhere: x exports it first.",
                                           confirm_label="Clear"), confirmed)

    # -- import and export ---------------------------------------------------------------------

    def action_import(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.import_file(Path(path).expanduser())

        self.app.push_screen(PathDialog("Import op configs (lines, .toml, .json) or an ONNX model:",
                                        dialog_default(self.context.settings)), chosen)

    @work(thread=True, exit_on_error=False, group="import")
    def import_file(self, path: Path) -> None:
        self._read_and_post(path)

    @work(thread=True, exit_on_error=False, group="import")
    def import_demo(self) -> None:
        from core.demo import demo_opconfigs_path

        self._read_and_post(demo_opconfigs_path())

    def _read_and_post(self, path: Path) -> None:
        read = read_op_list(path, self.context.settings)  # as `kdb opconfig extract` reads a model
        self.post_message(self.Imported(path, read.configs, read.errors, read.extraction))

    def on_op_configs_screen_imported(self, message: Imported) -> None:
        if message.extraction is not None:
            self.models.pop(message.path, None)
            self.models[message.path] = message.extraction
            self.refresh_bindings()
        known = {c.key for c in self.configs}
        new = [c for c in dedupe(message.configs) if c.key not in known]
        self.configs.extend(new)
        self._list_changed()
        if new:
            self._select(new[0].key)
        already = len(dedupe(message.configs)) - len(new)
        self.query_one(ImportReport).show(message.path, message.configs, message.errors, message.extraction,
                                          added=len(new), already=already)
        severity = "information" if new else "warning"
        self.notify(f"{len(new)} op config(s) added from {message.path.name}"
                    + (f" ({already} already listed)" if already else ""), severity=severity)

    def action_export(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.export_list(list(self.configs), Path(path).expanduser())

        self.app.push_screen(PathDialog(f"Export {len(self.configs)} op configs (.toml, .json, else lines) to:",
                                        dialog_default(self.context.settings, "opconfigs.txt")), chosen)

    @work(thread=True, exit_on_error=False, group="export")
    def export_list(self, configs: list[OpConfig], path: Path) -> None:
        write_opconfigs(configs, path)  # as `kdb opconfig extract -o` writes
        self.app.call_from_thread(self.notify, f"exported {len(configs)} op configs to {path}")

    # -- coverage ------------------------------------------------------------------------------

    def action_coverage(self) -> None:
        if self.configs:
            self.check_coverage()

    def check_coverage(self) -> None:
        self.coverage_generation += 1
        self.find_coverage(self.coverage_generation, list(self.configs), list(self.models.values()),
                           self.context.settings)

    @work(thread=True, exit_on_error=False, group="coverage", exclusive=True)
    def find_coverage(self, generation: int, configs: list[OpConfig], models: list[Extraction],
                      settings: Settings) -> None:
        with self.context.open_db() as db:
            self.post_message(self.Covered(generation, list_coverage(configs, models, db, settings)))

    def action_compile_with_nnfusion(self) -> None:
        """Compile the newest imported model with NNFusion and the open DB (console/screens/nnfusion.py)."""
        if self.models:
            from console.screens.nnfusion import compile_screen

            self.app.push_screen(compile_screen(self.context, next(reversed(self.models))))

    def action_convert(self, kind: Conversion) -> None:
        """`kdb model fp16` (depthwise convs kept float) or `kdb model expand`: the newest imported model written,
        then imported."""
        if self.models:
            model = next(reversed(self.models))
            ask_output(self.app, model, kind, lambda output: self.convert_and_import(model, output, kind))

    @work(thread=True, exit_on_error=False, group="import")
    def convert_and_import(self, model: Path, output: Path, kind: Conversion) -> None:
        self._read_and_post(convert_and_notify(self.app, model, output, kind))

    def on_op_configs_screen_covered(self, message: Covered) -> None:
        if message.generation != self.coverage_generation:
            return
        self.coverage = {e.config.key: e for e in message.entries}
        self.coverage_checked = True
        self._refresh()

    # -- generate and inject -------------------------------------------------------------------

    def action_generate(self) -> None:
        if self.running or not self.configs:
            return
        self.result = None
        self.cancel_requested = threading.Event()
        self.running = True
        self.query_one(GeneratePanel).reset()
        self.run_generate(GenerateRequest.from_settings(self.configs, self.context.db_path, self.context.settings),
                          self.cancel_requested)

    def action_cancel_run(self) -> None:
        if self.running and not self.cancel_requested.is_set():
            self.cancel_requested.set()
            self._keep_cancel_note()

    @work(thread=True, exit_on_error=False, group="generate", exclusive=True)
    def run_generate(self, request: GenerateRequest, cancel: threading.Event) -> GenerateReport:
        worker = get_current_worker()
        return generate_run.generate_and_inject(request, on_event=lambda event: self.post_message(self.RunEvent(event)),
                                                should_cancel=lambda: cancel.is_set() or worker.is_cancelled)

    def on_op_configs_screen_run_event(self, message: RunEvent) -> None:
        panel, event = self.query_one(GeneratePanel), message.event
        with self.app.batch_update():
            if isinstance(event, CodegenProgress):
                panel.show_codegen(event)
            elif isinstance(event, InjectSnapshot):
                panel.show_inject(event)
            else:
                panel.skip_compile("no nvcc")
            self._keep_cancel_note()

    def _keep_cancel_note(self) -> None:
        if self.cancel_requested.is_set():  # progress still arrives while the op in progress finishes
            self.query_one(GeneratePanel).show_current("cancelling after the op in progress…")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Failures are reported by KdbScreen's handler, which Textual calls too (each class's, along the MRO).
        if event.worker.group != "generate" or not event.worker.is_finished:
            return
        self.running = False
        panel = self.query_one(GeneratePanel)
        if event.state is WorkerState.SUCCESS and isinstance(event.worker.result, GenerateReport):
            self.result = event.worker.result
            panel.show_result(self.result)
            if self.result.inject is not None:
                self.check_coverage()  # the DB changed: show what it holds now
        elif event.state is WorkerState.ERROR:
            panel.show_error(str(event.worker.error))
        self.refresh_bindings()

    def watch_running(self) -> None:
        self.refresh_bindings()

    def action_show_failures(self) -> None:
        if self.result and self.result.failed:
            self.app.switch_mode("failures")

    @on(Button.Pressed, "#show-failures")
    def show_failures_pressed(self) -> None:
        self.action_show_failures()


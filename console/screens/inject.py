"""Inject: pick kernel JSON files or directories, set the options, run the engine's pipeline, read the summary.

The run is one thread worker that owns its DB and state handles; it posts coalesced progress snapshots
and returns the engine's report. Cancel sets a flag the engine reads between kernels (never mid-write).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.markup import escape
from textual.message import Message
from textual.reactive import var
from textual.widgets import Button, Checkbox, DirectoryTree, Footer, Header, Input, Label, OptionList, Static
from textual.widgets.option_list import Option
from textual.worker import Worker, WorkerState, get_current_worker

from console.context import ConsoleContext
from console.screens.base import KdbScreen
from console.widgets.stage_progress import GPU_NOT_RUN, StageProgress
from core.cuda.nvcc import NvccProbe, probe_nvcc
from core.inject.pipeline import GPU_NOT_RUN as PIPELINE_GPU_NOT_RUN
from core.inject.pipeline import STAGES, InjectOptions, InjectProgress, InjectReport, InjectSnapshot
from core.inject.session import open_injector
from core.settings import archs_problem, parse_value

PROGRESS_INTERVAL_S = 0.05  # the engine reports per kernel; the screen needs no more than ~20 frames a second
FAILURES_SHOWN = 3


class PathTree(DirectoryTree):
    """The file browser: directories and kernel JSON files only; space adds the highlighted entry."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "screen.add_highlighted", "Add to the list", show=False),
    ]

    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return [p for p in paths if not p.name.startswith(".") and (p.suffix == ".json" or self._safe_is_dir(p))]


class InjectScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+r", "start", "Start"),
        Binding("escape", "cancel", "Cancel run"),
        # Otherwise, in a text box, escape leaves it: digits and letters are the box's, not the views' keys.
        Binding("escape", "leave_input", "Leave the text box", show=False),
        Binding("f", "show_failures", "Show failures"),
        Binding("a", "add_highlighted", "Add highlighted path", show=False),
        Binding("x,delete", "remove_chosen", "Remove chosen path", show=False),
        Binding("slash", "focus_path", "Type a path", show=False),
        Binding("ctrl+g", "browse_to", "Browse to typed path", show=False),
    ]

    running: var[bool] = var(False)

    @dataclass
    class Progressed(Message):
        progress: InjectSnapshot

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, InjectScreen.Progressed)  # only the newest snapshot matters

    @dataclass
    class NvccProbed(Message):
        probe: NvccProbe

    def __init__(self) -> None:
        super().__init__()
        self.chosen: list[Path] = []
        self.probe: NvccProbe | None = None
        self.report: InjectReport | None = None
        self.cancel_requested = threading.Event()

    @property
    def context(self) -> ConsoleContext:
        return self.app.context  # type: ignore[attr-defined]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="inject-main"):
            with Vertical(id="inject-left"):
                with Horizontal(id="path-row"):
                    yield Input(placeholder="type or paste a file or directory, enter adds it", id="path")
                    yield Button("Browse", id="browse", tooltip="show this directory in the tree (ctrl+g)")
                yield PathTree(Path.cwd(), id="tree")
                yield Button("Add highlighted (space)", id="add")
                yield Label("Chosen", classes="section")
                yield OptionList(id="chosen")
                yield Static("nothing chosen yet: space adds the highlighted file or directory", id="chosen-empty")
                yield Button("Remove (x)", id="remove")
            with VerticalScroll(id="inject-right"):
                with Vertical(id="options"):
                    yield Label("Options", classes="section")
                    with Horizontal(id="archs-row"):
                        yield Label("SM archs", id="archs-label")
                        yield Input(", ".join(self.context.settings.archs), id="archs",
                                    placeholder="comma separated, like sm_80, sm_90")
                    yield Static(id="archs-error", classes="hidden")
                    yield Checkbox("compile check (nvcc)", True, id="compile", compact=True)
                    yield Static(id="nvcc-note")
                    yield Checkbox("replace existing", False, id="replace", compact=True)
                with Horizontal(id="run-buttons"):
                    yield Button("Start (ctrl+r)", variant="primary", id="start")
                    yield Button("Cancel (esc)", variant="error", id="cancel", disabled=True)
                yield Label("Stages", classes="section")
                with Vertical(id="stages"):
                    for stage in STAGES:
                        yield StageProgress(stage)
                yield Static(id="counts")
                yield Static(id="current")
                yield Static(id="summary")
                yield Button("Show failures (f)", id="show-failures", classes="hidden")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self._update_chosen()
        self._reset_stages()
        self.query_one(PathTree).focus()

    def on_screen_resume(self) -> None:
        # The settings view may have changed nvcc_path since we last looked.
        if not self.running:
            self.look_for_nvcc(self.context.settings.nvcc_path)

    # -- nvcc ----------------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="nvcc", exclusive=True)
    def look_for_nvcc(self, configured: str) -> None:
        self.post_message(self.NvccProbed(probe_nvcc(configured)))  # no nvcc: compile checks are just unavailable

    def on_inject_screen_nvcc_probed(self, message: NvccProbed) -> None:
        self.probe = message.probe
        compile_box = self.query_one("#compile", Checkbox)
        note = self.query_one("#nvcc-note", Static)
        if message.probe.problem:
            compile_box.value, compile_box.disabled = False, True
            note.update(f"compile check unavailable: {escape(message.probe.problem)}")
        else:
            compile_box.disabled = self.running
            compile_box.tooltip = f"with {message.probe.nvcc}"  # a tooltip: the path differs per machine
        note.display = bool(message.probe.problem)

    # -- choosing paths ------------------------------------------------------------------------

    def add_path(self, path: Path) -> None:
        path = path.expanduser().resolve()
        if not path.exists():
            self.notify(f"no such file or directory: {path}", severity="error")
            return
        if path not in self.chosen:
            self.chosen.append(path)
            self._update_chosen()

    def _update_chosen(self) -> None:
        chosen = self.query_one("#chosen", OptionList)
        highlighted = chosen.highlighted
        chosen.clear_options()
        chosen.add_options([Option(Content(f"{p}{'/' if p.is_dir() else ''}"), id=str(p)) for p in self.chosen])
        if self.chosen:
            chosen.highlighted = min(highlighted or 0, len(self.chosen) - 1)
        chosen.display = bool(self.chosen)
        self.query_one("#chosen-empty").display = not self.chosen

    def _tree_path(self) -> Path | None:
        node = self.query_one(PathTree).cursor_node
        return node.data.path if node is not None and node.data is not None else None

    def action_add_highlighted(self) -> None:
        path = self._tree_path()
        if path is not None:
            self.add_path(path)

    @on(Button.Pressed, "#add")
    def add_pressed(self) -> None:
        self.action_add_highlighted()

    @on(DirectoryTree.FileSelected, "#tree")
    def file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.add_path(event.path)  # enter or a click on a file adds it; on a directory it opens it

    @on(Input.Submitted, "#path")
    def path_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.add_path(Path(event.value.strip()))

    def action_focus_path(self) -> None:
        self.query_one("#path", Input).focus()

    def action_leave_input(self) -> None:
        self.query_one(PathTree).focus()

    @on(Button.Pressed, "#browse")
    def action_browse_to(self) -> None:
        text = self.query_one("#path", Input).value.strip()
        path = Path(text).expanduser() if text else Path.cwd()
        if not path.exists():
            self.notify(f"no such file or directory: {path}", severity="error")
            return
        tree = self.query_one(PathTree)
        tree.path = path if path.is_dir() else path.parent
        tree.focus()

    @on(Button.Pressed, "#remove")
    def action_remove_chosen(self) -> None:
        index = self.query_one("#chosen", OptionList).highlighted
        if index is not None and index < len(self.chosen) and not self.running:
            del self.chosen[index]
            self._update_chosen()

    # -- running -------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "start":
            return not self.running
        if action == "cancel":
            return self.running
        if action == "show_failures":
            return self.report is not None and self.report.failed > 0
        if action == "leave_input":
            return isinstance(self.focused, Input)
        return True

    @on(Button.Pressed, "#start")
    def action_start(self) -> None:
        if self.running:
            return
        if not self.chosen:
            self.notify("choose files or directories first: space adds the highlighted one", severity="warning")
            return
        compile_check = self.query_one("#compile", Checkbox).value
        if compile_check and self.probe is None:
            self.notify("still looking for nvcc: try again in a moment", severity="warning")
            return
        archs = tuple(parse_value("archs", self.query_one("#archs", Input).value))
        error = archs_problem(archs, self.probe if compile_check else None)  # as `kdb inject --arch` checks them
        self._show_archs_error(error)
        if error:
            return
        options = InjectOptions.from_settings(self.context.settings, archs=archs, compile=compile_check,
                                              replace=self.query_one("#replace", Checkbox).value)
        self.report = None
        self.cancel_requested = threading.Event()
        self.running = True
        self._reset_stages()
        self._show_summary(None)
        self.run_injection(list(self.chosen), options, self.context.db_path, self.cancel_requested)

    def _show_archs_error(self, error: str) -> None:
        field = self.query_one("#archs-error", Static)
        field.update(error)
        field.set_class(not error, "hidden")
        self.query_one("#archs", Input).set_class(bool(error), "bad")

    @on(Input.Changed, "#archs")
    def archs_changed(self) -> None:
        self._show_archs_error("")

    @on(Checkbox.Changed, "#compile")
    def compile_changed(self, event: Checkbox.Changed) -> None:
        row = self.query_one("#stage-compile", StageProgress)
        if event.value:
            row.reset()
        else:
            row.skip("not run: compile check off")

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        if self.running and not self.cancel_requested.is_set():
            self.cancel_requested.set()
            self.query_one("#current", Static).update("cancelling after the kernel in progress…")

    @work(thread=True, exit_on_error=False, group="inject", exclusive=True)
    def run_injection(self, paths: list[Path], options: InjectOptions, db_path: Path,
                      cancel: threading.Event) -> InjectReport:
        worker = get_current_worker()
        last_post = 0.0

        def on_progress(progress: InjectProgress) -> None:
            nonlocal last_post
            now = time.monotonic()
            if now - last_post >= PROGRESS_INTERVAL_S:
                last_post = now
                self.post_message(self.Progressed(progress.snapshot()))

        with open_injector(db_path, options, on_progress=on_progress,
                           should_cancel=lambda: cancel.is_set() or worker.is_cancelled) as injector:
            report = injector.run(paths)
        self.post_message(self.Progressed(injector.progress.snapshot()))  # the last one is never skipped
        return report

    def on_inject_screen_progressed(self, message: Progressed) -> None:
        self._show_progress(message.progress)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Failures are reported by KdbScreen's handler, which Textual calls too (each class's, along the MRO).
        if event.worker.group != "inject" or not event.worker.is_finished:
            return
        self.running = False
        if event.state is WorkerState.SUCCESS and isinstance(event.worker.result, InjectReport):
            self.report = event.worker.result
            self._show_summary(self.report)
        elif event.state is WorkerState.ERROR:
            self.query_one("#summary", Static).update(f"[$error]the run stopped: {escape(str(event.worker.error))}[/]")
        self.refresh_bindings()

    def watch_running(self, running: bool) -> None:
        self.query_one("#options").disabled = running
        self.query_one("#compile", Checkbox).disabled = running or bool(self.probe and self.probe.problem)
        self.query_one("#start", Button).disabled = running
        self.query_one("#cancel", Button).disabled = not running
        self.query_one("#remove", Button).disabled = running
        self.refresh_bindings()

    def action_show_failures(self) -> None:
        if self.report is not None and self.report.failed:
            self.app.switch_mode("failures")

    @on(Button.Pressed, "#show-failures")
    def show_failures_pressed(self) -> None:
        self.action_show_failures()

    # -- showing progress and the summary ------------------------------------------------------

    def _reset_stages(self) -> None:
        compile_on = self.query_one("#compile", Checkbox).value
        for row in self.query(StageProgress):
            if row.stage == "gpu":
                row.skip(GPU_NOT_RUN)
            elif row.stage == "compile" and not compile_on:
                row.skip("not run: compile check off")
            else:
                row.reset()
        self.query_one("#counts", Static).update("")
        self.query_one("#current", Static).update("")

    def _show_progress(self, p: InjectSnapshot) -> None:
        with self.app.batch_update():
            for row in self.query(StageProgress):
                if row.has_class("skipped"):
                    continue
                done, total = p.stage(row.stage)
                # Nothing reached this stage (yet): an empty bar, never a full one.
                row.show(done, max(total, 1), passed=p.passed.get(row.stage, 0), failed=p.failed_at.get(row.stage, 0))
            failed = f"[$error]{p.failed:,}[/]" if p.failed else "0"
            self.query_one("#counts", Static).update(
                f"injected {p.injected:,} · unchanged {p.unchanged:,} · failed {failed} · "
                f"items seen {p.items_seen:,} · files {p.files_done:,}/{p.files_total:,}")
            if not self.cancel_requested.is_set():
                self.query_one("#current", Static).update(f"now: {escape(p.current)}" if p.current else "")

    def _show_summary(self, report: InjectReport | None) -> None:
        summary = self.query_one("#summary", Static)
        self.query_one("#show-failures").set_class(report is None or not report.failed, "hidden")
        if report is None:
            summary.update("")
            return
        self.query_one("#current", Static).update("")
        status = "[$warning]cancelled[/]" if report.cancelled else "[$success]done[/]"
        failed = f"[$error]{report.failed:,} failed[/]" if report.failed else "0 failed"
        lines = [f"[b]{status}[/b]: {report.injected:,} injected · {report.unchanged:,} unchanged · {failed}"]
        if report.replaced_rows:
            lines.append(f"{report.replaced_rows:,} older rows replaced (backup: {escape(str(report.backup))})")
        for f in report.failures[:FAILURES_SHOWN]:
            where = Path(f.file).name + ("" if f.index is None else f"#{f.index}")
            lines.append(f"  ✗ {escape(where)} · {f.stage}: {escape(f.reason)}")
        if report.failed > FAILURES_SHOWN:
            lines.append(f"  … and {report.failed - FAILURES_SHOWN:,} more")
        # The gpu row already says why the GPU stages did not run, in the console's terms (not the CLI's flags).
        lines += [f"[dim]{escape(note)}[/]" for note in report.notes if note != PIPELINE_GPU_NOT_RUN]
        summary.update("\n".join(lines))

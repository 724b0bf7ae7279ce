"""The Network view: one ONNX model's story with the open DB, recent models remembered.

What the model's ops run (coverage, as `kdb coverage` says it), and every step taken with it, newest first, by either
face: compiles (used == promised), runs against the empty DB (the verdict), op times, never-slower steps; the core
use cases record them in the state file (core/db/state.py's ModelEvent), so `kdb nnfusion` in a terminal shows up
here too. c opens the compile dialog (r runs the network in it, t times each op, n keeps only the rows that make the
network faster), h converts the model to fp16 and opens that one, g lists its op configs in the Op configs view (to
generate their rows), t takes it to the Tuning view as one network. Without a GPU, what only a GPU can show says so.
"""

from __future__ import annotations

from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Label, OptionList, Static
from textual.widgets.option_list import Option

from console.screens.base import KdbScreen
from console.widgets.dialogs import PathDialog, dialog_default
from console.widgets.model_convert import Conversion, ask_output, convert_and_notify
from console.widgets.ratio_bar import ratio_bar
from core.db.state import StateDB, StoredModelEvent
from core.nnfusion.coverage import DB_KERNEL, CoverageEntry

HISTORY = 20  # events shown
RECENT = 10  # models remembered in the list
OK_STYLE = {True: "green", False: "red"}


@dataclass(frozen=True)
class ModelStory:
    model: Path
    entries: list[CoverageEntry]
    faults: list[str]  # nodes NNFusion cannot compile, or compiles into another network, with why
    events: list[StoredModelEvent]  # newest first, the "opened" marks left out
    tuning: str  # what the best tuned kernels so far predict for the network (the Tuning view's prediction)

    def op_ratios(self) -> dict[str, float | None]:
        """Each op's row time over the library's, by identifier, from the newest op times measured on a GPU."""
        for event in self.events:
            if event.kind == "op-times" and event.detail_dict().get("ratios"):
                return dict(event.detail_dict()["ratios"])
        return {}


class NetworkScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "open_model", "Open model"),
        Binding("c", "compile", "Compile / run", tooltip="Compile with NNFusion; in the dialog r runs, t times each "
                "op, n keeps only the rows that make the network faster"),
        Binding("h", "convert('fp16')", "fp16", tooltip="Convert the model to fp16 and open that one"),
        Binding("e", "convert('expand')", "Expand", tooltip="Write out the ops NNFusion cannot import (HardSwish, ...) "
                "as ONNX defines them, and open that model"),
        Binding("g", "list_ops", "Generate", tooltip="The model's op configs in the Op configs view (5), where g "
                "generates and injects their rows"),
        Binding("t", "tune", "Tune", tooltip="The model as one network in the Tuning view (7), where ctrl+r starts"),
        Binding("k", "open_row", "Open row", tooltip="The selected op's DB row in the Kernels view"),
        Binding("R", "reload", "Reload", show=False),
    ]

    @dataclass
    class Loaded(Message):
        story: ModelStory

    @dataclass
    class Recent(Message):
        models: list[str]

    def __init__(self) -> None:
        super().__init__()
        self.model: Path | None = None
        self.story: ModelStory | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("o opens an ONNX model (or pick a recent one): its ops, and every compile, run and op timing "
                     "of it with this DB", id="network-model")
        with Horizontal(id="network-main"):
            with Vertical(id="network-left"):
                yield Label("what each op runs (coverage)", classes="section")
                yield DataTable(id="network-ops", cursor_type="row", zebra_stripes=True)
                yield Static(id="network-coverage")
            with Vertical(id="network-right"):
                yield Label("recent models", classes="section")
                yield OptionList(id="network-recent")
                yield Static(id="network-gpu")
        yield Label("its story with this DB, newest first", classes="section")
        yield DataTable(id="network-history", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        ops = self.query_one("#network-ops", DataTable)
        for label, width in (("op", 58), ("nodes", 5), ("runs", 22), ("status", 10), ("row / library", 24),
                             ("row", 16)):
            ops.add_column(label, width=width)
        history = self.query_one("#network-history", DataTable)
        for label, width in (("when", 19), ("step", 12), ("", 2), ("outcome", None)):
            history.add_column(label, width=width)
        self.load_recent()

    @property
    def context(self):  # type: ignore[no-untyped-def]
        return self.app.context  # type: ignore[attr-defined]

    # -- loading ----------------------------------------------------------------------------------

    def open_model(self, model: Path) -> None:
        self.model = model.expanduser().resolve()
        self.query_one("#network-model", Static).update(Text(f"{self.model} · with {self.context.db_path}",
                                                             style="bold"))
        self.load(self.model, remember=True)

    @work(thread=True, exit_on_error=False, group="network", exclusive=True)
    def load(self, model: Path, remember: bool = False) -> None:
        """Coverage (as `kdb coverage` reads it) and the model's recorded steps with this DB."""
        from core.nnfusion.compile_job import CompileJob, model_coverage

        job = CompileJob.from_settings(self.context.settings, model, self.context.db_path)
        extraction, entries = model_coverage(job)
        with closing(StateDB()) as state:
            if remember:
                from core.db.state_records import ModelEvent

                state.record_model_event(ModelEvent(model=str(model), db_path=str(self.context.db_path),
                                                        kind="opened", ok=True, headline="opened in the console"))
            events = [e for e in state.model_events(model, self.context.db_path, HISTORY * 2) if e.kind != "opened"]
            recent = state.recent_models(RECENT)
        faults = [f"NNFusion cannot compile node {b.node} ({b.op_type}): {b.reason}" for b in extraction.blockers]
        faults += [f"NNFusion compiles node {w.node} into another network ({w.kind}): {w.text}"
                   for w in extraction.miscompiles]
        self.post_message(self.Loaded(ModelStory(model, entries, faults, events[:HISTORY],
                                                 self._tuning_prediction(model))))
        self.post_message(self.Recent(recent))

    def _tuning_prediction(self, model: Path) -> str:
        """The network's time as its ops' best tuned kernels so far make it, as the Tuning view (7) says it."""
        from core.tuning.board import TuneBoard, read_history
        from core.tuning.request import read_tune_inputs

        settings = self.context.settings
        board = TuneBoard()
        board.take(read_tune_inputs([model], settings), model.name)
        if board.network is None:
            return ""
        board.history_read(read_history(board.configs, "cuda", settings.archs[0]), running=False)
        return board.prediction(running=False, trials=settings.tune_trials, cap=None).text()

    @work(thread=True, exit_on_error=False, group="network-recent")
    def load_recent(self) -> None:
        with closing(StateDB()) as state:
            self.post_message(self.Recent(state.recent_models(RECENT)))

    def on_network_screen_recent(self, message: Recent) -> None:
        recent = self.query_one("#network-recent", OptionList)
        recent.clear_options()
        recent.add_options([Option(m, id=m) for m in message.models])

    def on_network_screen_loaded(self, message: Loaded) -> None:
        story = self.story = message.story
        if story.model != self.model:
            return
        ops = self.query_one("#network-ops", DataTable)
        ops.clear()
        ratios = story.op_ratios()
        # the slowest against the library first, where the op times measured it; the rest in model order
        for entry in sorted(story.entries, key=lambda e: -(ratios.get(e.lookup or e.identifier or "") or 0.0)):
            style = "green" if entry.row is not None and entry.runs.startswith(DB_KERNEL) else "yellow"
            ops.add_row(entry.config.describe(), str(entry.count), Text(entry.runs, style=style), entry.status,
                        ratio_bar(ratios.get(entry.lookup or entry.identifier or "")),
                        entry.row.key if entry.row else "-")
        on_db = sum(e.count - e.fused_away for e in story.entries if e.row is not None and e.runs.startswith(DB_KERNEL))
        lines = [f"{len(story.entries)} distinct op(s); {on_db} node(s) run DB rows",
                 f"tuning (7) so far: {story.tuning or 'nothing recorded'}"]
        lines += story.faults
        self.query_one("#network-coverage", Static).update("\n".join(lines))
        history = self.query_one("#network-history", DataTable)
        history.clear()
        for event in story.events:
            history.add_row(event.created_at.replace("T", " ")[:19], event.kind,
                            Text("ok" if event.ok else "no", style=OK_STYLE[event.ok]), event.headline)
        if not story.events:
            history.add_row("-", "-", "", "nothing yet: c compiles it")
        self._say_gpu()

    def _say_gpu(self) -> None:
        device = self.context.device_summary
        has_gpu = bool(device) and not device.lower().startswith(("no ", "detecting"))
        self.query_one("#network-gpu", Static).update(
            f"GPU: {device}" if has_gpu else
            f"GPU: {device}. Here the network compiles and builds; its run against the empty DB, the op times and "
            "the never-slower step need a CUDA GPU (they build and say 'not measured' here)")

    # -- actions ----------------------------------------------------------------------------------

    @on(OptionList.OptionSelected, "#network-recent")
    def recent_chosen(self, event: OptionList.OptionSelected) -> None:
        if event.option.id:
            self.open_model(Path(event.option.id))

    def action_open_model(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.open_model(Path(path))

        self.app.push_screen(PathDialog("Open which ONNX model?", dialog_default(self.context.settings)), chosen)

    def action_reload(self) -> None:
        if self.model is not None:
            self.load(self.model)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("compile", "convert", "reload", "open_row", "list_ops", "tune"):
            return True if self.model is not None else None
        return True

    def action_open_row(self) -> None:
        ops = self.query_one("#network-ops", DataTable)
        if ops.row_count and ops.cursor_row >= 0:
            key = str(ops.get_row_at(ops.cursor_row)[-1])
            if key != "-":
                self.app.show_in_kernels(key)  # type: ignore[attr-defined]
                return
        self.notify("this op has no DB row: c compiles it with the library, or generate one in Op configs (5)",
                    timeout=4)

    def action_list_ops(self) -> None:
        if self.model is not None:
            self.app.list_model_ops(self.model)  # type: ignore[attr-defined]

    def action_tune(self) -> None:
        if self.model is not None:
            self.app.tune_model(self.model)  # type: ignore[attr-defined]

    def action_compile(self) -> None:
        from console.screens.nnfusion import compile_screen

        if self.model is not None:
            self.app.push_screen(compile_screen(self.context, self.model), lambda _: self.action_reload())

    def action_convert(self, kind: Conversion) -> None:
        """`kdb model fp16` (depthwise convs kept float) or `kdb model expand`: the model written, then opened here."""
        model = self.model
        if model is not None:
            ask_output(self.app, model, kind, lambda output: self.convert(model, output, kind))

    @work(thread=True, exit_on_error=False, group="network-convert")
    def convert(self, model: Path, output: Path, kind: Conversion) -> None:
        self.app.call_from_thread(self.open_model, convert_and_notify(self.app, model, output, kind))

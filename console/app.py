"""The console: a small App of modes (one screen each), global bindings and the command palette.

Screens own their layout and their workers; the App only switches modes, keeps the shared context,
shows the open DB and device in the header, and handles every worker failure in one place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from console.commands import ActionCommands
from console.context import ConsoleContext
from console.screens.kernels import KernelsScreen
from core.db.kernel_db import kernel_db_path

STYLES = Path(__file__).resolve().parent.parent / "styles"


def _on_first_visit(module: str, screen: str) -> Callable[[], Screen]:
    """A mode whose screen is imported when first shown: the console starts with the Kernels view's code alone
    (the other views, with the inject pipeline, tuning and ONNX behind them, took 0.6 s more to import)."""

    def make() -> Screen:
        return getattr(importlib.import_module(module), screen)()

    return make


class KdbApp(App[int]):
    TITLE = "kdb"
    CSS_PATH: ClassVar = [STYLES / f"{name}.tcss" for name in
                          ("app", "inject", "failures", "settings", "opconfigs", "autotvm", "tuning", "network")]
    COMMANDS: ClassVar = App.COMMANDS | {ActionCommands}
    MODES: ClassVar = {
        "kernels": KernelsScreen,
        "inject": _on_first_visit("console.screens.inject", "InjectScreen"),
        "failures": _on_first_visit("console.screens.failures", "FailuresScreen"),
        "settings": _on_first_visit("console.screens.settings", "SettingsScreen"),
        "autotvm": _on_first_visit("console.screens.autotvm", "AutoTvmScreen"),
        "tuning": _on_first_visit("console.screens.tuning", "TuningScreen"),
        "network": _on_first_visit("console.screens.network", "NetworkScreen"),
    }
    DEFAULT_MODE = "kernels"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "switch_mode('kernels')", "Kernels"),
        Binding("2", "switch_mode('inject')", "Inject"),
        Binding("3", "switch_mode('failures')", "Failures"),
        Binding("4", "switch_mode('settings')", "GPU & SM"),
        Binding("5", "switch_mode('opconfigs')", "Op configs"),
        Binding("6", "switch_mode('autotvm')", "AutoTVM", tooltip="AutoTVM logs"),
        Binding("7", "switch_mode('tuning')", "Tuning"),
        Binding("8", "switch_mode('network')", "Network", tooltip="One model's story with this DB"),
        Binding("question_mark,f1", "help", "Help"),
        Binding("ctrl+t", "toggle_theme", "Light/dark", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, context: ConsoleContext) -> None:
        super().__init__()
        self.context = context
        self.add_mode("opconfigs", self._opconfigs_screen)

    def _opconfigs_screen(self) -> Screen:
        """The Op configs view, imported when first shown, on the context's list (which the Tuning view reads)."""
        from console.screens.opconfigs import OpConfigsScreen

        screen = OpConfigsScreen()
        screen.configs = self.context.opconfigs
        return screen

    def on_mount(self) -> None:
        self.sub_title = f"{self.context.db_path} · {self.context.device_summary}"
        self.detect_device()

    @work(thread=True, exit_on_error=False, group="device")
    def detect_device(self) -> None:
        from core.gpu.inventory import detect_devices

        devices, reason = detect_devices()
        summary = ", ".join(f"{d.name} ({d.arch})" for d in devices) if devices else reason
        self.call_from_thread(self._set_device, summary)

    def _set_device(self, summary: str) -> None:
        self.context.device_summary = summary
        self.sub_title = f"{self.context.db_path} · {summary}"

    def show_in_kernels(self, text: str) -> None:
        """Switch to the Kernels view filtered to `text` (a Key): how a view opens a row without reaching into
        another."""
        self.switch_mode("kernels")
        self.screen.show_rows_matching(text)  # type: ignore[attr-defined]

    def list_model_ops(self, model: Path) -> None:
        """Switch to the Op configs view with the op configs NNFusion looks up in `model` added to its list (as `i`
        adds them): `g` there generates and injects their rows."""
        self.switch_mode("opconfigs")
        self.screen.import_file(model)  # type: ignore[attr-defined]

    def tune_model(self, model: Path) -> None:
        """Switch to the Tuning view with `model` taken as one network (as its `i` takes it): ctrl+r starts."""
        self.switch_mode("tuning")
        self.screen.import_file(model)  # type: ignore[attr-defined]

    def action_help(self) -> None:
        from console.screens.help import HelpScreen

        self.push_screen(HelpScreen())

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.report_worker_failure(event)

    def report_worker_failure(self, event: Worker.StateChanged) -> None:
        """The one place worker failures surface: a notification with the cause, and the log."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            error = event.worker.error
            from core.errors import KdbError

            message = str(error) if isinstance(error, KdbError) else f"{type(error).__name__}: {error}"
            self.log.error(f"worker {event.worker.name} failed: {message}")
            self.notify(message, title=f"{event.worker.name or 'task'} failed", severity="error", timeout=10)


def run_app(db_path: str | None = None, *, demo: bool = False) -> int:
    if demo and db_path is None:
        path = _demo_db()
    else:
        path = kernel_db_path(db_path)
    app = KdbApp(ConsoleContext(db_path=path, demo=demo))
    return app.run() or 0


def _demo_db() -> Path:
    """Build the demo DB on first use (compile-checked when nvcc is here), then reuse it."""
    from core.cuda.nvcc import find_nvcc
    from core.demo import build_demo_db, demo_db_path
    from core.errors import ToolError
    from core.settings import load_settings

    if demo_db_path().exists():
        return demo_db_path()
    print("building the demo kernel DB (first run only)…", flush=True)
    settings = load_settings()
    try:
        nvcc = find_nvcc(settings.nvcc_path)
    except ToolError:
        nvcc = ""
    path, _ = build_demo_db(compile_check=bool(nvcc), archs=tuple(settings.archs), nvcc=nvcc,
                            workers=settings.effective_workers())
    return path

"""`kdb model fp16` in the console: where to write the model, and the conversion with its report as a notification.
The Op configs view imports the result, the Network view opens it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from textual.app import App

from console.widgets.dialogs import PathDialog


def ask_fp16_output(app: App[object], model: Path, chosen: Callable[[Path], None]) -> None:
    """Ask where the fp16 model goes (beside `model`, named <stem>-fp16 unless changed); `chosen` gets the path."""
    def answered(path: str | None) -> None:
        if path:
            chosen(Path(path).expanduser())

    app.push_screen(PathDialog(f"Write {model.name} in fp16 to:",
                               str(model.with_name(f"{model.stem}-fp16{model.suffix}"))), answered)


def convert_and_notify(app: App[object], model: Path, output: Path) -> Path:
    """The conversion `kdb model fp16` runs, its report lines as a notification; the model written. Call it from a
    thread worker."""
    from core.opconfigs.fp16_model import convert_to_fp16

    done = convert_to_fp16(model, output)
    app.call_from_thread(app.notify, "\n".join(done.report_lines()), title="fp16 model", timeout=10)
    return done.output

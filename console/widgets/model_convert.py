"""`kdb model fp16` and `kdb model expand` in the console: where to write the model, and the conversion with its
report as a notification. The Op configs view imports the result, the Network view opens it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from textual.app import App

from console.widgets.dialogs import PathDialog

Conversion = Literal["fp16", "expand"]
WHAT = {"fp16": "in fp16", "expand": "with the ops NNFusion cannot import written out"}
SUFFIX = {"fp16": "-fp16", "expand": "-expanded"}


def ask_output(app: App[object], model: Path, kind: Conversion, chosen: Callable[[Path], None]) -> None:
    """Ask where the converted model goes (beside `model`, named <stem>-fp16 or <stem>-expanded unless changed);
    `chosen` gets the path."""
    def answered(path: str | None) -> None:
        if path:
            chosen(Path(path).expanduser())

    app.push_screen(PathDialog(f"Write {model.name} {WHAT[kind]} to:",
                               str(model.with_name(f"{model.stem}{SUFFIX[kind]}{model.suffix}"))), answered)


def convert_and_notify(app: App[object], model: Path, output: Path, kind: Conversion = "fp16") -> Path:
    """The conversion `kdb model fp16` (or `expand`) runs, its report lines as a notification; the model written.
    Call it from a thread worker."""
    if kind == "expand":
        from core.opconfigs.expand_functions import expand_functions

        done = expand_functions(model, output)
    else:
        from core.opconfigs.fp16_model import convert_to_fp16

        done = convert_to_fp16(model, output)
    app.call_from_thread(app.notify, "\n".join(done.report_lines()), title=f"{kind} model", timeout=10)
    return done.output

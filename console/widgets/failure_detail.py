"""The detail pane of the Failures view: the cause of one failed conversion and the place it points at.

A compile failure shows the translation unit nvcc compiled with the error line highlighted and the
error lines of nvcc's log; a validate failure shows the kernel JSON item with the failing field's
line highlighted; parse and barrier failures show the kernel's CUDA code at the line the reason names;
a codegen failure shows the TVMScript of the failing schedule with the lines TVM points at, and TVM's
decisive lines.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import ScrollableContainer, Vertical
from textual.widgets import Static

from console.widgets.highlight import numbered_listing
from core.codegen.failures import CODEGEN_STAGE
from core.db.state import StoredFailure

HINT = "Select a failure to see its cause and the place it points at; select a group to act on all of it."
LOG_LINES = 8
CONTEXT_ABOVE = 6  # source lines kept visible above the highlighted one
_REASON_LINE = re.compile(r"\bline (\d+)\b")
_LOG_ERROR_LINE = re.compile(r"kernel\.cu\((\d+)\): (?:catastrophic )?error")
_SCRATCH_PATH = re.compile(r"[^\s(\"']*/(kernel\.cu)")  # nvcc's scratch dir is gone: keep the file name
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)


@dataclass
class Place:
    """The offending place: a titled, highlighted listing, scrolled so the marked line shows."""

    title: str
    listing: RenderableType
    line: int | None = None


# -- pure helpers (no widgets) ---------------------------------------------------------------


def json_lines(value: Any) -> tuple[str, dict[str, int]]:
    """Pretty JSON (lists of scalars kept on one line) and the 1-based line each field path starts on."""
    lines: list[str] = []
    starts: dict[str, int] = {}

    def emit(value: Any, path: str, depth: int, head: str, tail: str) -> None:
        starts[path] = len(lines) + 1
        pad = "  " * depth
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{head}{{")
            for i, (key, child) in enumerate(value.items()):
                emit(child, f"{path}.{key}" if path else str(key), depth + 1, json.dumps(str(key)) + ": ",
                     "," if i < len(value) - 1 else "")
            lines.append(f"{pad}}}{tail}")
        elif isinstance(value, list) and any(isinstance(v, dict | list) and v for v in value):
            lines.append(f"{pad}{head}[")
            for i, child in enumerate(value):
                emit(child, f"{path}[{i}]", depth + 1, "", "," if i < len(value) - 1 else "")
            lines.append(f"{pad}]{tail}")
        else:
            lines.append(f"{pad}{head}{json.dumps(value, ensure_ascii=False)}{tail}")

    emit(value, "", 0, "", "")
    return "\n".join(lines), starts


def pretty_item(text: str) -> str:
    """An item's raw JSON laid out for reading and editing (unchanged when it is not valid JSON)."""
    try:
        return json_lines(json.loads(text))[0]
    except ValueError:
        return text


def field_line(starts: dict[str, int], field: str) -> int | None:
    """The line of `field` (like parameters.output_shape[2]), or of its nearest enclosing field."""
    while field:
        if field in starts:
            return starts[field]
        shorter = re.sub(r"(\.[^.\[\]]*|\[\d+\])$", "", field)
        if shorter == field:
            return None
        field = shorter
    return None


def log_excerpt(log: str, limit: int = LOG_LINES) -> tuple[list[str], int]:
    """nvcc's error diagnostics (notes left out; the tail when there are none) and how many lines were cut."""
    lines = _SCRATCH_PATH.sub(r"\1", log).rstrip().splitlines()
    errors: list[str] = []
    in_error = False
    for line in lines:
        if not line.strip():
            in_error = False
        elif not line[0].isspace():  # a new diagnostic; indented lines continue the one above
            in_error = bool(_ERROR.search(line))
        if in_error:
            errors.append(line)
    shown = errors or lines[-limit:]
    return shown[:limit], len(shown) - min(len(shown), limit)


def age(created_at: str, now: datetime | None = None) -> str:
    """'just now', '5 min ago', ...: stable across test runs, unlike the raw timestamp."""
    try:
        then = datetime.fromisoformat(created_at)
    except ValueError:
        return created_at
    seconds = ((now or datetime.now(UTC)) - then).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now"


def item_label(failure: StoredFailure) -> str:
    name = Path(failure.file).name
    source = str(failure.detail_dict().get("source") or "") if failure.stage == CODEGEN_STAGE else ""
    if source:  # an op config: where it came from, "ops.txt:3" (line 3) or "model.onnx:conv1"
        return name + source[len(failure.file):] if source.startswith(failure.file) else source
    return f"{name} (whole file)" if failure.item_index is None else f"{name}#{failure.item_index}"


def listing(code: str, language: str, marked: set[int]) -> Text:
    return numbered_listing(code, language, marked)


def offending_place(failure: StoredFailure) -> Place | None:
    """Where the failure points, highlighted: slow on big items, so the view calls it in a worker."""
    detail = failure.detail_dict()
    if failure.stage == CODEGEN_STAGE:
        return _codegen_place(failure, detail)
    if failure.stage == "compile" and detail.get("source"):
        line = detail.get("line")
        line = line if isinstance(line, int) else None
        # nvcc often reports the same error in both forms of the kernel: mark every error line
        marked = {int(n) for n in _LOG_ERROR_LINE.findall(str(detail.get("log", "")))} | ({line} if line else set())
        where = f", error at line {line}" if line else ""
        return Place(f"translation unit nvcc compiled for {detail.get('arch', '?')}{where}",
                     listing(str(detail["source"]), "cuda", marked), line)
    if failure.input is None:
        return None
    try:
        item = json.loads(failure.input)
    except ValueError:
        return Place("the item as saved (not valid JSON)", Text(failure.input))
    field = detail.get("field")
    if isinstance(field, str) and field != "code":
        text, starts = json_lines(item)
        line = field_line(starts, field)
        return Place(f"kernel JSON item, field {field}", listing(text, "json", {line} if line else set()), line)
    code = item.get("code") if isinstance(item, dict) else None
    if failure.stage in ("parse", "barriers") and isinstance(code, str):
        lines = code.splitlines()
        named = {int(n) for n in _REASON_LINE.findall(failure.reason) if 0 < int(n) <= len(lines)}
        if not named and failure.stage == "barriers":  # no line named: point at every barrier
            named = {i for i, text in enumerate(lines, 1) if "sync" in text}
        return Place("the kernel's CUDA code (item field \"code\")", listing(code, "cuda", named),
                     min(named) if named else None)
    return Place("kernel JSON item", listing(json_lines(item)[0], "json", set()))


def _codegen_place(failure: StoredFailure, detail: dict[str, Any]) -> Place | None:
    script = detail.get("tvmscript")
    if isinstance(script, str) and script:
        marked = {n for n in detail.get("marked") or [] if isinstance(n, int)}
        pointed = ", the statements TVM points at marked" if marked else ""
        return Place(f"TVMScript of the failing schedule (at {detail.get('codegen_stage', '?')}){pointed}",
                     listing(script, "python", marked), min(marked) if marked else None)
    if failure.input is None:
        return None
    return Place("the op config (e edits it, then generates again)", listing(pretty_item(failure.input), "json", set()))


def summary(failure: StoredFailure) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    if failure.stage == CODEGEN_STAGE:
        detail = failure.detail_dict()
        grid.add_row("op", failure.name or "-")
        grid.add_row("op config", str(detail.get("op_config") or "-"))
        grid.add_row("source", item_label(failure) if detail.get("source") else failure.file)
        grid.add_row("stage", f"codegen, at {detail.get('codegen_stage', '?')} (TVM, for {detail.get('arch', '?')})")
    else:
        grid.add_row("kernel", failure.name or "-")
        grid.add_row("file", failure.file)
        grid.add_row("item", "the whole file" if failure.item_index is None else str(failure.item_index))
        grid.add_row("stage", failure.stage)
    grid.add_row("reason", Text(failure.reason, style="red"))
    grid.add_row("recorded", f"{age(failure.created_at)} · run #{failure.run_id} · failure #{failure.id}")
    return grid


def group_summary(title: str, failures: list[StoredFailure]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("group", title)
    grid.add_row("failures", f"{len(failures)} in {len({f.file for f in failures})} file(s)")
    for reason, n in Counter(f.reason for f in failures).most_common(5):
        grid.add_row("reason", Text.assemble((reason, "red"), (f"  ×{n}", "dim")))
    grid.add_row("", Text("r retries every failure of this group, x dismisses them; expand it to pick one.",
                          style="dim"))
    return grid


# -- the widget ------------------------------------------------------------------------------


class FailureDetail(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(HINT, id="failure-summary")
        yield Static(id="failure-place-title")
        with ScrollableContainer(id="failure-place"):
            yield Static(id="failure-listing")
        yield Static(id="failure-log")

    def show_failure(self, failure: StoredFailure) -> None:
        """The summary and nvcc's log at once; the place follows via show_place (built off the UI thread)."""
        self.query_one("#failure-summary", Static).update(summary(failure))
        self._show_place(Place("highlighting…", Text("")) if failure.input or failure.stage == "compile" else None)
        detail = failure.detail_dict()
        if failure.stage == "compile" and detail.get("log"):
            self._show_log("nvcc says:", *log_excerpt(str(detail["log"])))
        elif failure.stage == CODEGEN_STAGE and detail.get("tvm_error"):
            lines = str(detail["tvm_error"]).splitlines()
            self._show_log("TVM says:", lines[:LOG_LINES], max(0, len(lines) - LOG_LINES))
        else:
            self._show_log()

    def show_place(self, place: Place | None) -> None:
        self._show_place(place)

    def show_group(self, title: str, failures: list[StoredFailure]) -> None:
        self.query_one("#failure-summary", Static).update(group_summary(title, failures))
        self._show_place(None)
        self._show_log()

    def show_text(self, text: str) -> None:
        self.query_one("#failure-summary", Static).update(text)
        self._show_place(None)
        self._show_log()

    def _show_place(self, place: Place | None) -> None:
        title = self.query_one("#failure-place-title", Static)
        scroller = self.query_one("#failure-place", ScrollableContainer)
        title.display = scroller.display = place is not None
        if place is None:
            return
        title.update(Text(place.title, style="bold"))
        self.query_one("#failure-listing", Static).update(place.listing)
        y = max(0, (place.line or 1) - 1 - CONTEXT_ABOVE)
        # after the refresh, once the new listing has its size
        scroller.call_after_refresh(scroller.scroll_to, x=0, y=y, animate=False)

    def _show_log(self, title: str = "", shown: list[str] | None = None, cut: int = 0) -> None:
        """The tool's decisive lines under the place (none: hidden)."""
        widget = self.query_one("#failure-log", Static)
        widget.display = bool(shown)
        if not shown:
            return
        text = Text(f"{title}\n", style="bold")
        text.append("\n".join(shown), style="red")
        if cut:
            text.append(f"\n… {cut} more line(s)", style="dim")
        widget.update(text)

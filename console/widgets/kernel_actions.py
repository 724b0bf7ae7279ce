"""What the Kernels view does with the rows it shows, beside browsing them and maintaining the DB: export them as
kernel JSON, copy a body, verify or profile them on the GPU, convert an osdi20 DB.

No layout of its own: a worker per action, posting RowsChanged when the DB's rows changed (profiles written).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from textual import work
from textual.message import Message
from textual.widget import Widget
from textual.worker import Worker

from console.widgets.dialogs import PathDialog, dialog_default


class KernelActions(Widget):
    DEFAULT_CSS = "KernelActions { display: none; }"

    @dataclass
    class RowsChanged(Message):
        """Rows of the DB were rewritten in place (a GPU profile): the page shows them again."""

    def export(self, keys: list[str]) -> None:
        default = dialog_default(self.app.context.settings,  # type: ignore[attr-defined]
                                 f"kdb-export-{time.strftime('%Y%m%d-%H%M%S')}.json")

        def chosen(path: str | None) -> None:
            if path:
                self.export_rows(keys, Path(path).expanduser())

        self.app.push_screen(PathDialog(f"Export {len(keys)} kernel(s) as kernel JSON to:", default), chosen)

    @work(thread=True, exit_on_error=False, group="export")
    def export_rows(self, keys: list[str], path: Path) -> None:
        from core.kernels.export import write_kernel_json

        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            count = write_kernel_json([r for key in keys for r in db.find(key)], path)
        self.app.call_from_thread(self.notify, f"exported {count} kernel(s) to {path}")

    def check(self, keys: list[str], profile: bool) -> None:
        self.notify(f"{'profiling' if profile else 'verifying'} {len(keys)} kernel(s) on the GPU…", timeout=3)
        self.check_on_gpu(keys, profile)

    @work(thread=True, exit_on_error=False, group="gpu", exclusive=True)
    def check_on_gpu(self, keys: list[str], profile: bool) -> None:
        from core.errors import ToolError
        from core.gpu.rows import GpuCheckRequest, check_db_rows

        context = self.app.context  # type: ignore[attr-defined]
        request = GpuCheckRequest.from_settings(context.settings, context.db_path, keys, profile=profile)
        try:
            report = check_db_rows(request)
        except ToolError as exc:
            self.app.call_from_thread(self.notify, f"no CUDA device: {exc}", severity="warning", timeout=10)
            return
        failed = [c for c in report.checks if not c.ok]
        text = (f"{len(report.checks)} kernel(s) {'profiled' if profile else 'verified'} on {report.device}: "
                f"{len(report.checks) - len(failed)} ok, {len(failed)} failed")
        if failed:
            c = failed[0]
            why = c.error or next((r.reason for r in (c.verified, c.timed) if r is not None and not r.ok), "")
            text += f" (first: {c.name}: {why})"
        self.app.call_from_thread(self.notify, text, severity="error" if failed else "information", timeout=10)
        if profile:
            self.post_message(self.RowsChanged())  # the profiles are in the rows now

    @work(thread=True, exit_on_error=False, group="detail")
    def copy_body(self, key: str) -> None:
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            rows = db.find(key)
        if rows:
            body = json.loads(rows[0].function).get("function_body", "")
            self.app.call_from_thread(self.app.copy_to_clipboard, body)
            self.app.call_from_thread(self.notify, "CUDA body copied")

    def convert(self) -> None:
        old: Path = self.app.context.db_path  # type: ignore[attr-defined]
        default = str(old.with_name(old.stem + "-converted.db"))

        def chosen(path: str | None) -> None:
            if path:
                self.convert_db(old, Path(path).expanduser())

        self.app.push_screen(PathDialog("Convert this osdi20 DB into a new current-schema file:", default), chosen)

    @work(thread=True, exit_on_error=False, group="write")
    def convert_db(self, old: Path, new: Path) -> None:
        from core.db.convert import convert_db

        report = convert_db(old, new)
        self.app.call_from_thread(
            self.notify, f"{report.converted} rows converted into {new}; {len(report.failed)} could not be"
            + ("" if not report.failed else f" (first: {report.failed[0]['reason']})"), timeout=10)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker_failure(event)  # type: ignore[attr-defined]  # a widget's worker events do not bubble

"""Kernels: browse the DB a page at a time, filter as you type, sort, inspect.

All DB work happens in thread workers that post messages back; the screen applies them. Each reload carries a
generation number so a slow, stale page never overwrites a newer one. Non-visual widgets hold the workers: pages and
the browse index (console/widgets/kernel_pages.py), DB maintenance, previewed and undone with the CLI's plans
(console/widgets/db_maintenance.py), and what is done with the rows: export, copy, GPU checks, convert
(console/widgets/kernel_actions.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, DataTable, Footer, Header, Input, Select, Static

from console.screens.base import KdbScreen
from console.widgets.db_maintenance import DbMaintenance
from console.widgets.dialogs import PathDialog, dialog_default
from console.widgets.kernel_actions import KernelActions
from console.widgets.kernel_detail import KernelDetail
from console.widgets.kernel_pages import PAGE_SIZE, KernelPages
from console.widgets.kernel_table import COLUMNS, KernelTable
from core.db.browse import (
    KernelFilter,
    KernelSummary,
)
from core.db.kernel_db import KernelDB, Schema
from core.kernels.math_kind import CUDA_CORES, TENSOR_CORES


class KernelsScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("escape", "focus_table", "Back to the table", show=False),
        Binding("n", "page(1)", "Next", tooltip="Next page"),
        Binding("p", "page(-1)", "Prev", tooltip="Previous page"),
        Binding("space", "mark", "Mark", show=False),
        Binding("d", "delete", "Delete"),
        Binding("u", "undo", "Undo", tooltip="Undo the last change: a delete, a repair, keep fastest, standalone"),
        Binding("e", "export", "Export", tooltip="Export as kernel JSON"),
        Binding("c", "copy_identifier", "Copy id"),
        Binding("b", "copy_body", "Copy body", show=False),
        Binding("v", "check_on_gpu(False)", "Verify", tooltip="Verify on the GPU"),
        Binding("P", "check_on_gpu(True)", "Profile", tooltip="Profile on the GPU"),
        Binding("r", "reload", "Reload", show=False),
        Binding("R", "rebuild_index", "Rebuild the browse index", show=False),
        Binding("C", "convert", "Convert osdi20", show=False),
        Binding("N", "compile_with_nnfusion", "Compile with NNFusion", show=False),
        Binding("F", "repair_pairs", "Repair (fused pairs, older row forms)", show=False),
        Binding("K", "keep_fastest", "Keep each op's fastest row", show=False),
        Binding("S", "toggle_standalone", "Standalone: never fused by BlockFusion (or back)", show=False),
        Binding("L", "leave_to_library", "Leave ops whose rows ran slower than the library to it (op times file)",
                show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.kernel_filter = KernelFilter()
        self.sort, self.descending = "op", False
        self.page_offset = 0
        self.total: int | None = 0  # None while counting
        self.shown_sort = "op"
        self.waiting = False
        self.index_state = ""  # what the status line says of the browse index
        self.awaiting_page, self.filter_pending = False, False
        self.sync_after_first_page = True
        self.generation = 0
        self.marked: set[str] = set()
        self.rows: list[KernelSummary] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="banner", classes="hidden"):
            yield Static(id="banner-text")
            yield Button("Convert…", id="convert", variant="warning")
        with Horizontal(id="filters"):
            yield Input(placeholder="filter: identifier or key…", id="filter-text")
            yield Select([], prompt="op type", id="filter-op", allow_blank=True)
            yield Select([("External", "External"), ("NNFusion", "NNFusion"), ("Antares", "Antares")],
                         prompt="source", id="filter-source")
            yield Input(placeholder="tag", id="filter-tag", classes="narrow")
            yield Select([("CUDA_GPU", "CUDA_GPU"), ("ROCM_GPU", "ROCM_GPU"), ("GENERIC_CPU", "GENERIC_CPU")],
                         prompt="device", id="filter-device")
            yield Select([("ok", "ok"), ("problems", "problems")], prompt="lint", id="filter-lint")
            yield Select([("fp16", "fp16"), ("TF32", "tf32"), ("fp32", "fp32"), ("fp64", "fp64")], prompt="precision",
                         id="filter-precision", classes="narrow")
            yield Select([("tensor cores", TENSOR_CORES), ("CUDA cores", CUDA_CORES)], prompt="units",
                         id="filter-units", classes="narrow")
        with Horizontal(id="kernels-main"):
            with Vertical(id="kernels-left"):
                yield KernelTable(id="kernel-table")
                yield Static(id="page-status")
            yield KernelDetail(id="kernel-detail")
        yield KernelPages()
        yield DbMaintenance()
        yield KernelActions()
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(KernelTable).focus()

    @property
    def syncing(self) -> bool:
        """The browse index is being brought in step with the DB."""
        return self.query_one(KernelPages).syncing

    def request_sync(self, rebuild: bool = False) -> None:
        self.query_one(KernelPages).request_sync(rebuild)

    def on_screen_resume(self) -> None:
        # Shown for the first time, or back from another view (Inject, Failures retries change the DB): show the
        # current state. The first time, the index sync waits for the first page to be on screen: building an
        # index competes with the first paint for the CPU (and the GIL), and the first page does not need it.
        self.reload()
        if not self.sync_after_first_page:
            self.request_sync()

    # -- loading ----------------------------------------------------------------------------

    def reload(self) -> None:
        self.generation += 1
        self.awaiting_page = True
        self.query_one(KernelPages).load(self.generation, self.kernel_filter, self.sort, self.descending,
                                         self.page_offset)

    def on_kernel_pages_page_loaded(self, message: KernelPages.PageLoaded) -> None:
        if message.generation != self.generation:
            return  # a newer request is on its way
        self.awaiting_page = False
        if self.sync_after_first_page:
            self.sync_after_first_page = False
            self.request_sync()
        if self.filter_pending:  # keys typed meanwhile: this page is already out of date
            self.filter_pending = False
            self._apply_filters()
            return
        self.rows, self.page_offset, self.shown_sort = message.rows, message.offset, message.sort
        self.total, self.waiting = None, message.waiting
        with self.app.batch_update():
            self.query_one(KernelTable).show(message.rows, self.marked)
            if message.op_types is not None:
                self._update_op_choices(message.op_types)
            self._update_banner(message.schema)
            self._update_status()
        if not message.rows:
            self.query_one(KernelDetail).show(None, [])

    def on_kernel_pages_page_failed(self, message: KernelPages.PageFailed) -> None:
        self.awaiting_page = False  # no page is coming: typing must not wait for it
        if self.sync_after_first_page:
            self.sync_after_first_page = False
            self.request_sync()

    def on_kernel_pages_counted(self, message: KernelPages.Counted) -> None:
        if message.generation == self.generation:
            self.total = message.total
            self._update_status()

    def on_kernel_pages_index_progress(self, message: KernelPages.IndexProgress) -> None:
        share = f"{message.done / message.total:.0%}" if message.total else ""
        self.index_state = f"browse index: {message.done:,}/{message.total:,} rows {share}"
        self._update_status()

    def on_kernel_pages_index_synced(self, message: KernelPages.IndexSynced) -> None:
        self.index_state = ""
        if message.changed:
            self.reload()
        else:
            self._update_status()

    def _update_op_choices(self, ops: list[str]) -> None:
        select = self.query_one("#filter-op", Select)
        wanted = [(op, op) for op in ops]
        if getattr(select, "_kdb_ops", None) != wanted:
            select._kdb_ops = wanted  # type: ignore[attr-defined]
            with select.prevent(Select.Changed):
                select.set_options(wanted)
                if self.kernel_filter.op_type in ops:
                    select.value = self.kernel_filter.op_type

    def _update_banner(self, schema: Schema) -> None:
        banner = self.query_one("#banner")
        if schema is Schema.OSDI20:
            self.query_one("#banner-text", Static).update(
                "This DB uses the older osdi20 schema: shown read-only. Convert it into a new file to use it.")
            banner.remove_class("hidden")
        elif schema is Schema.EMPTY:
            self.query_one("#banner-text", Static).update(
                f"No kernels yet in {self.app.context.db_path}: inject some (2) to create it.")  # type: ignore[attr-defined]
            banner.remove_class("hidden")
            self.query_one("#convert", Button).display = False
        else:
            banner.add_class("hidden")

    def _update_status(self) -> None:
        sort = next((label for _, label, s, _ in COLUMNS if s == self.shown_sort), self.shown_sort)
        first, end = self.page_offset + 1 if self.rows else 0, self.page_offset + len(self.rows)
        if self.waiting:
            text = "this filter or sort waits for the browse index (a big DB: reading it directly takes minutes)"
        elif self.total is None:
            text = f"rows {first}-{end} of … (counting) · page {self.page_offset // PAGE_SIZE + 1}"
        else:
            pages = max(1, -(-self.total // PAGE_SIZE))
            text = f"rows {first}-{end} of {self.total:,} · page {self.page_offset // PAGE_SIZE + 1}/{pages}"
        text += f" · sorted by {sort} {'↓' if self.descending else '↑'}"
        if self.index_state:
            text += f" · {self.index_state}"
        if self.marked:
            text += f" · {len(self.marked)} marked"
        undo = self.query_one(DbMaintenance).undo_stack
        if undo:
            text += f" · u undoes: {undo[-1].title}"
        self.query_one("#page-status", Static).update(text)

    @on(DataTable.RowHighlighted, "#kernel-table")
    def row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.query_one(KernelDetail).load(str(event.row_key.value))

    # -- filtering and sorting ----------------------------------------------------------------

    @on(Input.Changed, "#filter-text")
    @on(Input.Changed, "#filter-tag")
    def text_filter_changed(self) -> None:
        # The first key queries at once; keys typed while that page is on its way are applied together
        # when it arrives, so fast typing runs one query per page shown, never one per key.
        if self.awaiting_page:
            self.filter_pending = True
        else:
            self._apply_filters()

    @on(Select.Changed)
    def select_filter_changed(self) -> None:
        self._apply_filters()

    def _apply_filters(self) -> None:
        def value(select_id: str) -> str:
            v = self.query_one(select_id, Select).value
            return v if isinstance(v, str) else ""

        self.kernel_filter = KernelFilter(
            text=self.query_one("#filter-text", Input).value.strip(),
            op_type=value("#filter-op"), source=value("#filter-source"),
            tag=self.query_one("#filter-tag", Input).value.strip(), device=value("#filter-device"),
            lint=value("#filter-lint"), precision=value("#filter-precision"), units=value("#filter-units"),
        )
        self.page_offset = 0
        self.reload()

    @on(DataTable.HeaderSelected, "#kernel-table")
    def header_selected(self, event: DataTable.HeaderSelected) -> None:
        sort = next((s for key, _, s, _ in COLUMNS if key == event.column_key.value), None)
        if sort is None:
            self.notify("this column is not sortable", timeout=2)
            return
        self.descending = not self.descending if sort == self.sort else False
        self.sort = sort
        self.page_offset = 0
        self.reload()

    # -- actions -----------------------------------------------------------------------------

    def show_rows_matching(self, text: str) -> None:
        """The rows whose identifier, name or Key holds `text`, as if typed in the filter (another view's "open in
        Kernels", through the App)."""
        self.query_one("#filter-text", Input).value = text

    def action_focus_filter(self) -> None:
        self.query_one("#filter-text", Input).focus()

    def action_focus_table(self) -> None:
        self.query_one(KernelTable).focus()

    def action_page(self, delta: int) -> None:
        new = self.page_offset + delta * PAGE_SIZE
        more = len(self.rows) == PAGE_SIZE if self.total is None else new < self.total
        if new >= 0 and (delta < 0 or more):
            self.page_offset = new
            self.reload()

    def action_reload(self) -> None:
        self.reload()
        self.query_one(KernelPages).retry()

    def action_rebuild_index(self) -> None:
        """Another tool may have UPDATEd rows in place, which a sync cannot see: read every row again."""
        self.query_one(KernelPages).retry(rebuild=True)

    def action_mark(self) -> None:
        key = self.query_one(KernelTable).current_key()
        if key is None:
            return
        self.marked.symmetric_difference_update({key})
        with self.app.batch_update():
            self.query_one(KernelTable).show(self.rows, self.marked)
            self._update_status()

    def _selection(self) -> list[str]:
        if self.marked:
            return sorted(self.marked)
        key = self.query_one(KernelTable).current_key()
        return [key] if key else []

    # -- DB maintenance: the core plans, previewed and applied by DbMaintenance -------------------------

    def action_delete(self) -> None:
        keys = self._selection()
        if keys:
            self.query_one(DbMaintenance).plan_delete(keys)

    def action_undo(self) -> None:
        self.query_one(DbMaintenance).undo_last()

    def action_repair_pairs(self) -> None:
        """What `kdb db repair` mends: fused kernels without their CUDA twin, rows in an older form, ops out of
        order."""
        self.query_one(DbMaintenance).plan_repair()

    def action_keep_fastest(self) -> None:
        """`kdb db fastest`: per op, the row timed fastest on the GPU stays and the others go."""
        self.query_one(DbMaintenance).plan_fastest()

    def action_toggle_standalone(self) -> None:
        """`kdb db standalone`: the ops of the marked rows (or the current one) run on their own launch, never fused
        by BlockFusion; if some are standalone already, they go back to BlockFusion instead."""
        keys = self._selection()
        if keys:
            self.query_one(DbMaintenance).plan_standalone(keys)

    def action_leave_to_library(self) -> None:
        """`kdb db leave-to-library TIMES.json`: the ops whose rows ran slower than cuDNN/cuBLAS on the GPU (a times
        file `kdb nnfusion --op-times` wrote) have their rows set aside, previewed first; `u` puts them back."""

        def chosen(path: str | None) -> None:
            if path:
                self.query_one(DbMaintenance).plan_leave_to_library(Path(path).expanduser())

        self.app.push_screen(PathDialog("Leave to the library the ops whose rows ran slower, by which times file "
                                        "(kdb nnfusion --op-times)?",
                                        dialog_default(self.app.context.settings, "times.json")),  # type: ignore[attr-defined]
                             chosen)

    def on_db_maintenance_plan_applied(self, message: DbMaintenance.PlanApplied) -> None:
        self.marked -= set(message.applied.deleted)
        self.reload()
        self.request_sync()

    def action_compile_with_nnfusion(self) -> None:
        """Ask for a model, then compile it with NNFusion and this DB (console/screens/nnfusion.py)."""
        from console.screens.nnfusion import compile_screen  # the compiler's job loads when first asked for

        def chosen(path: str | None) -> None:
            if path:
                self.app.push_screen(compile_screen(self.app.context, Path(path).expanduser()))  # type: ignore[attr-defined]

        self.app.push_screen(PathDialog("Compile which ONNX model with NNFusion and this DB?",
                                        dialog_default(self.app.context.settings)), chosen)  # type: ignore[attr-defined]

    # -- what is done with the rows: KernelActions -----------------------------------------------

    def action_export(self) -> None:
        keys = self._selection()
        if keys:
            self.query_one(KernelActions).export(keys)

    def action_check_on_gpu(self, profile: bool) -> None:
        keys = self._selection()
        if keys:
            self.query_one(KernelActions).check(keys, profile)

    def on_kernel_actions_rows_changed(self, message: KernelActions.RowsChanged) -> None:
        self.reload()

    def _current(self) -> KernelSummary | None:
        key = self.query_one(KernelTable).current_key()
        return next((r for r in self.rows if r.key == key), None)

    def action_copy_identifier(self) -> None:
        row = self._current()
        if row:
            self.app.copy_to_clipboard(row.identifier)
            self.notify("identifier copied")

    def action_copy_body(self) -> None:
        row = self._current()
        if row:
            self.query_one(KernelActions).copy_body(row.key)

    @on(Button.Pressed, "#convert")
    def action_convert(self) -> None:
        self.query_one(KernelActions).convert()

    def set_db(self, path: Path) -> None:
        """Open another DB (used after a conversion)."""
        self.app.context.db_path = path  # type: ignore[attr-defined]
        self.kernel_filter, self.page_offset = replace(self.kernel_filter), 0
        self.reload()


__all__ = ["KernelDB", "KernelsScreen"]

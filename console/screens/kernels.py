"""Kernels: browse the DB a page at a time, filter as you type, sort, inspect, delete/undo, export, copy.

All DB work happens in thread workers that post messages back; the screen applies them. Each reload
carries a generation number so a slow, stale page never overwrites a newer one. Pages come from the browse
index (core/db/summary_index.py) once it exists; a worker of its own keeps it in step with the DB, and the
page is shown first, its row count after (counting a million rows takes longer than painting 100).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, DataTable, Footer, Header, Input, Select, Static
from textual.worker import Worker, WorkerState, get_current_worker

from console.screens.base import KdbScreen
from console.widgets.dialogs import ConfirmDialog, PathDialog, dialog_default
from console.widgets.kernel_detail import KernelDetail, highlight_source
from console.widgets.kernel_table import COLUMNS, KernelTable
from core.db.browse import (
    KernelFilter,
    KernelSummary,
    count_kernels,
    count_kernels_indexed,
    list_kernels,
    list_kernels_indexed,
)
from core.db.fastest import FastestPlan, plan_fastest, profiled_devices
from core.db.kernel_db import KernelDB, Schema
from core.db.realign import RealignPlan, apply_realign, plan_realign
from core.db.standalone import RowChange
from core.db.summary_index import SummaryIndex
from core.errors import DbError
from core.kernels.kernel_row import KernelRow

PAGE_SIZE = 100
DIRECT_FILTER_LIMIT = 50_000  # rows above which filters wait for the browse index rather than read the DB
ALL = "__all__"


class KernelsScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("escape", "focus_table", "Back to the table", show=False),
        Binding("n", "page(1)", "Next", tooltip="Next page"),
        Binding("p", "page(-1)", "Prev", tooltip="Previous page"),
        Binding("space", "mark", "Mark", show=False),
        Binding("d", "delete", "Delete"),
        Binding("u", "undo", "Undo", tooltip="Undo the last delete"),
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
    ]

    @dataclass
    class PageLoaded(Message):
        generation: int
        rows: list[KernelSummary]
        offset: int
        schema: Schema
        sort: str  # what the page is sorted by (Key while there is no index yet and no filter)
        op_types: list[str] | None = None  # None: unchanged
        waiting: bool = False  # the filter waits for the browse index

    @dataclass
    class Counted(Message):
        generation: int
        total: int

    @dataclass
    class IndexProgress(Message):
        done: int
        total: int

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, KernelsScreen.IndexProgress)

    @dataclass
    class IndexSynced(Message):
        changed: bool
        failed: bool = False  # the worker's error reaches the App's handler; this only stops retries

    @dataclass
    class IndexStale(Message):
        """A page came from an index that the DB has moved on from."""

    @dataclass
    class DetailLoaded(Message):
        key: str
        view: dict | None
        findings: list

    def __init__(self) -> None:
        super().__init__()
        self.kernel_filter = KernelFilter()
        self.sort, self.descending = "op", False
        self.page_offset = 0
        self.total: int | None = 0  # None while counting
        self.shown_sort = "op"
        self.waiting = False
        self.index_state = ""  # what the status line says of the browse index
        self.syncing, self.sync_again, self.rebuild_next = False, False, False
        self.awaiting_page, self.filter_pending = False, False
        self.index_failed = False
        self.sync_after_first_page = True
        self.generation = 0
        self.marked: set[str] = set()
        self.undo_stack: list[list[KernelRow]] = []
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
        with Horizontal(id="kernels-main"):
            with Vertical(id="kernels-left"):
                yield KernelTable(id="kernel-table")
                yield Static(id="page-status")
            yield KernelDetail(id="kernel-detail")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(KernelTable).focus()
        # Another process (an injection in another terminal) may write at any time; a sync of an unchanged
        # file costs a stat() and one small query.
        self.set_interval(3.0, self._periodic_sync)

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
        self.load_page(self.generation, self.kernel_filter, self.sort, self.descending, self.page_offset)

    @work(thread=True, exit_on_error=False, group="page", exclusive=True)
    def load_page(self, generation: int, flt: KernelFilter, sort: str, descending: bool, offset: int) -> None:
        context = self.app.context  # type: ignore[attr-defined]
        if not context.db_path.exists():
            # Not an error: the first injection creates it.
            self.post_message(self.PageLoaded(generation, [], 0, Schema.EMPTY, sort, []))
            self.post_message(self.Counted(generation, 0))
            return
        with context.open_db() as db:
            if db.schema is not Schema.CURRENT:
                self.post_message(self.PageLoaded(generation, [], 0, db.schema, sort, []))
                self.post_message(self.Counted(generation, 0))
                return
            if self._page_from_index(generation, db, flt, sort, descending, offset):
                return
            # No index yet (it is being built): ask the DB itself. Unfiltered pages follow the Key index,
            # which gives a first page at once however big the DB is; a filter or sort over a big DB would read
            # every body (minutes at a million rows) and waits for the index instead.
            total = count_kernels(db)  # the Key index: milliseconds
            if flt == KernelFilter():
                sort = "key"
            elif total > DIRECT_FILTER_LIMIT:
                self.post_message(self.PageLoaded(generation, [], offset, db.schema, sort, waiting=True))
                return
            rows = list_kernels(db, flt, sort=sort, descending=descending, offset=offset, limit=PAGE_SIZE)
            self.post_message(self.PageLoaded(generation, rows, offset, db.schema, sort))
            if not get_current_worker().is_cancelled:
                self.post_message(self.Counted(generation, total if flt == KernelFilter() else count_kernels(db, flt)))

    def _page_from_index(self, generation: int, db: KernelDB, flt: KernelFilter, sort: str, descending: bool,
                         offset: int) -> bool:
        """Post the page (and then its count) from the browse index; False when there is no usable index."""
        try:
            index = SummaryIndex.open(db.path)
        except (sqlite3.Error, DbError, OSError):
            return False  # an unwritable state dir, say: the sync worker reports it; pages come from the DB
        with index:
            try:
                if not index.ready:
                    return False
                rows = list_kernels_indexed(index, flt, sort=sort, descending=descending, offset=offset,
                                            limit=PAGE_SIZE)
                ops = [op for op, _ in index.op_types()]
            except sqlite3.DatabaseError:
                return False  # a damaged cache: the sync worker rebuilds it
            self.post_message(self.PageLoaded(generation, rows, offset, db.schema, sort, ops))
            if not index.fresh:
                self.post_message(self.IndexStale())
            if not get_current_worker().is_cancelled:
                self.post_message(self.Counted(generation, count_kernels_indexed(index, flt)))
        return True

    def on_kernels_screen_page_loaded(self, message: PageLoaded) -> None:
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

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # KdbScreen's handler (the App's report) runs too: Textual calls each class's handler in the MRO.
        if event.worker.group == "page" and event.state is WorkerState.ERROR:
            self.awaiting_page = False  # no page is coming: typing must not wait for it
            if self.sync_after_first_page:
                self.sync_after_first_page = False
                self.request_sync()

    def on_kernels_screen_counted(self, message: Counted) -> None:
        if message.generation == self.generation:
            self.total = message.total
            self._update_status()

    def request_sync(self, rebuild: bool = False) -> None:
        """One sync at a time (a build of a big DB must not be restarted by every change); asked for again
        while one runs, it runs once more after."""
        if self.syncing:
            self.sync_again, self.rebuild_next = True, self.rebuild_next or rebuild
            return
        self.syncing = True
        self.sync_index(rebuild)

    def _periodic_sync(self) -> None:
        if not self.index_failed:  # reported once; r or R tries again
            self.request_sync()

    def on_kernels_screen_index_stale(self, message: IndexStale) -> None:
        if not self.index_failed:
            self.request_sync()

    @work(thread=True, exit_on_error=False, group="index")
    def sync_index(self, rebuild: bool = False) -> None:
        context = self.app.context  # type: ignore[attr-defined]
        changed, finished = False, False
        try:
            if context.db_path.exists():
                with context.open_db() as db:
                    current = db.schema is Schema.CURRENT
                if current:
                    worker = get_current_worker()
                    with SummaryIndex.open(context.db_path) as index:
                        changed = index.sync(lambda done, total: self.post_message(self.IndexProgress(done, total)),
                                             lambda: worker.is_cancelled, force_rebuild=rebuild).changed
            finished = True
        finally:  # a failure goes to the App's handler; the next request must still be able to run
            self.post_message(self.IndexSynced(changed, failed=not finished))

    def on_kernels_screen_index_progress(self, message: IndexProgress) -> None:
        share = f"{message.done / message.total:.0%}" if message.total else ""
        self.index_state = f"browse index: {message.done:,}/{message.total:,} rows {share}"
        self._update_status()

    def on_kernels_screen_index_synced(self, message: IndexSynced) -> None:
        self.index_state = ""
        self.syncing = False
        self.index_failed = message.failed
        if self.sync_again and message.failed:
            self.sync_again = self.rebuild_next = False  # r or R tries again
        elif self.sync_again:
            # A DB written without pause would keep a sync running back to back: leave the UI a breath.
            rebuild, self.sync_again, self.rebuild_next = self.rebuild_next, False, False
            self.set_timer(1.0, lambda: self.request_sync(rebuild))
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
        if self.undo_stack:
            text += f" · u undoes the last delete ({len(self.undo_stack[-1])} rows)"
        self.query_one("#page-status", Static).update(text)

    @on(DataTable.RowHighlighted, "#kernel-table")
    def row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.load_detail(str(event.row_key.value))

    @work(thread=True, exit_on_error=False, group="detail", exclusive=True)
    def load_detail(self, key: str) -> None:
        from core.kernels.lint import lint_row
        from core.kernels.rowview import describe_row

        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            rows = db.find(key)
        if not rows:
            self.post_message(self.DetailLoaded(key, None, []))
            return
        row = rows[0]
        view = describe_row(row)
        view["highlighted"] = highlight_source(view["signature"], view["body"])  # here, not on the UI thread
        self.post_message(self.DetailLoaded(key, view, lint_row((0, *row.values()))))

    def on_kernels_screen_detail_loaded(self, message: DetailLoaded) -> None:
        if self.query_one(KernelTable).current_key() == message.key:
            self.query_one(KernelDetail).show(message.view, message.findings)

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
            lint=value("#filter-lint"),
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
        self.index_failed = False
        self.reload()
        self.request_sync()

    def action_rebuild_index(self) -> None:
        """Another tool may have UPDATEd rows in place, which a sync cannot see: read every row again."""
        self.index_failed = False
        self.request_sync(rebuild=True)

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

    def action_delete(self) -> None:
        keys = self._selection()
        if not keys:
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.delete_rows(keys)

        self.app.push_screen(ConfirmDialog(
            f"Delete {len(keys)} kernel(s) from the DB?",
            "A fused kernel's two rows (CUDA_GPU and its CUDA twin) go together. The rows are kept in memory: "
            "`u` puts them back until you quit the console.",
            confirm_label="Delete"), confirmed)

    @work(thread=True, exit_on_error=False, group="write")
    def delete_rows(self, keys: list[str]) -> None:
        with self.app.context.open_db(write=True) as db:  # type: ignore[attr-defined]
            removed = db.delete(keys)
        with SummaryIndex.open(db.path) as index:
            index.forget([r.key for r in removed])  # gone from the pages at once, before the next sync
        self.app.call_from_thread(self._after_delete, removed)

    def _after_delete(self, removed: list[KernelRow]) -> None:
        if removed:
            self.undo_stack.append(removed)
        self.marked -= {r.key for r in removed}
        self.notify(f"deleted {len(removed)} row(s); u to undo")
        self.reload()
        self.request_sync()

    def action_undo(self) -> None:
        if not self.undo_stack:
            self.notify("nothing to undo", timeout=2)
            return
        self.restore_rows(self.undo_stack.pop())

    @work(thread=True, exit_on_error=False, group="write")
    def restore_rows(self, rows: list[KernelRow]) -> None:
        with self.app.context.open_db(write=True) as db:  # type: ignore[attr-defined]
            n = db.restore(rows)
        self.app.call_from_thread(self.notify, f"restored {n} row(s)")
        self.app.call_from_thread(self.request_sync)

    def action_compile_with_nnfusion(self) -> None:
        """Ask for a model, then compile it with NNFusion and this DB (console/screens/nnfusion.py)."""
        from console.screens.nnfusion import compile_screen  # the compiler's job loads when first asked for

        def chosen(path: str | None) -> None:
            if path:
                self.app.push_screen(compile_screen(self.app.context, Path(path).expanduser()))  # type: ignore[attr-defined]

        self.app.push_screen(PathDialog("Compile which ONNX model with NNFusion and this DB?",
                                        dialog_default(self.app.context.settings)), chosen)  # type: ignore[attr-defined]

    def action_repair_pairs(self) -> None:
        """What `kdb db repair` mends: fused kernels without the CUDA row NNFusion needs to use them, and older
        rows (shared arrays without their alignment, pointers without __restrict__). Preview, then write."""
        self.plan_repair()

    @work(thread=True, exit_on_error=False, group="write")
    def plan_repair(self) -> None:
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            unused, orphans = db.pair_problems()
            realign = plan_realign(db)
        self.app.call_from_thread(self._confirm_repair, [r.key for r in unused], len(orphans), realign)

    def _confirm_repair(self, keys: list[str], orphans: int, realign: RealignPlan) -> None:
        note = (f" {orphans} CUDA row(s) without their kernel make the compiler abort; repair leaves them: "
                "delete them here." if orphans else "")
        if not keys and not realign:
            severity = "warning" if orphans else "information"
            self.notify("every fused kernel has its CUDA twin and every row the form injection writes." + note,
                        severity=severity)
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.repair(keys, realign)

        asks = [f"add the CUDA twin of {len(keys)} fused kernel(s)"] if keys else []
        asks += [f"bring {len(realign)} kernel(s) to the form injection writes now"] if realign else []
        self.app.push_screen(ConfirmDialog(
            " and ".join(asks).capitalize() + "?",
            "NNFusion uses a fused kernel only when a CUDA row of its identifier is there too (its pattern "
            "substitution asks for it). It declares a row's shared arrays from shared_memory: without the "
            "alignment its code asks for, nvcc reads them 4 bytes at a time; and it compiles the signature as "
            "written: without __restrict__, no read-only loads. Nothing else in the DB is touched; the rows keep "
            "their Keys and profiles." + note, confirm_label="Repair"),
            confirmed)

    @work(thread=True, exit_on_error=False, group="write")
    def repair(self, keys: list[str], realign: RealignPlan) -> None:
        with self.app.context.open_db(write=True) as db:  # type: ignore[attr-defined]
            written = db.add_twins(keys)
            realigned = apply_realign(db, realign)
        self.app.call_from_thread(self.notify, f"added {len(written)} twin row(s), realigned {len(realigned)} "
                                               "kernel(s)")
        self.app.call_from_thread(self.request_sync)

    def action_keep_fastest(self) -> None:
        """Per op, the row timed fastest on the GPU stays and the others go: NNFusion takes an op's first row, not
        its fastest (core/db/fastest.py). Preview, then delete; `u` puts them back."""
        self.plan_keep_fastest()

    @work(thread=True, exit_on_error=False, group="write")
    def plan_keep_fastest(self) -> None:
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            devices = profiled_devices(db)
            device = self.app.context.settings.product_name or (devices.pop() if len(devices) == 1 else "")  # type: ignore[attr-defined]
            plan = plan_fastest(db, device) if device else None
        self.app.call_from_thread(self._confirm_keep_fastest, plan, len(devices))

    def _confirm_keep_fastest(self, plan: FastestPlan | None, devices: int) -> None:
        if plan is None:
            self.notify(f"Which GPU ranks the rows? Set product_name in Settings (this DB has times for {devices} "
                        "GPUs)." if devices else "No row of this DB has a GPU time yet: profile them first (P).",
                        severity="warning")
            return
        if not plan.removals:
            self.notify(f"Every op timed on {plan.device} has one row: nothing to keep or drop.")
            return
        unmeasured = sum(1 for c in plan.choices for lo in c.removed if lo.us is None)
        ops = sum(1 for c in plan.choices if c.removed)

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.delete_rows(plan.removals)

        self.app.push_screen(ConfirmDialog(
            f"Keep only the fastest row of {ops} op(s) on {plan.device}?",
            f"{len(plan.removals)} kernel(s) go ({unmeasured} of them not timed on {plan.device}), with their CUDA "
            "twins. NNFusion takes an op's first row, not its fastest. `u` puts them back until you quit.",
            confirm_label="Keep fastest"), confirmed)

    def action_toggle_standalone(self) -> None:
        """The ops of the marked rows (or the current one) run on their own launch, never fused by BlockFusion; if
        some are standalone already, they go back to BlockFusion instead (core/db/standalone.py)."""
        keys = self._selection()
        if keys:
            self.plan_standalone(keys)

    @work(thread=True, exit_on_error=False, group="write")
    def plan_standalone(self, keys: list[str]) -> None:
        from core.db.standalone import plan_fusable, plan_standalone
        from core.kernels.ops import DEFAULT_PRODUCT

        product = self.app.context.settings.product_name or DEFAULT_PRODUCT  # type: ignore[attr-defined]
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            back = plan_fusable(db, keys)
            plan = back or plan_standalone(db, keys, product)
        self.app.call_from_thread(self._confirm_standalone, plan, bool(back), product)

    def _confirm_standalone(self, plan: list[RowChange], back: bool, product: str) -> None:
        if not plan:
            self.notify("no External row of these ops to change", severity="warning")
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.write_standalone(plan)

        ops = len({c.row.identifier for c in plan})
        if back:
            question = f"Give {len(plan)} standalone row(s) of {ops} op(s) back to BlockFusion?"
            detail = "They become External rows again, which BlockFusion may fuse with other kernels."
        else:
            question = f"Run {len(plan)} row(s) of {ops} op(s) standalone?"
            detail = (f"For -fproduct_name {product!r}, kernel selection then emits each op's kernel on its own "
                      "launch, never fused by BlockFusion: for a fused kernel that cannot launch (`kdb nnfusion` "
                      "names it). The code, the Keys and the profiles stay; S again gives them back.")
        self.app.push_screen(ConfirmDialog(question, detail, confirm_label="Change"), confirmed)

    @work(thread=True, exit_on_error=False, group="write")
    def write_standalone(self, plan: list[RowChange]) -> None:
        from core.db.standalone import apply_changes

        with self.app.context.open_db(write=True) as db:  # type: ignore[attr-defined]
            written = apply_changes(db, plan)
        self.app.call_from_thread(self.notify, f"changed {len(written)} row(s)")
        self.app.call_from_thread(self.request_sync)

    def action_export(self) -> None:
        keys = self._selection()
        if not keys:
            return
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

    def action_check_on_gpu(self, profile: bool) -> None:
        keys = self._selection()
        if keys:
            self.notify(f"{'profiling' if profile else 'verifying'} {len(keys)} kernel(s) on the GPU…", timeout=3)
            self.check_on_gpu(keys, profile)

    @work(thread=True, exit_on_error=False, group="gpu", exclusive=True)
    def check_on_gpu(self, keys: list[str], profile: bool) -> None:
        from core.errors import ToolError
        from core.gpu.jobs import gpu_children, require_device
        from core.gpu.rows import NvccBuild, check_rows

        try:
            device = require_device()
        except ToolError as exc:
            self.app.call_from_thread(self.notify, f"no CUDA device: {exc}", severity="warning", timeout=10)
            return
        settings = self.app.context.settings  # type: ignore[attr-defined]
        with self.app.context.open_db(write=profile) as db:  # type: ignore[attr-defined]
            rows = [r for key in keys for r in db.find(key)]
            report = check_rows(db, rows, verify=True, profile=profile, product_name=settings.product_name,
                                timeout_s=settings.gpu_timeout_s, workers=gpu_children(settings.effective_workers()),
                                build=NvccBuild.from_settings(settings, device.arch))
        failed = [c for c in report.checks if not c.ok]
        text = (f"{len(report.checks)} kernel(s) {'profiled' if profile else 'verified'} on {report.device}: "
                f"{len(report.checks) - len(failed)} ok, {len(failed)} failed")
        if failed:
            c = failed[0]
            why = c.error or next((r.reason for r in (c.verified, c.timed) if r is not None and not r.ok), "")
            text += f" (first: {c.name}: {why})"
        self.app.call_from_thread(self.notify, text, severity="error" if failed else "information", timeout=10)
        if profile:
            self.app.call_from_thread(self.reload)  # the profiles are in the rows now

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
            self.copy_body(row.key)

    @work(thread=True, exit_on_error=False, group="detail")
    def copy_body(self, key: str) -> None:
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            rows = db.find(key)
        if rows:
            body = json.loads(rows[0].function).get("function_body", "")
            self.app.call_from_thread(self.app.copy_to_clipboard, body)
            self.app.call_from_thread(self.notify, "CUDA body copied")

    @on(Button.Pressed, "#convert")
    def action_convert(self) -> None:
        old: Path = self.app.context.db_path  # type: ignore[attr-defined]
        default = str(old.with_name(old.stem + "-converted.db"))

        def chosen(path: str | None) -> None:
            if path:
                self.convert(old, Path(path).expanduser())

        self.app.push_screen(PathDialog("Convert this osdi20 DB into a new current-schema file:", default), chosen)

    @work(thread=True, exit_on_error=False, group="write")
    def convert(self, old: Path, new: Path) -> None:
        from core.db.convert import convert_db

        report = convert_db(old, new)
        self.app.call_from_thread(
            self.notify, f"{report.converted} rows converted into {new}; {len(report.failed)} could not be"
            + ("" if not report.failed else f" (first: {report.failed[0]['reason']})"), timeout=10)

    def set_db(self, path: Path) -> None:
        """Open another DB (used after a conversion)."""
        self.app.context.db_path = path  # type: ignore[attr-defined]
        self.kernel_filter, self.page_offset = replace(self.kernel_filter), 0
        self.reload()


__all__ = ["KernelDB", "KernelsScreen"]

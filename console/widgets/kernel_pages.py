"""Where the Kernels view's pages come from: the browse index (core/db/summary_index.py) once it exists, else the DB
itself; and the index kept in step with the DB, one sync at a time.

No layout of its own: its workers post messages that bubble to the view. Each page carries the generation number
the view asked with, so the view can drop a slow, stale page. The page comes first, its row count after (counting a
million rows takes longer than painting 100).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from textual import work
from textual.message import Message
from textual.widget import Widget
from textual.worker import Worker, WorkerState, get_current_worker

from core.db.browse import (
    KernelFilter,
    KernelSummary,
    count_kernels,
    count_kernels_indexed,
    list_kernels,
    list_kernels_indexed,
)
from core.db.kernel_db import KernelDB, Schema
from core.db.summary_index import SummaryIndex
from core.errors import DbError

PAGE_SIZE = 100
DIRECT_FILTER_LIMIT = 50_000  # rows above which filters wait for the browse index rather than read the DB
SYNC_EVERY_S = 3.0  # another process (an injection in another terminal) may write at any time


class KernelPages(Widget):
    DEFAULT_CSS = "KernelPages { display: none; }"

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
    class PageFailed(Message):
        """No page is coming (the worker's error reached the App's handler)."""

    @dataclass
    class Counted(Message):
        generation: int
        total: int

    @dataclass
    class IndexProgress(Message):
        done: int
        total: int

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, KernelPages.IndexProgress)

    @dataclass
    class IndexSynced(Message):
        changed: bool
        failed: bool = False  # the worker's error reaches the App's handler; this only stops retries

    @dataclass
    class IndexStale(Message):
        """A page came from an index that the DB has moved on from."""

    def __init__(self) -> None:
        super().__init__()
        self.syncing, self.sync_again, self.rebuild_next = False, False, False
        self.failed = False  # the last sync failed: reported once; r or R tries again
        self.ticking = False  # the periodic sync runs from the view's first request on

    # -- pages ------------------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="page", exclusive=True)
    def load(self, generation: int, flt: KernelFilter, sort: str, descending: bool, offset: int) -> None:
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

    # -- the browse index ---------------------------------------------------------------------------

    def request_sync(self, rebuild: bool = False) -> None:
        """One sync at a time (a build of a big DB must not be restarted by every change); asked for again
        while one runs, it runs once more after."""
        if not self.ticking:
            # The periodic sync (an unchanged file: a stat() and one small query) starts with the view's first
            # request, made once its first page is on screen: a build competes with the first paint, and a tick
            # before the first page was a second sync, reported a second time when it failed.
            self.ticking = True
            self.set_interval(SYNC_EVERY_S, self._periodic_sync)
        if self.syncing:
            self.sync_again, self.rebuild_next = True, self.rebuild_next or rebuild
            return
        self.syncing = True
        self.sync_index(rebuild)

    def retry(self, rebuild: bool = False) -> None:
        """r or R: try again after a failure, too."""
        self.failed = False
        self.request_sync(rebuild)

    def _periodic_sync(self) -> None:
        if not self.failed:
            self.request_sync()

    def on_kernel_pages_index_stale(self, message: IndexStale) -> None:
        if not self.failed:
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

    def on_kernel_pages_index_synced(self, message: IndexSynced) -> None:
        """Bookkeeping only; the message goes on to the view, which shows the DB again if it changed."""
        self.syncing = False
        self.failed = message.failed
        if self.sync_again and message.failed:
            self.sync_again = self.rebuild_next = False  # r or R tries again
        elif self.sync_again:
            # A DB written without pause would keep a sync running back to back: leave the UI a breath.
            rebuild, self.sync_again, self.rebuild_next = self.rebuild_next, False, False
            self.set_timer(1.0, lambda: self.request_sync(rebuild))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker_failure(event)  # type: ignore[attr-defined]  # a widget's worker events do not bubble
        if event.worker.group == "page" and event.state is WorkerState.ERROR:
            self.post_message(self.PageFailed())

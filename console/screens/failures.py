"""Failures: every failed conversion of every run on this DB, grouped by stage and reason; retry, edit, dismiss.

The state DB is read and written only in thread workers (each opens its own StateDB and closes it).
Retries read the settings at the moment they start, so a changed SM arch or nvcc applies at once.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Footer, Header, ProgressBar, Static, Tree
from textual.widgets.tree import TreeNode
from textual.worker import Worker, get_current_worker

from console.screens.base import KdbScreen
from console.widgets.dialogs import ConfirmDialog, EditTextDialog
from console.widgets.failure_detail import FailureDetail, Place, item_label, offending_place, pretty_item
from core.codegen.failures import CODEGEN_STAGE
from core.db.state import StateDB, StoredFailure
from core.inject import retry as failure_retry
from core.inject.pipeline import STAGES, InjectOptions, InjectProgress, InjectReport

REASON_WIDTH = 60
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w])")


@dataclass(frozen=True)
class Entry:
    """What a tree node stands for: one failure (a leaf) or a group of them."""

    key: str  # stable across reloads, to keep the cursor and collapsed groups in place
    title: str
    failures: tuple[StoredFailure, ...]
    leaf: bool = False

    @property
    def ids(self) -> list[int]:
        return [f.id for f in self.failures if f.id is not None]


def reason_pattern(reason: str) -> str:
    """Reasons that differ only in numbers (lines, shapes, sizes) share a group."""
    return _NUMBER.sub("#", reason)


def shorten(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def group_failures(failures: list[StoredFailure]) -> list[tuple[str, list[tuple[str, list[StoredFailure]]]]]:
    """[(stage, [(reason, failures)])]: stages in pipeline order (codegen first), the biggest reason groups first.

    A group of one distinct reason is titled with it; reasons differing in numbers share their pattern.
    """
    by_stage: dict[str, dict[str, list[StoredFailure]]] = defaultdict(lambda: defaultdict(list))
    for f in failures:
        by_stage[f.stage][reason_pattern(f.reason)].append(f)
    order = {stage: i for i, stage in enumerate((CODEGEN_STAGE, *STAGES))}  # codegen comes before injection
    grouped = []
    for stage in sorted(by_stage, key=lambda s: (order.get(s, len(order)), s)):
        reasons = []
        for pattern, group in sorted(by_stage[stage].items(), key=lambda kv: (-len(kv[1]), kv[0])):
            title = group[0].reason if len({f.reason for f in group}) == 1 else pattern
            group.sort(key=lambda f: (f.file, -1 if f.item_index is None else f.item_index))
            reasons.append((title, group))
        grouped.append((stage, reasons))
    return grouped


def counted(label: str, n: int, style: str = "") -> Text:
    return Text.assemble((label, style), (f"  {n}", "dim"))


class FailureTree(Tree[Entry]):
    """stage -> reason -> failure."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__("failures", **kwargs)  # type: ignore[arg-type]
        self.show_root = False
        self.guide_depth = 3
        self._chosen: TreeNode[Entry] | None = None  # `show`'s choice until the cursor has moved to it

    @property
    def current(self) -> Entry | None:
        """The entry under the cursor, or the one `show` chose if the cursor has not reached it yet."""
        node = self._chosen or self.cursor_node
        return node.data if node is not None else None

    def _settle(self, chosen: TreeNode[Entry]) -> None:
        if self._chosen is chosen:  # a newer `show` has not replaced it
            self.move_cursor(chosen)
            self._chosen = None

    def show(self, failures: list[StoredFailure]) -> Entry | None:
        """Rebuild from `failures`; keep collapsed groups and the cursor's place. Returns the entry now current."""
        wanted: list[str] = []  # the cursor's entry, else its group, else its stage (a resolved failure is gone)
        node = self._chosen or self.cursor_node
        while node is not None and node.data is not None:
            wanted.append(node.data.key)
            node = node.parent
        collapsed = {node.data.key for node in self._walk(self.root)
                     if node.data is not None and not node.data.leaf and not node.is_expanded}
        self.clear()
        nodes: dict[str, TreeNode[Entry]] = {}
        for stage, reasons in group_failures(failures):
            everything = tuple(f for _, group in reasons for f in group)
            stage_node = self._add(self.root, Entry(stage, f"stage {stage}", everything), collapsed, nodes,
                                   counted(stage, len(everything), "bold"))
            for title, group in reasons:
                group_entry = Entry(f"{stage}\x1f{reason_pattern(title)}", title, tuple(group))
                reason_node = self._add(stage_node, group_entry, collapsed, nodes, counted(shorten(title), len(group)))
                for f in group:
                    # keyed by item: one that fails again keeps the cursor
                    entry = Entry(f"{f.file}#{f.item_index}", f"{item_label(f)} {f.name}", (f,), leaf=True)
                    label = Text.assemble(item_label(f), " ", (f.name or "-", "italic"))
                    nodes[entry.key] = reason_node.add_leaf(label, data=entry)
        chosen = next((nodes[key] for key in wanted if key in nodes), next(iter(nodes.values()), None))
        self._chosen = chosen
        if chosen is None:
            self.move_cursor(None)
            return None
        node = chosen.parent
        while node is not None:  # a chosen failure inside a collapsed group: open the way to it
            node.expand()
            node = node.parent
        # lines are numbered at the next render; until then `current` answers with `chosen`
        self.call_after_refresh(self._settle, chosen)
        return chosen.data

    def _walk(self, node: TreeNode[Entry]) -> list[TreeNode[Entry]]:
        return [node, *(n for child in node.children for n in self._walk(child))]

    @staticmethod
    def _add(parent: TreeNode[Entry], entry: Entry, collapsed: set[str], nodes: dict[str, TreeNode[Entry]],
             label: Text) -> TreeNode[Entry]:
        node = parent.add(label, data=entry, expand=entry.key not in collapsed)
        nodes[entry.key] = node
        return node


class FailuresScreen(KdbScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "retry", "Retry"),
        Binding("R", "retry_all", "Retry all"),
        Binding("e", "edit", "Edit + retry"),
        Binding("x", "dismiss_failures", "Dismiss"),
        Binding("ctrl+r", "reload", "Reload"),
        Binding("escape", "cancel_retry", "Cancel retry"),
    ]

    @dataclass
    class Loaded(Message):
        generation: int
        failures: list[StoredFailure]

    @dataclass
    class PlaceReady(Message):
        failure_id: int | None
        place: Place | None

    @dataclass
    class RetryProgress(Message):
        done: int
        total: int
        failed: int

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, FailuresScreen.RetryProgress)  # only the latest count matters

    @dataclass
    class RetryDone(Message):
        report: InjectReport | None  # None: the retry raised (the App reports the error)
        archs: tuple[str, ...]

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0
        self.failures: list[StoredFailure] = []
        self.retry_worker: Worker[None] | None = None  # set until its RetryDone arrives

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="failures-main"):
            with Vertical(id="failures-left"):
                yield FailureTree(id="failure-tree")
                yield ProgressBar(id="retry-progress", show_eta=False)
                yield Static(id="failures-status")
            with Vertical(id="failures-right"):
                yield FailureDetail(id="failure-detail")
                with Horizontal(id="failure-actions"):
                    yield Button("Retry", id="retry", action="screen.retry", variant="primary")
                    yield Button("Retry all", id="retry-all", action="screen.retry_all")
                    yield Button("Edit + retry", id="edit", action="screen.edit")
                    yield Button("Dismiss", id="dismiss", action="screen.dismiss_failures", variant="error")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#retry-progress").display = False
        self.query_one(FailureTree).focus()

    def on_screen_resume(self) -> None:
        self.reload()  # on first show, and again on return: runs in other views may have added failures

    # -- loading ----------------------------------------------------------------------------

    def reload(self) -> None:
        self.generation += 1
        self.load_failures(self.generation)

    @work(thread=True, exit_on_error=False, group="failures-load", exclusive=True)
    def load_failures(self, generation: int) -> None:
        state = StateDB()
        try:
            failures = state.failures(self.app.context.db_path)  # type: ignore[attr-defined]
        finally:
            state.close()
        self.post_message(self.Loaded(generation, failures))

    def on_failures_screen_loaded(self, message: Loaded) -> None:
        if message.generation != self.generation:
            return  # a newer load is on its way
        self.failures = message.failures
        with self.app.batch_update():
            self._show(self.query_one(FailureTree).show(message.failures))
            if not self._retrying():  # its progress line stays until it ends
                self._update_status()

    def _update_status(self, text: str = "") -> None:
        if not text:
            files = len({f.file for f in self.failures})
            text = (f"{len(self.failures)} open failure(s) in {files} file(s)" if self.failures
                    else "no open failures")
        self.query_one("#failures-status", Static).update(text)

    def _show(self, entry: Entry | None) -> None:
        detail = self.query_one(FailureDetail)
        if entry is None:
            detail.show_text(f"No open failures for {self.app.context.db_path}.\n\n"  # type: ignore[attr-defined]
                             "Op configs TVM cannot generate a kernel for, and kernels that fail to convert "
                             "during injection, are listed here with the reason.")
        elif entry.leaf:
            detail.show_failure(entry.failures[0])
            self.find_place(entry.failures[0])
        else:
            detail.show_group(entry.title, list(entry.failures))

    @work(thread=True, exit_on_error=False, group="failure-place", exclusive=True)
    def find_place(self, failure: StoredFailure) -> None:
        self.post_message(self.PlaceReady(failure.id, offending_place(failure)))

    def on_failures_screen_place_ready(self, message: PlaceReady) -> None:
        current = self._current()
        if current is not None and current.leaf and current.failures[0].id == message.failure_id:
            self.query_one(FailureDetail).show_place(message.place)  # else the selection moved on

    @on(Tree.NodeHighlighted, "#failure-tree")
    def node_highlighted(self, event: Tree.NodeHighlighted[Entry]) -> None:
        self._show(event.node.data)

    def _current(self) -> Entry | None:
        return self.query_one(FailureTree).current

    # -- actions -----------------------------------------------------------------------------

    def action_reload(self) -> None:
        self.reload()

    def action_retry(self) -> None:
        entry = self._current()
        if entry is None:
            self.notify("no failure selected", timeout=2)
            return
        self._start_retry(entry.ids)

    def action_retry_all(self) -> None:
        if not self.failures:
            self.notify("no open failures", timeout=2)
            return
        self._start_retry(None)

    def action_edit(self) -> None:
        entry = self._current()
        if entry is None or not entry.leaf:
            self.notify("select one failure to edit its item", timeout=3)
            return
        failure = entry.failures[0]
        if failure.item_index is None or failure.input is None:
            why = "the whole file failed" if failure.item_index is None else "the item was too large to keep"
            self.notify(f"nothing to edit here: {why}; fix {failure.file}, then retry with r", timeout=5)
            return
        self._open_editor(failure, pretty_item(failure.input))

    def _open_editor(self, failure: StoredFailure, text: str) -> None:
        def saved(new_text: str | None) -> None:
            if new_text is None or failure.id is None:
                return
            try:
                json.loads(new_text)
            except ValueError as exc:  # keep the edit: reopen it with the error shown
                self.notify(f"not valid JSON: {exc}", severity="error", timeout=6)
                self._open_editor(failure, new_text)
                return
            self._start_retry([failure.id], edited=(failure.id, new_text))

        what = "the op config" if failure.stage == CODEGEN_STAGE else failure.name or "the item"
        self.app.push_screen(EditTextDialog(f"Edit {what} ({item_label(failure)}); saving retries it", text), saved)

    def action_dismiss_failures(self) -> None:
        entry = self._current()
        if entry is None:
            return
        ids = entry.ids

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.dismiss_failures(ids)

        self.app.push_screen(ConfirmDialog(
            f"Dismiss {len(ids)} failure(s)?",
            "They leave this list and `kdb failures`; their kernels stay out of the DB. "
            "The records are kept in the state file.", confirm_label="Dismiss"), confirmed)

    @work(thread=True, exit_on_error=False, group="failures-write")
    def dismiss_failures(self, ids: list[int]) -> None:
        state = StateDB()
        try:
            state.close_failures(ids, resolved=False)
        finally:
            state.close()
        self.app.call_from_thread(self.notify, f"dismissed {len(ids)} failure(s)")
        self.app.call_from_thread(self.reload)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_retry":
            return self._retrying()  # only while a retry runs (escape is free otherwise)
        return True

    def action_cancel_retry(self) -> None:
        if self.retry_worker is not None:
            self.retry_worker.cancel()
            self._update_status("cancelling after the current kernel…")

    # -- retrying ----------------------------------------------------------------------------

    def _retrying(self) -> bool:
        return self.retry_worker is not None

    def _start_retry(self, ids: list[int] | None, *, edited: tuple[int, str] | None = None) -> None:
        if self._retrying():
            self.notify("a retry is already running (escape cancels it)", timeout=3)
            return
        bar = self.query_one("#retry-progress", ProgressBar)
        bar.update(total=None, progress=0)
        bar.display = True
        self._update_status("retrying…")
        self.retry_worker = self.retry(ids, edited)
        self.refresh_bindings()

    @work(thread=True, exit_on_error=False, group="retry")
    def retry(self, ids: list[int] | None, edited: tuple[int, str] | None) -> None:
        """Retry the given failures (None: every open one) with the settings as they are now."""
        worker = get_current_worker()
        context = self.app.context  # type: ignore[attr-defined]
        report: InjectReport | None = None
        try:
            options = InjectOptions.from_settings(context.settings)
            report = failure_retry.retry_open_failures(context.db_path, options, ids, edited=edited,
                                                       on_progress=self._post_progress,
                                                       should_cancel=lambda: worker.is_cancelled)
        finally:  # after a cancel or an error too (the App shows it): the thread is done only now
            self.post_message(self.RetryDone(report, tuple(context.settings.archs)))

    def _post_progress(self, progress: InjectProgress) -> None:
        self.post_message(self.RetryProgress(progress.items_done, progress.items_seen, progress.failed))

    def on_failures_screen_retry_progress(self, message: RetryProgress) -> None:
        if self.retry_worker is None:
            return
        self.query_one("#retry-progress", ProgressBar).update(total=max(message.total, 1), progress=message.done)
        then = "cancelling after the current kernel…" if self.retry_worker.is_cancelled else "escape cancels"
        self._update_status(f"retrying {message.done}/{message.total} · {message.failed} failed again · {then}")

    def on_failures_screen_retry_done(self, message: RetryDone) -> None:
        self.retry_worker = None
        self.query_one("#retry-progress").display = False
        self.refresh_bindings()
        report = message.report
        if report is not None:
            text = (f"{report.injected} injected, {report.unchanged} already in the DB, {report.failed} failed "
                    f"again (archs {', '.join(message.archs)})")
            if report.cancelled:  # the engine closes no failure of a cancelled retry
                text = f"cancelled: {text}; retry again to close the failures of kernels now in the DB"
            if report.failures:
                text += f"; first: {report.failures[0].reason}"
            self.notify(text, title="retry", severity="warning" if report.failed else "information",
                        timeout=8 if report.failed else 4)
        self.reload()



__all__ = ["FailuresScreen"]

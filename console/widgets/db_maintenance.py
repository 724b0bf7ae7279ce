"""DB maintenance in the console: the core plans (core/db/maintenance.py) previewed, applied and undone.

The same plans as `kdb db repair | fastest | standalone | leave-to-library | undo`: each worker makes or applies one
and posts a message; the dialog shows the plan's own title, lines and notes, those the CLI prints. Every apply writes
its undo file (the state dir's `undo/`), so `u` here and `kdb db undo FILE --apply` put back the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static
from textual.worker import Worker

from console.widgets.dialogs import ConfirmDialog
from core.db import maintenance
from core.db.edit import Applied
from core.db.kernel_db import KernelDB
from core.db.maintenance import Plan
from core.db.summary_index import SummaryIndex

SHOWN_LINES = 20  # the dialog's lines; `kdb db VERB` lists them all


class PlanDialog(ConfirmDialog):
    """A plan's preview: its title as the question, a line per row it touches, its notes; True applies it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel"), Binding("y", "confirm", "Apply")]

    def __init__(self, plan: Plan, confirm_label: str) -> None:
        super().__init__(f"{plan.title}?", confirm_label=confirm_label)
        self.plan = plan

    def details(self) -> ComposeResult:
        lines = [f"{ln.action} {ln.key}" + (f" ({ln.why})" if ln.why else "") for ln in self.plan.lines[:SHOWN_LINES]]
        if len(self.plan.lines) > SHOWN_LINES:
            lines.append(f"… and {len(self.plan.lines) - SHOWN_LINES} more (`kdb db {self.plan.verb}` lists them)")
        yield Static("\n".join(lines), id="plan-lines", classes="dialog-detail", markup=False)
        yield Static(" ".join([*self.plan.notes, "Written in one transaction; `u` puts it back."]),
                     id="plan-notes", classes="dialog-detail", markup=False)


@dataclass(frozen=True)
class UndoEntry:
    title: str  # the plan it undoes
    undo_file: Path


class DbMaintenance(Widget):
    """No layout of its own: the maintenance workers of a view, and the undo files of what they applied (newest
    last). Its messages bubble to the view, which shows the DB again."""

    DEFAULT_CSS = "DbMaintenance { display: none; }"

    @dataclass
    class Planned(Message):
        plan: Plan
        confirm_label: str

    @dataclass
    class PlanApplied(Message):
        plan: Plan
        applied: Applied

    def __init__(self) -> None:
        super().__init__()
        self.undo_stack: list[UndoEntry] = []

    # -- the plans: one line each -----------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="db-plan")
    def plan_repair(self) -> None:
        self._make(maintenance.repair_plan, "Repair")

    @work(thread=True, exit_on_error=False, group="db-plan")
    def plan_fastest(self) -> None:
        self._make(lambda db: maintenance.fastest_plan(db, self._product()), "Keep fastest")

    @work(thread=True, exit_on_error=False, group="db-plan")
    def plan_standalone(self, keys: list[str]) -> None:
        self._make(lambda db: maintenance.toggle_standalone_plan(db, keys, self._product()), "Change")

    @work(thread=True, exit_on_error=False, group="db-plan")
    def plan_leave_to_library(self, times_file: Path) -> None:
        self._make(lambda db: maintenance.library_plan(db, times_file), "Leave to the library")

    @work(thread=True, exit_on_error=False, group="db-plan")
    def plan_delete(self, keys: list[str]) -> None:
        self._make(lambda db: maintenance.delete_plan(db, keys), "Delete")

    @work(thread=True, exit_on_error=False, group="db-write")
    def apply(self, plan: Plan) -> None:
        with self.app.context.open_db(write=True) as db:  # type: ignore[attr-defined]
            applied = maintenance.apply_plan(db, plan)
        if applied.deleted:
            with SummaryIndex.open(db.path) as index:
                index.forget(applied.deleted)  # gone from the pages at once, before the next sync
        self.post_message(self.PlanApplied(plan, applied))

    @work(thread=True, exit_on_error=False, group="db-write")
    def undo(self, entry: UndoEntry) -> None:
        with self.app.context.open_db(write=True) as db:  # type: ignore[attr-defined]
            plan = maintenance.undo_plan(db, entry.undo_file)
            self.post_message(self.PlanApplied(plan, maintenance.apply_plan(db, plan)))

    def _make(self, make: Callable[[KernelDB], Plan], confirm_label: str) -> None:
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            self.post_message(self.Planned(make(db), confirm_label))

    def _product(self) -> str:
        return self.app.context.settings.product_name  # type: ignore[attr-defined]

    # -- on the UI thread -------------------------------------------------------------------------

    def undo_last(self) -> None:
        if not self.undo_stack:
            self.notify("nothing to undo", timeout=2)
            return
        self.undo(self.undo_stack.pop())

    def on_db_maintenance_planned(self, message: Planned) -> None:
        plan = message.plan
        if not plan.writes:
            self.notify(" ".join([plan.title + ".", *plan.notes]), severity="warning" if plan.notes else "information")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.apply(plan)

        self.app.push_screen(PlanDialog(plan, message.confirm_label), answered)

    def on_db_maintenance_plan_applied(self, message: PlanApplied) -> None:
        plan, undo_file = message.plan, message.applied.undo_file
        if undo_file is not None and plan.verb != "undo":
            self.undo_stack.append(UndoEntry(plan.title, undo_file))
        self.notify(f"{plan.title}: done" + (f"; u (or `kdb db undo {undo_file} --apply`) puts it back"
                                              if undo_file is not None and plan.verb != "undo" else ""), timeout=6)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker_failure(event)  # type: ignore[attr-defined]  # a widget's worker events do not bubble

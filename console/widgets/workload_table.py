"""The workloads of an AutoTVM log, one row each, keyed by their position in the log."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import DataTable

from console.widgets.opconfig_table import fit
from core.opconfigs.autotvm_log import WorkloadSummary

COLUMNS = [  # (key, label, width)
    ("n", "#", 2),
    ("task", "task", 23),
    ("op", "op config", 52),
    ("trials", "trials", 6),
    ("ok", "ok", 5),
    ("errors", "errors by kind", 33),
    ("best", "best µs", 9),
    ("at", "at trial", 8),
]

# AutoTVM's MeasureErrorNo names, short enough for a column (the detail pane spells them out).
SHORT_ERRORS = {"INSTANTIATION_ERROR": "inst", "COMPILE_HOST": "host", "COMPILE_DEVICE": "compile",
                "RUNTIME_DEVICE": "runtime", "WRONG_ANSWER": "wrong", "BUILD_TIMEOUT": "build t/o",
                "RUN_TIMEOUT": "run t/o", "UNKNOWN_ERROR": "unknown"}


def cells(number: int, w: WorkloadSummary) -> list[object]:
    errors = " · ".join(f"{n} {SHORT_ERRORS.get(kind, kind)}" for kind, n in w.errors_by_kind.items())
    op = Text(fit(w.op_config.describe(), 52)) if w.op_config else Text(fit(w.op_config_note, 52), style="dim")
    return [
        str(number),
        fit(w.task, 23),
        op,
        f"{w.trials:,}",
        f"{w.successes:,}",
        fit(errors, 33) if errors else Text("none", style="dim"),
        f"{w.best_seconds * 1e6:,.2f}" if w.best_seconds is not None else Text("-", style="red"),
        f"{w.best_trial:,}" if w.best_trial is not None else "-",
    ]


class WorkloadTable(DataTable[object]):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, workloads: Sequence[WorkloadSummary]) -> None:
        """A new log: every row anew, the cursor on the first workload."""
        self.clear()
        for number, w in enumerate(workloads, start=1):
            self.add_row(*cells(number, w), key=str(number - 1))
        if workloads:
            self.move_cursor(row=0)

    def current_index(self) -> int | None:
        if not self.row_count:
            return None
        return int(str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value))

"""The tuning queue as a table: one row per op config keyed by OpConfig.key, updated by diffing (cursor kept).

Attributes down: the screen hands in the configs, each one's OpRun (an immutable snapshot), each one's trial
budget and, for a network, how often each op occurs in it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rich.text import Text
from textual.widgets import DataTable

from console.widgets.opconfig_table import description, fit
from core.opconfigs.autotvm_log import WorkloadSummary
from core.opconfigs.opconfig import OpConfig
from core.tuning.progress import OpRun

COLUMNS = [  # (key, label, width)
    ("n", "#", 2),
    ("op", "op type", 16),
    ("desc", "description", 26),
    ("count", "×", 3),
    ("status", "status", 11),
    ("trials", "trials", 9),
    ("best", "best µs", 9),
    ("speed", "speed", 13),
    ("errors", "errors", 6),
]

_STATUS_STYLES = {"done": "green", "tuned": "green", "failed": "bold red", "cancelled": "yellow",
                  "resumable": "yellow", "tuning": "bold yellow", "generating": "bold yellow",
                  "injecting": "bold yellow"}


def curve(config: OpConfig, run: OpRun) -> WorkloadSummary:
    """The op's trials as the best-so-far plot reads them."""
    summary = WorkloadSummary(config.op_type, [], config, trials=run.trials)
    for trial, seconds in enumerate(run.runs, start=1):
        if seconds is not None:
            summary.successes += 1
            if summary.best_seconds is None or seconds < summary.best_seconds:
                summary.best_seconds, summary.best_trial = seconds, trial
        summary.best_so_far.append(math.inf if summary.best_seconds is None else summary.best_seconds)
    return summary


def cells(number: int, config: OpConfig, run: OpRun, budget: int, count: int) -> list[object]:
    best = run.best_seconds
    status = run.status_text(budget)
    style = _STATUS_STYLES.get(run.status if run.status == "tuning" else status, "dim")
    return [
        str(number),
        fit(config.op_type, 16),
        fit(description(config), 26),
        Text(f"{count:,}", style="dim" if count == 1 else ""),
        Text(status, style=style),
        f"{run.trials:,}/{budget:,}",
        f"{best * 1e6:,.2f}" if best is not None else Text("-", style="dim"),
        config.speed_text(best) if best else Text("-", style="dim"),  # GB/s for pools, GFLOP/s otherwise
        Text(f"{run.errors:,}", style="red") if run.errors else Text("0", style="dim"),
    ]


class TuneTable(DataTable[object]):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, configs: Sequence[OpConfig], run_of: Callable[[str], OpRun], budget_of: Callable[[str], int],
             count_of: Callable[[str], int]) -> None:
        """Bring the table to `configs` with as few changes as possible (call inside app.batch_update())."""
        wanted = [c.key for c in configs]

        def row(number: int, config: OpConfig) -> list[object]:
            return cells(number, config, run_of(config.key), budget_of(config.key), count_of(config.key))

        if [str(k.value) for k in self.rows] != wanted:
            keep = self.cursor_row
            self.clear()
            for number, config in enumerate(configs, start=1):
                self.add_row(*row(number, config), key=config.key)
            if configs:
                self.move_cursor(row=min(keep, len(configs) - 1))
            return
        for number, config in enumerate(configs, start=1):
            for (column, _, _), value in zip(COLUMNS, row(number, config), strict=True):
                if str(self.get_cell(config.key, column)) != str(value):
                    self.update_cell(config.key, column, value)

    def current_key(self) -> str | None:
        if not self.row_count:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)

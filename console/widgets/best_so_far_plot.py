"""A tuning curve: the best time found so far after each trial, as a Sparkline with its scale and trials marked.

Trials before the first success have no best time: the curve starts at the first success. The time axis is
logarithmic by default, because the first configs found are often ten times slower than the last and a
linear scale would flatten every later improvement to the floor.
"""

from __future__ import annotations

import math

from textual.app import ComposeResult, RenderResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label, Sparkline, Static

from core.opconfigs.autotvm_log import WorkloadSummary

Y_LABEL_WIDTH = 12


def microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:,.2f} µs"


class TrialAxis(Widget):
    """One row under the curve: the first and last trial at the ends, ▲ under the column of the best trial."""

    DEFAULT_CSS = "TrialAxis { height: 1; }"

    first: reactive[int] = reactive(0)
    last: reactive[int] = reactive(0)
    best: reactive[int] = reactive(0)

    def render(self) -> RenderResult:
        width = self.size.width
        if not self.last or width < 2:
            return ""
        trials = self.last - self.first + 1
        # The same bucketing as the Sparkline: trial i of n lands in column floor(i * width / n).
        column = min((self.best - self.first) * width // trials, width - 1)
        row = [" "] * width
        for label, start in ((str(self.first), 0), (str(self.last), max(width - len(str(self.last)), 0))):
            if not start - 1 <= column <= start + len(label):  # a label the marker would touch is left out
                row[start:start + len(label)] = label
        row[column] = "▲"
        line = "".join(row)[:width]
        return Content.assemble((line[:column], "$text-muted"), ("▲", "bold $success"),
                                (line[column + 1:], "$text-muted"))


class BestSoFarPlot(Vertical):
    """Attributes down: the owner calls show(workload); `log_scale` switches the time axis."""

    log_scale: reactive[bool] = reactive(True)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.workload: WorkloadSummary | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="plot-title")
        with Horizontal(id="plot-body"):
            with Vertical(id="plot-y"):
                yield Label(id="plot-top")
                yield Static(id="plot-gap")
                yield Label(id="plot-bottom")
            # max: each column shows the best time at the start of its trials, so the first column is the top label.
            yield Sparkline([], id="plot-line", summary_function=max)
        with Horizontal(id="plot-x"):
            yield Static(" trial", id="plot-x-label")
            yield TrialAxis(id="plot-axis")
        yield Static(id="plot-note")

    def on_mount(self) -> None:
        self.show(None)

    def watch_log_scale(self) -> None:
        if self.is_mounted:
            self.show(self.workload)

    def show(self, workload: WorkloadSummary | None) -> None:
        self.workload = workload
        curve = [s for s in workload.best_so_far if math.isfinite(s)] if workload else []
        self.query_one("#plot-body").display = bool(curve)
        self.query_one("#plot-x").display = bool(curve)
        scale = "log scale" if self.log_scale else "linear scale"
        title = self.query_one("#plot-title", Static)
        note = self.query_one("#plot-note", Static)
        if workload is None:
            title.update("Best so far")
            note.update("select a workload to see how its best time fell trial by trial")
            return
        if not curve:
            title.update("Best so far")
            note.update(f"no successful trial among {workload.trials:,}: nothing to plot")
            return
        first = workload.trials - len(curve) + 1  # the first success
        title.update(f"Best so far, per trial (µs, {scale}; l switches)")
        self.query_one("#plot-top", Label).update(microseconds(curve[0]).rjust(Y_LABEL_WIDTH - 1))
        self.query_one("#plot-bottom", Label).update(microseconds(curve[-1]).rjust(Y_LABEL_WIDTH - 1))
        self.query_one(Sparkline).data = [math.log10(s) for s in curve] if self.log_scale else curve
        axis = self.query_one(TrialAxis)
        axis.first, axis.last, axis.best = first, workload.trials, workload.best_trial or first
        note.update(f"[$success]▲[/] best {microseconds(workload.best_seconds or curve[-1])} at trial "
                    f"{workload.best_trial:,} of {workload.trials:,}"
                    + (f" · first success at trial {first:,}" if first > 1 else "")
                    + f" · {curve[0] / curve[-1]:.1f}x faster than the first success")

"""The Tuning view's selected op: what it is, how its tuning stands, and its best-so-far curve."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Static

from console.widgets.best_so_far_plot import BestSoFarPlot, microseconds
from console.widgets.tune_table import curve
from core.opconfigs.opconfig import OpConfig
from core.tuning.progress import OpRun, plural


class SelectedOp(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.plotted: tuple[str, OpRun] | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="tune-selected")
        yield BestSoFarPlot(id="tune-curve")

    def show(self, config: OpConfig | None, run: OpRun | None = None, planned: int = 0) -> None:
        """`config` and its `run` (`planned` trials for it), or nothing selected."""
        selected, plot = self.query_one("#tune-selected", Static), self.query_one(BestSoFarPlot)
        if config is None or run is None:
            selected.update("")
            if self.plotted is not None:
                self.plotted = None
                plot.show(None)
            return
        best = f" · best {microseconds(run.best_seconds)}" if run.best_seconds is not None else ""
        detail = f"\n[dim]{escape(run.detail)}[/]" if run.detail else ""
        selected.update(f"[b]{escape(config.describe())}[/b] · {run.status_text(planned)} · "
                        f"{plural(run.trials, 'trial')}{best}{detail}")
        if self.plotted != (config.key, run):  # redraw only when the curve changed
            self.plotted = (config.key, run)
            plot.show(curve(config, run))

    def toggle_scale(self) -> None:
        plot = self.query_one(BestSoFarPlot)
        plot.log_scale = not plot.log_scale

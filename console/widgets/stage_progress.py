"""One pipeline stage as a row: its name, a progress bar and its pass/fail counts (or why it did not run)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

# The console's injections run the CPU stages only; the GPU ones are the Kernels view's v and P.
GPU_NOT_RUN = "not run (v/P in Kernels run it)"


class StageProgress(Horizontal):
    """Attributes down: the owner calls show(), skip() or reset(); the row never reads the engine itself."""

    def __init__(self, stage: str) -> None:
        super().__init__(id=f"stage-{stage}", classes="stage")
        self.stage = stage

    def compose(self) -> ComposeResult:
        yield Label(self.stage, classes="stage-name")
        # A known total from the start: an unknown one animates, which would read as "working".
        yield ProgressBar(total=1, show_eta=False, classes="stage-bar")
        yield Label("", classes="stage-counts")

    def show(self, done: int, total: int, *, passed: int, failed: int) -> None:
        """`done` of `total` kernels have left this stage; `passed` went on, `failed` stopped here."""
        self.remove_class("skipped")
        self.set_class(failed > 0, "has-failures")
        self.query_one(ProgressBar).update(total=total, progress=done)
        counts = f"{passed:,} passed" + (f" · [$error]{failed:,} failed[/]" if failed else "")
        self.query_one(".stage-counts", Label).update(counts)

    def skip(self, reason: str) -> None:
        """This stage does not run at all: say why instead of drawing a bar that could look done."""
        self.add_class("skipped")
        self.remove_class("has-failures")
        self.query_one(".stage-counts", Label).update(reason)

    def reset(self) -> None:
        self.show(0, 1, passed=0, failed=0)
        self.query_one(".stage-counts", Label).update("")

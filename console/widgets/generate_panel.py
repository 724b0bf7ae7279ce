"""Generate and inject, as a panel: a codegen row, then one row per injection stage, the op in progress and a summary.

Attributes down: the owner hands in the run's immutable events (core.inject.generate_run: CodegenProgress, the
injection's InjectSnapshot) and its final GenerateReport; the panel never reads the engine itself.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Button, Static

from console.widgets.stage_progress import GPU_NOT_RUN, StageProgress
from core.inject.generate_run import CodegenProgress, GenerateReport
from core.inject.pipeline import STAGES, InjectSnapshot

FAILURES_SHOWN = 3


class GeneratePanel(Vertical):
    def compose(self) -> ComposeResult:
        yield StageProgress("codegen")
        for stage in STAGES:
            yield StageProgress(stage)
        yield Static(id="run-current")
        yield Static(id="run-summary")
        yield Button("Show failures (f)", id="show-failures", classes="hidden")

    def on_mount(self) -> None:
        self.reset()
        self.query_one("#run-current", Static).update("g generates a kernel for every op config and injects them")

    def reset(self) -> None:
        for row in self.query(StageProgress):
            if row.stage == "gpu":
                row.skip(GPU_NOT_RUN)
            else:
                row.reset()
        self.query_one("#run-current", Static).update("")
        self.show_result(None)

    def skip_compile(self, reason: str) -> None:
        self.query_one("#stage-compile", StageProgress).skip(f"not run: {reason}")

    def show_current(self, text: str) -> None:
        self.query_one("#run-current", Static).update(escape(text))

    def show_codegen(self, p: CodegenProgress) -> None:
        self.query_one("#stage-codegen", StageProgress).show(p.done, max(p.total, 1), passed=p.done - p.failed,
                                                              failed=p.failed)
        self.show_current(f"generating {p.done + 1}/{p.total}: {p.current}" if p.current else "")

    def show_inject(self, p: InjectSnapshot) -> None:
        for row in self.query(StageProgress):
            if row.stage == "codegen" or row.has_class("skipped"):
                continue
            done, total = p.stage(row.stage)
            row.show(done, max(total, 1), passed=p.passed.get(row.stage, 0), failed=p.failed_at.get(row.stage, 0))
        self.show_current(f"injecting: {Path(p.current).name}" if p.current else "")

    def show_result(self, result: GenerateReport | None) -> None:
        summary = self.query_one("#run-summary", Static)
        self.query_one("#show-failures").set_class(not (result and result.failed), "hidden")
        if result is None:
            summary.update("")
            return
        self.show_current("")
        summary.update("\n".join(summary_lines(result)))

    def show_error(self, error: str) -> None:
        self.show_current("")
        self.query_one("#run-summary", Static).update(f"[$error]the run stopped: {escape(error)}[/]")


def summary_lines(result: GenerateReport) -> list[str]:
    codegen, inject = result.codegen, result.inject
    status = "[$warning]cancelled[/]" if result.cancelled else "[$success]done[/]"
    failed_text = f"[$error]{result.failed} failed[/]" if result.failed else "0 failed"
    injected = f"{inject.injected} injected · {inject.unchanged} unchanged" if inject else "nothing injected"
    lines = [f"[b]{status}[/b]: {len(codegen.items)} generated · {injected} · {failed_text}"]
    for g in codegen.failed[:FAILURES_SHOWN]:
        lines.append(f"  ✗ {escape(g.config.describe())} · {g.stage}: {escape(g.error)}")
    if len(codegen.failed) > FAILURES_SHOWN:
        lines.append(f"  … and {len(codegen.failed) - FAILURES_SHOWN} more codegen failures in the Failures view")
    if inject:
        for f in inject.failures[:FAILURES_SHOWN]:
            lines.append(f"  ✗ {escape(f.name)} · {f.stage}: {escape(f.reason)}")
        if inject.failed > FAILURES_SHOWN:
            lines.append(f"  … and {inject.failed - FAILURES_SHOWN} more in the Failures view")
    lines += [f"[dim]{escape(note)}[/]" for note in result.notes]
    return lines

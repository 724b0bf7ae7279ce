"""Under the Tuning view's buttons: why Start refused, what the run is doing, how the last one ended and what
ctrl+r would do next. Attributes down: the screen hands in the facts, the note words them."""

from __future__ import annotations

from collections.abc import Sequence

from textual.markup import escape
from textual.widgets import Static

from core.tuning.progress import OpRun, plural
from core.tuning.queue import QueueReport


class RunNote(Static):
    def show(self, explanation: str, *, running: bool, cancelling: bool, run_error: str,
             report: QueueReport | None, states: Sequence[str], next_step: str) -> None:
        """`explanation`: markup, Start's refusal; `states`: the last run's op statuses."""
        lines = [explanation]
        if running:
            lines.append("cancelling after the trial in flight (every trial measured is kept)…"
                         if cancelling else "tuning… esc cancels after the trial in flight")
        else:
            lines += summary_lines(run_error, report, states)
            lines.append(next_step)
        self.update("\n".join(line for line in lines if line))


def summary_lines(run_error: str, report: QueueReport | None, states: Sequence[str]) -> list[str]:
    if run_error:
        return [f"[$error]the run stopped: {escape(run_error)}[/]"]
    if report is None:
        return []
    status = "[$warning]cancelled[/]" if report.cancelled else "[$success]done[/]"
    failed = states.count("failed")
    lines = [f"[b]{status}[/b]: {states.count('done')} tuned · "
             + (f"[$error]{failed} failed[/]" if failed else "0 failed")
             + (f" · {states.count('cancelled')} cancelled" if report.cancelled else "")]
    lines += [f"  ✗ {escape(job)}: {escape(reason)}" for job, reason in report.failures[:3]]
    return lines


def next_step(runs: Sequence[tuple[OpRun, int]], budget: int, *, network: bool) -> str:
    """What ctrl+r does, given each op's run and planned trials (`budget`: the trials per op asked)."""
    if not runs:
        return ""
    todo = [(run, planned) for run, planned in runs if run.status != "done" and run.trials < planned]
    kept = sum(run.trials for run, _ in todo)
    if not todo:
        return f"[dim]every op has its {plural(budget, 'trial')}: raise the trials per op to tune further[/]"
    if kept:
        return f"ctrl+r resumes: it continues from the {plural(kept, 'trial')} kept"
    if network:
        return (f"ctrl+r tunes the network: {plural(sum(planned for _, planned in runs), 'trial')} over "
                f"{plural(len(todo), 'op')}, more where more of its time goes")
    return f"ctrl+r tunes {plural(len(todo), 'op')}, {plural(budget, 'trial')} each"

"""A run's progress op by op, folded from run_request's events into immutable snapshots: what a live view of a
run shows (the console's Tuning view), kept out of the view so that its worker only relays them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from core.tuning.job import PhaseEvent, TrialEvent
from core.tuning.network import NetworkEvent
from core.tuning.queue import JobEvent
from core.tuning.records import recorded_runs
from core.tuning.request import TuneRequest

IDLE = "idle"  # not in a run of this session: what the op's work dir holds


@dataclass(frozen=True)
class OpRun:
    """One op of a run: its status (a JobEvent's, or IDLE) and the seconds of every trial recorded so far."""

    status: str = IDLE
    runs: tuple[float | None, ...] = ()  # resumed trials first; None: the build or the run failed
    detail: str = ""
    phase: str = ""  # while tuning: where its batch is ("build 5/32"...)
    planned: int = 0  # the trials its latest job was given (a network's probe, then its share); 0: none yet

    @property
    def trials(self) -> int:
        return len(self.runs)

    @property
    def errors(self) -> int:
        return sum(s is None for s in self.runs)

    @property
    def best_seconds(self) -> float | None:
        return min((s for s in self.runs if s is not None), default=None)

    def status_text(self, budget: int) -> str:
        if self.status == "tuning" and self.phase:
            return self.phase
        if self.status != IDLE:
            return self.status
        return "not started" if not self.runs else "tuned" if self.trials >= budget else "resumable"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


Snapshot = Callable[[Mapping[str, OpRun], "NetworkEvent | None"], None]


class RunProgress:
    """Every op of a request, by OpConfig.key, as its events come: `on_snapshot` gets a read-only copy after each
    event (with a network's latest prediction), `on_note` a line for the run's log at each job's turn."""

    def __init__(self, request: TuneRequest, root: Path, on_snapshot: Snapshot, on_note: Callable[[str], None]) -> None:
        self.directories = {c.key: request.job(c, 1).directory(root) for c in request.configs}
        self.runs = {key: OpRun("queued", tuple(recorded_runs(d))) for key, d in self.directories.items()}
        self.on_snapshot, self.on_note = on_snapshot, on_note
        self.current = ""  # the key of the job the trial and phase events are about
        self.prediction: NetworkEvent | None = None

    def _changed(self) -> None:
        self.on_snapshot(MappingProxyType(dict(self.runs)), self.prediction)

    def job(self, event: JobEvent) -> None:
        self.current = key = event.key
        run = self.runs[key]
        self.runs[key] = replace(run, status=event.status, detail=event.detail, phase="",
                                 planned=event.trials or run.planned)
        if event.status == "tuning":
            kept = run.trials
            self.on_note(f"{event.job} ({event.stage + ' ' if event.stage else ''}{event.index + 1}/"
                         f"{event.of or len(self.runs)}): "
                         + (f"tuning on from {plural(kept, 'trial')} kept" if kept else "tuning")
                         + f" in {self.directories[key]}" + (f" ({event.detail})" if event.detail else ""))
        elif event.status != "queued":
            self.on_note(f"{event.job}: {event.status}" + (f": {event.detail}" if event.detail else ""))
        self._changed()

    def trial(self, event: TrialEvent) -> None:
        run = self.runs[self.current]
        self.runs[self.current] = replace(run, runs=(*run.runs, event.seconds))
        if event.error:
            self.on_note(f"{event.job}: trial {event.trial} failed: {event.error}")
        self._changed()

    def phase(self, event: PhaseEvent) -> None:
        text = {"build": f"build {event.done}/{event.total}", "search": "search"}.get(event.phase, event.phase)
        self.runs[self.current] = replace(self.runs[self.current], phase=text)
        self._changed()

    def network(self, event: NetworkEvent) -> None:
        self.prediction = event
        self._changed()

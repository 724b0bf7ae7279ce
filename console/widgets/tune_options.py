"""The Tuning view's options, read as core's TuneChoices: an empty field is the default, as an option left out
of `kdb tune` is; core's tune_request checks them and says which one it refused (mark_bad shows it here).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.widgets import Checkbox, Input, Label, Select, Static

from core.errors import KdbError
from core.settings import Settings
from core.tuning.job import DEFAULT_BATCH, DEFAULT_POPULATION
from core.tuning.request import LIMITS, ChoiceError, TuneChoices

# TuneChoices field -> (this view's Input id, its label in messages)
FIELDS = {"trials": ("trials", "trials per op"), "batch": ("batch", "candidates per round"),
          "population": ("population", "population"), "max_per_op": ("cap", "max per op"),
          "minutes": ("minutes", "time budget"), "arch": ("arch", "SM arch")}


def label_of(error: KdbError) -> str:
    """The refused choice as this view names it (core's name where the view has no field for it)."""
    return FIELDS[error.choice][1] if isinstance(error, ChoiceError) and error.choice in FIELDS else error.where


class TuneOptions(Vertical):
    """Trials, round, population, cap, time budget, target, arch and whether to measure on the tracker's servers."""

    def __init__(self, settings: Settings, **kwargs: str) -> None:
        super().__init__(**kwargs)
        self.settings = settings

    def compose(self) -> ComposeResult:
        yield Label("Options", classes="section")
        yield from self._row("Trials per op", Input(str(self.settings.tune_trials), type="integer", compact=True,
                                                    id="trials"))
        yield from self._row("Per round", Input(str(DEFAULT_BATCH), type="integer", compact=True, id="batch",
                                                tooltip="candidates per search round: the search costs about the "
                                                        "same per round, so larger rounds search less per trial "
                                                        "and learn less often"))
        yield from self._row("Population", Input(
            "", placeholder=str(DEFAULT_POPULATION), type="integer", compact=True, id="population",
            tooltip=f"candidates the evolutionary search keeps and mutates each round (empty: kdb's "
                    f"{DEFAULT_POPULATION}, or one round when larger; MetaSchedule's own is 512); at least one "
                    "round's worth"))
        yield from self._row("Max per op", Input("", placeholder="no cap", type="integer", compact=True, id="cap",
                                                 tooltip="a network: no op gets more trials than this; what the "
                                                         "cap frees goes to the other ops"))
        yield from self._row("Minutes", Input("", placeholder="no limit", type="number", compact=True, id="minutes",
                                              tooltip="a time budget: then the op in flight injects its best so "
                                                      "far and the ops not started wait (Start again goes on)"))
        yield from self._row("Target", Select([("cuda (GPU)", "cuda"), ("llvm (this CPU)", "llvm")], value="cuda",
                                              allow_blank=False, compact=True, id="target"))
        yield from self._row("SM arch", Input(self.settings.archs[0], placeholder="like sm_90", compact=True,
                                              id="arch"))
        yield Static(id="measure-note")
        yield Checkbox("measure on the tracker's servers", True, id="use-rpc", compact=True)

    @staticmethod
    def _row(label: str, field: Input | Select[str]) -> ComposeResult:
        with Horizontal(classes="option-row"):
            yield Label(label, classes="option-label")
            yield field

    def show_measuring(self, tracker: str, gpu: tuple[bool, str] | None, db_name: str) -> None:
        """Where the trials will be measured and what becomes of the kernels, for the settings' `tracker`, this
        host's `gpu` (None: still looking) and the DB's name."""
        use_rpc = self.query_one("#use-rpc", Checkbox)
        use_rpc.display = bool(tracker)
        if self.target == "llvm":
            text = "llvm: every trial is built and timed on this machine's CPU; nothing is injected"
        elif gpu is None:
            text = "looking for a CUDA device…"
        elif gpu[0]:
            text = f"GPU: {escape(gpu[1])} · the best kernels are verified, timed and injected into {escape(db_name)}"
        elif tracker and use_rpc.value:
            text = ("no CUDA device here: trials are measured on the tracker's servers; the best kernels are "
                    "injected unverified")
        else:
            text = f"[$warning]no CUDA device here[/]: {escape(gpu[1])}"
        self.query_one("#measure-note", Static).update(text)

    def _number(self, choice: str) -> int | None:
        text = self.query_one(f"#{FIELDS[choice][0]}", Input).value.strip()
        if not text:
            return None
        try:
            return int(text)
        except ValueError:
            raise ChoiceError(choice, f"{text!r} is not a whole number") from None

    def _minutes(self) -> float | None:
        text = self.query_one("#minutes", Input).value.strip()
        try:
            return float(text) if text else None
        except ValueError:
            raise ChoiceError("minutes", f"{text!r} is not a number of minutes") from None

    def choices(self) -> TuneChoices:
        """The fields as choices (ChoiceError for a field that holds no number)."""
        return TuneChoices(trials=self._number("trials"), batch=self._number("batch"),
                           population=self._number("population"), max_per_op=self._number("max_per_op"),
                           minutes=self._minutes(), target=self.target,
                           arch=self.query_one("#arch", Input).value.strip() or None,
                           rpc=None if self.query_one("#use-rpc", Checkbox).value else "")

    def mark_bad(self, error: KdbError) -> None:
        if isinstance(error, ChoiceError) and error.choice in FIELDS:
            self.query_one(f"#{FIELDS[error.choice][0]}", Input).add_class("bad")

    def clear_bad(self, *choices: str) -> None:
        for choice in choices:
            self.query_one(f"#{FIELDS[choice][0]}", Input).remove_class("bad")

    def _valid(self, choice: str) -> int | None:
        """A field's number while it is one the run would take (for the plan shown before Start)."""
        try:
            value = self._number(choice)
        except ChoiceError:
            return None
        least, most = LIMITS[choice]
        return value if value is not None and least <= value <= (most or value) else None

    @property
    def trials(self) -> int:
        return self._valid("trials") or self.settings.tune_trials

    @property
    def cap(self) -> int | None:
        return self._valid("max_per_op")

    @property
    def target(self) -> str:
        value = self.query_one("#target", Select).value
        return value if isinstance(value, str) else "cuda"

    @property
    def arch(self) -> str:
        return self.query_one("#arch", Input).value.strip() or self.settings.archs[0]

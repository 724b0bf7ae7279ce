"""The op-config table: one row per op config keyed by OpConfig.key, updated by diffing (cursor kept); and the
status line on the list."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from rich.text import Text
from textual.markup import escape
from textual.widgets import DataTable, Static

from core.nnfusion.coverage import FALLS_BACK, FUSED_AWAY, IN_DB, MISSING, CoverageEntry, summarize
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.opconfig import OpConfig

STATUS_LEVEL = {MISSING: "warning", FALLS_BACK: "warning", FUSED_AWAY: "dim"}  # NOT_USED, ABORTS: error

COLUMNS = [  # (key, label, width)
    ("n", "#", 3),
    ("op", "op type", 26),
    ("desc", "description", 52),
    ("gflop", "GFLOP", 8),
    ("source", "source", 28),
    ("db", "in DB", 28),
]


def fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def gflop(config: OpConfig) -> str:
    value = config.flops / 1e9
    return f"{value:,.3f}" if value >= 0.001 else "<0.001"


def description(config: OpConfig) -> str:
    """describe() without the op type, which has a column of its own."""
    text = config.describe()
    return text[len(config.op_type):].strip() if text.startswith(config.op_type) else text


def coverage_status(entry: CoverageEntry | None) -> tuple[str, str]:
    """The words for an op's coverage and their level: dim (not checked), success, warning or error."""
    if entry is None:
        return "not checked (c)", "dim"
    if entry.status == IN_DB:
        return f"in DB ({entry.kernels} kernel{'s' if entry.kernels != 1 else ''})", "success"
    return entry.status, STATUS_LEVEL.get(entry.status, "error")


_STYLES = {"dim": "dim", "success": "green", "warning": "yellow", "error": "red"}


def cells(number: int, config: OpConfig, entry: CoverageEntry | None) -> list[object]:
    return [
        str(number),
        config.op_type,
        fit(description(config), 52),
        gflop(config),
        fit(config.source, 28),
        _coverage_cell(entry),
    ]


def _coverage_cell(entry: CoverageEntry | None) -> Text:
    text, level = coverage_status(entry)
    return Text(fit(text, 28), style=_STYLES[level])


class OpConfigTable(DataTable[object]):
    """Shows a list of op configs and what coverage knows about each (attributes down: the screen calls show)."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, configs: Sequence[OpConfig], coverage: Mapping[str, CoverageEntry]) -> None:
        """Bring the table to `configs` with as few changes as possible (call inside app.batch_update())."""
        wanted = [c.key for c in configs]
        if [str(k.value) for k in self.rows] != wanted:
            keep = self.cursor_row
            self.clear()
            for number, config in enumerate(configs, start=1):
                self.add_row(*cells(number, config, coverage.get(config.key)), key=config.key)
            if configs:
                self.move_cursor(row=min(keep, len(configs) - 1))
            return
        for number, config in enumerate(configs, start=1):
            for (column, _, _), value in zip(COLUMNS, cells(number, config, coverage.get(config.key)), strict=True):
                if str(self.get_cell(config.key, column)) != str(value):
                    self.update_cell(config.key, column, value)

    def current_key(self) -> str | None:
        if not self.row_count:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)


class OpListStatus(Static):
    """One line on the list: how many ops, their FLOPs, and with coverage what the DB holds of them (a model NNFusion
    cannot compile whatever the DB holds said first)."""

    def show(self, configs: list[OpConfig], coverage: dict[str, CoverageEntry], models: list[Extraction],
             db_name: str) -> None:
        total = sum(c.flops for c in configs) / 1e9
        text = f"{len(configs)} op config{'s' if len(configs) != 1 else ''} · {total:,.3f} GFLOP in all"
        entries = [coverage[c.key] for c in configs if c.key in coverage]
        if entries:
            counts = Counter(e.status for e in entries)
            share = summarize(entries)["db_flops_share"]
            text += (f" · in {escape(db_name)}: " + " · ".join(f"{n} {status}" for status, n in counts.items())
                     + f" · DB kernels run {share:.0%} of the FLOPs")
            if len(entries) < len(configs):
                text += f" · {len(configs) - len(entries)} not checked (c)"
            text = "".join(f"[$error]NNFusion cannot compile {escape(model.model_name)}: node {escape(b.node)} "
                           f"({escape(b.op_type)}): {escape(b.reason)}[/]\n"
                           for model in models for b in model.blockers) + text
        elif configs:
            text += f" · c checks which have a kernel in {escape(db_name)}"
        self.update(text)

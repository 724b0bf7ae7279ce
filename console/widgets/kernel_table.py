"""The kernel table: one page of rows, updated by diffing on Key (no flicker, cursor kept)."""

from __future__ import annotations

import re

from rich.text import Text
from textual.widgets import DataTable

from core.db.browse import KernelSummary
from core.kernels.math_kind import TENSOR_CORES
from core.kernels.math_kind import label as math_label
from core.kernels.ops import CONV_FAMILY, DTYPES

# What tells rows apart comes first: kernel names are often alike for their first 30 characters
# (tuned_fused_convolution_op_float_...), the shapes never are; a fused kernel's two rows differ in their
# device (CUDA_GPU and its CUDA twin). Identifiers sort by op, then shapes.
COLUMNS = [  # (key, label, sort key or None, width)
    ("mark", " ", None, 1),
    ("op", "op type", "op", 26),
    ("device", "device", "device", 8),
    ("math", "math", None, 13),
    ("shapes", "shapes (inputs → output)", "identifier", 40),
    ("time", "best time", None, 12),
    ("launch", "grid / block", "blocks", 18),
    ("smem", "smem B", None, 7),
    ("barriers", "barriers", "barriers", 8),
    ("lint", "lint", None, 24),
    ("name", "kernel", None, 40),
    ("source", "source", "source", 8),
    ("tags", "tags", "tags", 10),
]
_DIMS = re.compile(r"\d+(?:,\d+)*(?:;\d+(?:,\d+)*)*")


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def shapes_of(op_type: str, identifier: str) -> str:
    """The tensor shapes an identifier starts with, as "1x64x56x56 64x64x3x3 → 1x64x56x56" ('' if it has none).

    The identifier is the op's name, its shapes (dims ',' tensors ';', the output last) and one C type per
    tensor; a fused convolution's starts with its Convolution. A dtype other than float is added.
    """
    name = "Convolution" if op_type in CONV_FAMILY else op_type
    if not identifier.startswith(name):
        return ""
    rest = identifier[len(name):]
    dims = _DIMS.match(rest)
    if dims is None:
        return ""
    *inputs, output = (t.replace(",", "x") for t in dims.group().split(";"))
    text = " ".join(inputs) + f" → {output}" if inputs else output
    dtype = next((d for d in DTYPES if rest.startswith(d, dims.end())), "")
    return text if dtype in ("float", "") else f"{text} {dtype}"


def cells(row: KernelSummary, marked: bool) -> list[object]:
    best = row.best_time()
    tags = row.tags.split(",")
    extra = [t for t in tags if t not in ("KernelEmitter", "CudaEmitter", "BlockCudaEmitter")]
    # "block": BlockFusion may fuse the row; "standalone": a kernel of its own (core/db/standalone.py)
    emitter = "block" if "BlockCudaEmitter" in tags else "standalone" if "CudaEmitter" in tags else "none"
    shown_tags = ",".join(extra) if extra and emitter == "block" else ",".join([emitter, *extra])
    launch = f"{'x'.join(map(str, row.grid or []))} / {'x'.join(map(str, row.block or []))}"
    return [
        "●" if marked else " ",
        _fit(row.op, 26),
        _fit(row.device_type, 8),
        Text(math_label(row.precision, row.units), style="bold" if row.units == TENSOR_CORES else ""),
        _fit(shapes_of(row.op, row.identifier) or row.identifier, 40),
        Text(f"{best[1]:.2f} us", style="green") if best else Text("not measured", style="dim"),
        launch,
        "-" if row.shared_bytes is None else f"{row.shared_bytes:,}",
        "?" if row.barriers is None else str(row.barriers),
        Text("ok", style="green") if not row.problem else Text(_fit(row.problem, 24), style="bold red"),
        _fit(row.name or row.identifier, 40),
        row.source,
        shown_tags,
    ]


class KernelTable(DataTable[object]):
    """A DataTable that shows a page of KernelSummary rows keyed by Key."""

    # The row the cursor was on when a reload left it out of the page, and the row the cursor fell back to: an edit
    # rewrites a row at a new rowid, and a reload can run before the browse index has it. When a later page holds
    # the row again and nobody moved the cursor off the fallback, the cursor goes back to it.
    _lost_key: str | None = None
    _fallback_key: str | None = None

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for key, label, _, width in COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, rows: list[KernelSummary], marked: set[str]) -> None:
        """Bring the table to `rows` with as few changes as possible (call inside app.batch_update())."""
        current = [str(k.value) for k in self.rows]
        wanted = [r.key for r in rows]
        if current != wanted:
            # The cursor stays on its row: an edit rewrites a row at a new rowid, which can move it in the page
            keep, keep_key = self.cursor_row, self.current_key()
            if self._lost_key is not None and keep_key == self._fallback_key:
                keep_key = self._lost_key  # still lost, unless it is back in this page
            self._lost_key = self._fallback_key = None
            self.clear()
            for r in rows:
                self.add_row(*cells(r, r.key in marked), key=r.key)
            if rows:
                found = keep_key in wanted
                self.move_cursor(row=wanted.index(keep_key) if found else min(keep, len(rows) - 1))
                if not found and keep_key is not None:
                    self._lost_key, self._fallback_key = keep_key, self.current_key()
            return
        for r in rows:
            for (col, _, _, _), value in zip(COLUMNS, cells(r, r.key in marked), strict=True):
                if str(self.get_cell(r.key, col)) != str(value):
                    self.update_cell(r.key, col, value)

    def current_key(self) -> str | None:
        if not self.row_count:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)

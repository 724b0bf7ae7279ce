"""The detail pane of the Kernels view: everything about one row, the CUDA body highlighted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static
from textual.worker import Worker

from console.widgets.highlight import numbered_listing
from core.kernels.lint import Finding, lint_kernel_row
from core.kernels.math_kind import describe
from core.kernels.rowview import describe_row


def render_detail(view: dict[str, Any], findings: list[Finding]) -> Group:
    info = Table.grid(padding=(0, 1))
    info.add_column(style="bold", no_wrap=True)
    info.add_column(overflow="fold")
    info.add_row("kernel", view.get("name") or "-")
    info.add_row("identifier", view["identifier"])
    info.add_row("key", view["key"])
    info.add_row("op / source", f"{view['op_type']} · {view['source']} · {view['device_type']}")
    info.add_row("math", describe(view["precision"], view["units"]))
    info.add_row("tags", view["tags"])
    info.add_row("attributes", json.dumps(view["attributes"]))
    info.add_row("launch", f"grid {view['grid']} · block {view['block']} · resource {view['resource']}")
    info.add_row("barriers", str(view["num_syncthreads"]))
    parts: list[Any] = [info]

    if view["shared_memory"]:
        sm = Table(title="shared memory", title_justify="left", expand=False)
        for col in ("symbol", "dtype", "size", "bytes"):
            sm.add_column(col)
        for s in view["shared_memory"]:
            sm.add_row(s["symbol"], s["dtype"], str(s["size"]), "?" if s["bytes"] is None else f"{s['bytes']:,}")
        parts.append(sm)

    prof = Table(title="profile (NNFusion picks the smallest time, or time x resource with BlockFusion)",
                 title_justify="left")
    for col in ("device", "time", "resource", "time x resource"):
        prof.add_column(col)
    for p in view["profile"]:
        prof.add_row(p["device"], f"{p['us']:.3f} us", str(p["resource"]), f"{p['efficiency']:,.0f}")
    if not view["profile"]:
        prof.add_row("-", "not measured", str(view["resource"]), "-")
    parts.append(prof)
    if view["profile_error"]:
        parts.append(Text(f"profile: {view['profile_error']}", style="red"))

    compiled = view.get("compile") or {}
    for arch, kernels in compiled.items():
        res = kernels.get("kdb_block_kernel") or next(iter(kernels.values()), {})
        parts.append(Text(f"nvcc {arch}: {res.get('registers', '?')} registers, {res.get('shared_bytes', '?')} B smem, "
                          f"{res.get('spill_stores', 0)}/{res.get('spill_loads', 0)} B spill st/ld"))
    for note in view.get("notes") or []:
        parts.append(Text(f"note: {note}", style="yellow"))
    if findings:
        for f in findings:
            style = "bold red" if f.severity == "crash" else "magenta" if f.severity == "unreachable" else "yellow"
            parts.append(Text(f"lint {f.severity}: {f.message}", style=style))
    else:
        parts.append(Text("lint: ok", style="green"))
    parts.append(view.get("highlighted") or highlight_source(view["signature"], view["body"]))
    return Group(*parts)


def highlight_source(signature: str, body: str) -> Text:
    """The kernel's CUDA, highlighted and numbered (workers call this: see console.widgets.highlight)."""
    return numbered_listing(signature + "\n{\n" + body + "\n}", "cuda")


class KernelDetail(VerticalScroll):
    """Shows the row of a Key: read, described and linted in a worker (as `kdb show` does), the newest asked only."""

    @dataclass
    class Loaded(Message):
        key: str
        view: dict[str, Any] | None  # None: no such row (deleted meanwhile)
        findings: list[Finding]

    wanted = ""  # the Key last asked for: a slower read of another is dropped

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static("Select a kernel to see its attributes, launch config, profile and CUDA body.", id="detail-body")

    def load(self, key: str) -> None:
        self.wanted = key
        self.read_row(key)

    @work(thread=True, exit_on_error=False, group="detail", exclusive=True)
    def read_row(self, key: str) -> None:
        with self.app.context.open_db() as db:  # type: ignore[attr-defined]
            rows = db.find(key)
        if not rows:
            self.post_message(self.Loaded(key, None, []))
            return
        view = describe_row(rows[0])
        view["highlighted"] = highlight_source(view["signature"], view["body"])  # here, not on the UI thread
        self.post_message(self.Loaded(key, view, lint_kernel_row(rows[0])))

    def on_kernel_detail_loaded(self, message: Loaded) -> None:
        if message.key == self.wanted:
            self.show(message.view, message.findings)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker_failure(event)  # type: ignore[attr-defined]  # a widget's worker events do not bubble

    def show(self, view: dict[str, Any] | None, findings: list[Finding]) -> None:
        body = self.query_one("#detail-body", Static)
        if view is None:
            body.update("No kernel selected.")
            return
        body.update(render_detail(view, findings))
        self.scroll_home(animate=False)

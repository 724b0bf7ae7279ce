"""The Op configs view's two text panes: the selected op config, and what the last import brought in or left out."""

from __future__ import annotations

from pathlib import Path

from textual.markup import escape
from textual.widgets import Static

from console.widgets.opconfig_table import coverage_status, gflop
from core.errors import InputError
from core.nnfusion.coverage import CoverageEntry
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.opconfig import OpConfig, format_line

LISTED = 50  # refused lines or unmapped nodes listed before "… and N more"
_MARKUP = {"dim": "dim", "success": "$success", "warning": "$warning", "error": "$error"}


class OpConfigDetail(Static):
    """Attributes down: the owner calls show() with the selected op config and its coverage, if checked."""

    def show(self, config: OpConfig | None, entry: CoverageEntry | None) -> None:
        if config is None:
            self.update("[dim]nothing selected[/]")
            return
        try:
            identifier = escape(config.signature().identifier)
        except InputError as exc:
            identifier = f"[$warning]none: {escape(exc.reason)}[/]"
        status, level = coverage_status(entry)
        kernels = f"[{_MARKUP[level]}]{escape(status)}[/]"
        if entry is not None:
            kernels += f"\n[dim]NNFusion runs[/] {escape(entry.runs)}"
            if entry.row is not None:
                kernels += f"\n[dim]row[/] {escape(entry.row.key)}: {escape(entry.row.why)}"
                if entry.row.interplay_key:
                    kernels += f"\n[dim]{escape(entry.row.interplay_why)}: {escape(entry.row.interplay_key)}[/]"
            kernels += "".join(f"\n[dim]-[/] {escape(reason)}" for reason in entry.reasons)
        self.update("\n".join([
            f"[b]{escape(config.describe())}[/b]",
            f"[dim]line[/]  {escape(format_line(config))}",
            f"[dim]GFLOP[/]  {gflop(config)} · [dim]source[/] {escape(config.source or '-')}",
            f"[dim]identifier[/]  {identifier}",
            f"[dim]kernels[/]  {kernels}",
        ]))


class ImportReport(Static):
    """What an import added, and what it could not: refused lines, ONNX nodes with no op config and why."""

    def show(self, path: Path, configs: list[OpConfig], errors: list[InputError], extraction: Extraction | None,
             *, added: int, already: int) -> None:
        counts = f"{added} added" + (f", {already} already listed" if already else "")
        name = escape(path.name)
        if extraction is None:
            lines = [f"[b]{name}[/b]: {len(configs)} op configs ({counts})"]
            if errors:
                lines.append(f"[$error]{len(errors)} refused:[/]")
                lines += [f"  {escape(str(e))}" for e in errors[:LISTED]]
                lines += [f"  … and {len(errors) - LISTED} more"] if len(errors) > LISTED else []
            self.update("\n".join(lines))
            return
        fused = len(extraction.configs) - len(configs)
        lines = [f"[b]{name}[/b]: model {escape(extraction.model_name)}, {extraction.node_count} nodes -> "
                 f"{len(configs)} distinct op configs the compiler looks up ({counts})"
                 + (f"; {fused} more fused into NNFusion's own element-wise kernels at -fkernel_fusion_level="
                    f"{extraction.kernel_fusion_level}, never looked up, not listed" if fused else "")]
        unmapped = extraction.unmapped
        if unmapped:
            nodes = f"{len(unmapped)} node{'' if len(unmapped) == 1 else 's'}"
            lines.append(f"[$warning]{nodes} unmapped[/] (no kernel-DB op config):")
            lines += [f"  {escape(u.node)} ({escape(u.op_type)}): {escape(u.reason)}" for u in unmapped[:LISTED]]
            lines += [f"  … and {len(unmapped) - LISTED} more"] if len(unmapped) > LISTED else []
        else:
            lines.append("every node maps to an op config")
        lines += [f"[dim]note: {escape(n.node)}: {escape(n.text)}[/]" for n in extraction.notes]
        lines += [f"[$error]NNFusion cannot compile node {escape(b.node)} ({escape(b.op_type)}): {escape(b.reason)}[/]"
                  for b in extraction.blockers]
        self.update("\n".join(lines))

"""An op-config list as the Op configs view builds it: read from op-config files and ONNX models, and what the kernel
DB holds for each op (coverage against the DB, an imported model's ops with its graph)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from core.db.kernel_db import KernelDB
from core.errors import InputError
from core.nnfusion.compiler import CompilerFlags, extract_for_compiler
from core.nnfusion.coverage import CoverageEntry, coverage
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.opconfig import OpConfig, read_opconfigs
from core.settings import Settings


@dataclass(frozen=True)
class OpListRead:
    configs: list[OpConfig]  # each with its source, named by the file's name (not its whole path)
    errors: list[InputError]  # lines or entries of an op-config file that were refused
    extraction: Extraction | None  # set for an ONNX model


def read_op_list(path: Path, settings: Settings) -> OpListRead:
    """The op configs of an op-config file (lines, .toml, .json), or of an ONNX model: the ops the settings' compiler
    looks up at the settings' flags, in the graph it imports (what `kdb opconfig extract` writes)."""
    if path.suffix.lower() == ".onnx":
        extraction = extract_for_compiler(path, settings.nnfusion_flags, nnfusion_path=settings.nnfusion_path)
        return OpListRead([replace(c, source=f"{path.name}:{c.source}") for c in extraction.looked_up()], [],
                          extraction)

    def short(source: str) -> str:  # the file's name instead of its full path
        return source.replace(str(path), path.name, 1) if source.startswith(str(path)) else source

    read = read_opconfigs(path)
    return OpListRead([replace(c, source=short(c.source)) for c in read.configs],
                      [InputError(e.reason, where=short(e.where)) for e in read.errors], None)


def list_coverage(configs: list[OpConfig], models: list[Extraction], db: KernelDB,
                  settings: Settings) -> list[CoverageEntry]:
    """Coverage of each of `configs` (in their order) in `db`: an op of an imported model (the newest first) with its
    graph (counts, what NNFusion fuses away), the rest as a model in which each op occurs once."""
    flags = CompilerFlags.parse(settings.nnfusion_flags)
    entries: dict[str, CoverageEntry] = {}
    for model in reversed(models):
        for e in coverage(model, db, flags, settings.product_name):
            entries.setdefault(e.config.key, e)
    rest = [c for c in configs if c.key not in entries]
    plain = Extraction("op configs", len(rest), rest, {c.key: [(c.source,)] for c in rest})
    for e in coverage(plain, db, flags, settings.product_name):
        entries[e.config.key] = e
    return [entries[c.key] for c in configs if c.key in entries]

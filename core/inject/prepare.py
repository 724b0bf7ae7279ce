"""The CPU stages of injection: validate -> parse -> barriers -> row, for one item or a chunk.

Worker processes import only this module (the function they run is pickled by reference to it), so it must
stay light: no database, no GPU, nothing that imports SQLAlchemy (that import alone cost each spawned
worker half a second). Keep it free of shared state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.cuda.barriers import count_barriers
from core.cuda.source import KernelSource, parse_kernel
from core.errors import InputError, printable
from core.kernels.kernel_json import KernelSpec, validate_item
from core.kernels.kernel_row import KernelRow, build_row


@dataclass
class ItemFailure:
    file: str
    index: int | None  # None: the whole file failed
    name: str
    stage: str
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    input: str | None = None  # the raw item, kept for retry

    def as_report(self) -> dict[str, Any]:
        return {"file": self.file, "index": self.index, "name": self.name, "stage": self.stage,
                "reason": self.reason}


@dataclass
class Prepared:
    """What the CPU stages made of one item: a row, or the failure."""

    file: str
    index: int
    name: str
    row: KernelRow | None = None
    failure: ItemFailure | None = None
    raw: Any = None
    needs_gpu_barriers: tuple[KernelSpec, KernelSource] | None = None  # static count failed: count on the GPU


def prepare(file: str, index: int, raw: Any, gpu_barriers: bool = False) -> Prepared:
    name = raw.get("tvm_func_name", "") if isinstance(raw, dict) else ""
    name = name if isinstance(name, str) else ""
    out = Prepared(file, index, printable(name[:200]))

    def fail(stage: str, reason: str, **detail: Any) -> Prepared:
        out.failure = ItemFailure(file, index, out.name, stage, reason, detail, dump_input(raw))
        return out

    stage = "validate"
    try:
        spec = validate_item(raw)
        stage = "parse"
        src = parse_kernel(spec.code)
        stage = "barriers"
        barriers = count_barriers(src, spec.block, spec.grid)
        if not barriers.known:
            if gpu_barriers:
                out.needs_gpu_barriers = (spec, src)
                return out
            return fail("barriers", f"{barriers.reason}; the GPU count was not run (no GPU stage asked for)")
        stage = "parse"
        out.row = build_row(spec, src, barriers, extra_miscs={"from": item_origin(file, index)})
    except InputError as exc:
        # str(exc) names the field or place ("parameters.output_shape[2]: ...").
        return fail(stage, str(exc), field=exc.where)
    except Exception as exc:  # a bug must fail this item, never the batch: keep the cause
        return fail(stage, f"internal error: {type(exc).__name__}: {exc}")
    return out  # without the raw item: the caller has it, and shipping it back doubles the IPC


def prepare_chunk(items: tuple[tuple[str, int, Any], ...], gpu_barriers: bool = False) -> list[Prepared]:
    return [prepare(file, index, raw, gpu_barriers) for file, index, raw in items]


def item_origin(file: str, index: int) -> str:
    """Where a row came from, as its Miscs record it: "file.json#3"."""
    return f"{printable(Path(file).name)}#{index}"


def dump_input(raw: Any) -> str | None:
    try:
        return json.dumps(raw, ensure_ascii=True, allow_nan=False)  # ASCII: lone surrogates stay escaped
    except (TypeError, ValueError):
        return None

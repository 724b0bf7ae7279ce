"""Which kernel-DB rows a compiled network really runs, step by step (the truth `kdb nnfusion` reports)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.kernels.kernel_row import COLUMNS, KernelRow, distinct_kernels, is_standalone
from core.nnfusion.generated import (
    BLOCKFUSION,
    ELIMINATED,
    HOST,
    KERNEL,
    LIBRARY,
    Generated,
    RowFacts,
    RowUse,
    SkippedCopy,
    Step,
    member_node,
    parse_generated,
    row_shapes,
    rows_in_source,
)

if TYPE_CHECKING:
    from core.db.kernel_db import KernelDB

DB_KERNEL, NNFUSION_KERNEL = "DB kernel", "NNFusion's kernel"


@dataclass(frozen=True)
class Part:
    """One node's kernel inside a step (a BlockFusion kernel has several)."""

    node: str
    function: str
    runs: str  # DB_KERNEL, NNFUSION_KERNEL, "cuDNN" or "cuBLAS"
    rows: tuple[str, ...] = ()  # Keys of the DB rows whose body this function holds


@dataclass(frozen=True)
class StepUse:
    node: str
    kind: str
    parts: tuple[Part, ...]
    function: str = ""  # the kernel (or host function) the step calls

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "kind": self.kind, "function": self.function,
                "parts": [{"node": p.node, "function": p.function, "runs": p.runs, "rows": list(p.rows)}
                          for p in self.parts]}


@dataclass
class Usage:
    steps: list[StepUse]
    rows: list[RowUse]  # every kernel asked about, with the functions that hold it (none: not used)
    library_calls: dict[str, int] = field(default_factory=dict)
    skipped: list[SkippedCopy] = field(default_factory=list)  # Concats left out whose output nothing writes

    def used_keys(self) -> set[str]:
        return {r.key for r in self.rows if r.functions}

    def parts(self) -> list[Part]:
        return [p for s in self.steps for p in s.parts]

    def blockfusion_groups(self) -> list[StepUse]:
        return [s for s in self.steps if s.kind == BLOCKFUSION]

    def kernel_launches(self) -> list[StepUse]:
        """The steps that launch a kernel (a library call launches the library's own, unseen here)."""
        return [s for s in self.steps if s.kind in (KERNEL, BLOCKFUSION)]

    def distinct_kernels(self) -> set[str]:
        """The kernels launched: NNFusion emits one function for nodes of one kernel (an unrolled LSTM's 128 Dots
        of one shape launch one kernel 128 times)."""
        return {s.function for s in self.kernel_launches()}

    def summary(self) -> str:
        """kernel_entry in one line: its steps, as kernel launches (of how many distinct kernels) and library calls."""
        launches, kernels = len(self.kernel_launches()), len(self.distinct_kernels())
        groups = self.blockfusion_groups()
        calls = sum(self.library_calls.values())
        by_library = ", ".join(f"{name} {count}" for name, count in sorted(self.library_calls.items()))
        return (f"kernel_entry runs {len(self.steps)} steps: {launches} kernel launch{'es' * (launches != 1)} of "
                f"{kernels} distinct kernel{'s' * (kernels != 1)}"
                + (f" ({len(groups)} BlockFusion launches, running {sum(len(s.parts) for s in groups)} nodes)"
                   if groups else "")
                + f", {calls} library call{'s' * (calls != 1)}" + (f" ({by_library})" if by_library else ""))

    def as_dict(self) -> dict[str, Any]:
        parts = self.parts()
        return {"steps": [s.as_dict() for s in self.steps],
                "kernel_launches": len(self.kernel_launches()), "distinct_kernels": len(self.distinct_kernels()),
                "library_calls": self.library_calls,
                "db_rows_used": sorted(self.used_keys()),
                "db_rows_not_used": sorted(r.key for r in self.rows if not r.functions),
                "nodes_run_by": {runs: sum(p.runs == runs for p in parts)
                                 for runs in (DB_KERNEL, NNFUSION_KERNEL, "cuDNN", "cuBLAS")},
                "blockfusion_groups": [[p.node for p in s.parts] for s in self.blockfusion_groups()],
                "skipped_copies": [c.describe() for c in self.skipped]}


def analyse(generated: Generated, rows: Iterable[KernelRow]) -> Usage:
    """Each kernel_entry step with what it runs, given the DB rows to look for (a pair counts once)."""
    kernels = list(distinct_kernels(rows))
    facts = {f.key: f for f in map(_facts, kernels)}
    uses = rows_in_source(generated, facts.values())
    by_function: dict[str, list[str]] = {}
    for use in uses:
        for fn in use.functions:
            by_function.setdefault(fn, []).append(use.key)
    steps = []
    for step in generated.steps:
        if step.kind in (ELIMINATED, HOST):
            continue
        if step.kind == LIBRARY:
            parts: tuple[Part, ...] = (Part(step.node, step.function, step.library),)
        elif step.kind == BLOCKFUSION:
            parts = _blockfusion_parts(generated, step, by_function, facts)
        else:
            assert step.kind == KERNEL
            parts = (_part(step.node, step.function, _launched(step, by_function.get(step.function, ()), facts)),)
        steps.append(StepUse(step.node, step.kind, parts, step.function))
    return Usage(steps, uses, generated.library_calls(), generated.skipped_copies())


def _blockfusion_parts(generated: Generated, step: Step, by_function: dict[str, list[str]],
                       facts: dict[str, RowFacts]) -> tuple[Part, ...]:
    """One part per node a BlockFusion kernel runs, in block order: a node whose blocks are split over several calls
    is one part. Where rows of one body share a block function (NNFusion dedupes byte-identical kernels), each call
    is the row of its own tensors' shapes."""
    if not step.call_nodes:  # the code does not say which tensors the calls write
        return tuple(_part(_call_node(m, step.calls[:k]), m, by_function.get(m, ())) for k, m in enumerate(step.calls))
    parts: dict[str, Part] = {}
    for k, (node, function) in enumerate(zip(step.call_nodes, step.calls, strict=True)):
        keys = by_function.get(function, [])
        shapes = generated.call_shapes(step.call_tensors[k]) if len(keys) > 1 else None
        if shapes is not None:
            keys = [key for key in keys if facts[key].inputs is None or row_shapes(facts[key]) == shapes] or keys
        parts.setdefault(node or f"#{k}", _part(node or _call_node(function, step.calls[:k]), function, keys))
    return tuple(parts.values())


def _call_node(block_function: str, earlier: tuple[str, ...]) -> str:
    """The node a block-function call runs: the one the function is named after for its first call; the code does
    not name the nodes that share the function (NNFusion emits one per kernel), so those are said to share it."""
    node = member_node(block_function)
    return node if block_function not in earlier else f"a node sharing {node}'s kernel"


def _launched(step: Step, keys: Sequence[str], facts: dict[str, RowFacts]) -> Sequence[str]:
    """Of the rows whose body the step's function holds, those launched as the step launches it: rows of one body
    and two sizes (a Relu's) are one function NNFusion calls with each one's grid. Where the launch tells none apart,
    all."""
    own = [k for k in keys if step.launch is None or facts[k].launch in (None, step.launch)]
    return own or keys


def _part(node: str, function: str, keys: Sequence[str]) -> Part:
    """The part of a node running `function`, with the DB rows found in it (none: NNFusion's own kernel)."""
    return Part(node, function, DB_KERNEL if keys else NNFUSION_KERNEL, tuple(keys))


def _facts(row: KernelRow) -> RowFacts:
    """The row as the code would show it: its emitted body, its tensors (C type, shape: the Attributes'), its
    launch (the Function's grid and block). What cannot be read is left unknown, never guessed."""
    try:
        fn, attrs = json.loads(row.function), json.loads(row.attributes)
    except ValueError:
        return RowFacts(row.key, row.identifier, row.op, _emitted_body(row))
    dtype = attrs.get("dtype", "float") if isinstance(attrs, dict) else "float"

    def tensors(name: str) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
        shapes = attrs.get(name) if isinstance(attrs, dict) else None
        if not isinstance(shapes, list) or not all(isinstance(s, list) for s in shapes):
            return None
        return tuple((dtype, tuple(int(d) for d in shape)) for shape in shapes)

    def dims(name: str) -> tuple[int, int, int] | None:
        value = fn.get(name) if isinstance(fn, dict) else None
        return (int(value[0]), int(value[1]), int(value[2])) if isinstance(value, list) and len(value) == 3 else None

    grid, block = dims("grid_dim"), dims("block_dim")
    return RowFacts(row.key, row.identifier, row.op, _emitted_body(row), tensors("input_shape"),
                    tensors("output_shape"), (grid, block) if grid and block else None)


def _emitted_body(row: KernelRow) -> str:
    """The body the compiler writes for the row: block_function_body (CacheBlockCudaEmitter), or function_body
    for a standalone row (CacheCudaEmitter, core/db/standalone.py)."""
    try:
        fn = json.loads(row.function)
    except ValueError:
        return ""
    field = "function_body" if is_standalone(row) else "block_function_body"
    body = fn.get(field) if isinstance(fn, dict) else None
    return body if isinstance(body, str) else ""


def analyse_project(source_file: Path, db: KernelDB, identifiers: Iterable[str] | None = None) -> Usage:
    """Usage of the DB's rows (those of `identifiers` only, when given) in a generated nnfusion_rt.cu."""
    generated = parse_generated(source_file.read_text(encoding="utf-8", errors="replace"))
    return analyse(generated, rows_looked_up(db, identifiers))


def rows_looked_up(db: KernelDB, identifiers: Iterable[str] | None = None) -> list[KernelRow]:
    """The DB's rows of these Identifiers (every row when None)."""
    if identifiers is None:
        return list(db.iter_rows())
    wanted = sorted(set(identifiers))
    return [r for chunk in range(0, len(wanted), 500)
            for r in db.iter_rows(f"WHERE Identifier IN ({', '.join('?' * len(wanted[chunk:chunk + 500]))})",
                                  wanted[chunk:chunk + 500])]


def db_kernels_used(db_path: Path, source: str, product_name: str = "") -> dict[str, Any]:
    """For scripts (bench/bench_network.py, run where SQLAlchemy may be absent): the usage of every row of the
    DB at db_path in this source, read with sqlite3 alone."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        rows = [KernelRow.from_values(tuple(r)) for r in conn.execute(f"SELECT {', '.join(COLUMNS)} FROM KernelCache")]
    finally:
        conn.close()
    usage = analyse(parse_generated(source), rows)
    report = usage.as_dict()
    report["product_name"] = product_name
    return report

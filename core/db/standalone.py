"""Rows BlockFusion never fuses: a kernel kept out of every BlockFusion group, run on its own launch.

NNFusion's BlockFusion runs each member's block function in blocks of the group's largest size, with no
`__launch_bounds__`; a member whose registers were sized for a small block can make the group's kernel unable
to launch, and the network then computes wrong numbers without an error (core/nnfusion/launch_check.py; a
190-register 64-thread convolution fused with a 448-thread one did so on the H200, twelfth session).

Kernel selection (FetchBasedSelector::fetch_inventory) takes an op's first External row and emits it through
CacheBlockCudaEmitter, which BlockFusion can fuse. When the op has no External row it takes, among the rows of
Source "Antares" whose `Miscs.antares.device_name` is the compile's -fproduct_name and whose `planned_steps` is
above 0, the one of smallest `Miscs.antares.time`; a row of those without the BlockCudaEmitter tag goes through
CacheCudaEmitter: the row's own `function_signature` and `function_body`, launched with its own grid and block.
BlockFusion skips every kernel that is not a BlockCudaEmitter ("is not BlockCudaEmitter, skip in BlockFusion").

So a standalone row is the same kernel with Source "Antares", no BlockCudaEmitter tag, and `Miscs.antares`
naming the product it is for. Every CUDA_GPU row of the op's Identifier changes together: one External row left
would be taken first. The Key, the code, the profile and the order stay; `fusable` turns the rows back. The
maintenance plan (core/db/maintenance.py, standalone_plan) writes either in one transaction, with its undo file. A row
injected later for a standalone op goes in standalone too (core/db/kernel_db.py, insert): the op stays as it was made.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from core.db.kernel_db import KernelDB
from core.db.op_rows import UNPROFILED_US, standalone_columns
from core.errors import InputError
from core.kernels.kernel_row import KernelRow, is_standalone
from core.kernels.ops import BLOCK_TAG, DEFAULT_PRODUCT, DEVICE_TYPE, EXTERNAL_SOURCE

__all__ = ["UNPROFILED_US", "RowChange", "plan_fusable", "plan_standalone"]


@dataclass(frozen=True)
class RowChange:
    """One row's new Source, Tags and Miscs."""

    row: KernelRow
    source: str
    tags: str
    miscs: dict[str, Any]

    def columns(self) -> dict[str, str]:
        """The columns as the DB stores them (KernelDB.update_rows)."""
        return {"Source": self.source, "Tags": self.tags,
                "Miscs": json.dumps(self.miscs, ensure_ascii=False, allow_nan=False)}


def plan_standalone(db: KernelDB, keys: Iterable[str], product: str) -> list[RowChange]:
    """The changes that make the ops of these rows (Keys, or Identifiers) standalone for `product`: every External
    CUDA_GPU row of each op. InputError names a Key or Identifier the DB does not have."""
    product = product or DEFAULT_PRODUCT
    changes = []
    for row in _rows_of_ops(db, keys):
        if row.source != EXTERNAL_SOURCE:
            continue  # standalone already, or a row of NNFusion's own kind: left as it is
        changes.append(RowChange(row, *standalone_columns(row, product)))
    return changes


def plan_fusable(db: KernelDB, keys: Iterable[str]) -> list[RowChange]:
    """The changes that give these ops' standalone rows back to BlockFusion (External, BlockCudaEmitter)."""
    changes = []
    for row in _rows_of_ops(db, keys):
        if not is_standalone(row):
            continue
        miscs = _miscs(row)
        miscs.pop("antares", None)
        tags = [t for t in row.tags.split(",") if t]
        at = tags.index("CudaEmitter") + 1 if "CudaEmitter" in tags else len(tags)
        changes.append(RowChange(row, EXTERNAL_SOURCE, ",".join([*tags[:at], BLOCK_TAG, *tags[at:]]), miscs))
    return changes


def _rows_of_ops(db: KernelDB, keys: Iterable[str]) -> list[KernelRow]:
    identifiers: list[str] = []
    for key in keys:
        found = db.find(key)
        if not found:
            raise InputError(f"{key}: no row has this Key or Identifier", where=key)
        for row in found:  # a Key prefix finds a fused kernel's CUDA twin too: the same Identifier
            if row.identifier not in identifiers:
                identifiers.append(row.identifier)
    return [row for identifier in identifiers
            for row in db.iter_rows("WHERE Identifier = ? AND DeviceType = ?", [identifier, DEVICE_TYPE])]


def _miscs(row: KernelRow) -> dict[str, Any]:
    miscs = json.loads(row.miscs or "{}")
    if not isinstance(miscs, dict):
        raise InputError(f"row {row.key[:20]}: Miscs is not a JSON object", where=row.key)
    return miscs


"""Which op configs of a model already have a kernel in the DB, which are missing, which fall back.

NNFusion looks each op up by its identifier and device type (and, for a Dot, requires the transA /
transB tags); without a row it emits its fallback: cuDNN for convolutions and pools, cuBLAS for Dot,
its own generated kernel for element-wise ops. A fused Conv+Relu / Conv+Add+Relu is only substituted
when the DB holds the fused kernel; otherwise the convolution goes to cuDNN and the Add and Relu run
as element-wise kernels. Grouped and depthwise convolutions have no kernel-DB op type at all.

One COUNT query per distinct identifier. (KernelCache has no index on Identifier, only NNFusion's
primary key, so SQLite scans the table for each; the compiler's own fetch does the same.)
"""

from __future__ import annotations

from dataclasses import dataclass

from core.db.kernel_db import KernelDB
from core.errors import InputError
from core.kernels.ops import CONV_FAMILY, DEVICE_TYPE, POOLS
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.opconfig import OpConfig

IN_DB = "in DB"
MISSING = "missing: tune it"
FALLS_BACK = "falls back"


@dataclass(frozen=True)
class CoverageEntry:
    config: OpConfig
    count: int  # occurrences in the model
    identifier: str | None  # None: the op has no kernel-DB identifier
    kernels: int  # rows for this identifier and device type
    status: str  # IN_DB, MISSING, or "falls back: <reason>"
    fallback: str  # what the compiler runs when the DB has no kernel for it

    def to_dict(self) -> dict[str, object]:
        return {"config": self.config.to_dict(), "description": self.config.describe(), "count": self.count,
                "identifier": self.identifier, "kernels": self.kernels, "status": self.status,
                "fallback": self.fallback}


def fallback_for(config: OpConfig) -> str:
    """What the compiler runs for this op when the DB has no kernel for it."""
    if config.groups != 1:
        depthwise = config.groups == _channels(config)
        return "DepthwiseConv2dNative (NNFusion's kernel)" if depthwise else "cuDNN"
    if config.op_type == "Convolution" or config.op_type in POOLS:
        return "cuDNN"
    if config.op_type in CONV_FAMILY:
        return "cuDNN + element-wise kernels (not fused)"
    if config.op_type == "Dot":
        return "cuBLAS"
    return "NNFusion's element-wise kernel"


def _channels(config: OpConfig) -> int | None:
    shape = config.params.get("input_shape")
    return shape[1] if isinstance(shape, list) and len(shape) > 1 else None


def _no_op_type(config: OpConfig) -> str:
    if config.groups == _channels(config):
        return (f"{FALLS_BACK}: depthwise convolution (groups={config.groups}) has no kernel-DB op type; "
                "NNFusion emits DepthwiseConv2dNative")
    return (f"{FALLS_BACK}: grouped convolution (groups={config.groups}) has no kernel-DB op type; NNFusion splits "
            "it into one Convolution per group")


def coverage(extraction: Extraction, db: KernelDB, device_type: str = DEVICE_TYPE) -> list[CoverageEntry]:
    """One entry per distinct op config of the model, in model order."""
    counted: dict[tuple[str, tuple[str, ...]], int] = {}
    entries = []
    for config in extraction.configs:
        count, fallback = extraction.count(config), fallback_for(config)
        if config.groups != 1:
            entries.append(CoverageEntry(config, count, None, 0, _no_op_type(config), fallback))
            continue
        try:
            identifier = config.signature().identifier
        except InputError as exc:
            entries.append(CoverageEntry(config, count, None, 0, f"{FALLS_BACK}: {exc.reason}", fallback))
            continue
        tags = _required_tags(config)
        if (identifier, tags) not in counted:
            counted[identifier, tags] = _count(db, identifier, device_type, tags)
        kernels = counted[identifier, tags]
        entries.append(CoverageEntry(config, count, identifier, kernels, IN_DB if kernels else MISSING, fallback))
    return entries


def _required_tags(config: OpConfig) -> tuple[str, ...]:
    """Tags a row must carry to be fetched for this op (Dot transposes travel in Tags, not the identifier)."""
    if config.op_type != "Dot":
        return ()
    p = config.params
    return tuple(tag for tag, on in (("transA", p.get("transpose_A")), ("transB", p.get("transpose_B"))) if on)


def _count(db: KernelDB, identifier: str, device_type: str, tags: tuple[str, ...]) -> int:
    # Tags is a comma-separated list: match whole entries, case-sensitively (as the compiler splits it).
    where = "WHERE Identifier = ? AND DeviceType = ?" + " AND instr(',' || Tags || ',', ?) > 0" * len(tags)
    return db.count(where, (identifier, device_type, *(f",{t}," for t in tags)))

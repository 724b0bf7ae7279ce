"""What NNFusion will run for each op of a model, given the kernel DB and the compiler's flags.

This is a model of the compiler's passes (read from its sources, checked against the real compiler by
tests/test_nnfusion_compiler.py), in the order they run:

1. Pattern substitution: Convolution+Add+Relu and Convolution+Relu chains are replaced by a Matched_Pattern
   node only when the DB holds a row of the fused identifier under DeviceType CUDA. Its kernel is then fetched
   under CUDA_GPU (none there: the compiler aborts). Not substituted, the convolution is looked up alone and the
   Add/Relu stay element-wise nodes.
2. Element-wise fusion (-fkernel_fusion_level > 0): element-wise nodes (the bias Add NNFusion puts after a
   Conv/Gemm among them) become kernels of NNFusion's own as its KernelFusionPass groups them, replayed on a model
   of its graph (core/opconfigs/fusion.py); only those it leaves alone are looked up in the DB.
3. Kernel selection: each remaining node's identifier is fetched under CUDA_GPU; the compiler takes the FIRST
   External row in table order (profiles are not compared). A row of an unsupported OpType under the same
   identifier makes the fetch return nothing. Without a row: cuDNN for convolutions and pools, cuBLAS for Dot,
   NNFusion's own kernel for element-wise ops.
4. BlockFusion with interplay: in a group of parallel kernels whose blocks exceed 4 x 80, each node's row is
   swapped for the one with the smallest time x resource for -fproduct_name (a row without a profile for it
   counts as 10 us).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from core.db.kernel_db import KernelDB
from core.errors import InputError
from core.kernels.kernel_row import antares_entry
from core.kernels.ops import (
    BATCH_MATMUL,
    BLOCK_TAG,
    CONV_FAMILY,
    CONV_TRANSPOSE,
    DEFAULT_PRODUCT,
    DEPTHWISE,
    DEVICE_TYPE,
    FUSED_OP_TYPES,
    MATRIX_OP_TYPES,
    PATTERN_DEVICE_TYPE,
    POOLS,
    RESIZE,
    ROW_ONLY_OP_TYPES,
    STANDALONE_SOURCE,
    SUPPORTED_OP_TYPES,
)
from core.kernels.profile import parse_profile
from core.nnfusion.compiler import CompilerFlags
from core.opconfigs.nnfusion_import import HALF_DEPTHWISE
from core.opconfigs.onnx_extract import Extraction, grouped_conv_reason
from core.opconfigs.opconfig import OpConfig

# Status of an op: what the DB does for it.
IN_DB = "in DB"  # the compiler will run a DB row
MISSING = "missing: tune it"  # no row: the op would run a DB kernel once one is there
NOT_USED = "row not used"  # rows are there, and the compiler will not use them (see reasons)
FUSED_AWAY = "fused away"  # NNFusion fuses the op into its own element-wise kernel; never looked up
FALLS_BACK = "falls back"  # no kernel-DB op type at all
ABORTS = "compiler aborts"  # the DB makes the compiler fail on this op
DOES_NOT_BUILD = "does not build"  # NNFusion's own kernel for the op is no valid CUDA: the network cannot be built
STATUSES = (IN_DB, MISSING, NOT_USED, FUSED_AWAY, FALLS_BACK, ABORTS, DOES_NOT_BUILD)

# What runs.
DB_KERNEL, NNFUSION_KERNEL = "DB kernel", "NNFusion's kernel"
DEFAULT_PROFILE_US = 10.0  # what the compiler assumes for a row without a profile for the product
GROUP_CAPACITY = 4 * 80  # BlockFusion's RESOURCE_CAPACITY (blocks)


@dataclass(frozen=True)
class RowChoice:
    """The row the compiler takes for a lookup, and why that one."""

    key: str
    rows: int  # External CUDA_GPU rows of the identifier (none: the Antares rows for the product)
    why: str
    time_us: float | None  # profile for the product name (None: none, the compiler assumes 10 us)
    interplay_key: str | None = None  # the row BlockFusion's interplay swaps in, when another
    interplay_why: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"key": self.key, "rows": self.rows, "why": self.why, "time_us": self.time_us,
                "interplay_key": self.interplay_key, "interplay_why": self.interplay_why}


WRONG_NUMBERS = "WRONG NUMBERS"  # a reason that says the row the compiler takes computes another op


@dataclass(frozen=True)
class CoverageEntry:
    config: OpConfig
    count: int  # occurrences in the model
    identifier: str | None  # what the compiler looks up (None: the op has no kernel-DB identifier)
    kernels: int  # CUDA_GPU rows of that identifier
    status: str  # one of STATUSES
    runs: str  # what executes: DB_KERNEL, "cuDNN", "cuBLAS", NNFUSION_KERNEL (+ the element-wise tail)
    fallback: str  # what the compiler runs when the DB has no kernel for it
    row: RowChoice | None = None
    reasons: tuple[str, ...] = ()  # why rows are not used, and what else to know
    fused_away: int = 0  # occurrences NNFusion fuses into its own element-wise kernel
    lookup: str | None = None  # the identifier really looked up, when not `identifier` (a conv left unfused)

    @property
    def wrong_numbers(self) -> list[str]:
        """The reasons that say the row the compiler takes for this op computes another op."""
        return [r for r in self.reasons if r.startswith(WRONG_NUMBERS)]

    @property
    def db_flops(self) -> int:
        """FLOPs of this op that really run on DB kernels."""
        return self.config.flops * (self.count - self.fused_away) if self.runs.startswith(DB_KERNEL) else 0

    def to_dict(self) -> dict[str, object]:
        return {"config": self.config.to_dict(), "description": self.config.describe(), "count": self.count,
                "identifier": self.identifier, "lookup": self.lookup, "kernels": self.kernels,
                "status": self.status, "runs": self.runs, "fallback": self.fallback,
                "row": self.row.to_dict() if self.row else None, "reasons": list(self.reasons),
                "fused_away": self.fused_away, "flops": self.config.flops * self.count, "db_flops": self.db_flops}


def fallback_for(config: OpConfig) -> str:
    """What the compiler runs for this op when the DB has no kernel for it."""
    if config.groups != 1:
        return "DepthwiseConv2dNative (NNFusion's kernel)" if _depthwise(config) else GROUPED_ABORT
    if config.op_type == "Convolution" or config.op_type in POOLS:
        return "cuDNN"
    if config.op_type in CONV_FAMILY:
        return "cuDNN + the Add/Relu as element-wise nodes (not fused)"
    if config.op_type == "Dot":
        return "cuBLAS"
    if config.op_type == BATCH_MATMUL:
        return "cuBLAS (strided batched GEMM)"
    if config.op_type == DEPTHWISE:
        return "DepthwiseConv2dNative (NNFusion's kernel)"
    return NNFUSION_KERNEL


GROUPED_ABORT = "nothing: the compiler aborts at import"
# What an op's identifier does not say and its row's Attributes keep (its shapes alone are the identifier)
_UNSAID = {DEPTHWISE: (("window_movement_strides", "stride"), ("window_dilation_strides", "dilation"),
                       ("padding_below_diff", "padding")),
           RESIZE: (("mode", "mode"), ("coordinate_transformation_mode", "coordinates"), ("nearest_mode", "rounding")),
           CONV_TRANSPOSE: (("window_movement_strides", "stride"), ("padding_below_diff", "padding"))}
NEEDS_ROW = ("nothing: NNFusion has no CUDA kernel of its own for a {}, and kernel selection aborts ('No valid kernel "
             "found') without a row of it (`kdb codegen` makes one)")


def _library_pool_shape(config: OpConfig) -> str:
    """Why NNFusion's own MaxPool cannot compute this one ("" where it can): its cuDNN pool is given the pads below
    alone, for both sides (kernels/cuda_gpu/kernels/max_pool.cpp), so pads that differ above make cuDNN's windows
    other than the output's."""
    p = config.params
    if config.op_type != "MaxPool" or p.get("padding_below") == p.get("padding_above"):
        return ""
    try:
        spatial = list(zip(p["input_shape"][2:], p["window_shape"], p["window_stride"], p["padding_below"],
                           strict=True))
        theirs = [(size + 2 * below - window) // stride + 1 for size, window, stride, below in spatial]
    except (KeyError, TypeError, ValueError):
        return ""
    if theirs == list(p["output_shape"][2:]):
        return ""
    return (f"without its row, NNFusion's cuDNN pool pads both sides by the pads below {p['padding_below']} "
            f"(max_pool.cpp) and makes {theirs} windows where the model's output has {p['output_shape'][2:]}: not the "
            "model's numbers, or no run; its row computes it (`kdb codegen` makes one)")


def _depthwise(config: OpConfig) -> bool:
    shape = config.params.get("input_shape")
    return isinstance(shape, list) and len(shape) > 1 and config.groups == shape[1]


def _no_op_type(config: OpConfig) -> str:
    shape, filt = config.params.get("input_shape") or [0, 0], config.params.get("filter_shape") or [0]
    return grouped_conv_reason(config.groups, shape[1], filt[0])[0]


def coverage(extraction: Extraction, db: KernelDB, flags: CompilerFlags | None = None,
             product_name: str = "") -> list[CoverageEntry]:
    """One entry per distinct op config of the model, in model order."""
    return _Model(db, flags or CompilerFlags(), product_name).entries(extraction)


def summarize(entries: list[CoverageEntry]) -> dict[str, object]:
    """Per-status op counts (each occurrence of an op once: the nodes the compiled code runs, so "in DB" is the nodes
    that run DB rows), and the share of FLOPs (of these ops) that really runs on DB kernels."""
    total = sum(e.config.flops * e.count for e in entries)
    on_db = sum(e.db_flops for e in entries)
    ops = dict.fromkeys(STATUSES, 0)
    for e in entries:  # an op's occurrences fused into NNFusion's own kernels count as fused away, not as run
        away = e.count if e.status == FUSED_AWAY else e.fused_away
        ops[e.status] += e.count - away
        ops[FUSED_AWAY] += away
    return {"ops": ops,
            "distinct": dict(Counter(e.status for e in entries)),
            "db_flops_share": on_db / total if total else 0.0}


class _Model:
    def __init__(self, db: KernelDB, flags: CompilerFlags, product_name: str) -> None:
        self.db, self.flags, self.product = db, flags, product_name
        self._choices: dict[tuple[str, str], tuple[RowChoice | None, tuple[str, ...], str | None]] = {}

    def entries(self, ex: Extraction) -> list[CoverageEntry]:
        substituted = {c.key for c in ex.configs if c.op_type in FUSED_OP_TYPES and self._substitutes(c)}
        fused_units = self._fused_units(ex, substituted)
        out = []
        for config in ex.configs:
            count = ex.count(config)
            occurrences = ex.nodes.get(config.key, [])
            away = sum(1 for m in occurrences if ex.unit_of(config, m) in fused_units) \
                if config.op_type not in (*MATRIX_OP_TYPES, *POOLS) else 0
            out.append(self.entry(config, count, away))
        return out

    def entry(self, config: OpConfig, count: int, fused_away: int = 0) -> CoverageEntry:
        fallback = fallback_for(config)
        if config.groups != 1:
            status = FALLS_BACK if _depthwise(config) else ABORTS
            if status == FALLS_BACK and config.dtype == "half":
                return CoverageEntry(config, count, None, 0, DOES_NOT_BUILD, fallback, fallback,
                                     reasons=(HALF_DEPTHWISE,))
            return CoverageEntry(config, count, None, 0, status, fallback, fallback, reasons=(_no_op_type(config),))
        try:
            identifier = config.signature().identifier
        except InputError as exc:
            return CoverageEntry(config, count, None, 0, FALLS_BACK, fallback, fallback, reasons=(exc.reason,))
        kernels = len(self.db.fetch_like_compiler(identifier, DEVICE_TYPE))
        if fused_away and fused_away == count:
            return CoverageEntry(config, count, identifier, kernels, FUSED_AWAY, NNFUSION_KERNEL, fallback,
                                 reasons=(self._fusion_reason(kernels),), fused_away=fused_away)
        if config.op_type in FUSED_OP_TYPES:
            return self._fused(config, count, identifier, kernels, fallback)
        row, reasons, abort = self._choose(identifier, config)
        extra = (f"{fused_away} of {count} fused into NNFusion's element-wise kernels",) if fused_away else ()
        if abort:
            return CoverageEntry(config, count, identifier, kernels, ABORTS, abort, fallback, row, (abort, *reasons))
        if row is not None:
            return CoverageEntry(config, count, identifier, kernels, IN_DB, DB_KERNEL, fallback, row,
                                 (*extra, *reasons), fused_away)
        status = NOT_USED if kernels or any("DeviceType" in r for r in reasons) else MISSING
        if config.op_type == DEPTHWISE and config.dtype == "half":  # NNFusion's own kernel would run: no valid CUDA
            status, reasons = DOES_NOT_BUILD, (HALF_DEPTHWISE, *reasons)
        if config.op_type in ROW_ONLY_OP_TYPES:  # NNFusion has no kernel of its own to run
            needs = NEEDS_ROW.format(config.op_type)
            status, reasons, fallback = ABORTS, (needs, *reasons), needs
        elif why := _library_pool_shape(config):
            reasons = (why, *reasons)
        return CoverageEntry(config, count, identifier, kernels, status, fallback, fallback, None, (*extra, *reasons),
                             fused_away)

    # -- fused convolutions ---------------------------------------------------------------------

    def _substitutes(self, config: OpConfig) -> bool:
        if not self.flags.pattern_substitution:
            return False
        try:
            identifier = config.signature().identifier
        except InputError:
            return False
        rows = self.db.fetch_like_compiler(identifier, PATTERN_DEVICE_TYPE)
        return bool(rows) and all(r[2] in SUPPORTED_OP_TYPES for r in rows)

    def _fused(self, config: OpConfig, count: int, identifier: str, kernels: int, fallback: str) -> CoverageEntry:
        if self._substitutes(config):
            row, reasons, abort = self._choose(identifier, config)
            if row is not None and not abort:
                return CoverageEntry(config, count, identifier, kernels, IN_DB, DB_KERNEL, fallback, row, reasons)
            why = abort or (f"the {PATTERN_DEVICE_TYPE} row makes the compiler substitute the pattern, and no "
                            f"{DEVICE_TYPE} kernel of it can be fetched: the compiler aborts "
                            "(Kernel_Selection_Result check)")
            return CoverageEntry(config, count, identifier, kernels, ABORTS, why, fallback, None, (why, *reasons))
        # Not substituted: the convolution is looked up alone, the Add/Relu become NNFusion's element-wise kernel.
        pattern = (self._why_not_substituted(identifier, kernels),
                   *(self._why_no_rows(identifier, config) if not kernels else ()))
        plain = replace(config, op_type="Convolution")
        plain_id = plain.signature().identifier
        row, reasons, abort = self._choose(plain_id, plain)
        tail = " + the Add/Relu as element-wise nodes"
        runs = (abort or (f"{DB_KERNEL} (plain Convolution)" if row else "cuDNN")) + tail
        status = ABORTS if abort else NOT_USED if kernels else MISSING
        return CoverageEntry(config, count, identifier, kernels, status, runs, fallback, row, (*pattern, *reasons),
                             lookup=plain_id)

    def _why_not_substituted(self, identifier: str, kernels: int) -> str:
        if not self.flags.pattern_substitution:
            return "pattern substitution is off (-fpattern_substitution=false): the fused kernel is never used"
        poisoned = [r[2] for r in self.db.fetch_like_compiler(identifier, PATTERN_DEVICE_TYPE)
                    if r[2] not in SUPPORTED_OP_TYPES]
        if poisoned:
            return (f"a {PATTERN_DEVICE_TYPE} row of unsupported OpType {poisoned[0]!r} poisons the pattern lookup: "
                    "never substituted")
        if kernels:
            return (f"no {PATTERN_DEVICE_TYPE} row of this identifier: the pattern-substitution pass never replaces "
                    "the nodes, so its kernel is never used (`kdb db repair` adds the twins)")
        return "no fused kernel in the DB: the pattern is not substituted"

    # -- kernel selection -----------------------------------------------------------------------

    def _choose(self, identifier: str, config: OpConfig) -> tuple[RowChoice | None, tuple[str, ...], str]:
        """(the row the compiler takes, reasons, abort text) for one CUDA_GPU lookup."""
        key = (identifier, config.op_type)
        if key not in self._choices:
            self._choices[key] = self._select(identifier, config)
        row, reasons, abort = self._choices[key]
        if row is not None and row.rows:  # (after the cache: ops of one lookup may differ in what they need of its row)
            reasons = (*self._made_for_another_op(config, row.key), *reasons)
        return row, reasons, abort or ""

    def _select(self, identifier: str, config: OpConfig) -> tuple[RowChoice | None, tuple[str, ...], str | None]:
        fetched = self.db.fetch_like_compiler(identifier, DEVICE_TYPE)
        if not fetched:
            return None, self._why_no_rows(identifier, config), None
        bad = [r[2] for r in fetched if r[2] not in SUPPORTED_OP_TYPES]
        if bad:
            return None, (f"a row of unsupported OpType {bad[0]!r} shares the identifier: every fetch of it returns "
                          "nothing, for all its rows",), None
        external = [r for r in fetched if r[3] == "External"]
        if not external:
            return self._standalone(fetched)
        first = external[0]
        if "BlockCudaEmitter" not in str(first[4]).split(","):
            return None, (), "the first External row has no BlockCudaEmitter tag: the compiler CHECK-fails on it"
        why = ("the only External row" if len(external) == 1 else
               f"the first of {len(external)} External rows in table order: kernel selection takes the first and "
               "does not compare profiles")
        profiles = [(r[1], *self._profile(r[5])) for r in external]
        time_us = profiles[0][1]
        reasons = []
        if time_us is None:
            reasons.append(f"no profile for {self.product or 'the product name (not set)'}: BlockFusion schedules "
                           f"it as {DEFAULT_PROFILE_US:g} us")
        choice = RowChoice(first[1], len(external), why, time_us)
        if self.flags.blockfusion_level > 0 and self.flags.blockfusion_interplay and len(external) > 1:
            efficient = self._efficient(profiles)
            if efficient is not None and efficient[0] != first[1]:
                choice = replace(choice, interplay_key=efficient[0], interplay_why=(
                    f"in a BlockFusion group over {GROUP_CAPACITY} blocks the row with the smallest time x resource "
                    f"({efficient[1]:g} us x {efficient[2]}) replaces it"))
        return choice, tuple(reasons), None

    def _standalone(self, fetched: list[tuple[Any, ...]]) -> tuple[RowChoice | None, tuple[str, ...], str | None]:
        """No External row: the Antares row for the product with the smallest time (core/db/standalone.py)."""
        product = self.product or DEFAULT_PRODUCT
        timed = []
        for r in fetched:
            try:
                entry = antares_entry(json.loads(r[5] or "{}"), product) if r[3] == STANDALONE_SOURCE else None
            except ValueError:
                entry = None
            if entry is not None:
                timed.append((entry["time"], r))
        if not timed:
            return None, (f"{len(fetched)} row(s) of Source {fetched[0][3]!r}: kernel selection uses External rows, "
                          f"else Antares rows whose Miscs.antares names the product ({product!r})",), None
        time_us, first = min(timed, key=lambda t: t[0])  # the first of equal times, as the selector's `<` keeps
        tags = str(first[4]).split(",")
        if BLOCK_TAG in tags:
            why = "the fastest Antares row for the product (BlockCudaEmitter: BlockFusion may fuse it)"
        elif "CudaEmitter" in tags:
            why = "standalone: the fastest Antares row for the product, never fused by BlockFusion"
        else:
            return None, (), "the chosen Antares row has neither CudaEmitter tag: the compiler CHECK-fails on it"
        return RowChoice(first[1], len(timed), why, time_us), (), None

    def _efficient(self, profiles: list[tuple[str, float | None, int]]) -> tuple[str, float, int] | None:
        """fetch_with_tags(efficient=true): the smallest time x resource among rows profiled for the product."""
        best: tuple[str, float, int] | None = None
        for key, t, resource in profiles:
            if t is not None and (best is None or t * resource < best[1] * best[2]):
                best = (key, t, resource)
        return best

    def _profile(self, miscs_text: str) -> tuple[float | None, int]:
        try:
            profile = json.loads(miscs_text).get("external_profile") or {}
            times = parse_profile(profile.get("time") or "")
            resource = int(profile.get("resource") or 0)
        except (ValueError, AttributeError, TypeError, InputError):
            return None, 0
        return (times.get(self.product) if self.product else None), resource

    def _made_for_another_op(self, config: OpConfig, key: str) -> tuple[str, ...]:
        """What the chosen row says it computes that this op is not: the identifiers of a Dot (no transposes), of a
        depthwise convolution and of a Resize (shapes only) cannot tell such ops apart, so the compiler uses the row
        anyway."""
        if config.op_type not in ("Dot", *_UNSAID):
            return ()
        rows = self.db.find(key)
        if not rows:
            return ()
        return (*self._tag_mismatch(config, rows[0].key, rows[0].tags),
                *self._attributes_mismatch(config, rows[0].attributes))

    @staticmethod
    def _tag_mismatch(config: OpConfig, key: str, tags: str) -> tuple[str, ...]:
        """A Dot row made for other transposes. kdb writes every Dot row's transposes in its Tags (ops.tags_for): a
        row of kdb's, or one whose Tags name a transpose, computes what they say; another tool's row may leave them
        out."""
        if config.op_type != "Dot":
            return ()
        have = set(tags.split(","))
        want = {t for t, on in (("transA", config.params.get("transpose_A")),
                                ("transB", config.params.get("transpose_B"))) if on}
        got = have & {"transA", "transB"}
        if got == want:
            return ()
        said = f"the row's Tags say {sorted(got) or 'no transpose'}, the op has {sorted(want) or 'none'}"
        if not (got or key.startswith("kdb:")):
            return (f"{said}: the compiler uses the row anyway (kernel selection does not read Tags)",)
        return (f"{WRONG_NUMBERS}: {said}, and the compiler uses it anyway (the Dot identifier has the shapes only; "
                "kernel selection does not read Tags): generate this op's row in a DB of its own, or set the row "
                "aside so that cuBLAS runs the op",)

    @staticmethod
    def _attributes_mismatch(config: OpConfig, attributes: str) -> tuple[str, ...]:
        """A depthwise or Resize row's identifier is its shapes only: a row made for another stride or padding (a 3x3
        at SAME padding on a 2x2 map, stride 2 or 3), or another mode, of the same shapes is fetched all the same, and
        computes the wrong numbers for this node. The row's Attributes keep what it computes."""
        unsaid = _UNSAID.get(config.op_type, ())
        attrs = json.loads(attributes or "{}")
        made = attrs.get("parameters", {}) if isinstance(attrs, dict) else {}
        if not unsaid or not isinstance(made, dict) or all(made.get(n) == config.params.get(n) for n, _ in unsaid):
            return ()
        return (f"{WRONG_NUMBERS}: the row computes {', '.join(f'{label} {made.get(n)}' for n, label in unsaid)}; "
                f"this node has {', '.join(f'{label} {config.params.get(n)}' for n, label in unsaid)}. The compiler "
                "uses it anyway (the identifier has the shapes only, and one row serves every node of them): generate "
                "this node's row in a DB of its own; where another node of the network needs the row as it is, one "
                "of the two computes wrong numbers whatever the DB holds",)

    def _why_no_rows(self, identifier: str, config: OpConfig) -> tuple[str, ...]:
        reasons = [f"{n} row(s) under DeviceType {d!r}: the compiler asks for {DEVICE_TYPE}"
                   for d, n in self.db.device_types_of(identifier).items() if d != DEVICE_TYPE]
        prefix = identifier.split(";")[0]
        near = [i for i in self.db.identifiers_starting(prefix, DEVICE_TYPE) if i != identifier]
        if near:
            reasons.append(f"{len(near)} identifier(s) of the same op and first shape differ: {near[0]!r} "
                           f"(looked up: {identifier!r})")
        return tuple(reasons)

    # -- element-wise fusion --------------------------------------------------------------------

    def _fused_units(self, ex: Extraction, substituted: set[str]) -> set[str]:
        """Element-wise nodes in NNFusion's own ElementWiseFused kernels, the patterns the DB serves substituted."""
        patterns = [members for config in ex.configs if config.key in substituted
                    for members in ex.nodes.get(config.key, [])]
        return ex.fused_units(self.flags.kernel_fusion_level, patterns)

    def _fusion_reason(self, kernels: int) -> str:
        text = (f"NNFusion fuses it with its element-wise neighbours into one kernel of its own "
                f"(-fkernel_fusion_level={self.flags.kernel_fusion_level}): never looked up")
        return text + (f"; its {kernels} row(s) are unused here" if kernels else "")

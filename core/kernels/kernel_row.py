"""A validated kernel + its parsed CUDA -> the nine columns of NNFusion's KernelCache row.

Column contents follow what NNFusion's own import tool writes (see NNFUSION-KERNEL-DB.md), with two
deliberate differences: Key is a digest of (identifier, launch dims, body) so kernels that share a
body but not a grid no longer overwrite each other, and Miscs carries no time until one is measured
on a GPU (the compiler then treats the row as unprofiled; nothing is made up).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from core.cuda.shared_types import BLOCKFUSION_SHARED_DTYPES
from core.cuda.warps import pad_body, warp_padded_block
from core.errors import InputError
from core.kernels.ops import (
    BLOCK_TAG,
    DEFAULT_PRODUCT,
    DEVICE_TYPE,
    EXTERNAL_SOURCE,
    FUSED_OP_TYPES,
    PATTERN_DEVICE_TYPE,
    ROW_OP_TYPE,
    STANDALONE_SOURCE,
    UNREAD_INPUTS,
    op_of_row,
    parameter_order,
    tags_for,
)
from core.kernels.opsig import DotParams

if TYPE_CHECKING:  # types only: every DB read imports this module, and the CUDA parsers cost 40 ms
    from core.cuda.barriers import BarrierCount
    from core.cuda.source import KernelSource, Param, SharedDecl
    from core.kernels.kernel_json import KernelSpec

COLUMNS = ("Key", "Identifier", "OpType", "Attributes", "Source", "DeviceType", "Function", "Tags", "Miscs")


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One KernelCache row, every column a non-NULL string (JSON columns valid JSON)."""

    key: str
    identifier: str
    op_type: str
    attributes: str
    source: str
    device_type: str
    function: str
    tags: str
    miscs: str

    @property
    def op(self) -> str:
        """kdb's op type for the row: the OpType column, or the op its identifier names where the column stands in
        (a BatchMatMul row's OpType says Dot: core/kernels/ops.py ROW_OP_TYPE)."""
        return op_of_row(self.op_type, self.identifier)

    def values(self) -> tuple[str, ...]:
        return (self.key, self.identifier, self.op_type, self.attributes, self.source, self.device_type,
                self.function, self.tags, self.miscs)

    @classmethod
    def from_values(cls, values: tuple[Any, ...]) -> KernelRow:
        return cls(*(v if isinstance(v, str) else "" for v in values))


# A fused kernel's second row (DeviceType CUDA, for the pattern-substitution pass) has its kernel's Key
# with this suffix: readable in the Kernels view, and derived, so the pair can be kept in step by Key.
TWIN_SUFFIX = "#CUDA"


def is_standalone(row: KernelRow) -> bool:
    """A row kernel selection emits on its own launch, never fused by BlockFusion (core/db/standalone.py)."""
    return row.source == STANDALONE_SOURCE and BLOCK_TAG not in row.tags.split(",")


def antares_entry(miscs: Any, product: str) -> dict[str, Any] | None:
    """A row's `Miscs.antares` when kernel selection would take the row (Source Antares) for `product`, else None:
    it must name the product and have planned_steps above 0 and a time."""
    entry = miscs.get("antares") if isinstance(miscs, dict) else None
    if not isinstance(entry, dict) or entry.get("device_name") != (product or DEFAULT_PRODUCT):
        return None
    steps, time = entry.get("planned_steps"), entry.get("time")
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (steps, time))
    return entry if numeric and steps > 0 else None


def needs_pattern_twin(row: KernelRow) -> bool:
    """A fused kernel's CUDA_GPU row: the compiler uses it only when its CUDA twin is there too."""
    return row.op_type in FUSED_OP_TYPES and row.device_type == DEVICE_TYPE


def is_pattern_twin(row: KernelRow) -> bool:
    return row.op_type in FUSED_OP_TYPES and row.device_type == PATTERN_DEVICE_TYPE


def twin_key(key: str) -> str:
    return key + TWIN_SUFFIX


def primary_key(key: str) -> str | None:
    """The Key of the CUDA_GPU row whose twin has this Key (None if it is not a twin's Key)."""
    return key[: -len(TWIN_SUFFIX)] if key.endswith(TWIN_SUFFIX) and len(key) > len(TWIN_SUFFIX) else None


def pattern_twin(row: KernelRow) -> KernelRow:
    """The CUDA row that makes the compiler substitute the fusion pattern: every column as the kernel's own
    row (the pass only checks that a Function is there), DeviceType CUDA, its own Key."""
    return replace(row, key=twin_key(row.key), device_type=PATTERN_DEVICE_TYPE)


def distinct_kernels(rows: Iterable[KernelRow]) -> Iterator[KernelRow]:
    """One row per kernel: a fused kernel's CUDA twin stands for its CUDA_GPU row (the pair is one kernel, to
    export, verify and time once; a profile written to the CUDA_GPU row reaches the twin in the same write)."""
    seen: set[str] = set()
    for row in rows:
        if is_pattern_twin(row):
            row = replace(row, key=primary_key(row.key) or row.key, device_type=DEVICE_TYPE)
        if row.key not in seen:
            seen.add(row.key)
            yield row


def kernel_key(identifier: str, grid: tuple[int, ...], block: tuple[int, ...], body: str) -> str:
    """Same key <=> same kernel: identifier, launch dims and body all equal."""
    h = hashlib.sha256()
    for part in (identifier, repr(tuple(grid)), repr(tuple(block)), body):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return "kdb:" + h.hexdigest()


def map_parameters(op_type: str, params: tuple[Param, ...], dtype: str, inputs: int | None = None) -> list[str]:
    """The canonical tensor name (input0.., output0..) for each of the kernel's parameters.

    Parameters already named canonically keep their names (TVM writes `input0, input1, compute,
    input2` for conv+add+relu); the others take the op type's positional convention.
    """
    order = parameter_order(op_type, inputs).kernel_order
    unread = UNREAD_INPUTS.get(op_type, ())
    if unread and len(params) == len(order) - len(unread):  # the kernel leaves out inputs it never reads
        order = tuple(n for n in order if n not in unread)
    if len(params) != len(order):
        raise InputError(
            f"kernel has {len(params)} parameters, {op_type} needs {len(order)} "
            f"({', '.join(order)} in NNFusion's order)",
            where="code",
        )
    for p in params:
        if p.pointer_depth != 1 or p.base_type != dtype:
            raise InputError(
                f"parameter {p.name!r} is {p.text!r}; every tensor of a {dtype} kernel is passed as {dtype}*",
                where="code",
            )
    canonical_names = set(order)
    named = [p.name for p in params if p.name in canonical_names]
    if len(set(named)) != len(named):
        raise InputError("two parameters share a canonical name", where="code")
    if len(named) == len(params):
        return [p.name for p in params]  # all canonical: trust the names
    taken = set(named)
    mapped = []
    for p, conventional in zip(params, order, strict=True):
        if p.name in canonical_names:
            if p.name != conventional:
                raise InputError(
                    f"parameter {p.name!r} sits where {op_type}'s convention puts {conventional} "
                    f"({', '.join(order)}); rename it or reorder the parameters",
                    where="code",
                )
            mapped.append(p.name)
        else:
            if conventional in taken:
                raise InputError(f"parameter {p.name!r} would map to {conventional}, already used", where="code")
            mapped.append(conventional)
    return mapped


def nnfusion_signature(dtype: str, names: list[str], threads_per_block: int) -> str:
    """The signature NNFusion compiles a row's kernel alone with (it uses it verbatim), `names` the pointers in
    order (input0.., output0..).

    `__launch_bounds__` of the block size, as NNFusion's own CudaEmitter writes it: without it nvcc may give a
    thread more registers than a big block can have, and the launch fails ("too many resources requested", seen
    on the H200 with a tuned conv); NNFusion's import script leaves it out.

    `__restrict__` on every pointer, as TVM's kernel had them and NNFusion's own generated kernels have them
    (AntaresCudaKernelEmitter: all but its in-place pairs): the inputs are then read through the read-only
    path (`ld.global.nc`); on the H200 that took 3% off the geometric mean of 29 rows, 23% off a MaxPool (twelfth
    session). No pointer of a DB row can alias another that is written: NNFusion allocates an op's outputs before
    it frees its inputs (tensor_memory_layout) and shares an output with an input only for the in-place pairs a
    kernel emitter declares (reshape, broadcast, slice...), never for a DB row's."""
    params = ", ".join(f"{dtype}* __restrict__ {name}" for name in names)
    return f'extern "C" __launch_bounds__({threads_per_block}) __global__ void ({params})'


def one_block_signature(signature: str) -> str | None:
    """The signature with `__launch_bounds__(N, 1)` for `__launch_bounds__(N)` (None if it has no such bound).

    Under the maximum block size alone, ptxas may aim at full occupancy: on the H200 a tuned conv got 32
    registers and 3 KB of spills per thread and ran 7x its tuned time; asking for one resident block instead
    left it 255 registers and 296 bytes of spills. The block size still bounds the registers, so the launch
    never asks for more than a block can have."""
    bounded = re.sub(r"__launch_bounds__\(\s*(\d+)\s*\)", r"__launch_bounds__(\1, 1)", signature, count=1)
    return bounded if bounded != signature else None


def build_row(
    spec: KernelSpec,
    src: KernelSource,
    barriers: BarrierCount,
    *,
    extra_miscs: dict[str, Any] | None = None,
) -> KernelRow:
    """The row NNFusion will read for this kernel. InputError if the kernel cannot be stored."""
    if barriers.count is None:
        raise InputError(barriers.reason, where="code")
    if src.launch_bounds is not None and spec.threads_per_block > src.launch_bounds:
        raise InputError(
            f"blockDim has {spec.threads_per_block} threads but the kernel declares "
            f"__launch_bounds__({src.launch_bounds})",
            where="blockDim",
        )
    dtype = spec.op.dtype
    canonical = map_parameters(spec.op.op_type, src.params, dtype, len(spec.op.inputs))
    inputs = sorted({n for n in canonical if n.startswith("input")} | set(UNREAD_INPUTS.get(spec.op.op_type, ())))
    outputs = sorted(n for n in canonical if n.startswith("output"))
    block, body, block_body = spec.block, src.body, src.body_without_shared()
    padded = warp_padded_block(spec.block, barriers.count)
    if padded is not None:  # see core/cuda/warps.py: BlockFusion would hang on a partial warp with barriers
        block = padded
        body = pad_body(body, spec.threads_per_block, barriers.count)
        block_body = pad_body(block_body, spec.threads_per_block, barriers.count)
    signature = nnfusion_signature(dtype, inputs + outputs, math.prod(block))
    aliases = [
        f"{'const ' if p.is_const else ''}{p.base_type}* {p.name} = {name};"
        for p, name in zip(src.params, canonical, strict=True)
        if p.name != name
    ]
    prefix = "\n".join(aliases) + "\n" if aliases else ""
    shared_aliases = "".join(d.alias + "\n" for d in src.shared if d.alias)
    function_body = prefix + body
    function = {
        "function_signature": signature,
        "function_body": function_body,
        "grid_dim": list(spec.grid),
        "block_dim": list(block),
        "block_function_body": prefix + shared_aliases + block_body,
        "shared_memory": {
            "symbol": declared_symbols(src.shared),
            "dtype": [d.stored_dtype for d in src.shared],
            "size": aligned_sizes(src.shared),
        },
        "num_syncthreads": barriers.count,
    }
    identifier = spec.op.identifier
    p = spec.op.params
    tags = tags_for(spec.op.op_type, *(p.transpose_a, p.transpose_b) if isinstance(p, DotParams) else ())
    miscs: dict[str, Any] = {"external_profile": {"time": "", "resource": spec.resource}}
    kdb: dict[str, Any] = {"name": spec.name}
    if padded is not None:
        kdb["warp_padded"] = (f"blockDim {spec.threads_per_block} padded to {padded[0]} threads with non-aligned "
                              "barriers, so BlockFusion cannot hang on a partial warp")
    notes = list(spec.warnings) + list(src.notes)
    if notes:
        kdb["notes"] = notes
    if extra_miscs:
        kdb.update(extra_miscs)
    miscs["kdb"] = kdb
    return KernelRow(
        key=kernel_key(identifier, spec.grid, block, function_body),
        identifier=identifier,
        op_type=ROW_OP_TYPE.get(spec.op.op_type, spec.op.op_type),  # the column the compiler's fetch accepts
        attributes=_dumps(spec.op.attributes()),
        source=EXTERNAL_SOURCE,
        device_type=DEVICE_TYPE,
        function=_dumps(function),
        tags=tags,
        miscs=_dumps(miscs),
    )


def _dumps(value: Any) -> str:
    # allow_nan=False: NaN/Infinity are not JSON and nlohmann::json would throw on them.
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


DTYPE_BYTES = {"float": 4, "float2": 8, "float4": 16, "half": 2, "half2": 4, "double": 8, "int": 4,
               "unsigned int": 4, "char": 1, "signed char": 1, "unsigned char": 1, "int4": 16, "int2": 8,
               "short": 2, "long": 8, "long long": 8, "uint": 4, "int8_t": 1, "uint8_t": 1, "int32_t": 4,
               "uint32_t": 4, "int64_t": 8, "uint64_t": 8, "__half": 2, "__half2": 4, "bool": 1,
               **BLOCKFUSION_SHARED_DTYPES}


# The alignment declared_symbols puts before a symbol (lint and `kdb db repair` recognise it by this one pattern)
ALIGN_PREFIX = re.compile(r"^\s*__align__\s*\(\s*\d+\s*\)\s*")


def declared_symbols(shared: Iterable[SharedDecl]) -> list[str]:
    """The shared_memory symbols, each array that asks for an alignment declared with it: `__align__(N) name`.

    NNFusion writes each entry verbatim as `__shared__ <dtype> <symbol>[<size>];` (`<dtype>* <symbol> =
    (<dtype>*)(shared_buffer + <offset>);` in a BlockFusion kernel), and its dtype must be a scalar type. A plain
    float array is only 4-byte aligned, so nvcc cannot merge neighbouring shared loads into the 128-bit loads of
    TVM's kernel (`alignas(64)`): the H200 ran such a row 1.79x its own tuning record (docs/BENCHMARKS-HISTORY.md,
    eleventh session). With the alignment in the symbol the array is declared as TVM declared it; in the
    BlockFusion form it aligns a pointer variable, which changes nothing there.
    """
    out = []
    for d in shared:
        elem = DTYPE_BYTES.get(d.stored_dtype)
        out.append(f"__align__({d.align}) {d.symbol}" if d.align and elem and d.align > elem else d.symbol)
    return out


def aligned_sizes(shared: Iterable[SharedDecl]) -> list[int]:
    """The shared_memory sizes that keep each array's alignment where NNFusion puts it.

    NNFusion re-declares the arrays without TVM's `alignas(64)`: one after the other in a plain kernel, at
    running byte offsets of one `shared_buffer` in a BlockFusion kernel. A float4 load from an array that
    follows one of 2457 floats then faults ("misaligned address", seen on the H200). So when any array asks
    for an alignment, every array of the kernel is padded to a multiple of the largest one asked: then each
    starts on such a boundary in both forms. The kernel never reads the padding.
    """
    decls = list(shared)
    align = max((d.align for d in decls), default=0)
    sizes = []
    for d in decls:
        elem = DTYPE_BYTES.get(d.stored_dtype)
        if align and elem and align > elem:
            sizes.append(-(-d.size * elem // align) * align // elem)
        else:
            sizes.append(d.size)
    return sizes


def shared_bytes(function: dict[str, Any]) -> int | None:
    """Static shared memory a row's kernel declares, in bytes (None if a dtype is unknown)."""
    sm = function.get("shared_memory") or {}
    try:
        return sum(DTYPE_BYTES[t] * int(n) for t, n in zip(sm.get("dtype", []), sm.get("size", []), strict=True))
    except (KeyError, TypeError, ValueError):
        return None

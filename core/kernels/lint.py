"""Find every row the compiler could never fetch, or would crash on, and say why.

The checks mirror how NNFusion reads the file (KernelCacheManager::fetch_all and the cache emitters):
non-NULL text in every column, JSON that nlohmann::json parses, a supported OpType (one bad row
poisons every fetch of its identifier), CUDA_GPU rows, BlockCudaEmitter on External rows, a profile
string std::stof accepts, a Function the emitters can read, and an Identifier that matches what the
row's Attributes describe. Fused kernels are checked as pairs (see PATTERN_DEVICE_TYPE in ops.py): a
CUDA_GPU row without its CUDA twin is never used, a CUDA row without a CUDA_GPU row aborts the compiler.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from core.cuda.nvcc import SPILL_LIMIT_BYTES, max_threads_per_block
from core.cuda.shared_types import BLOCKFUSION_SHARED_DTYPES
from core.cuda.warps import partial_warp_barriers
from core.errors import InputError
from core.kernels.kernel_row import ALIGN_PREFIX, DTYPE_BYTES, KernelRow
from core.kernels.ops import (
    DEVICE_TYPE,
    FUSED_OP_TYPES,
    PATTERN_DEVICE_TYPE,
    SUPPORTED_OP_TYPES,
    UNSERVED_DTYPES,
    dtype_problem,
    op_of_row,
)
from core.kernels.opsig import signature_from_attributes
from core.kernels.profile import parse_profile

# Severity: "crash" - the compiler fails when it reads the row; "unreachable" - the row (or others)
# can never be fetched; "warning" - works, but is probably not what was meant.
CRASH, UNREACHABLE, WARNING = "crash", "unreachable", "warning"
KNOWN_DEVICE_TYPES = frozenset({"CUDA_GPU", "ROCM_GPU", "GENERIC_CPU", "HLSL", "GraphCore", "UNKNOWN"})


@dataclass(frozen=True, slots=True)
class Finding:
    rowid: int
    key: str
    identifier: str
    severity: str
    check: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"rowid": self.rowid, "key": self.key, "identifier": self.identifier, "severity": self.severity,
                "check": self.check, "message": self.message}


def _strict_json(text: str) -> Any:
    def reject(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=reject)


def lint_row(raw: tuple[Any, ...]) -> list[Finding]:
    """Findings for one row given as (rowid, Key, Identifier, OpType, Attributes, Source, DeviceType,
    Function, Tags, Miscs) exactly as stored."""
    rowid, key, ident, op_type, attrs, source, device, function, tags, miscs = raw
    key_s = key if isinstance(key, str) else repr(key)
    ident_s = ident if isinstance(ident, str) else repr(ident)
    out: list[Finding] = []

    def add(severity: str, check: str, message: str) -> None:
        out.append(Finding(rowid, key_s, ident_s, severity, check, message))

    names = ("Key", "Identifier", "OpType", "Attributes", "Source", "DeviceType", "Function", "Tags", "Miscs")
    values = (key, ident, op_type, attrs, source, device, function, tags, miscs)
    for name, value in zip(names, values, strict=True):
        if value is None:
            add(CRASH, "null", f"{name} is NULL: the compiler builds a std::string from it and crashes")
        elif isinstance(value, bytes):
            add(WARNING, "not-text", f"{name} is stored as a BLOB")
        elif not isinstance(value, str):
            add(WARNING, "not-text", f"{name} is stored as {type(value).__name__}, not TEXT")
    parsed: dict[str, Any] = {}
    for name, value in (("Attributes", attrs), ("Function", function), ("Miscs", miscs)):
        if not isinstance(value, str):
            continue
        try:
            parsed[name] = _strict_json(value)
        except (ValueError, RecursionError) as exc:
            what = "empty" if value == "" else f"not valid JSON ({exc})"
            add(CRASH, "json", f"{name} is {what}: nlohmann::json::parse throws")
    if isinstance(op_type, str) and op_type not in SUPPORTED_OP_TYPES:
        add(UNREACHABLE, "op-type", f"OpType {op_type!r} is not supported: every fetch of this identifier "
                                    "returns nothing, for all its rows")
    if isinstance(device, str) and device != DEVICE_TYPE and not _is_pattern_row(op_type, device):
        sev = WARNING if device in KNOWN_DEVICE_TYPES else UNREACHABLE
        add(sev, "device-type", f"DeviceType {device!r}: never fetched for CUDA (expected {DEVICE_TYPE})")
    tag_list = tags.split(",") if isinstance(tags, str) and tags else []
    if isinstance(tags, str) and (" " in tags or "" in tag_list):
        add(WARNING, "tags", f"Tags {tags!r} hold spaces or empty entries (the compiler splits on ',' only)")
    if source == "External" and "BlockCudaEmitter" not in tag_list:
        add(CRASH, "tags", "External row without the BlockCudaEmitter tag: the compiler CHECK-fails on it")
    if source == "Antares" and not {"BlockCudaEmitter", "CudaEmitter"} & set(tag_list):
        add(CRASH, "tags", "Antares row with neither the BlockCudaEmitter nor the CudaEmitter tag: the compiler "
            "CHECK-fails when it selects it")
    if "Miscs" in parsed:
        _check_miscs(parsed["Miscs"], add)
    if "Function" in parsed:
        _check_function(parsed["Function"], "BlockCudaEmitter" in tag_list, add)
        _check_element_type(parsed["Function"], parsed.get("Attributes"), ident, add)
        if "Miscs" in parsed:
            _check_launch_registers(parsed["Miscs"], parsed["Function"], add)
    if "Attributes" in parsed and isinstance(op_type, str) and isinstance(ident, str) \
            and op_type in SUPPORTED_OP_TYPES and op_type != "Matched_Pattern":
        try:
            expected = signature_from_attributes(op_of_row(op_type, ident), parsed["Attributes"]).identifier
        except InputError as exc:
            add(WARNING, "identifier", f"cannot rebuild the identifier from Attributes: {exc}")
        else:
            if expected != ident:
                add(UNREACHABLE, "identifier",
                    f"Identifier does not match its Attributes, which describe {expected!r}: "
                    "the compiler looks the op up by the latter")
    if _is_pattern_row(op_type, device):
        out = [f for f in out if f.check not in BODY_CHECKS]
    return out


# What a kernel's body does when it runs: nothing for a fused kernel's CUDA twin, which the compiler only checks
# for a Function and never compiles. Said once, on the CUDA_GPU row that runs.
BODY_CHECKS = frozenset({"register-spill", "partial-warp-barrier", "shared-alignment", "launch-registers",
                         "lane-indexed-fragments"})


def _is_pattern_row(op_type: Any, device: Any) -> bool:
    """A fused kernel's CUDA row, which the pattern-substitution pass looks for."""
    return device == PATTERN_DEVICE_TYPE and op_type in FUSED_OP_TYPES


def _check_miscs(miscs: Any, add: Any) -> None:
    if not isinstance(miscs, dict) or "external_profile" not in miscs:
        return
    prof = miscs["external_profile"]
    if not isinstance(prof, dict):
        add(CRASH, "profile", "external_profile is not an object")
        return
    if not isinstance(prof.get("time"), str):
        add(CRASH, "profile", "external_profile.time is missing or not a string")
    else:
        try:
            parse_profile(prof["time"])
        except InputError as exc:
            sev = WARNING if "does not end with ';'" in exc.reason else CRASH
            add(sev, "profile", f"malformed profile string: {exc.reason}")
    res = prof.get("resource")
    if isinstance(res, bool) or not isinstance(res, int | float):
        add(CRASH, "profile", "external_profile.resource is missing or not a number")
    _check_spills(miscs, add)




def block_form_resources(miscs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(arch, ptxas resources) of the block form (what NNFusion compiles) the nvcc check recorded in
    Miscs.kdb.compile; nothing where the row has no such record or it is malformed."""
    kdb = miscs.get("kdb") if isinstance(miscs, dict) else None
    compiled = kdb.get("compile") if isinstance(kdb, dict) else None
    for arch, kernels in compiled.items() if isinstance(compiled, dict) else ():
        block = kernels.get("kdb_block_kernel") if isinstance(kernels, dict) else None
        if isinstance(block, dict):
            yield arch, block


def _check_spills(miscs: dict[str, Any], add: Any) -> None:
    """The nvcc check's resources (Miscs.kdb.compile): ptxas spilling registers of the form NNFusion compiles.

    Seen on the H200: a tuned conv measured 86 us by the tuner ran 624 us as a row, ptxas having given it 32
    registers under its `__launch_bounds__` and 3 KB of spills per thread."""
    for arch, block in block_form_resources(miscs):
        spilled = block.get("spill_stores")
        if isinstance(spilled, int) and spilled > SPILL_LIMIT_BYTES:
            add(WARNING, "register-spill",
                f"{arch}: ptxas spills {spilled} bytes per thread ({block.get('registers', '?')} registers): the "
                "kernel is probably far slower than its tuning measured; time it (kdb gpu profile KEY) before "
                "trusting it")


def _check_launch_registers(miscs: Any, fn: Any, add: Any) -> None:
    """The registers nvcc gave the block form (Miscs.kdb.compile) against the threads the row launches: a block of
    more threads than its registers allow never starts ('too many resources requested for launch'), and NNFusion's
    code does not check its launches. A tensor-core tiling of many warps, each with many fp32 accumulators, can
    get there."""
    dims = fn.get("block_dim") if isinstance(fn, dict) else None
    if not (isinstance(dims, list) and all(isinstance(d, int) and d > 0 for d in dims)):
        return
    threads = dims[0] * dims[1] * dims[2] if len(dims) == 3 else 0
    for arch, block in block_form_resources(miscs):
        registers = block.get("registers")
        if isinstance(registers, int) and threads > (limit := max_threads_per_block(registers, arch)):
            add(CRASH, "launch-registers",
                f"{arch}: {registers} registers a thread allow {limit} threads a block, and the row launches "
                f"{threads}: the launch fails, unchecked by NNFusion's code, and the network computes without this "
                "kernel (regenerate or retune it with fewer warps a block)")


_ASM = re.compile(r"\b(?:__asm__|asm)\b\s*(?:__volatile__|volatile)?\s*\(")
_OPERAND = re.compile(r'"[^"]*"\s*\(')


def lane_indexed_fragments(body: str) -> bool:
    """Whether an mma.sync or ldmatrix of the body takes a register operand addressed by the lane (threadIdx): its
    fragments are then one array per thread indexed by threadIdx.x, 32x the registers, kept in local memory (what
    TVM 0.27 wrote before kdb lowered every warp buffer: core/codegen/mma.py)."""
    from core.cuda.source import mask, match_close

    masked = mask(body)
    for m in _ASM.finditer(masked):
        close = match_close(masked, m.end() - 1)
        if not re.search(r"mma\.sync|ldmatrix", body[m.end():close]):
            continue
        colon = masked.find(":", m.end(), close)
        for operand in _OPERAND.finditer(body, colon if colon >= 0 else close, close):
            end = match_close(masked, operand.end() - 1)
            if "threadIdx" in body[operand.end():end]:
                return True
    return False


def _check_function(fn: Any, block: bool, add: Any) -> None:
    if not isinstance(fn, dict):
        add(CRASH, "function", "Function is not a JSON object")
        return
    for name in ("function_signature", "function_body"):
        if not isinstance(fn.get(name), str):
            add(CRASH, "function", f"Function.{name} is missing or not a string")
    for name in ("grid_dim", "block_dim"):
        dims = fn.get(name)
        if not (isinstance(dims, list) and len(dims) == 3
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)):
            add(CRASH, "function", f"Function.{name} must be 3 positive integers, got {json.dumps(dims)[:40]}")
    if not block:
        return
    if not isinstance(fn.get("block_function_body"), str):
        add(CRASH, "function", "Function.block_function_body is missing or not a string")
    sm = fn.get("shared_memory")
    if not isinstance(sm, dict):
        add(CRASH, "function", "Function.shared_memory is missing (BlockCudaEmitter CHECK-fails)")
    else:
        lists = [sm.get(k) for k in ("symbol", "dtype", "size")]
        if sm and (not all(isinstance(v, list) for v in lists) or len({len(v) for v in lists}) != 1  # type: ignore[arg-type]
                   or not all(isinstance(n, int) and n > 0 for n in lists[2])):  # type: ignore[union-attr]
            add(CRASH, "function", "Function.shared_memory needs equal-length symbol/dtype/size lists, sizes > 0")
    n = fn.get("num_syncthreads")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        add(CRASH, "function", "Function.num_syncthreads is missing or not a non-negative integer")
    elif partial_warp_barriers(fn.get("block_dim"), n, fn.get("block_function_body")):
        add(WARNING, "partial-warp-barrier",
            f"blockDim {fn.get('block_dim')} ends in a partial warp and the kernel has {n} __syncthreads(): in a "
            "BlockFusion group with a larger blockDim the compiled network can hang (seen on the H200); "
            "rewrite it (kdb show KEY --export k.json; kdb inject --replace k.json): kdb now pads such blocks")
    _check_shared_alignment(fn, add)


# Half helpers TVM's CUDA prelude defines for its own kernels and NNFusion's generated code does not (TVM 0.27's
# codegen_cuda: its fp16 prelude); a row that calls one makes nnfusion_rt.cu fail to compile.
TVM_HALF_HELPERS = ("herf", "htanh", "hpow", "htan", "hatan", "half4", "make_half4", "__pack_half2")
STATIC_SHARED_LIMIT = 48 * 1024  # bytes of static shared memory a block may declare (nvcc refuses more)
_POINTER_PARAM = re.compile(r"([A-Za-z_][\w\s]*?)\s*\*")


def _check_element_type(fn: Any, attrs: Any, ident: Any, add: Any) -> None:
    """What a row of a given element type (half above all) must hold for the compiler to fetch and compile it: its
    signature in that type, shared arrays of BlockFusion's table within the static limit, no dynamic shared memory
    (every launch gets 0 bytes of it), none of TVM's own half helpers."""
    from core.cuda.source import find_words, mask

    dtype = attrs.get("dtype", "float") if isinstance(attrs, dict) else "float"
    if (problem := dtype_problem(dtype)) is not None or (isinstance(ident, str) and "bfloat16" in ident):
        add(UNREACHABLE, "dtype", f"element type: {problem or UNSERVED_DTYPES['bfloat16']}")
        return
    if not isinstance(fn, dict):
        return
    signature = fn.get("function_signature")
    if isinstance(signature, str) and "(" in signature:
        params = signature[signature.rfind("(") + 1:]
        types = {" ".join(w for w in t.split() if w not in ("const", "__restrict__", "volatile"))
                 for t in _POINTER_PARAM.findall(params)}
        if types and types != {dtype}:
            add(CRASH, "signature-dtype",
                f"function_signature passes {', '.join(sorted(types))}* and the row's tensors are {dtype}: the "
                f"compiler copies the signature as written and calls it with {dtype}* buffers, so nnfusion_rt.cu "
                "does not compile")
    sm = fn.get("shared_memory")
    dtypes, sizes = (sm.get("dtype"), sm.get("size")) if isinstance(sm, dict) else (None, None)
    if isinstance(dtypes, list):
        # a dtype that is no string (a list, an object: any JSON) is unknown too, and says so rather than raising
        unknown = sorted({str(t) for t in dtypes if not isinstance(t, str) or t not in BLOCKFUSION_SHARED_DTYPES})
        if unknown:
            add(CRASH, "shared-dtype",
                f"shared_memory declares {', '.join(repr(t) for t in unknown)}, which BlockFusion's table of shared "
                f"dtypes ({', '.join(BLOCKFUSION_SHARED_DTYPES)}) lacks: the compiler CHECK-fails 'Unknown data "
                "type' when it emits the row (re-inject the kernel: kdb declares a half array uint16_t and reads it "
                "as half)")
        elif isinstance(sizes, list) and len(sizes) == len(dtypes) and all(isinstance(n, int) for n in sizes):
            total = sum(BLOCKFUSION_SHARED_DTYPES[t] * n for t, n in zip(dtypes, sizes, strict=True))
            if total > STATIC_SHARED_LIMIT:
                add(CRASH, "shared-size",
                    f"{total:,} bytes of static shared memory, over the {STATIC_SHARED_LIMIT:,} a block may declare: "
                    "nvcc refuses the compiled network (NNFusion declares every array statically)")
    bodies = [b for b in (fn.get("function_body"), fn.get("block_function_body")) if isinstance(b, str)]
    masked = [mask(b) for b in bodies]
    if any(re.search(r"\bextern\s+__shared__\b|\b__shared__\s+extern\b", m) for m in masked):
        add(CRASH, "dynamic-shared",
            "the kernel declares dynamic shared memory (extern __shared__, TVM's shared.dyn): NNFusion launches every "
            "kernel with 0 bytes of it, so the kernel reads and writes outside any allocation")
    if any(lane_indexed_fragments(b) for b in bodies):
        add(WARNING, "lane-indexed-fragments",
            "an mma.sync or ldmatrix takes its registers from an array indexed by threadIdx: each thread keeps its "
            "warp's whole fragment (32x the registers) in local memory, and the row runs far slower than it could "
            "(generate it again: kdb lowers every warp buffer to registers)")
    if any(find_words(m, "nvcuda") for m in masked):
        add(CRASH, "wmma",
            "the kernel uses WMMA (nvcuda::wmma), declared in <mma.h>, which NNFusion's generated code does not "
            "include: nnfusion_rt.cu does not compile")
    if dtype == "half":
        used = sorted({h for m in masked for h in TVM_HALF_HELPERS if find_words(m, h)})
        if used:
            add(CRASH, "tvm-half-helper",
                f"the kernel calls {', '.join(used)}, defined only in TVM's CUDA prelude, which NNFusion's generated "
                "code lacks: nnfusion_rt.cu does not compile (kdb computes such functions in float, as NNFusion's own "
                "half kernels do)")


_ALIGNED_SHARED = re.compile(r"__shared__[^;]*?(?:alignas|__align__)\s*\(\s*(\d+)\s*\)")


def _check_shared_alignment(fn: dict[str, Any], add: Any) -> None:
    """The kernel asks for aligned shared arrays (TVM's alignas(64), for vector loads), and NNFusion re-declares
    them without it: only sizes that are multiples of the alignment keep each array on such a boundary."""
    body, sm = fn.get("function_body"), fn.get("shared_memory")
    if not isinstance(body, str) or not isinstance(sm, dict):
        return
    align = max((int(a) for a in _ALIGNED_SHARED.findall(body)), default=0)
    try:
        sizes = [DTYPE_BYTES[t] * int(n) for t, n in zip(sm.get("dtype", []), sm.get("size", []), strict=True)]
    except (KeyError, TypeError, ValueError):
        return
    if len(sizes) > 1 and align and any(size % align for size in sizes[:-1]):
        add(CRASH, "shared-alignment",
            f"the kernel's shared arrays ask for alignas({align}), which NNFusion's re-declaration drops, and their "
            "sizes do not keep it: vector loads fault with 'misaligned address' in the compiled network "
            "(re-inject the kernel with --replace: kdb now pads the sizes)")
    elif align > 4 and not any(ALIGN_PREFIX.match(str(s)) for s in sm.get("symbol") or []):
        add(WARNING, "shared-alignment-dropped",
            f"the kernel's shared arrays ask for alignas({align}) and the row declares them without it: nvcc cannot "
            "read them 128 bits at a time, and such a row ran 1.79x its own tuning record on the H200 "
            "(`kdb db repair --apply` writes `__align__(N) name` as the symbol; the row keeps its profile)")


def lint_kernel_row(row: KernelRow) -> list[Finding]:
    """Findings for one row read from the DB, on its own: the Kernels view's detail and `kdb show`."""
    return lint_row((0, *row.values()))


def lint_rows(rows: Iterable[tuple[Any, ...]]) -> Iterator[Finding]:
    """Findings for every row, plus what only the rows together tell: the identifiers a bad OpType
    poisons for its neighbours, and fused kernels whose pair of rows is broken."""
    poisoned: dict[tuple[str, str], str] = {}
    members: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    fused: set[tuple[str, str]] = set()
    for raw in rows:
        yield from lint_row(raw)
        rowid, key, ident, op_type, device = raw[0], raw[1], raw[2], raw[3], raw[6]
        if isinstance(ident, str) and isinstance(device, str):
            members[(ident, device)].append((rowid, key if isinstance(key, str) else repr(key)))
            if isinstance(op_type, str) and op_type not in SUPPORTED_OP_TYPES:
                poisoned[(ident, device)] = op_type
            if op_type in FUSED_OP_TYPES:
                fused.add((ident, device))
    for (ident, device), bad in poisoned.items():
        for rowid, key in members[(ident, device)]:
            yield Finding(rowid, key, ident, UNREACHABLE, "poisoned",
                          f"shares its identifier with a row of unsupported OpType {bad!r}: never fetched")
    for ident, device in sorted(fused):
        if device == DEVICE_TYPE and (ident, PATTERN_DEVICE_TYPE) not in members:
            for rowid, key in members[(ident, device)]:
                yield Finding(rowid, key, ident, UNREACHABLE, "pattern-twin",
                              f"fused kernel without a {PATTERN_DEVICE_TYPE} row of its identifier: the "
                              "pattern-substitution pass never replaces the convolution, so this row is never "
                              "used (`kdb db repair` adds the twin)")
        elif device == PATTERN_DEVICE_TYPE and (ident, DEVICE_TYPE) not in members:
            for rowid, key in members[(ident, device)]:
                yield Finding(rowid, key, ident, CRASH, "pattern-twin",
                              f"{PATTERN_DEVICE_TYPE} row without a {DEVICE_TYPE} row of its identifier: the "
                              "compiler substitutes the pattern, then finds no kernel for it and aborts")


def quick_problem(op_type: Any, attributes: Any, identifier: Any, source: Any, device: Any, tags: Any,
                  function_ok: Any, miscs_ok: Any, profile_time: Any, resource: Any) -> str:
    """The first problem of a row found without reading its big Function column ('' when none).

    Registered as an SQL function so the Kernels browser can show and filter lint status per page
    without loading bodies; the detail view runs the full lint_row.
    """
    if None in (op_type, identifier, source, device, tags, attributes):
        return "NULL column"
    if not all(isinstance(v, str) for v in (op_type, identifier, source, device, tags, attributes)):
        return "a text column holds a number or blob"
    if not function_ok or not miscs_ok:
        return "Function or Miscs is not valid JSON"
    if op_type not in SUPPORTED_OP_TYPES:
        return f"unsupported OpType {op_type}"
    if device != DEVICE_TYPE and not _is_pattern_row(op_type, device):
        return f"DeviceType {device}"
    if source == "External" and "BlockCudaEmitter" not in str(tags).split(","):
        return "External row without BlockCudaEmitter"
    if profile_time is not None:
        try:
            parse_profile(profile_time)
        except InputError as exc:
            return f"profile: {exc.reason}"
        if isinstance(resource, bool) or not isinstance(resource, int | float):
            return "profile resource missing"
    if op_type == "Matched_Pattern":
        return ""
    try:
        expected = signature_from_attributes(op_of_row(op_type, identifier), _strict_json(attributes)).identifier
    except (InputError, ValueError, RecursionError):
        return "Attributes unreadable"
    return "" if expected == identifier else "Identifier does not match Attributes"

"""What NNFusion's generated CUDA really runs, read from nnfusion_rt.cu.

`kernel_entry` runs the network: one statement per graph node, each after a `// name=<node>` comment. A
statement calls a kernel (`F_Call(grid, block, ...)`), a BlockFusion kernel (whose blocks call one
`__device__ ... _block_kernel` function per fused node), or a host function that calls cuDNN / cuBLAS; some
are `// eliminated:`. A kernel-DB row is in the code when its block_function_body appears in a function's
body (whitespace aside): NNFusion's cache emitters paste it verbatim, as the standalone kernel's body and as a
BlockFusion block function's body.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_DEFINITION = re.compile(
    r'^(?:extern "C" )?(?:__launch_bounds__\((\d+)\) )?(__global__|__device__(?: __noinline__| __forceinline__)?)?'
    r"\s*(?:void|int) (\w+)\(", re.MULTILINE)
_HOST_DEFINITION = re.compile(r"^(?:extern )?void (\w+)\(", re.MULTILINE)
_STEP = re.compile(r"^\s*// name=(\S+)\s*\n(\s*//\s*eliminated:.*|[^\n]*)", re.MULTILINE)
_CALLEE = re.compile(r"^\s*(\w+)\(")
_LIBRARY_CALL = re.compile(r"\b(cudnn\w+|cublas\w+)\s*\(")
_BLOCK_MEMBER = re.compile(r"_cuda_(\w+?)_block_kernel$")
# A body this short can be anyone's (`output0[i] = input0[i];`): too little to tell a DB row by.
MIN_BODY_CHARS = 24

KERNEL, BLOCKFUSION, LIBRARY, HOST, ELIMINATED = "kernel", "blockfusion", "library", "host", "eliminated"


@dataclass(frozen=True)
class Function:
    name: str
    kind: str  # "global", "device" or "host"
    body: str  # between the outermost braces
    launch_bounds: int | None = None  # a kernel's __launch_bounds__(N): ptxas keeps its registers to fit N threads


@dataclass(frozen=True)
class Step:
    """One statement of kernel_entry."""

    node: str
    function: str  # the function it runs ('' when eliminated)
    kind: str  # KERNEL, BLOCKFUSION, LIBRARY, HOST or ELIMINATED
    library: str = ""  # "cuDNN" / "cuBLAS" for LIBRARY steps
    members: tuple[str, ...] = ()  # a BlockFusion kernel's block functions, in block order
    # each block-function call, in block order: one per fused node (nodes of one kernel share its block function,
    # named after the first of them: an LSTM's Dots of one shape call one function many times)
    calls: tuple[str, ...] = ()


@dataclass
class Generated:
    functions: dict[str, Function]
    steps: list[Step]
    normalized: dict[str, str] = field(default_factory=dict, repr=False)  # function -> body without whitespace

    def library_calls(self) -> dict[str, int]:
        """cuDNN / cuBLAS statements in kernel_entry."""
        counts: dict[str, int] = {}
        for s in self.steps:
            if s.kind == LIBRARY:
                counts[s.library] = counts.get(s.library, 0) + 1
        return counts

    def containing(self, body: str) -> list[str]:
        """The functions whose body contains this kernel body (whitespace aside)."""
        needle = squash(body)
        if len(needle) < MIN_BODY_CHARS:
            return []
        return [name for name, text in self.normalized.items() if needle in text]


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def parse_generated(source: str) -> Generated:
    """The functions and kernel_entry steps of an nnfusion_rt.cu."""
    functions: dict[str, Function] = {}
    for match in _DEFINITION.finditer(source):
        bounds, qualifier, name = match.group(1), match.group(2), match.group(3)
        body = _body_after(source, match.end())
        if body is None:
            continue  # a declaration
        kind = "global" if qualifier == "__global__" else "device" if qualifier else "host"
        functions.setdefault(name, Function(name, kind, body, int(bounds) if bounds else None))
    for match in _HOST_DEFINITION.finditer(source):
        body = _body_after(source, match.end())
        if body is not None:
            functions.setdefault(match.group(1), Function(match.group(1), "host", body))
    entry = functions.get("kernel_entry")
    steps = [_step(m.group(1), m.group(2), functions) for m in _STEP.finditer(entry.body)] if entry else []
    generated = Generated(functions, steps)
    generated.normalized = {n: squash(f.body) for n, f in functions.items() if f.kind != "host" or n != "kernel_entry"}
    return generated


def _body_after(source: str, start: int) -> str | None:
    """The text inside the braces of the definition whose parameter list opens just before `start`."""
    depth, i = 1, start
    while i < len(source) and depth:  # the parameter list
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        i += 1
    while i < len(source) and source[i] in " \t\r\n":
        i += 1
    if i >= len(source) or source[i] != "{":
        return None
    depth, begin = 1, i + 1
    i = begin
    while i < len(source) and depth:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        i += 1
    return source[begin:i - 1]


def _step(node: str, statement: str, functions: dict[str, Function]) -> Step:
    if statement.lstrip().startswith("//"):
        return Step(node, "", ELIMINATED)
    match = _CALLEE.match(statement)
    callee = match.group(1) if match else ""
    name = callee.removesuffix("_Call")
    function = functions.get(name)
    if function is None:
        return Step(node, name, HOST)
    calls = _LIBRARY_CALL.findall(function.body)
    if function.kind == "host" and calls:
        return Step(node, name, LIBRARY, library="cuDNN" if calls[0].startswith("cudnn") else "cuBLAS")
    if function.kind == "host":
        return Step(node, name, HOST)
    calls = tuple(m for m in re.findall(r"\b(\w+_block_kernel)\s*\(", function.body) if m in functions)
    if name.startswith("BlockFusionKernel") or calls:
        return Step(node, name, BLOCKFUSION, members=tuple(dict.fromkeys(calls)), calls=calls)
    return Step(node, name, KERNEL)


def member_node(block_function: str) -> str:
    """The graph node a BlockFusion block function was emitted for (Convolution_52 for
    `Convolution_float_float_float_cuda_Convolution_52_block_kernel`)."""
    match = _BLOCK_MEMBER.search(block_function)
    return match.group(1) if match else block_function


@dataclass(frozen=True)
class RowUse:
    """A kernel-DB row and the generated functions that contain its body."""

    key: str
    identifier: str
    op_type: str
    functions: tuple[str, ...]


def rows_in_source(generated: Generated, rows: Iterable[tuple[str, str, str, str]]) -> list[RowUse]:
    """For (Key, Identifier, OpType, block_function_body) rows: the functions holding each one's body."""
    return [RowUse(key, ident, op_type, tuple(generated.containing(body))) for key, ident, op_type, body in rows]

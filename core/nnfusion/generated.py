"""What NNFusion's generated CUDA really runs, read from nnfusion_rt.cu.

`kernel_entry` runs the network: one statement per graph node, each after a `// name=<node>` comment. A
statement calls a kernel (`F_Call(grid, block, ...)`), a BlockFusion kernel (whose blocks call one
`__device__ ... _block_kernel` function per fused node), or a host function that calls cuDNN / cuBLAS; some
are `// eliminated:`. A kernel-DB row is in a function when the function runs that row's node: its body holds the
row's block_function_body (whitespace aside: NNFusion's cache emitters paste it verbatim, as the standalone kernel's
body and as a BlockFusion block function's body), the node comment NNFusion writes above the function gives the row's
input and output shapes and element types, and the function is launched with the row's grid and block (the
kernel_entry call's `dim3`s; a block function's own `gridDim`/`blockDim`). The body alone is not enough: TVM writes
byte-identical bodies for element-wise ops of different sizes whose grids fit them exactly.
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
# A host function that launches a kernel of NNFusion's own: its Softmax of rows up to 1024 elements calls ONNX
# Runtime's warp softmax (kernels/cuda_gpu/kernels/softmax.cpp; longer rows go to cudnnSoftmaxForward), its LayerNorm
# HostApplyLayerNorm, its attention's softmaxes ComputeSoftmax*, a half scale nnfusionHalfScale (the launching
# helpers of kernels/cuda_gpu/cuda_langunit.cpp)
_OWN_KERNEL_LAUNCH = re.compile(
    r"\b(?:dispatch_softmax_forward|HostApplyLayerNorm|ComputeSoftmax\w*)\s*<|\bnnfusionHalfScale\s*\(")
_BLOCK_MEMBER = re.compile(r"_cuda_(\w+?)_block_kernel$")
# A body this short can be anyone's (`output0[i] = input0[i];`): too little to tell a DB row by.
MIN_BODY_CHARS = 24

KERNEL, BLOCKFUSION, LIBRARY, HOST, ELIMINATED = "kernel", "blockfusion", "library", "host", "eliminated"


Dims = tuple[int, int, int]
TensorShapes = tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]  # (input shapes, output shapes)


@dataclass(frozen=True)
class NodeComment:
    """What NNFusion's comment above a function says of the node it was emitted for."""

    node: str
    op_type: str  # its Description
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # (C type, shape) of each input
    outputs: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Function:
    name: str
    kind: str  # "global", "device" or "host"
    body: str  # between the outermost braces
    launch_bounds: int | None = None  # a kernel's __launch_bounds__(N): ptxas keeps its registers to fit N threads
    comment: NodeComment | None = None  # the node comment above its definition
    launch: tuple[Dims, Dims] | None = None  # a block function's own (gridDim, blockDim)
    params: tuple[str, ...] = ()  # its parameters' names, in order


@dataclass(frozen=True)
class Step:
    """One statement of kernel_entry."""

    node: str
    function: str  # the function it runs ('' when eliminated)
    kind: str  # KERNEL, BLOCKFUSION, LIBRARY, HOST or ELIMINATED
    library: str = ""  # "cuDNN" / "cuBLAS" for LIBRARY steps
    launch: tuple[Dims, Dims] | None = None  # the call's (grid, block)
    members: tuple[str, ...] = ()  # a BlockFusion kernel's block functions, in block order
    # each block-function call, in block order: one per fused node (nodes of one kernel share its block function,
    # named after the first of them: an LSTM's Dots of one shape call one function many times)
    calls: tuple[str, ...] = ()
    # the node each call runs, by the tensor it writes (kernel_entry's argument for its output parameter); '' where
    # the code does not say
    call_nodes: tuple[str, ...] = ()
    # the tensors each call reads and writes, as kernel_entry names them: (inputs, outputs); () where not said
    call_tensors: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    skipped: str = ""  # an ELIMINATED step's function, as the comment names it
    args: tuple[str, ...] = ()  # an ELIMINATED step's tensor arguments (its launch's left out)


@dataclass(frozen=True)
class SkippedCopy:
    """A Concat NNFusion left out (`// eliminated:`) though its output is not its first input's memory: nothing writes
    the output. Its ConcatKernel::is_eliminative (kernels/cuda_gpu/kernels/concat.cpp) compares the two tensors'
    offsets in their memory pools and not the pools: a constant at offset 0 of the persistent pool and the output at
    offset 0 of the work pool look alike to it."""

    node: str
    first_input: str
    first_input_at: tuple[str, int]  # (pool, byte offset); a kernel_entry input is the caller's buffer
    output: str
    output_at: tuple[str, int]

    def describe(self) -> str:
        def at(address: tuple[str, int]) -> str:
            pool, offset = address
            return "the caller's buffer" if pool.startswith("the caller's") else f"{pool} + {offset}"

        return (f"NNFusion skips node {self.node}'s Concat (`// eliminated`) though its output {self.output} "
                f"({at(self.output_at)}) is not its first input {self.first_input} ({at(self.first_input_at)}): "
                "nothing writes the output, and the network "
                "computes wrong numbers (its ConcatKernel::is_eliminative compares pool offsets, not pools: "
                "kernels/cuda_gpu/kernels/concat.cpp). A DB row of the Concat is run instead of skipped: `kdb "
                "opconfig extract` makes one for a Concat NNFusion does not lay out in place")


@dataclass
class Generated:
    functions: dict[str, Function]
    steps: list[Step]
    normalized: dict[str, str] = field(default_factory=dict, repr=False)  # function -> body without whitespace
    # each tensor's shape, from NNFusion's comments ("- name: Relu_6_0 type: float shape: Shape{1, 16, 16, 16}")
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    # each pooled tensor's (pool, byte offset): `Relu_2_0 = (float*)(group_0_CUDA_GPU0_allocator_memory_pool+64);`
    addresses: dict[str, tuple[str, int]] = field(default_factory=dict, repr=False)

    def skipped_copies(self) -> list[SkippedCopy]:
        """The Concats left out whose output is not their first input's memory (SkippedCopy): both addresses known
        and different."""
        entry = self.functions.get("kernel_entry")
        callers = set(entry.params) if entry else set()  # kernel_entry's inputs: the caller's buffers, in no pool

        def where(tensor: str) -> tuple[str, int] | None:
            return self.addresses.get(tensor) or (("the caller's buffer " + tensor, 0) if tensor in callers else None)

        found = []
        for step in self.steps:
            if step.kind != ELIMINATED or not step.skipped.startswith("Concat_") or len(step.args) < 2:
                continue
            first, out = step.args[0], step.args[-1]
            first_at, out_at = where(first), where(out)
            if first_at is not None and out_at is not None and first_at != out_at:
                found.append(SkippedCopy(step.node, first, first_at, out, out_at))
        return found

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

    def launches(self, function: str) -> set[tuple[Dims, Dims]]:
        """Every (grid, block) the function runs with: its kernel_entry calls', or a block function's own."""
        own = self.functions[function].launch if function in self.functions else None
        found = {s.launch for s in self.steps if s.function == function and s.launch is not None}
        return found | ({own} if own is not None else set())

    def call_shapes(self, tensors: tuple[tuple[str, ...], tuple[str, ...]]) -> TensorShapes | None:
        """The (input shapes, output shapes) of a block-function call's tensors (Step.call_tensors); None when a
        comment does not give one of them."""
        ins, outs = tensors
        if not all(t in self.shapes for t in (*ins, *outs)):
            return None
        return tuple(self.shapes[t] for t in ins), tuple(self.shapes[t] for t in outs)

    def block_call_shapes(self, function: str) -> set[TensorShapes]:
        """The shapes of every BlockFusion call of this block function whose tensors are known: the nodes it runs,
        the commented one and those NNFusion deduped onto it alike."""
        found = (self.call_shapes(tensors) for step in self.steps
                 for called, tensors in zip(step.calls, step.call_tensors, strict=False) if called == function)
        return {shapes for shapes in found if shapes is not None}


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
        functions.setdefault(name, Function(name, kind, body, int(bounds) if bounds else None,
                                            _comment_before(source, match.start()), _own_launch(body),
                                            _param_names(source, match.end())))
    for match in _HOST_DEFINITION.finditer(source):
        body = _body_after(source, match.end())
        if body is not None:
            functions.setdefault(match.group(1), Function(match.group(1), "host", body,
                                                          params=_param_names(source, match.end())))
    entry = functions.get("kernel_entry")
    steps = [_step(m.group(1), m.group(2), functions) for m in _STEP.finditer(entry.body)] if entry else []
    generated = Generated(functions, steps)
    generated.shapes = {name: _shape(dims) for name, _, dims in _TENSOR.findall(source)}
    generated.addresses = {name: (pool, int(offset)) for name, pool, offset in _ADDRESS.findall(source)}
    generated.normalized = {n: squash(f.body) for n, f in functions.items() if f.kind != "host" or n != "kernel_entry"}
    return generated


def _shape(dims: str) -> tuple[int, ...]:
    """A comment's `Shape{1, 16, 16, 16}` contents as numbers."""
    return tuple(int(d) for d in dims.replace(" ", "").split(",") if d)


def _param_names(source: str, start: int) -> tuple[str, ...]:
    """The names in the parameter list opening just before `start` (`float* __restrict__ input0` gives input0)."""
    end = source.find(")", start)
    return tuple(m.group(1) for m in (re.search(r"(\w+)\s*$", p) for p in source[start:end].split(",")) if m)


def _top_level_args(call: str) -> list[str]:
    """The arguments of the first call in `call`, split at its own commas (not those inside a dim3(...))."""
    open_at = call.find("(")
    args, depth, current = [], 0, []
    for ch in call[open_at + 1:]:
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    return [*args, "".join(current).strip()] if open_at >= 0 else []


def _call_tensors(kernel: Function, caller: Function | None,
                  statement: str) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """For each block-function call of a BlockFusion kernel, the tensors it reads and writes: its inputN / outputN
    arguments bound through kernel_entry's call of `caller` (a tensor is named <node>_<output index>); () where the
    call's arguments are not the caller's parameters, '' for a tensor that cannot be read."""
    entry_args = _top_level_args(statement)
    if caller is None or len(caller.params) != len(entry_args) or caller.params[-len(kernel.params):] != kernel.params:
        return ()
    offset = len(entry_args) - len(kernel.params)  # the _Call's launch parameters come first, then the kernel's

    def bound(param: str) -> str:
        at = kernel.params.index(param) + offset if param in kernel.params else -1
        return entry_args[at] if 0 <= at < len(entry_args) else ""

    calls = []
    for call in re.finditer(r"\b\w+_block_kernel\s*\([^;]*\);", kernel.body):
        args = _top_level_args(call.group(0))
        calls.append((tuple(bound(a) for a in args if re.fullmatch(r"input\d+", a)),
                      tuple(bound(a) for a in args if re.fullmatch(r"output\d+", a))))
    return tuple(calls)


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


_NODE_NAME = re.compile(r"^// Node name:\s*(.*?)\s*$", re.MULTILINE)
_TENSOR = re.compile(r"^//\s*- name: (\S+)\s+type: (\w+)\s+shape: Shape\{([\d, ]*)\}", re.MULTILINE)
_DIM3 = re.compile(r"dim3\((\d+),\s*(\d+),\s*(\d+)\)")
_ADDRESS = re.compile(r"^\s*(\w+) = \([\w ]+\*\)\((\w+)\+(\d+)\);", re.MULTILINE)
_OWN_DIM3 = re.compile(r"const dim3 (blockDim|gridDim)\((\d+),\s*(\d+),\s*(\d+)\);")


def _comment_before(source: str, start: int) -> NodeComment | None:
    """The node comment just above a definition: `// Node name:`, `// Description:`, then `// Input:` and
    `// Output:` with one `//\t- name: ...\ttype: T\tshape: Shape{...}` line a tensor; None when there is none."""
    head = source.rfind("// Node name:", max(0, start - 20000), start)
    if head < 0:
        return None
    block = source[head:start]
    if any(line.strip() and not line.strip().startswith("//") for line in block.splitlines()):
        return None  # the comment belongs to something before: code stands between it and the definition
    name = _NODE_NAME.match(block)
    description = re.search(r"^// Description:\s*(.*?)\s*$", block, re.MULTILINE)
    inputs_at, outputs_at = block.find("// Input:"), block.find("// Output:")
    if name is None or inputs_at < 0 or outputs_at < 0:
        return None

    def tensors(text: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return tuple((t, _shape(dims)) for _, t, dims in _TENSOR.findall(text))

    return NodeComment(name.group(1), description.group(1) if description else "",
                       tensors(block[inputs_at:outputs_at]), tensors(block[outputs_at:]))


def _own_launch(body: str) -> tuple[Dims, Dims] | None:
    """A BlockFusion block function's launch, from its `const dim3 gridDim(...)` and `blockDim(...)` lines."""
    dims = {kind: (int(x), int(y), int(z)) for kind, x, y, z in _OWN_DIM3.findall(body[:2000])}
    return (dims["gridDim"], dims["blockDim"]) if {"gridDim", "blockDim"} <= dims.keys() else None


def _call_launch(statement: str) -> tuple[Dims, Dims] | None:
    """The (grid, block) of a kernel_entry call `F_Call(dim3(..), dim3(..), ...)`."""
    dims = _DIM3.findall(statement)
    if len(dims) < 2:
        return None
    grid, block = ((int(x), int(y), int(z)) for x, y, z in dims[:2])
    return grid, block


def _step(node: str, statement: str, functions: dict[str, Function]) -> Step:
    if statement.lstrip().startswith("//"):
        call = statement.split("eliminated:", 1)[-1].strip()
        match = _CALLEE.match(call)
        args = tuple(a for a in _top_level_args(call) if re.fullmatch(r"[A-Za-z_]\w*", a))  # (0s and dim3s left out)
        return Step(node, "", ELIMINATED, skipped=match.group(1).removesuffix("_Call") if match else "", args=args)
    match = _CALLEE.match(statement)
    callee = match.group(1) if match else ""
    name = callee.removesuffix("_Call")
    function = functions.get(name)
    if function is None:
        return Step(node, name, HOST)
    calls = _LIBRARY_CALL.findall(function.body)
    if function.kind == "host" and calls:
        return Step(node, name, LIBRARY, library="cuDNN" if calls[0].startswith("cudnn") else "cuBLAS")
    if function.kind == "host" and _OWN_KERNEL_LAUNCH.search(function.body):
        return Step(node, name, KERNEL)
    if function.kind == "host":
        return Step(node, name, HOST)
    calls = tuple(m for m in re.findall(r"\b(\w+_block_kernel)\s*\(", function.body) if m in functions)
    if name.startswith("BlockFusionKernel") or calls:
        tensors = _call_tensors(function, functions.get(callee), statement)
        tensors = tensors if len(tensors) == len(calls) else ()
        call_nodes = tuple(re.sub(r"_\d+$", "", outs[0]) if outs else "" for _, outs in tensors)
        return Step(node, name, BLOCKFUSION, members=tuple(dict.fromkeys(calls)), calls=calls,
                    launch=_call_launch(statement), call_nodes=call_nodes, call_tensors=tensors)
    return Step(node, name, KERNEL, launch=_call_launch(statement))


def member_node(block_function: str) -> str:
    """The graph node a BlockFusion block function was emitted for (Convolution_52 for
    `Convolution_float_float_float_cuda_Convolution_52_block_kernel`)."""
    match = _BLOCK_MEMBER.search(block_function)
    return match.group(1) if match else block_function


@dataclass(frozen=True)
class RowUse:
    """A kernel-DB row and the generated functions that run it (its body, its node's tensors, its launch)."""

    key: str
    identifier: str
    op_type: str
    functions: tuple[str, ...]


@dataclass(frozen=True)
class RowFacts:
    """What tells a row's node in the code: its emitted body, its tensors (C type, shape) and its launch."""

    key: str
    identifier: str
    op_type: str
    body: str
    inputs: tuple[tuple[str, tuple[int, ...]], ...] | None = None  # None: not known (not checked)
    outputs: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    launch: tuple[Dims, Dims] | None = None


def rows_in_source(generated: Generated, rows: Iterable[RowFacts]) -> list[RowUse]:
    """For each row: the functions holding its body whose node it is (tensors) and that run at its launch."""
    return [RowUse(r.key, r.identifier, r.op_type,
                   tuple(f for f in generated.containing(r.body) if _runs_row(generated, f, r))) for r in rows]


def _runs_row(generated: Generated, function: str, row: RowFacts) -> bool:
    """Whether the function, holding the row's body, runs the row's node: one of its launches is the row's, and where
    that launch is the commented node's own (NNFusion emits one function for nodes whose code is the same, and its
    comment describes the first of them), the comment's tensors are the row's. What is not known on either side is
    not held against the row."""
    launches = generated.launches(function)
    if row.launch is not None and launches and row.launch not in launches:
        return False
    comment = generated.functions[function].comment
    if comment is None or row.inputs is None or row.outputs is None:
        return True
    callers = {s.node for s in generated.steps if s.function == function and s.launch == row.launch}
    own = not callers or callers == {comment.node}  # a block function, or the commented node's own call alone
    if not own or (comment.inputs, comment.outputs) == (row.inputs, row.outputs):
        return True
    # a block function NNFusion deduped another node's kernel onto (byte-identical code): a call of it on the row's
    # tensors runs the row (the comment above it describes only the first node)
    return row_shapes(row) in generated.block_call_shapes(function)


def row_shapes(row: RowFacts) -> TensorShapes:
    return tuple(s for _, s in row.inputs or ()), tuple(s for _, s in row.outputs or ())

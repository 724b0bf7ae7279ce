"""An fp32 ONNX model made fp16 for the user, by onnxconverter-common's float16 converter (not one of our own).

The converter makes every float tensor half: initializers, inputs and outputs (unless asked to keep the graph's inputs
and outputs float, with Casts at the edges), and puts Casts around the ops it keeps in float (its block list). Depthwise
convolutions go on that list: NNFusion's own half depthwise kernel is no valid CUDA (HALF_DEPTHWISE), so a network
with one in half compiles and then never builds; in float, between Casts, it builds and runs. Half means (ReduceMean)
are then written as MatMuls for the importer (import_rewrites._half_mean: NNFusion's half Sum overflows). NNFusion
then compiles the model in half and looks every op up with `half` identifiers (docs/NNFUSION-RULES.md, "Half rows").
The file is written whole or not at all (a temporary name renamed), and never over the model it reads.
"""

from __future__ import annotations

import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError, ToolError
from core.opconfigs.expand_functions import expand_functions
from core.opconfigs.import_rewrites import constants_for_import, drop_orphans, fresh_name, input_dim_names, reads
from core.opconfigs.import_rules import constant_values
from core.opconfigs.nnfusion_import import import_faults, with_shapes
from core.opconfigs.onnx_extract import extraction_miscompiles, read_model, write_model

FLOAT, FLOAT16 = 1, 10  # ONNX TensorProto element types
_INSTALL = "pip install -e '.[tvm]' (onnxconverter-common)"


@dataclass(frozen=True)
class Fp16Conversion:
    source: Path
    output: Path
    nodes: int  # nodes of the converted graph
    casts_added: int  # Cast nodes the converter put in (around ops kept in float, at kept float inputs/outputs)
    half_initializers: int
    float_initializers: int  # left float by the converter (weights of ops it keeps in float)
    io_types: str  # "half" or "float" (keep_io_types)
    clamped: int = 0  # weight and Constant values clamped to half's range (MIN_POSITIVE, MAX_FINITE)
    kept_float: tuple[str, ...] = ()  # nodes kept in float (depthwise convolutions: see the module's docstring)
    # the first node (a square) of each norm statistic kept in float: square, mean, epsilon, square root
    statistics_float: tuple[str, ...] = ()
    # the Sin and Cos nodes kept in float with the chain that computes their angle (a timestep's or a position's)
    angles_float: tuple[str, ...] = ()
    # (op type, nodes) the converter's own block list keeps in float, between Casts (Max, Min, Resize, TopK, ...)
    blocked: tuple[tuple[str, int], ...] = ()
    # what was then written for NNFusion's importer (import_rewrites.constants_for_import), by kind
    for_import: tuple[tuple[str, int], ...] = ()
    faults: int = 0  # nodes of the written model NNFusion cannot compile or compiles into another network
    # nodes `kdb model expand` would leave so (a trial expansion of the written model), and how many faults it mends
    left_by_expand: tuple[str, ...] = ()
    mended_by_expand: int = 0
    dynamic_dims: tuple[str, ...] = ()  # the graph's named dimensions: expand's --dim gives them sizes

    def report_lines(self) -> list[str]:
        """What was written and what was kept in float, as `kdb model fp16` and the console say it."""
        kept = f", {self.float_initializers} left float" if self.float_initializers else ""
        kept += (f"; {self.clamped:,} weight and Constant values clamped to half's range (|x| > 65,504 to 65,504; "
                 "0 < |x| < 1e-7 to 1e-7)" if self.clamped else "")
        lines = [f"written: {self.output} (fp16: {self.half_initializers} initializers in half{kept}; {self.nodes} "
                 f"nodes, {self.casts_added} Casts added; inputs and outputs {self.io_types})"]
        if self.kept_float:
            lines.append(f"kept in float: {len(self.kept_float)} depthwise convolution(s) "
                         f"({', '.join(self.kept_float[:5])}{', ...' if len(self.kept_float) > 5 else ''}), with Casts "
                         "around them: NNFusion's own half depthwise kernel does not compile "
                         "(core/kernels/cuda_gpu/kernels/depthwise_conv2d.cpp writes `float *input = input0;`)")
        if self.statistics_float:
            lines.append(f"kept in float: {len(self.statistics_float)} norm statistic(s) (a square, its mean and what "
                         f"follows to the square root: {', '.join(self.statistics_float[:3])}"
                         f"{', ...' if len(self.statistics_float) > 3 else ''}), with Casts around them: in half a "
                         "square is inf once a value is 256 from the mean")
        if self.angles_float:
            lines.append(f"kept in float: {len(self.angles_float)} Sin/Cos ({', '.join(self.angles_float[:3])}"
                         f"{', ...' if len(self.angles_float) > 3 else ''}) and what computes their angles from a "
                         "constant frequency, with Casts around them: in half an angle of 1,000 (a diffusion "
                         "timestep's) is off by up to 0.5, and its sine by as much")
        if self.blocked:
            lines.append(f"kept in float by onnxconverter-common's block list: {sum(n for _, n in self.blocked)} "
                         f"node(s) ({', '.join(f'{op} x {n}' for op, n in self.blocked)}), with Casts around them: "
                         "they compute in fp32, and NNFusion looks them up with float identifiers")
        if self.for_import:
            lines.append("for NNFusion's importer: " + ", ".join(f"{n} x {kind}" for kind, n in self.for_import)
                         + " (what its importer cannot take, or NNFusion computes wrong, in half: a half Constant, "
                         "a Resize's scales computed, a mean summed in half; docs/NNFUSION-RULES.md)")
        if self.faults and not self.left_by_expand:  # (expand mends them all)
            lines.append(f"still to expand: {self.faults} node(s) NNFusion cannot compile as written, or compiles into "
                         "another network; `kdb model expand` rewrites them (`kdb coverage` names them)")
        elif self.left_by_expand:
            left = self.left_by_expand
            lines.append(f"NNFusion cannot compile {self.faults} node(s) as written, or compiles them into another "
                         f"network, and `kdb model expand` leaves {len(left)} so: {', '.join(left[:5])}"
                         f"{', ...' if len(left) > 5 else ''} (`kdb coverage` says why)")
        return lines

    @property
    def expand_helps(self) -> bool:
        """Whether `kdb model expand` of the written model mends some of its faults: the next step then."""
        return self.mended_by_expand > 0

    def as_dict(self) -> dict[str, object]:
        return {"source": str(self.source), "output": str(self.output), "nodes": self.nodes,
                "casts_added": self.casts_added, "half_initializers": self.half_initializers,
                "float_initializers": self.float_initializers, "io_types": self.io_types, "clamped": self.clamped,
                "kept_float": list(self.kept_float), "statistics_float": list(self.statistics_float),
                "angles_float": list(self.angles_float),
                "blocked": dict(self.blocked),
                "for_import": dict(self.for_import), "faults": self.faults,
                "left_by_expand": list(self.left_by_expand), "mended_by_expand": self.mended_by_expand,
                "dynamic_dims": list(self.dynamic_dims)}


def convert_to_fp16(source: Path, output: Path, *, keep_io_types: bool = False) -> Fp16Conversion:
    """Write `source` converted to fp16 as `output`; InputError naming the file when it cannot be read or converted."""
    try:
        from onnxconverter_common import float16
    except ImportError as exc:
        raise ToolError(f"converting a model to fp16 needs onnxconverter-common: {_INSTALL}") from exc
    if output.resolve() == source.resolve():
        raise InputError("the fp16 model would overwrite the fp32 one it is made from: give another OUT path",
                         where=str(output))
    model = read_model(source)
    elems = _float_types(model)
    if FLOAT not in elems:
        have = "already fp16" if FLOAT16 in elems else "no float tensors"
        raise InputError(f"nothing to convert: the model has {have}", where=str(source))
    if made := _made_fp16(model):  # (its float parts are what a conversion kept in float: the converter fails on them)
        raise InputError(f"nothing to convert: the model is fp16 already, with float parts between Casts ({made}); "
                         "convert the fp32 model it was made from", where=str(source))
    casts_before, clamped = _casts(model), _clamped_values(model)
    try:
        with warnings.catch_warnings(record=True) as said:  # one warning per clamped value: counted, not printed
            warnings.simplefilter("always")
            _initializers_of_identities(model)
            kept = _name_depthwise_convs(model)
            statistics = _name_square_statistics(model)
            angles = _name_angles(model)
            angled = set(angles)
            in_float = [*kept, *(name for chain in statistics for name in chain), *angles]
            _constants_of_kept(model, set(in_float))
            _unshared(model, set(in_float))
            casts_of_model = _cast_ends(model)
            # check_fp16_ready off: a float model may hold a half tensor or two (a rounding Cast pair) and is still
            # a float model to convert; one with no float tensor was refused above
            converted = float16.convert_float_to_float16(model, keep_io_types=keep_io_types,
                                                         node_block_list=in_float or None, check_fp16_ready=False,
                                                         min_positive_val=MIN_POSITIVE, max_finite_val=MAX_FINITE)
    except Exception as exc:  # the converter raises plain exceptions of its own for graphs it cannot handle
        raise InputError(f"onnxconverter-common could not convert it: {type(exc).__name__}: {exc}",
                         where=str(source)) from exc
    del said  # the converter warns per tensor; the values it clamps are counted below instead
    _float_between_kept(converted, casts_of_model)
    # (counted before the import's folding, which may take out Casts of the model's own: "-4 Casts added")
    casts_added = _casts(converted) - casts_before
    blocked = _blocked_in_float(converted, float16.DEFAULT_OP_BLOCK_LIST)
    _cast_to_declared_half(converted)
    for_import = constants_for_import(converted)
    _check(converted, source)
    write_model(converted, output)
    shaped = with_shapes(converted)  # (what extraction and coverage then find: expand mends some of it)
    blockers, shape_warnings = import_faults(shaped)
    own, clashes = extraction_miscompiles(shaped)
    faults = {f.node for f in (*blockers, *shape_warnings, *own, *clashes)}
    dynamic = input_dim_names(converted.graph)
    left = _left_after_expand(output, dynamic) if faults else ()
    initializers = Counter(t.data_type for t in converted.graph.initializer)
    return Fp16Conversion(source, output, len(converted.graph.node), casts_added, initializers[FLOAT16],
                          initializers[FLOAT], "float" if keep_io_types else "half", clamped, kept,
                          tuple(chain[0] for chain in statistics),
                          tuple(n.name for n in model.graph.node if n.op_type in ("Sin", "Cos") and n.name in angled),
                          tuple(sorted(blocked.items())),
                          tuple(sorted(for_import.items())),
                          len(faults), left, len(faults - set(left)), dynamic)


def _left_after_expand(path: Path, dynamic: tuple[str, ...]) -> tuple[str, ...]:
    """The nodes `kdb model expand` of the model at `path` leaves NNFusion unable to compile, or compiling into another
    network (expanded into a temporary folder, then dropped; its dynamic dimensions given a size, as --dim does)."""
    with tempfile.TemporaryDirectory() as folder:
        expansion = expand_functions(path, Path(folder) / path.name, dict.fromkeys(dynamic, 1))
    return tuple(dict.fromkeys([*(n for n, _, _ in expansion.blocked), *(n for n, _, _ in expansion.miscompiled)]))


def _blocked_in_float(model: Any, block_list: Any) -> Counter[str]:
    """Nodes of the converter's block list that compute on float tensors (not those of an int shape computation)."""
    import onnx

    graph = model.graph
    typed = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output, *graph.input)
             if v.type.HasField("tensor_type")}
    typed.update((t.name, t.data_type) for t in graph.initializer)
    if not graph.value_info:  # (the converter ran without shapes: learn the types once)
        inferred = onnx.shape_inference.infer_shapes(model).graph
        typed.update((v.name, v.type.tensor_type.elem_type) for v in inferred.value_info
                     if v.type.HasField("tensor_type"))
    return Counter(n.op_type for n in graph.node if n.op_type in block_list
                   and any(typed.get(t) == FLOAT for t in (*n.input, *n.output) if t))


def _cast_to_declared_half(model: Any) -> None:
    """The converter makes a Cast's output half (its value info) but leaves the Cast's `to` float where the model
    casts to float itself (BERT's additive mask: the int mask Cast to float): such a Cast now casts to half, as the
    graph around it declares (ONNX Runtime and NNFusion refuse the model otherwise)."""
    graph = model.graph
    declared = {v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)
                if v.type.HasField("tensor_type")}
    for node in graph.node:
        if node.op_type == "Cast" and declared.get(node.output[0]) == FLOAT16:
            for a in node.attribute:
                if a.name == "to" and a.i == FLOAT:
                    a.i = FLOAT16


def _check(model: Any, source: Path) -> None:
    """ONNX's own checker, with its type inference: a converted model it refuses is never written."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # onnx's checker raises ValidationError and InferenceError, both with the node named
        raise InputError(f"onnxconverter-common's fp16 model is no valid ONNX, so it is not written: {exc}",
                         where=str(source)) from exc


def _initializers_of_identities(model: Any) -> None:
    """An Identity of an initializer as an initializer of its own, under its output's name: torch's export aliases
    equal constants so (a zero bias of several convolutions), and a kept-float depthwise convolution and a converted
    one would then read one tensor (the converter makes it half: the model is no valid ONNX)."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    read_before, kept = reads(graph), []
    for node in graph.node:
        source = initializers.get(node.input[0]) if node.op_type == "Identity" and node.input else None
        if source is None or node.output[0] in outputs:
            kept.append(node)
            continue
        graph.initializer.append(_copy(source, node.output[0]))
    del graph.node[:]
    graph.node.extend(kept)
    drop_orphans(graph, read_before)


def _unshared(model: Any, kept: set[str]) -> None:
    """Each initializer a kept-float node shares with a converted one, copied for the kept node (see above)."""
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    converted_reads = {t for n in graph.node if n.name not in kept for t in n.input}
    taken = set(initializers) | {t for n in graph.node for t in (*n.input, *n.output)}
    for node in graph.node:
        if node.name not in kept:
            continue
        for k, name in enumerate(node.input):
            if name in initializers and name in converted_reads:
                node.input[k] = fresh_name(taken, f"{name}_float")
                taken.add(node.input[k])
                graph.initializer.append(_copy(initializers[name], node.input[k]))


def _copy(tensor: Any, name: str) -> Any:
    copy = type(tensor)()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


def _named(node: Any, names: set[str], prefix: str) -> str:
    """The node's name, naming it (prefix_k, unused) where it has none: the converter's block list goes by name."""
    if not node.name:
        node.name = fresh_name(names, prefix)
    return node.name


def _name_depthwise_convs(model: Any) -> tuple[str, ...]:
    """The names of the model's depthwise convolutions (group > 1, one input channel a filter), naming any unnamed
    one."""
    filters = {t.name: list(t.dims) for t in model.graph.initializer}
    names = {n.name for n in model.graph.node}
    found = []
    for node in model.graph.node:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        weight = filters.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if group > 1 and weight is not None and len(weight) > 1 and weight[1] == 1:
            found.append(_named(node, names, "depthwise"))
    return tuple(found)


MEANS = {"ReduceMean", "ReduceSum", "MatMul"}  # (a MatMul by a constant column: `kdb model expand`'s mean)
AFTER_MEAN = ("Add", "Sqrt", "Reciprocal")  # + epsilon, its root, its inverse: each optional, in this order


def _name_square_statistics(model: Any) -> list[tuple[str, ...]]:
    """The norm statistics of the model, each named node by node: a square (Mul(x, x), Pow(x, 2)) read only by a mean,
    then whatever of + constant, Sqrt and Reciprocal follows, each read by the next alone. In half a square passes
    65,504 once a value is 256 from the mean (an opset-13 LayerNorm's Pow(x - mean, 2), an RMSNorm's x * x, the
    GroupNorm `kdb model expand` writes: ONNX Runtime computes them in float, NNFusion in half); kept in float,
    between Casts, the root that comes out fits half whenever x does."""
    graph = model.graph
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def only_reader(node: Any) -> Any | None:
        found = readers.get(node.output[0], [])
        return found[0] if len(found) == 1 and node.output[0] not in outputs else None

    names, chains = {n.name for n in graph.node}, []
    for node in graph.node:
        mean = only_reader(node) if _is_square(node, graph) else None
        if mean is None or mean.op_type not in MEANS or mean.input[0] != node.output[0] or (
                mean.op_type == "MatMul" and mean.input[1] not in constants):
            continue
        chain, last = [node, mean], mean
        for op_type in AFTER_MEAN:
            after = only_reader(last)
            if after is not None and after.op_type == op_type and (
                    op_type != "Add" or any(t in constants for t in after.input)):
                chain.append(after)
                last = after
        chains.append(tuple(_named(n, names, f"statistic_{n.op_type}") for n in chain))
    return chains


# What computes a Sin's or Cos's angle from a timestep or a position: scaled by constant frequencies, reshaped, cast
ANGLE_OPS = {"Mul", "Div", "Add", "Sub", "Unsqueeze", "Reshape", "Squeeze", "Flatten", "Transpose", "Expand", "Cast"}


def _name_angles(model: Any) -> list[str]:
    """The Sin and Cos nodes, and back from them the nodes that compute their angle (ANGLE_OPS, each with one input
    that is not a constant, each read by those nodes alone), named. In half an angle of 1,000 is off by up to 0.5:
    a diffusion model's timestep embedding, NeRF's or a Fourier feature network's high frequencies (torch's own
    diffusers computes them in float in a half model)."""
    graph = model.graph
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    chain = [n for n in graph.node if n.op_type in ("Sin", "Cos")]
    taken, frontier = {id(n) for n in chain}, list(chain)
    while frontier:
        for name in frontier.pop().input:
            node = producer.get(name)
            if node is None or id(node) in taken or node.op_type not in ANGLE_OPS or name in outputs \
                    or sum(1 for t in node.input if t and t not in constants) != 1 \
                    or any(id(r) not in taken for r in readers.get(name, [])):
                continue
            taken.add(id(node))
            chain.append(node)
            frontier.append(node)
    names = {n.name for n in graph.node}
    return [_named(n, names, f"angle_{n.op_type}") for n in graph.node if id(n) in taken]


def _constants_of_kept(model: Any, kept: set[str]) -> None:
    """Each float Constant node read by a node kept in float written as an initializer: the converter makes a Constant
    half whoever reads it (a frequency 0.0001 then rounds to 0.000100016), an initializer only its readers keep float
    it leaves float."""
    graph = model.graph
    read_by_kept = {t for n in graph.node if n.name in kept for t in n.input}
    nodes = []
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is None or node.output[0] not in read_by_kept or value.data_type != FLOAT:
            nodes.append(node)
            continue
        graph.initializer.append(_copy(value, node.output[0]))
    del graph.node[:]
    graph.node.extend(nodes)


def _cast_ends(model: Any) -> set[tuple[str, str]]:
    return {(n.input[0], n.output[0]) for n in model.graph.node if n.op_type == "Cast"}


def _float_between_kept(model: Any, of_model: set[tuple[str, str]]) -> None:
    """The converter's round trips to half between two nodes it keeps in float taken out: where a kept node's float
    output has several readers (an angle read by a Sin and a Cos) it casts it to half and each reader back to float,
    and the rounding it set out to avoid happens there. Casts the model had (of_model: input, output) stay."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}

    def cast_to(node: Any, to: int) -> bool:
        return node.op_type == "Cast" and (node.input[0], node.output[0]) not in of_model and any(
            a.name == "to" and a.i == to for a in node.attribute)

    renamed: dict[str, str] = {}
    for node in graph.node:
        down = producer.get(node.input[0]) if node.input else None
        if cast_to(node, FLOAT) and down is not None and cast_to(down, FLOAT16) and node.output[0] not in outputs:
            renamed[node.output[0]] = down.input[0]
    if not renamed:
        return
    dropped = set(renamed)
    for node in graph.node:
        node.input[:] = [renamed.get(t, t) for t in node.input]
    read = {t for n in graph.node if n.output[0] not in dropped for t in n.input} | outputs
    unread = {n.output[0] for n in graph.node if cast_to(n, FLOAT16) and n.output[0] not in read}
    kept = [n for n in graph.node if n.output[0] not in dropped | unread]
    del graph.node[:]
    graph.node.extend(kept)


def _is_square(node: Any, graph: Any) -> bool:
    """Mul(x, x), or Pow(x, 2) of a constant 2."""
    if node.op_type == "Mul" and len(node.input) == 2:
        return node.input[0] == node.input[1]
    return node.op_type == "Pow" and len(node.input) == 2 and constant_values(graph, node.input[1]) == [2.0]


def _made_fp16(model: Any) -> str:
    """What says a model was converted already (half graph inputs or outputs, half weights, Casts into half), or "".
    A float model with a rounding Cast pair has no half weights and no half inputs: it is still one to convert."""
    graph = model.graph
    weights = Counter(t.data_type for t in graph.initializer)
    io_half = [v.name for v in (*graph.input, *graph.output) if v.type.tensor_type.elem_type == FLOAT16]
    if not weights[FLOAT16] or not io_half:
        return ""
    casts = sum(n.op_type == "Cast" and any(a.name == "to" and a.i == FLOAT16 for a in n.attribute)
                for n in graph.node)
    return f"{weights[FLOAT16]} initializers in half, {weights[FLOAT]} in float, {casts} Casts into half"


def _float_types(model: Any) -> set[int]:
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    return {t.data_type for t in graph.initializer} | {v.type.tensor_type.elem_type for v in values}


# onnxconverter-common's defaults: a weight of smaller magnitude (not 0) or of larger becomes the bound.
MIN_POSITIVE, MAX_FINITE = 1e-7, 65504.0  # (the converter's own default bound, 1e4, changed values half holds)


def _clamped_values(model: Any) -> int:
    """How many float values of initializers and Constant nodes the converter will clamp (its bounds above)."""
    import numpy as np
    from onnx import numpy_helper

    tensors = [*model.graph.initializer, *(a.t for n in model.graph.node if n.op_type == "Constant"
                                          for a in n.attribute if a.name == "value")]
    count = 0
    for tensor in tensors:
        if tensor.data_type == FLOAT:
            magnitude = np.abs(numpy_helper.to_array(tensor))
            # (an infinity, a mask's fill, stays one: the converter clamps finite values only)
            count += int(((magnitude > 0) & (magnitude < MIN_POSITIVE)).sum()
                         + ((magnitude > MAX_FINITE) & np.isfinite(magnitude)).sum())
    return count


def _casts(model: Any) -> int:
    return sum(1 for n in model.graph.node if n.op_type == "Cast")

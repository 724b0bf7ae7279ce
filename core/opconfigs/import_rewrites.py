"""Rewrites of an ONNX model into one NNFusion's importer takes and computes as ONNX does, where core/opconfigs/
import_rules.py and nnfusion_import.py find it would not (`kdb model expand` runs them before it writes ONNX
functions out). Each keeps ONNX's numbers: a dynamic dimension pinned to the size given, shape computations on
static shapes folded into constants, negative axes and indices counted from 0, a Min or Max of other than two inputs
written with two-input ones, a Min that broadcasts as numpy written as Max of negations, DepthToSpace as the
Reshape, Transpose and Reshape ONNX defines it as, a LayerNormalization given its zero bias, a Transpose its default
perm, a tanh Gelu its formula, a MaxPool's SAME padding ONNX's pads, a ReduceSum or ReduceMean of an axes input
one the importer reads, a Where's condition and values the output's shape, a Split's negative axis counted from 0, a
depthwise conv's dilation and odd padding an undilated filter and a Pad, and a bool initializer (which the importer
cannot read) an int32 one and a Cast."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.opconfigs import einsum, import_rules
from core.opconfigs.nnfusion_import import (
    PAD_ATTRIBUTES,
    READABLE_INITIALIZERS,
    Shapes,
    attributes,
    conv_transpose_sliceable,
    depthwise_padding_ok,
    reduce_axes_ignored,
    static_shapes,
)

HALF = 10  # ONNX TensorProto.FLOAT16
FOLD_LIMIT = import_rules.FOLD_LIMIT
NOT_FOLDED = import_rules.RANDOM_OPS
Made = tuple[str, list[Any], list[Any]]  # (kind, nodes in the node's place, initializers added)
Rewrite = Callable[[Any, "_Context"], Made | None]


def input_dim_names(graph: Any) -> tuple[str, ...]:
    """The named (dim_param) dimensions of the graph's inputs, in order: the sizes a user gives (--dim)."""
    return tuple(dict.fromkeys(d.dim_param for vi in graph.input if vi.type.HasField("tensor_type")
                               for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param") and d.dim_param))


def pin_dims(model: Any, dims: dict[str, int]) -> int:
    """Give each dimension of the graph's inputs named by a key of `dims` (a dim_param) its size, and that name its size
    wherever else it stands (outputs, value infos); the count of the graph's input and output dimensions pinned (value
    infos, which an fp16 conversion adds by the dozen, are pinned too and not counted). A name that stands on no input
    is left: it follows from the inputs (a legacy export names an output's axes so, one name for two sizes)."""
    graph, pinned = model.graph, 0
    dims = {name: size for name, size in dims.items() if name in input_dim_names(graph)}
    edges = len(graph.input) + len(graph.output)
    for k, vi in enumerate((*graph.input, *graph.output, *graph.value_info)):
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in dims:
                size = dims[d.dim_param]
                d.Clear()
                d.dim_value = size
                pinned += k < edges
    return pinned


def outputs_as_inferred(model: Any, shapes: Shapes) -> int:
    """Each graph output's dimension named by no input (a legacy export's [Tanh70_dim_0, 3, Tanh70_dim_0, ...]) given
    the size shape inference finds, where it finds all; the count of outputs so written."""
    names, written = input_dim_names(model.graph), 0
    for vi in model.graph.output:
        dims, found = vi.type.tensor_type.shape.dim, shapes.get(vi.name)
        free = [d for d in dims if d.HasField("dim_param") and d.dim_param not in names]
        if not free or found is None or len(found) != len(dims):
            continue
        for d, size in zip(dims, found, strict=True):
            if d.HasField("dim_param") and d.dim_param not in names:
                d.Clear()
                d.dim_value = size
        written += 1
    return written


def constants_for_import(model: Any) -> Counter[str]:
    """What `kdb model fp16` owes the importer after its conversion, in place: the Constants it made half as
    initializers, what is computed from constants alone folded (a Resize's scales it Casts back to float: NNFusion
    takes only constant scales), and half means as MatMuls (_half_mean). What was done, counted by kind."""
    return rewrite_for_import(model, {"Constant": _constant, "ReduceMean": _half_mean, "ReduceL2": _half_l2,
                                      "LayerNormalization": _half_layer_norm})


def _reduced_axes(node: Any, shape: list[int], cx: _Context) -> list[int] | None:
    """The axes a reduction node reduces (its axes input where constant, else its attribute, else every axis); None
    where unknown or empty (noop_with_empty_axes decides)."""
    import numpy as np

    if len(node.input) > 1 and node.input[1]:
        axes = cx.values.get(node.input[1])
        if axes is None or not np.size(axes):
            return None
    else:
        axes = attributes(node).get("axes", range(len(shape)))
    return sorted({int(a) % len(shape) for a in np.ravel(list(axes))})


def _half_reduction(node: Any, cx: _Context) -> tuple[list[int], list[int], list[int]] | None:
    """(input shape, output shape, reduced axes) of a reduction of a half tensor, where all are known; else None."""
    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if cx.types.get(node.input[0]) != HALF or shape is None or out is None or not shape:
        return None
    reduced = _reduced_axes(node, shape, cx)
    return None if reduced is None else (shape, out, reduced)


def _half_mean(node: Any, cx: _Context) -> Made | None:
    """A half ReduceMean as a MatMul by a column of 1/count. The importer makes a ReduceMean a Sum, then a Divide,
    and NNFusion's half Sum adds in half (reduce.hpp: `half val`): a LayerNorm's or RMSNorm's mean of squares over 768
    values passes 65,504 at an RMS of 9.2 (inf). The MatMul's running sums are of x / count, never past the largest
    |x|; it replaces the Sum and the Divide (no kernel more, where Casts to float and back added two unfused ones)."""
    if (known := _half_reduction(node, cx)) is None:
        return None
    shape, out, reduced = known
    base = node.name or node.output[0]
    made, initializers, _ = importable_reduce(node.input[0], reduced, shape, out, node.output[0], base, cx, mean=True,
                                              half=True)
    if node.name:
        made[-1].name = node.name
    return "half ReduceMean written as a MatMul by a column of 1/count", made, initializers


def _half_l2(node: Any, cx: _Context) -> Made | None:
    """A half ReduceL2 (F.normalize's norm), written as _l2_of_mean writes it: NNFusion's Square then half Sum
    overflows once the norm passes 256, where the mean of squares holds until an element does."""
    if (known := _half_reduction(node, cx)) is None:
        return None
    return _l2_of_mean(node, cx, *known, half=True)


def _l2_of_mean(node: Any, cx: _Context, shape: list[int], out: list[int], reduced: list[int], *, half: bool) -> Made:
    """A ReduceL2 as sqrt(count) * sqrt(mean(x * x)), the mean as importable_reduce writes it (a MatMul in half): the
    sum of squares itself would pass half's 65,504 once the norm passes 256, in a model made fp16 after this too."""
    import numpy as np
    from onnx import numpy_helper

    base = node.name or node.output[0]
    t = {k: cx.namer(f"{base}/{k}") for k in ("square", "mean", "root", "scale")}
    made, initializers, how = importable_reduce(t["square"], reduced, shape, out, t["mean"], f"{base}/mean", cx,
                                                mean=True, half=half)
    count = math.prod(shape[a] for a in reduced)
    made = [_like("Mul", [node.input[0], node.input[0]], [t["square"]], cx.namer(f"{base}/Square")), *made,
            _like("Sqrt", [t["mean"]], [t["root"]], cx.namer(f"{base}/Sqrt")),
            _like("Mul", [t["root"], t["scale"]], list(node.output), node.name or cx.namer(f"{base}/Scale"))]
    initializers.append(numpy_helper.from_array(np.array(math.sqrt(count), np.float16 if half else np.float32),
                                                t["scale"]))
    return (f"{'half ' if half else ''}ReduceL2 written as sqrt(count) times the root of a mean of squares (the mean "
            f"with {how})", made, initializers)


def _half_layer_norm(node: Any, cx: _Context) -> Made | None:
    """A half LayerNormalization as its formula in float, between two Casts (_normalised), as PyTorch computes a half
    LayerNorm: NNFusion's LayerNorm kernel keeps its Welford sums in half (cuda_langunit.cpp's cuWelfordOnlineSum),
    its M2 the variance times the row's length, which passes 65,504 over 768 values of variance 85; and in half a
    square passes it once a value is 256 from the mean (a residual stream's outliers). Its scale and bias must be
    initializers (read back in float); only its first output (the other two are training's)."""
    import numpy as np
    from onnx import numpy_helper

    shape = cx.shapes.get(node.input[0])
    params = [cx.initializers.get(name) for name in node.input[1:3] if name]
    if cx.types.get(node.input[0]) != HALF or shape is None or not shape or any(node.output[1:]) \
            or len(node.input) < 2 or any(p is None for p in params):
        return None
    axis = int(attributes(node).get("axis", -1)) % len(shape)
    reduced, kept = list(range(axis, len(shape))), [*shape[:axis], *[1] * (len(shape) - axis)]
    scale, *bias = (numpy_helper.to_array(p).astype(np.float32) for p in params)
    made, initializers, how = _normalised(node, cx, shape, reduced, kept, scale, bias[0] if bias else None,
                                          node.name or cx.namer(f"{node.name or node.output[0]}/ToHalf"))
    return (f"half LayerNormalization written as its formula in float, between two Casts (its means with {how})",
            made, initializers)


def _normalised(node: Any, cx: _Context, shape: list[int], reduced: list[int], kept: list[int], scale: Any,
                bias: Any | None, name: str) -> tuple[list[Any], list[Any], str]:
    """The node's input normalised over the axes `reduced` (`kept`: its statistics' shape), times `scale` plus `bias`
    (float32 arrays that broadcast against it; no bias: None): (x - mean) / sqrt(var + epsilon) * scale + bias, each
    mean as importable_reduce writes it in float. A half input is computed in float between two Casts (NNFusion's
    half mean and LayerNorm overflow: _half_mean, _half_layer_norm). The last node is named `name`.
    (nodes, initializers, how the means are written)."""
    import numpy as np
    from onnx import numpy_helper

    base = node.name or node.output[0]
    t = {k: cx.namer(f"{base}/{k}") for k in ("x", "mean", "centred", "square", "var", "eps", "padded", "std",
                                              "normed", "scale", "scaled", "bias", "y")}
    half = cx.types.get(node.input[0]) == HALF
    x, y = (t["x"], t["y"]) if half else (node.input[0], node.output[0])
    mean, mean_inits, how = importable_reduce(x, reduced, shape, kept, t["mean"], f"{base}/mean", cx, mean=True,
                                              half=False)
    var, var_inits, _ = importable_reduce(t["square"], reduced, shape, kept, t["var"], f"{base}/var", cx, mean=True,
                                          half=False)
    scaled_name = name if not half and bias is None else cx.namer(f"{base}/Scale")
    made = [*([_like("Cast", [node.input[0]], [x], cx.namer(f"{base}/ToFloat"), to=1)] if half else []),
            *mean,
            _like("Sub", [x, t["mean"]], [t["centred"]], cx.namer(f"{base}/Sub")),
            _like("Mul", [t["centred"], t["centred"]], [t["square"]], cx.namer(f"{base}/Square")),
            *var,
            _like("Add", [t["var"], t["eps"]], [t["padded"]], cx.namer(f"{base}/AddEpsilon")),
            _like("Sqrt", [t["padded"]], [t["std"]], cx.namer(f"{base}/Sqrt")),
            _like("Div", [t["centred"], t["std"]], [t["normed"]], cx.namer(f"{base}/Div")),
            _like("Mul", [t["normed"], t["scale"]], [t["scaled"] if bias is not None else y], scaled_name),
            *([_like("Add", [t["scaled"], t["bias"]], [y], cx.namer(f"{base}/Bias") if half else name)]
              if bias is not None else []),
            *([_like("Cast", [y], list(node.output), name, to=HALF)] if half else [])]
    eps = float(attributes(node).get("epsilon", 1e-5))
    initializers = [*mean_inits, *var_inits, numpy_helper.from_array(np.array(eps, np.float32), t["eps"]),
                    numpy_helper.from_array(scale, t["scale"]),
                    *([numpy_helper.from_array(bias, t["bias"])] if bias is not None else [])]
    return made, initializers, how


def rewrite_for_import(model: Any, rewrites: dict[str, Rewrite] | None = None) -> Counter[str]:
    """Rewrite `model` in place (see the module's doc); what was done, counted by kind."""
    import onnx

    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in model.opset_import}

    done: Counter[str] = Counter()
    read_before = reads(model.graph)
    while True:  # a folded computation gives later ones their static shapes (a GroupNorm's Reshapes, one by one)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # a model shape inference fails on keeps what needs no shapes only
            inferred = model
        shapes, values = static_shapes(inferred.graph), _constants(model.graph, opsets)
        folded = _fold_shape_computations(model.graph, shapes, values, opsets)
        done["shape computations folded"] += folded
        if not folded:
            break
    graph, nodes = model.graph, []
    namer = _Namer.of(graph)
    cx = _Context(shapes, values, {t.name: t for t in graph.initializer}, element_types(inferred.graph), namer,
                  opsets)
    for node in graph.node:
        rewrite = (_REWRITES if rewrites is None else rewrites).get(node.op_type) \
            if node.domain in ("", "ai.onnx") else None
        made = rewrite(node, cx) if rewrite else None
        if made is None:
            nodes.append(node)
            continue
        kind, replacement, initializers = made
        nodes += replacement
        graph.initializer.extend(initializers)
        done[kind] += 1
    casts = _readable_initializers(graph, namer)
    if casts:
        done["bool (or other unreadable) initializers stored as int32 and Cast"] += len(casts)
    del graph.node[:]
    graph.node.extend([*casts, *nodes])
    _drop_dead_constants(graph)
    drop_orphans(graph, read_before)
    return Counter({k: v for k, v in done.items() if v})


def nearest_as_repeats(model: Any, names: set[str], shapes: Shapes) -> int:
    """Rewrite in place each Resize of `names` (nodes sharing a Resize identifier with another mode: NNFusion runs one
    row for all of them) that is a nearest upsampling by whole factors as the repeat it is: a Reshape to
    [N, C, H, 1, W, 1], an Expand to [N, C, H, s, W, s], a Reshape to the output (no DB row, NNFusion's broadcast).
    Such a Resize picks input floor(i / s) wherever half_pixel (or pytorch_half_pixel) rounding puts i, and with
    asymmetric coordinates where it rounds down (torch's nn.Upsample). `shapes`: the model's static shapes. The count
    of rewrites."""
    import numpy as np
    from onnx import numpy_helper

    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in model.opset_import}
    values = _constants(model.graph, opsets)
    namer, nodes, initializers = _Namer.of(model.graph), [], []
    for node in model.graph.node:
        factors = _nearest_factors(node, shapes, values) if node.name in names else None
        if factors is None:
            nodes.append(node)
            continue
        n, c, h, w = shapes[node.input[0]]
        base = node.name or node.output[0]
        steps = {"split": [n, c, h, 1, w, 1], "wide": [n, c, h, factors[0], w, factors[1]],
                 "out": [n, c, h * factors[0], w * factors[1]]}
        t = {k: namer(f"{base}/{k}") for k in (*steps, "split_x", "wide_x")}
        initializers += [numpy_helper.from_array(np.array(v, np.int64), t[k]) for k, v in steps.items()]
        nodes += [_like("Reshape", [node.input[0], t["split"]], [t["split_x"]], namer(f"{base}/Split")),
                  _like("Expand", [t["split_x"], t["wide"]], [t["wide_x"]], namer(f"{base}/Repeat")),
                  _like("Reshape", [t["wide_x"], t["out"]], list(node.output), node.name)]
    done = len(nodes) - len(model.graph.node)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.graph.initializer.extend(initializers)
    return done // 2


def _nearest_factors(node: Any, shapes: Shapes, values: dict[str, Any]) -> tuple[int, int] | None:
    """A Resize's whole upsampling factors (height, width) where it is a repeat of each pixel (nearest_as_repeats)."""
    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attributes(node).items()}
    coordinates = attrs.get("coordinate_transformation_mode", "half_pixel")
    rounding = attrs.get("nearest_mode", "round_prefer_floor")
    if attrs.get("mode", "nearest") != "nearest" or not (
            coordinates in ("half_pixel", "pytorch_half_pixel") or (coordinates, rounding) == ("asymmetric", "floor")):
        return None
    shape, out = shapes.get(node.input[0]), shapes.get(node.output[0])
    if shape is None or out is None or len(shape) != 4 or list(out[:2]) != list(shape[:2]) or 0 in shape:
        return None
    given = values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    scales = [float(v) for v in given] if given is not None and len(given) == 4 else [o / i for o, i in
                                                                                      zip(out, shape, strict=True)]
    factors = [o // i for o, i in zip(out[2:], shape[2:], strict=True)]
    if scales[:2] != [1.0, 1.0] or [o % i for o, i in zip(out[2:], shape[2:], strict=True)] != [0, 0] \
            or scales[2:] != [float(f) for f in factors]:
        return None
    return factors[0], factors[1]


def _drop_dead_constants(graph: Any) -> None:
    """Constant nodes a rewrite left with no reader (a Where's scalar fill, now a broadcast initializer): ONNX Runtime
    warns of each."""
    read = reads(graph) | {o.name for o in graph.output}
    kept = [n for n in graph.node if n.op_type != "Constant" or any(o in read for o in n.output)]
    if len(kept) < len(graph.node):
        del graph.node[:]
        graph.node.extend(kept)


def _readable_initializers(graph: Any, namer: Callable[[str], str]) -> list[Any]:
    """Each initializer of a type the importer cannot read (a bool causal mask, as torch exports it) that a node
    reads, stored as readable_initializer stores it: the int32 initializer and the Casts to put first."""
    from onnx import numpy_helper

    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    casts = []
    for tensor in list(graph.initializer):
        # (a Dropout's training_mode: expand writes an inference Dropout as the Identity it is, reading its value)
        if tensor.data_type in READABLE_INITIALIZERS or readers.get(tensor.name, {"Dropout"}) == {"Dropout"}:
            continue
        made, initializers = readable_initializer(numpy_helper.to_array(tensor), tensor.name, namer)
        graph.initializer.remove(tensor)
        graph.initializer.extend(initializers)
        casts += made
    return casts


@dataclass
class _Context:
    shapes: dict[str, list[int]]  # static shapes (shape inference's)
    values: dict[str, Any]  # small constant values (numpy)
    initializers: dict[str, Any]  # by name (TensorProto): what a rewrite cuts, read when it does
    types: dict[str, int]  # ONNX element types
    namer: _Namer
    opsets: dict[str, int]


def reads(graph: Any) -> set[str]:
    """The tensors the graph's nodes read, and its outputs."""
    return {name for n in graph.node for name in n.input} | {o.name for o in graph.output}


def drop_orphans(graph: Any, used_before: set[str]) -> None:
    """Initializers only replaced or folded nodes read (a Dropout's ratio and training_mode: a bool one the importer
    cannot read; a folded computation's constants), with their graph inputs where an old model lists them there too."""
    used = reads(graph)
    orphans = {t.name for t in graph.initializer if t.name in used_before and t.name not in used}
    for field_ in (graph.initializer, graph.input):
        kept = [t for t in field_ if t.name not in orphans]
        del field_[:]
        field_.extend(kept)


def fresh_name(taken: set[str], name: str) -> str:
    """`name`, or `name_1`, `name_2`, ...: the first not in `taken`, which it joins."""
    fresh, k = name, 1
    while fresh in taken:
        fresh, k = f"{name}_{k}", k + 1
    taken.add(fresh)
    return fresh


class _Namer:
    @classmethod
    def of(cls, graph: Any) -> _Namer:
        """A namer of the names the graph's nodes, tensors and initializers already take."""
        return cls({n.name for n in graph.node} | {t for n in graph.node for t in (*n.input, *n.output)}
                   | {t.name for t in graph.initializer})

    def __init__(self, taken: set[str]) -> None:
        self.taken = taken

    def __call__(self, name: str) -> str:
        return fresh_name(self.taken, name)




def element_types(graph: Any) -> dict[str, int]:
    """Each tensor's ONNX element type, as the graph declares it (all of them, after shape inference)."""
    types = {t.name: t.data_type for t in graph.initializer}
    return types | {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info, *graph.output)
                    if v.type.HasField("tensor_type")}


def _constants(graph: Any, opsets: dict[str, int]) -> dict[str, Any]:
    """Small constant values: initializers and Constant nodes of at most FOLD_LIMIT elements."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if math.prod(t.dims) <= FOLD_LIMIT}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            try:
                (value,) = _evaluate(node, {}, opsets)
            except Exception:  # a Constant the reference cannot make (sparse): not a shape computation's
                continue
            if value.size <= FOLD_LIMIT:
                values[node.output[0]] = value
    return values


def readable_initializer(value: Any, name: str, fresh: Callable[[str], str]) -> tuple[list[Any], list[Any]]:
    """`value` as the initializer `name`, or, of a type the importer cannot read (a bool mask: it aborts 'unsupported
    data type: 9'), as an int32 initializer and a Cast to the type: (nodes, initializers)."""
    import numpy as np
    from onnx import helper, numpy_helper

    value = np.asarray(value)
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    if elem in READABLE_INITIALIZERS:
        return [], [numpy_helper.from_array(value, name)]
    stored = fresh(f"{name}_int32")
    return ([helper.make_node("Cast", [stored], [name], name=fresh(f"{name}/Cast"), to=elem)],
            [numpy_helper.from_array(value.astype(np.int32), stored)])


def _fold_shape_computations(graph: Any, shapes: dict[str, list[int]], values: dict[str, Any],
                             opsets: dict[str, int]) -> int:
    """Evaluate what follows from Shape of statically shaped tensors and from constants alone (a torch export's
    `x.view(x.size(0), -1)`, `cls.expand(B, -1, -1)`'s Where of ConstantOfShapes, a `head_dim ** -0.5` Pow, a Cast of
    a constant), and give each node that reads such a value an initializer instead; nodes left with no reader go. The
    count of nodes folded."""
    import numpy as np
    from onnx import helper

    known, made, folded = dict(values), set(), set()  # values, the tensors folded, the indices of the nodes folded
    outputs = {o.name for o in graph.output}  # (a graph output stays a node's)
    for i, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or node.op_type == "Constant" or outputs.intersection(node.output):
            continue
        if node.op_type == "Cast" and attributes(node).get("to") not in READABLE_INITIALIZERS:
            continue  # (folded, it would be stored as it is: an int32 initializer and this Cast; a bool mask's)
        if node.op_type == "Shape" and node.input[0] in shapes:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            dims = shapes[node.input[0]]
            outs = [np.array(dims[attrs.get("start", 0):attrs.get("end", len(dims))], np.int64)]
        elif node.input and node.op_type not in NOT_FOLDED and all(not t or t in known for t in node.input):
            try:
                outs = [np.asarray(o) for o in _evaluate(node, {t: known[t] for t in node.input if t}, opsets)]
            except Exception:  # an op the reference does not evaluate: left to the compiler, with its blocker
                continue
            if any(o.size > FOLD_LIMIT for o in outs):
                continue
        else:
            continue
        known.update(zip(node.output, outs, strict=False))
        made.update(node.output)
        folded.add(i)
    read = {t for i, n in enumerate(graph.node) if i not in folded for t in n.input if t in made}
    if not read:
        return 0
    namer = _Namer.of(graph)
    casts = []
    for tensor in sorted(read):
        nodes, initializers = readable_initializer(known[tensor], tensor, namer)
        casts += nodes
        graph.initializer.extend(initializers)
    kept = casts + [n for i, n in enumerate(graph.node) if i not in folded]
    count = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(kept)
    return count


def _evaluate(node: Any, feeds: dict[str, Any], opsets: dict[str, int]) -> list[Any]:
    """`node`'s outputs for these inputs, by ONNX's reference evaluator at the model's opsets (a bare node would be
    evaluated at the newest: an opset-11 Unsqueeze's axes attribute is then refused)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for t, v in feeds.items()]
    graph = helper.make_graph([node], "fold", inputs, [helper.make_empty_tensor_value_info(o) for o in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    return list(ReferenceEvaluator(model).run(None, feeds))


def _like(op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs: Any) -> Any:
    from onnx import helper

    return helper.make_node(op_type, inputs, outputs, name=name, **attrs)


def _flatten(node: Any, cx: _Context) -> Made | None:
    axis, shape = attributes(node).get("axis", 1), cx.shapes.get(node.input[0])
    if axis >= 0 or shape is None:
        return None
    return "Flatten axes counted from 0", [_like("Flatten", list(node.input), list(node.output), node.name,
                                                 axis=len(shape) + axis)], []


def _min_max(node: Any, cx: _Context) -> Made | None:
    inputs = [t for t in node.input if t]
    base = node.name or node.output[0]
    if len(inputs) == 1:
        return (f"{node.op_type} of one input as Identity",
                [_like("Identity", inputs, list(node.output), node.name)], [])
    if len(inputs) > 2:
        made, left = [], inputs[0]
        for k, right in enumerate(inputs[1:], 1):
            out = node.output[0] if k == len(inputs) - 1 else cx.namer(f"{base}/{node.op_type}_{k}")
            made.append(_like(node.op_type, [left, right], [out], cx.namer(f"{base}/{node.op_type}_{k}")))
            left = out
        return f"{node.op_type} of {len(inputs)} inputs as two-input ones", made, []
    if node.op_type == "Min" and any(import_rules.min_broadcast(node, cx.shapes)):
        # Min(a, b) = -Max(-a, -b): Max broadcasts as numpy does
        neg = [cx.namer(f"{base}/neg_{k}") for k in range(3)]
        made = [_like("Neg", [inputs[0]], [neg[0]], cx.namer(f"{base}/Neg_a")),
                _like("Neg", [inputs[1]], [neg[1]], cx.namer(f"{base}/Neg_b")),
                _like("Max", neg[:2], [neg[2]], cx.namer(f"{base}/Max")),
                _like("Neg", [neg[2]], list(node.output), node.name)]
        return "Min broadcast as numpy (Max of negations)", made, []
    return None


def _gather(node: Any, cx: _Context) -> Made | None:
    import numpy as np
    from onnx import numpy_helper

    indices, data = cx.values.get(node.input[1]), cx.shapes.get(node.input[0])
    if indices is None or data is None or not (indices < 0).any():
        return None
    axis = attributes(node).get("axis", 0) % len(data)
    positive = np.where(indices < 0, indices + data[axis], indices).astype(indices.dtype)
    name = cx.namer(f"{node.name or node.output[0]}/indices")
    return ("Gather indices counted from 0", [_like("Gather", [node.input[0], name], list(node.output),
                                                    node.name, axis=axis)], [numpy_helper.from_array(positive, name)])


def _slice(node: Any, cx: _Context) -> Made | None:
    from onnx import numpy_helper

    stepped = len(node.input) > 4 and node.input[4] and node.input[4] in cx.values
    if stepped and (cx.values[node.input[4]] < 0).any():
        return _slice_backwards(node, cx)
    if len(node.input) < 4 or not node.input[3] or node.input[3] not in cx.values:
        return None
    axes, data = cx.values[node.input[3]], cx.shapes.get(node.input[0])
    if data is None or not (axes < 0).any():
        return None
    name = cx.namer(f"{node.name or node.output[0]}/axes")
    inputs = list(node.input)
    inputs[3] = name
    return ("Slice axes counted from 0", [_like("Slice", inputs, list(node.output), node.name)],
            [numpy_helper.from_array((axes % len(data)).astype(axes.dtype), name)])


def _slice_backwards(node: Any, cx: _Context) -> Made | None:
    """A Slice of constant starts, ends, axes and steps, some negative, on a static shape: a Gather per axis of the
    indices ONNX's Slice takes along it (its own semantics, by the reference evaluator on each axis' positions)."""
    import numpy as np
    from onnx import numpy_helper

    data = cx.shapes.get(node.input[0])
    given = [cx.values.get(t) for t in node.input[1:5]]
    if data is None or any(v is None for v in given[:2]) or (node.input[3] and given[2] is None):
        return None
    starts, ends, axes, steps = given[0], given[1], given[2] if node.input[3] else np.arange(len(given[0])), given[3]
    made, initializers, last = [], [], node.input[0]
    base = node.name or node.output[0]
    for k, (start, end, axis, step) in enumerate(zip(starts, ends, axes, steps, strict=True)):
        axis = int(axis) % len(data)
        feeds = {"p": np.arange(data[axis], dtype=np.int64)}
        slicing = _like("Slice", ["p", "s", "e", "a", "t"], ["q"], "positions")
        consts = {n: np.array([v], np.int64) for n, v in zip("seat", (start, end, 0, step), strict=True)}
        (indices,) = _evaluate(slicing, feeds | consts, cx.opsets)
        name = cx.namer(f"{base}/indices_{k}")
        out = node.output[0] if k == len(starts) - 1 else cx.namer(f"{base}/gathered_{k}")
        made.append(_like("Gather", [last, name], [out], node.name if out == node.output[0] else cx.namer(
            f"{base}/Gather_{k}"), axis=axis))
        initializers.append(numpy_helper.from_array(np.asarray(indices, np.int64), name))
        last = out
    return "Slice of negative steps written as Gathers", made, initializers


def _transpose(node: Any, cx: _Context) -> Made | None:
    shape = cx.shapes.get(node.input[0])
    if "perm" in attributes(node) or shape is None:
        return None
    return ("Transpose perm written out", [_like("Transpose", list(node.input), list(node.output), node.name,
                                                 perm=list(reversed(range(len(shape)))))], [])


def _layer_norm(node: Any, cx: _Context) -> Made | None:
    import numpy as np
    from onnx import numpy_helper

    if len(node.input) > 2 and node.input[2]:
        return None
    scale = cx.values.get(node.input[1]) if len(node.input) > 1 else None
    scale_shape = cx.shapes.get(node.input[1]) if len(node.input) > 1 else None
    if scale_shape is None:
        return None
    dtype = scale.dtype if scale is not None else np.float32
    name = cx.namer(f"{node.name or node.output[0]}/bias")
    made = _like("LayerNormalization", [node.input[0], node.input[1], name], list(node.output), node.name)
    made.attribute.extend(node.attribute)
    return "LayerNormalization given its zero bias", [made], [numpy_helper.from_array(np.zeros(scale_shape, dtype),
                                                                                      name)]


def _depth_to_space(node: Any, cx: _Context) -> Made | None:
    import numpy as np
    from onnx import numpy_helper

    shape = cx.shapes.get(node.input[0])
    if shape is None or len(shape) != 4:
        return None
    attrs = attributes(node)
    b, mode = attrs.get("blocksize", 1), attrs.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    n, c, h, w = shape
    base = node.name or node.output[0]
    # ONNX's definition of DepthToSpace (its operator doc): DCR and CRD order the channels differently
    first, perm = (([n, b, b, c // b**2, h, w], [0, 3, 4, 1, 5, 2]) if mode == "DCR"
                   else ([n, c // b**2, b, b, h, w], [0, 1, 4, 2, 5, 3]))
    shape_a, shape_b = cx.namer(f"{base}/shape_6d"), cx.namer(f"{base}/shape_4d")
    mid, moved = cx.namer(f"{base}/blocks"), cx.namer(f"{base}/moved")
    made = [_like("Reshape", [node.input[0], shape_a], [mid], cx.namer(f"{base}/Reshape_6d")),
            _like("Transpose", [mid], [moved], cx.namer(f"{base}/Transpose"), perm=perm),
            _like("Reshape", [moved, shape_b], list(node.output), node.name)]
    inits = [numpy_helper.from_array(np.array(first, np.int64), shape_a),
             numpy_helper.from_array(np.array([n, c // b**2, h * b, w * b], np.int64), shape_b)]
    return "DepthToSpace as Reshape, Transpose, Reshape", made, inits


def _gelu(node: Any, cx: _Context) -> Made | None:
    import numpy as np
    from onnx import numpy_helper

    approximate = attributes(node).get("approximate", b"none")
    if (approximate.decode() if isinstance(approximate, bytes) else approximate) != "tanh":
        return None
    # ONNX's Gelu, approximate "tanh": 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    x, base = node.input[0], node.name or node.output[0]
    dtype = np.float16 if cx.types.get(x) == HALF else np.float32
    c = {k: cx.namer(f"{base}/{k}") for k in ("three", "k", "root", "half", "one")}
    inits = [numpy_helper.from_array(np.array(v, dtype), c[k]) for k, v in
             (("three", 3.0), ("k", 0.044715), ("root", math.sqrt(2 / math.pi)), ("half", 0.5), ("one", 1.0))]
    t = {k: cx.namer(f"{base}/{k}") for k in ("cube", "scaled", "inner", "arg", "tanh", "plus", "halfx")}
    made = [_like("Pow", [x, c["three"]], [t["cube"]], cx.namer(f"{base}/Pow")),
            _like("Mul", [t["cube"], c["k"]], [t["scaled"]], cx.namer(f"{base}/Mul_k")),
            _like("Add", [x, t["scaled"]], [t["inner"]], cx.namer(f"{base}/Add_inner")),
            _like("Mul", [t["inner"], c["root"]], [t["arg"]], cx.namer(f"{base}/Mul_root")),
            _like("Tanh", [t["arg"]], [t["tanh"]], cx.namer(f"{base}/Tanh")),
            _like("Add", [t["tanh"], c["one"]], [t["plus"]], cx.namer(f"{base}/Add_one")),
            _like("Mul", [x, c["half"]], [t["halfx"]], cx.namer(f"{base}/Mul_half")),
            _like("Mul", [t["halfx"], t["plus"]], list(node.output), node.name)]
    return "tanh Gelu written out", made, inits


def _reciprocal(node: Any, cx: _Context) -> Made | None:
    """Reciprocal (the importer has no translator for it) as Div(1, x), the one of x's type."""
    import numpy as np
    from onnx import numpy_helper

    x, base = node.input[0], node.name or node.output[0]
    one = cx.namer(f"{base}/one")
    dtype = np.float16 if cx.types.get(x) == HALF else np.float32
    made = [_like("Div", [one, x], list(node.output), node.name or cx.namer(f"{base}/Div"))]
    return "Reciprocal written as Div(1, x)", made, [numpy_helper.from_array(np.array(1.0, dtype), one)]


def _reduce_of_axes_input(node: Any, cx: _Context) -> Made | None:
    """A ReduceSum (opset 13 on) or ReduceMean (18 on) given its axes as an input, which the importer does not read
    (it reduces every axis): written as importable_reduce does."""
    import numpy as np

    shape, out, axes = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0]), None
    if len(node.input) > 1 and node.input[1]:
        axes = cx.values.get(node.input[1])
    if shape is None or out is None or axes is None or not np.size(axes) \
            or not reduce_axes_ignored(node, out):
        return None
    reduced = sorted({int(a) % len(shape) for a in np.ravel(axes)})
    base = node.name or node.output[0]
    made, initializers, how = importable_reduce(node.input[0], reduced, shape, out, node.output[0], base, cx,
                                                mean=node.op_type == "ReduceMean")
    if node.name:
        made[-1].name = node.name
    return f"{node.op_type} of axes as an input written with {how}", made, initializers


def _reduce_l2(node: Any, cx: _Context) -> Made | None:
    """A ReduceL2 the importer computes wrong (keepdims 0: it sums the input, not its squares; axes as an input: it
    reduces every axis) as its formula, written as _l2_of_mean writes it."""
    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if shape is None or out is None or not shape or (reduced := _reduced_axes(node, shape, cx)) is None \
            or not (import_rules.reduce_l2_unsquared(node) or reduce_axes_ignored(node, out)):
        return None
    return _l2_of_mean(node, cx, shape, out, reduced, half=cx.types.get(node.input[0]) == HALF)


def _reduce_extreme(node: Any, cx: _Context) -> Made | None:
    """A ReduceMax or ReduceMin (torch's amax, CBAM's max over channels), which the importer has no translator for, as
    a MaxPool: the reduced axes moved last and flattened into one row a window wide, [1, 1, rows, count] pooled by a
    [1, count] window, then reshaped to the output's shape; a minimum is the negated maximum of the negated input."""
    import numpy as np
    from onnx import numpy_helper

    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if shape is None or out is None or not shape or (reduced := _reduced_axes(node, shape, cx)) is None:
        return None
    rank = len(shape)
    kept = [a for a in range(rank) if a not in reduced]
    rows, count = math.prod(shape[a] for a in kept), math.prod(shape[a] for a in reduced)
    base = node.name or node.output[0]
    name = {k: cx.namer(f"{base}/{k}") for k in ("negated", "moved", "rows", "rows_shape", "pooled", "shape", "max")}
    minimum = node.op_type == "ReduceMin"
    made, data = [], node.input[0]
    if minimum:
        made.append(_like("Neg", [data], [name["negated"]], cx.namer(f"{base}/Neg")))
        data = name["negated"]
    if kept + reduced != list(range(rank)):
        made.append(_like("Transpose", [data], [name["moved"]], cx.namer(f"{base}/Transpose"), perm=kept + reduced))
        data = name["moved"]
    result = name["max"] if minimum else node.output[0]
    made += [_like("Reshape", [data, name["rows_shape"]], [name["rows"]], cx.namer(f"{base}/Rows")),
             _like("MaxPool", [name["rows"]], [name["pooled"]], cx.namer(f"{base}/MaxPool"), kernel_shape=[1, count],
                   strides=[1, count]),
             _like("Reshape", [name["pooled"], name["shape"]], [result],
                   cx.namer(f"{base}/Out") if minimum else node.name or cx.namer(f"{base}/Out"))]
    if minimum:
        made.append(_like("Neg", [result], list(node.output), node.name or cx.namer(f"{base}/Min")))
    how = " of the negated input, negated" if minimum else ""
    shapes = [numpy_helper.from_array(np.array([1, 1, rows, count], np.int64), name["rows_shape"]),
              numpy_helper.from_array(np.array(out, np.int64), name["shape"])]
    return f"{node.op_type} written as a MaxPool of the reduced axes{how}", made, shapes


def _log_sum_exp(node: Any, cx: _Context) -> Made | None:
    """A ReduceLogSumExp (torch.logsumexp; the importer has no translator, and ONNX's own definition from opset 18,
    Log(ReduceSum(Exp(x))), is inf once x passes 88 in float, 11 in half) as the stable formula: m = max(x) over the
    axes (a MaxPool, as _reduce_extreme writes it), then Log(ReduceSum(Exp(x - m))) + m, each sum as the importer
    reads it (importable_reduce)."""
    import numpy as np
    from onnx import numpy_helper

    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if shape is None or out is None or not shape or (reduced := _reduced_axes(node, shape, cx)) is None:
        return None
    base, x = node.name or node.output[0], node.input[0]
    kept = [1 if a in reduced else n for a, n in enumerate(shape)]
    t = {k: cx.namer(f"{base}/{k}") for k in ("max", "shifted", "exp", "sum", "log", "kept", "shape")}
    cx.shapes[t["max"]] = kept
    peak = _reduce_extreme(_like("ReduceMax", [x], [t["max"]], cx.namer(f"{base}/ReduceMax"), axes=reduced,
                                 keepdims=1), cx)
    if peak is None:
        return None
    half = cx.types.get(x) == HALF
    summed, sum_inits, how = importable_reduce(t["exp"], reduced, shape, kept, t["sum"], base, cx, mean=False,
                                               half=half)
    last = t["kept"] if kept != out else node.output[0]
    made = [*peak[1], _like("Sub", [x, t["max"]], [t["shifted"]], cx.namer(f"{base}/Sub")),
            _like("Exp", [t["shifted"]], [t["exp"]], cx.namer(f"{base}/Exp")), *summed,
            _like("Log", [t["sum"]], [t["log"]], cx.namer(f"{base}/Log")),
            _like("Add", [t["log"], t["max"]], [last], cx.namer(f"{base}/Add"))]
    initializers = [*peak[2], *sum_inits]
    if last != node.output[0]:  # (keepdims 0)
        made.append(_like("Reshape", [last, t["shape"]], list(node.output), node.name or cx.namer(f"{base}/Out")))
        initializers.append(numpy_helper.from_array(np.array(out, np.int64), t["shape"]))
    return f"ReduceLogSumExp written as its stable formula (its max a MaxPool, its sum {how})", made, initializers


def importable_reduce(x: str, reduced: list[int], shape: list[int], out: list[int], output: str, base: str,
                      cx: _Context, *, mean: bool, half: bool | None = None) -> tuple[list[Any], list[Any], str]:
    """x's sum or mean over the axes `reduced`, into `output` of shape `out`, in ops the importer reads: below opset
    18 a ReduceMean of an axes attribute (times the count, for a sum); from 18 on, where no reduce takes the attribute,
    and for a half x at any opset, a MatMul of the reduced axes, moved last, by a column of ones (of 1/count, for a
    mean), then a Reshape to `out`.
    (nodes, initializers, how); `half`: x's type where the model does not say it (a tensor a rewrite makes)."""
    import numpy as np
    from onnx import numpy_helper

    rank, count = len(shape), math.prod(shape[a] for a in reduced)
    dtype = np.float16 if (cx.types.get(x) == HALF if half is None else half) else np.float32
    name = {k: cx.namer(f"{base}/{k}") for k in ("mean", "count", "moved", "rows", "rows_shape", "column", "sums",
                                                 "shape")}
    if cx.opsets.get("", 0) < 18 and dtype != np.float16:  # (a half one: a MatMul at any opset, see _half_mean)
        keepdims = int(len(out) == rank)
        if mean:
            return [_like("ReduceMean", [x], [output], cx.namer(f"{base}/ReduceMean"), axes=reduced,
                          keepdims=keepdims)], [], "an axes attribute"
        made = [_like("ReduceMean", [x], [name["mean"]], cx.namer(f"{base}/ReduceMean"), axes=reduced,
                      keepdims=keepdims),
                _like("Mul", [name["mean"], name["count"]], [output], cx.namer(f"{base}/Mul"))]
        return (made, [numpy_helper.from_array(np.array(count, dtype), name["count"])],
                "a ReduceMean of an axes attribute, times the count")
    kept = [a for a in range(rank) if a not in reduced]
    made, moved = [], x
    if kept + reduced != list(range(rank)):
        made.append(_like("Transpose", [x], [name["moved"]], cx.namer(f"{base}/Transpose"), perm=kept + reduced))
        moved = name["moved"]
    made += [_like("Reshape", [moved, name["rows_shape"]], [name["rows"]], cx.namer(f"{base}/Rows")),
             _like("MatMul", [name["rows"], name["column"]], [name["sums"]], cx.namer(f"{base}/MatMul")),
             _like("Reshape", [name["sums"], name["shape"]], [output], cx.namer(f"{base}/Out"))]
    rows = math.prod(shape[a] for a in kept)
    return made, [numpy_helper.from_array(np.array([rows, count], np.int64), name["rows_shape"]),
                  numpy_helper.from_array(np.full((count, 1), 1.0 / count if mean else 1.0, dtype), name["column"]),
                  numpy_helper.from_array(np.array(out, np.int64), name["shape"])], "a MatMul"


WHERE_CONSTANT_LIMIT = 1 << 22  # elements: a constant broadcast to the output's shape up to this; past it, an Expand


def _where(node: Any, cx: _Context) -> Made | None:
    """A Where whose condition and values differ in shape (a causal mask [1, 1, T, T] and a scalar fill over scores
    [B, H, T, T]): NNFusion's Select reads each at the output's index, past the end of the smaller ones. Each smaller
    one is given the output's shape: a constant broadcast into an initializer of it, another an Expand to it."""
    import numpy as np
    from onnx import numpy_helper

    if len(node.input) != 3:
        return None
    out = cx.shapes.get(node.output[0])
    shapes = [cx.shapes.get(t) for t in node.input]
    if out is None or any(s is None for s in shapes) or all(s == out for s in shapes):
        return None
    base, inputs, made, initializers = node.name or node.output[0], list(node.input), [], []
    for i, (tensor, shape) in enumerate(zip(node.input, shapes, strict=True)):
        if shape == out:
            continue
        value = cx.values.get(tensor)
        if value is None and tensor in cx.initializers:
            value = numpy_helper.to_array(cx.initializers[tensor])
        wide = cx.namer(f"{base}/{tensor}_wide")
        if value is not None and math.prod(out) <= WHERE_CONSTANT_LIMIT:
            nodes, tensors = readable_initializer(np.broadcast_to(value, out).copy(), wide, cx.namer)
            made += nodes
            initializers += tensors
        else:
            shape_name = cx.namer(f"{base}/{tensor}_shape")
            made.append(_like("Expand", [tensor, shape_name], [wide], cx.namer(f"{base}/Expand_{i}")))
            initializers.append(numpy_helper.from_array(np.array(out, np.int64), shape_name))
        inputs[i] = wide
    made.append(_like("Where", inputs, list(node.output), node.name))
    return "Where's condition and values given the output's shape", made, initializers


def _split(node: Any, cx: _Context) -> Made | None:
    """A Split on a negative axis (torch's `x.split(d, -1)` at opset 13 on): the importer reads the axis' length at the
    raw index and aborts; written counted from 0."""
    axis, shape = int(attributes(node).get("axis", 0)), cx.shapes.get(node.input[0]) if node.input else None
    if axis >= 0 or shape is None:
        return None
    made = _like("Split", list(node.input), list(node.output), node.name, axis=axis + len(shape))
    made.attribute.extend(a for a in node.attribute if a.name != "axis")
    return "negative axes counted from 0", [made], []


def _resize_by_sizes(node: Any, cx: _Context) -> Made | None:
    """A Resize given constant `sizes` (F.interpolate(size=...) once its shape computation is folded) on a static
    shape: the importer takes only constant scales (Resize.cpp). ONNX takes the scales of sizes as sizes / input
    (float32); written so, where floor(input x scale) gives the sizes back, or does a few ulps up (11 -> 13: the
    coordinates then move by 1e-6 of a pixel)."""
    import numpy as np
    from onnx import numpy_helper

    shape = cx.shapes.get(node.input[0])
    sizes = cx.values.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if shape is None or sizes is None or (len(node.input) > 2 and node.input[2]) or len(sizes) != len(shape):
        return None
    given, size = np.asarray(sizes, np.int64), np.asarray(shape, np.float32)
    scales = given.astype(np.float32) / size
    for _ in range(4):  # (11 -> 13: 13/11 in float32 times 11 is 12.999999; a few ulps up it floors to 13)
        short = np.floor(size * scales).astype(np.int64) < given
        if not short.any():
            break
        scales = np.where(short, np.nextafter(scales, np.float32(np.inf)), scales).astype(np.float32)
    if not np.array_equal(np.floor(size * scales).astype(np.int64), given):
        return None
    name = cx.namer(f"{node.name or node.output[0]}/scales")
    made = _like("Resize", [node.input[0], node.input[1], name], list(node.output), node.name)
    made.attribute.extend(node.attribute)
    return "Resize by sizes given its scales", [made], [numpy_helper.from_array(scales, name)]


def _auto_pad_written(node: Any, cx: _Context, window: list[int] | None, kinds: tuple[str, ...]) -> Any | None:
    """`node` (a Conv or MaxPool) with its auto_pad of `kinds` written as the pads ONNX gives it, or None where it has
    none or its shapes are unknown. `window`: the kernel's size (a Conv's may come from its filter's shape)."""
    attrs = attributes(node)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    data, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if auto_pad not in kinds or data is None or out is None or window is None:
        return None
    if auto_pad == "VALID":
        pads = [0] * 2 * len(window)
    else:
        strides = list(attrs.get("strides", [1] * len(window)))
        dilations = list(attrs.get("dilations", [1] * len(window)))
        dilated = [d * (k - 1) + 1 for k, d in zip(window, dilations, strict=True)]
        below, above = import_rules.onnx_same_pads(data[2:], out[2:], dilated, strides, auto_pad)
        pads = [*below, *above]
    made = _like(node.op_type, list(node.input), list(node.output), node.name, pads=pads)
    made.attribute.extend(a for a in node.attribute if a.name not in ("auto_pad", "pads"))
    return made


def _floor_pads_above(shape: list[int], out: list[int], window: list[int], strides: list[int], below: list[int],
                      least: list[int]) -> list[int] | None:
    """The pads above each spatial axis with which a pool that rounds its windows down (no ceil_mode, as NNFusion's
    importer pools) gives the model's `out`: at least `least`, enough for the last window; None where none do."""
    above = [max(a, (o - 1) * s + k - n - b) for o, s, k, n, b, a in zip(out, strides, window, shape, below, least,
                                                                        strict=True)]
    floored = [(n + b + a - k) // s + 1 for n, b, a, k, s in zip(shape, below, above, window, strides, strict=True)]
    return above if floored == out else None


def _max_pool(node: Any, cx: _Context) -> Made | None:
    """A MaxPool's auto_pad written as ONNX's pads; its ceil_mode, which the importer drops (the windows round down:
    SqueezeNet's pools), as that many more pads above: a max reads no padding. Pads that then differ above need the
    pool's row (coverage says so: NNFusion's cuDNN pool pads both sides by the pads below)."""
    window = list(attributes(node)["kernel_shape"])
    made = _auto_pad_written(node, cx, window, ("SAME_UPPER", "SAME_LOWER"))
    kinds = ["auto_pad written as ONNX's pads"] if made is not None else []
    source = pool = made if made is not None else node
    attrs = attributes(source)
    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if attrs.get("ceil_mode", 0) and shape is not None and out is not None and len(shape) == 2 + len(window) \
            and not any(d != 1 for d in attrs.get("dilations", [])):
        half = len(window)
        strides, pads = list(attrs.get("strides", [1] * half)), list(attrs.get("pads", [0] * 2 * half))
        above = _floor_pads_above(shape[2:], out[2:], window, strides, pads[:half], pads[half:])
        if above is not None and above != pads[half:]:
            pool = _like("MaxPool", list(node.input), list(node.output), node.name, pads=[*pads[:half], *above])
            pool.attribute.extend(a for a in source.attribute if a.name not in ("pads", "ceil_mode", "auto_pad"))
            kinds.append("ceil_mode as pads above")
    return None if not kinds else (f"MaxPool {' and '.join(kinds)}", [pool], [])


def _pad(node: Any, cx: _Context) -> Made | None:
    """A Pad in a form the importer misreads, in the one it reads (op/pad.hpp): of opset 11 on, the pads an input and
    mode its one attribute; before, a 4-D constant Pad's attributes in the order mode, pads, value."""
    attrs = attributes(node)
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode in ("reflect", "edge"):
        return _border_pad(node, cx, mode)
    if "pads" not in attrs:
        if len(attrs) == 1 or len(node.input) < 2 or not node.input[1]:
            return None
        return "Pad's one attribute, mode, written out", [_like("Pad", list(node.input), list(node.output), node.name,
                                                                mode=mode)], []
    shape = cx.shapes.get(node.input[0])
    if mode != "constant" or shape is None or len(shape) != 4 or len(attrs["pads"]) != 8 \
            or [a.name for a in node.attribute] == PAD_ATTRIBUTES:
        return None
    made = _like("Pad", [node.input[0]], list(node.output), node.name, mode=mode, pads=list(attrs["pads"]),
                 value=float(attrs.get("value", 0.0)))  # (make_node writes them sorted: mode, pads, value)
    return "Pad's attributes in the order the importer reads them (mode, pads, value)", [made], []


def _border_pad(node: Any, cx: _Context, mode: str) -> Made | None:
    """A reflect or edge Pad (CycleGAN's and style transfer's ReflectionPad2d; the importer pads zeros whatever the
    mode) as a Gather of constant indices along each padded axis: reflect reads i -> -i before the start and
    2 (n - 1) - i past the end, edge the nearest element; every value is one of the input's."""
    import numpy as np
    from onnx import numpy_helper

    attrs, shape = attributes(node), cx.shapes.get(node.input[0])
    pads = attrs.get("pads") if "pads" in attrs else (
        cx.values.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None)
    if shape is None or pads is None:
        return None
    pads, rank = [int(p) for p in np.ravel(pads)], len(shape)
    axes = list(attrs.get("axes", [])) or (list(cx.values[node.input[3]]) if len(node.input) > 3 and node.input[3]
                                           and node.input[3] in cx.values else list(range(rank)))
    half = len(pads) // 2
    if len(axes) != half or any(p < 0 for p in pads) or any(
            mode == "reflect" and max(pads[k], pads[half + k]) >= shape[int(a) % rank] for k, a in enumerate(axes)):
        return None
    base, made, initializers, tensor = node.name or node.output[0], [], [], node.input[0]
    padded = [(int(a) % rank, pads[k], pads[half + k]) for k, a in enumerate(axes) if pads[k] or pads[half + k]]
    for j, (axis, before, after) in enumerate(padded):
        n, i = shape[axis], np.arange(-before, shape[axis] + after)
        index = np.clip(i, 0, n - 1) if mode == "edge" else np.where(i < 0, -i, np.where(i >= n, 2 * (n - 1) - i, i))
        name = cx.namer(f"{base}/{mode}_index{axis}")
        initializers.append(numpy_helper.from_array(index.astype(np.int64), name))
        out = node.output[0] if j == len(padded) - 1 else cx.namer(f"{base}/{mode}{axis}")
        made.append(_like("Gather", [tensor, name], [out], node.name if out == node.output[0] else
                          cx.namer(f"{base}/Gather{axis}"), axis=axis))
        tensor = out
    if not made:
        made = [_like("Identity", [node.input[0]], list(node.output), node.name)]
    return f"Pad in {mode} mode written as Gathers of its indices", made, initializers


def _einsum(node: Any, cx: _Context) -> Made | None:
    """An Einsum of static shapes (torch.einsum's attention; a Performer's three operands, two at a time) as
    Transposes, Reshapes and a MatMul a pair (core/opconfigs/einsum.py); the importer has no translator for Einsum."""
    import numpy as np
    from onnx import numpy_helper

    shapes = [cx.shapes.get(t) for t in node.input]
    equation = attributes(node).get("equation", b"")
    chain = None if None in shapes or not shapes else einsum.steps(
        equation.decode() if isinstance(equation, bytes) else str(equation), shapes)
    plans = [einsum.plan(step, given) for step, given in chain or []]
    if not plans or None in plans:
        return None
    base, nodes, initializers = node.name or node.output[0], [], []

    def step(op_type: str, inputs: list[str], last: bool, shape: list[int] | None = None, **attrs: Any) -> str:
        out = node.output[0] if last else cx.namer(f"{base}/{op_type.lower()}")
        if shape is not None:
            inputs = [*inputs, cx.namer(f"{base}/{op_type.lower()}_shape")]
            initializers.append(numpy_helper.from_array(np.array(shape, np.int64), inputs[-1]))
        nodes.append(_like(op_type, inputs, [out], cx.namer(f"{base}/{op_type}"), **attrs))
        return out

    inputs = list(node.input[:2])
    for k, ((_, given), made) in enumerate(zip(chain, plans, strict=True)):
        operands, one, final = [], len(made.operands) == 1, k == len(plans) - 1
        for tensor, shape, operand in zip(inputs, given, made.operands, strict=True):
            if operand.perm != sorted(operand.perm):
                tensor = step("Transpose", [tensor], one and final, perm=operand.perm)
            if not one and operand.shape != [shape[i] for i in operand.perm]:
                tensor = step("Reshape", [tensor], False, operand.shape)
            operands.append(tensor)
        if one:
            if not nodes:
                step("Identity", operands, True)
            return "Einsum written as a Transpose", nodes, initializers
        moved = made.out_perm != sorted(made.out_perm)
        product = step("Reshape", [step("MatMul", operands, False)], final and not moved, made.product)
        if moved:
            product = step("Transpose", [product], final, perm=made.out_perm)
        inputs = [product, *node.input[k + 2:k + 3]]
    return "Einsum written as Transposes, Reshapes and a MatMul a pair of operands", nodes, initializers


def _average_pool(node: Any, cx: _Context) -> Made | None:
    """A 2-D AveragePool the importer takes wrong (its translator reads kernel_shape and strides only: pads and
    ceil_mode dropped, the windows shifted or fewer; no strides attribute: it aborts) as a Pad of zeros to every
    window the model has, the pool without padding, and a Mul by each output's own divisor over the window's size
    (ONNX's count_include_pad and ceil_mode rules, taken from ONNX's reference pooling a tensor of ones). Inception's
    3x3 average pools, padded 1, count_include_pad 0."""
    import numpy as np
    from onnx import numpy_helper

    window = list(attributes(node).get("kernel_shape", []))
    if attributes(node).get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):  # (written as ONNX's pads first)
        node = _auto_pad_written(node, cx, window, ("SAME_UPPER", "SAME_LOWER", "VALID"))
        if node is None:
            return None
    attrs = attributes(node)
    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    if shape is None or out is None or len(shape) != 4 or len(window) != 2:
        return None
    strides, pads = list(attrs.get("strides", [1, 1])), list(attrs.get("pads", [0, 0, 0, 0]))
    if "strides" in attrs and not any(pads) and not attrs.get("ceil_mode", 0):
        return None
    base = node.name or node.output[0]
    if (above := _floor_pads_above(shape[2:], out[2:], window, strides, pads[:2], [0, 0])) is None:
        return None
    made, initializers, pooled = [], [], node.input[0]
    if any(pads[:2]) or any(above):
        written = _zero_pad(node.input[0], [0, 0, *pads[:2], 0, 0, *above], base, cx)
        assert written is not None  # (eight pads: a Pad of every opset takes them)
        pad, initializers, pooled = written
        made.append(pad)
    ones = np.ones([1, 1, *shape[2:]], np.float32)
    (theirs,) = _evaluate(node, {node.input[0]: ones}, cx.opsets)  # (ONNX's own divisors)
    plain = _like("AveragePool", [pooled], [cx.namer(f"{base}/pooled")], cx.namer(f"{base}/AveragePool"),
                  kernel_shape=window, strides=strides)
    padded = np.pad(ones, [(0, 0), (0, 0), (pads[0], above[0]), (pads[1], above[1])])
    (ours,) = _evaluate(_like("AveragePool", ["x"], ["y"], "ours", kernel_shape=window, strides=strides),
                        {"x": padded}, cx.opsets)
    scale = (np.asarray(theirs) / np.asarray(ours)).astype(np.float16 if cx.types.get(node.input[0]) == HALF
                                                           else np.float32)
    if np.allclose(scale, 1):
        plain.output[0] = node.output[0]
        plain.name = node.name or plain.name
        return "AveragePool written with its strides", [*made, plain], initializers
    divisors = cx.namer(f"{base}/divisors")
    made += [plain, _like("Mul", [plain.output[0], divisors], list(node.output),
                          node.name or cx.namer(f"{base}/Mul"))]
    return ("AveragePool's padding written as a Pad and its divisors as a Mul", made,
            [*initializers, numpy_helper.from_array(scale, divisors)])


def _conv_transpose_1d(node: Any, cx: _Context) -> Made | None:
    """A 1-D ConvTranspose (HiFi-GAN's upsampling; the importer's checks take NCHW only) as the convolution it is:
    the input with stride - 1 zeros after each sample (a Pad of a trailing axis, a Reshape, a Slice), then a Conv1d of
    the flipped filter, [Cout, Cin, k], padded k - 1 - pad below and that plus output_padding above."""
    import numpy as np
    from onnx import numpy_helper

    attrs = attributes(node)
    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    weight = cx.initializers.get(node.input[1]) if len(node.input) > 1 else None
    if shape is None or out is None or len(shape) != 3 or weight is None or int(attrs.get("group", 1)) != 1 \
            or any(d != 1 for d in attrs.get("dilations", [1])) or "output_shape" in attrs \
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or cx.opsets.get("", 1) < 11:
        return None
    w = numpy_helper.to_array(weight)
    (stride,), pads = list(attrs.get("strides", [1])), list(attrs.get("pads", [0, 0]))
    (extra,), k = list(attrs.get("output_padding", [0])), int(w.shape[2])
    below, above = k - 1 - pads[0], k - 1 - pads[1] + extra
    n, c, length = shape
    spread = (length - 1) * stride + 1
    if below < 0 or above < 0 or spread + below + above - k + 1 != out[2]:
        return None
    base = node.name or node.output[0]
    t = {key: cx.namer(f"{base}/{key}") for key in ("wide", "wide_shape", "row", "row_shape", "spread", "starts",
                                                     "ends", "axes", "filter")}
    gaps = _zero_pad(t["wide"], [0, 0, 0, 0, 0, 0, 0, stride - 1], f"{base}/gaps", cx)
    padded = _zero_pad(t["spread"], [0, 0, below, 0, 0, above], base, cx)
    assert gaps is not None and padded is not None  # (opset 11 on: a Pad of any rank)
    values = {"wide_shape": [n, c, length, 1], "row_shape": [n, c, length * stride], "starts": [0], "ends": [spread],
              "axes": [2]}
    made = [_like("Reshape", [node.input[0], t["wide_shape"]], [t["wide"]], cx.namer(f"{base}/Reshape_wide")),
            gaps[0], _like("Reshape", [gaps[2], t["row_shape"]], [t["row"]], cx.namer(f"{base}/Reshape_row")),
            _like("Slice", [t["row"], t["starts"], t["ends"], t["axes"]], [t["spread"]], cx.namer(f"{base}/Slice")),
            padded[0], _like("Conv", [padded[2], t["filter"], *node.input[2:3]], list(node.output),
                             node.name or cx.namer(f"{base}/Conv"), kernel_shape=[k], strides=[1], pads=[0, 0])]
    initializers = [*gaps[1], *padded[1], *(numpy_helper.from_array(np.array(v, np.int64), t[key])
                                            for key, v in values.items())]
    initializers.append(numpy_helper.from_array(np.ascontiguousarray(w[:, :, ::-1].transpose(1, 0, 2)), t["filter"]))
    return "1-D ConvTranspose written as zeros between its samples and a Conv1d of the flipped filter", made, \
        initializers


def _conv_transpose(node: Any, cx: _Context) -> Made | None:
    """A 2-D ConvTranspose whose output_padding or unequal pads kdb's rows cannot take (torch's exact 2x upsampling:
    stride 2, padding 1, output_padding 1; NNFusion's output shape is (in - 1) * stride + k - 2 * pad) as the
    ConvTranspose without padding, its whole output, then a Slice of the model's rows and columns from the pads
    below: each output element is the same sum of the same products."""
    import numpy as np
    from onnx import numpy_helper

    shape = cx.shapes.get(node.input[0])
    if shape is not None and len(shape) == 3:
        return _conv_transpose_1d(node, cx)
    attrs = attributes(node)
    pads, out = list(attrs.get("pads", [0, 0, 0, 0])), cx.shapes.get(node.output[0])
    if (pads[:2] == pads[2:] and not any(attrs.get("output_padding", [0, 0]))) or cx.opsets.get("", 1) < 10 \
            or out is None or not conv_transpose_sliceable(node, attrs, cx.shapes):
        return None
    base = node.name or node.output[0]
    t = {k: cx.namer(f"{base}/{k}") for k in ("whole", "starts", "ends", "axes")}
    conv = _like("ConvTranspose", list(node.input), [t["whole"]], cx.namer(f"{base}/ConvTranspose"), pads=[0, 0, 0, 0])
    conv.attribute.extend(a for a in node.attribute if a.name not in ("pads", "output_padding"))
    cut = _like("Slice", [t["whole"], t["starts"], t["ends"], t["axes"]], list(node.output), node.name or
                cx.namer(f"{base}/Slice"))
    values = {"starts": pads[:2], "ends": [b + o for b, o in zip(pads[:2], out[2:], strict=True)], "axes": [2, 3]}
    return ("ConvTranspose's padding and output_padding written as a Slice of its whole output", [conv, cut],
            [numpy_helper.from_array(np.array(v, np.int64), t[k]) for k, v in values.items()])


def _constant(node: Any, cx: _Context) -> Made | None:
    """A Constant NNFusion's importer cannot make (a half one: `kdb model fp16`'s of a torch export's Constants;
    a value_float ...): an initializer of its value, under its output's name."""

    if not import_rules.constant(node, attributes(node)):
        return None
    try:
        (value,) = _evaluate(node, {}, cx.opsets)
    except Exception:  # a Constant the reference cannot make (sparse): left, with its blocker
        return None
    nodes, initializers = readable_initializer(value, node.output[0], cx.namer)
    return "Constants written as initializers", nodes, initializers


def _squeeze(node: Any, cx: _Context) -> Made | None:
    """A Squeeze or Unsqueeze given its axes as an input (opset 13 on): a Reshape to its static output shape."""
    import numpy as np
    from onnx import numpy_helper

    out = cx.shapes.get(node.output[0])
    if len(node.input) < 2 or not node.input[1] or "axes" in attributes(node) or out is None:
        return None
    name = cx.namer(f"{node.name or node.output[0]}/shape")
    return (f"{node.op_type} of axes as an input written as a Reshape",
            [_like("Reshape", [node.input[0], name], list(node.output), node.name)],
            [numpy_helper.from_array(np.array(out, np.int64), name)])


def _conv(node: Any, cx: _Context) -> Made | None:
    """A Conv's auto_pad (torch's `padding="same"`; the importer aborts on any) written as its pads, pads that differ
    before and after as a Pad node, then the rewrites of the convolutions the importer cannot take as they are."""
    filters = cx.shapes.get(node.input[1]) if len(node.input) > 1 else None
    window = list(attributes(node).get("kernel_shape", filters[2:] if filters else [])) or None
    conv, kinds, first, initializers = node, [], [], []
    if (written := _auto_pad_written(node, cx, window, ("SAME_UPPER", "SAME_LOWER", "VALID"))) is not None:
        conv, kinds = written, ["auto_pad written as ONNX's pads"]
    if (apart := _pads_apart(conv, cx)) is not None:
        pad, pads_init, conv = apart
        first, initializers, kinds = [pad], pads_init, [*kinds, "pads that differ before and after as a Pad"]
    made = _grouped_conv(conv, cx) or _depthwise_1d(conv, cx) or _depthwise_padding(conv, cx)
    if not kinds:
        return made
    kind, nodes, more = made or ("", [conv], [])
    return "Conv " + ", then ".join([*kinds, *([kind] if kind else [])]), [*first, *nodes], [*initializers, *more]


def _pads_apart(node: Any, cx: _Context) -> tuple[Any, Any, Any] | None:
    """A Conv whose pads differ before and after (an even kernel's SAME; TensorFlow's exports), as a Pad of zeros and
    the Conv without padding: (the Pad, its initializers, the Conv). The importer would pad with a Pad node of its
    own, the two halves swapped (conv.cpp: padding_above takes the first): the input shifted, wrong numbers."""
    pads = [int(p) for p in attributes(node).get("pads", [])]
    shape, half = cx.shapes.get(node.input[0]), len(pads) // 2
    if not pads or pads[:half] == pads[half:] or shape is None or len(shape) != 2 + half:
        return None
    if (written := _zero_pad(node.input[0], [0, 0, *pads[:half], 0, 0, *pads[half:]], node.name or node.output[0],
                             cx)) is None:
        return None
    pad, pads_init, padded = written
    cx.shapes[padded] = [*shape[:2], *(n + b + a for n, b, a in zip(shape[2:], pads[:half], pads[half:], strict=True))]
    if node.input[0] in cx.types:
        cx.types[padded] = cx.types[node.input[0]]
    conv = _like("Conv", [padded, *node.input[1:]], list(node.output), node.name, pads=[0] * len(pads))
    conv.attribute.extend(a for a in node.attribute if a.name not in ("pads", "auto_pad"))
    return pad, pads_init, conv


def _zero_pad(x: str, pads: list[int], base: str, cx: _Context) -> tuple[Any, list[Any], str] | None:
    """A Pad of zeros (a conv's own padding) of x: (its node, its initializers, its output), or None where the
    importer cannot read it. From opset 11 on, one attribute, mode, and the pads an input: op/pad.hpp reads that form
    when the node has exactly one attribute. Before, the attributes mode, pads and value, in that order (make_node
    sorts them so), and 4-D only: the importer reads them by position, eight pads."""
    import numpy as np
    from onnx import numpy_helper

    padded, node_name = cx.namer(f"{base}/padded"), cx.namer(f"{base}/Pad")
    if cx.opsets.get("", 1) < 11:
        if len(pads) != 8:
            return None
        return _like("Pad", [x], [padded], node_name, mode="constant", pads=pads, value=0.0), [], padded
    pads_name = cx.namer(f"{base}/pads")
    return (_like("Pad", [x, pads_name], [padded], node_name, mode="constant"),
            [numpy_helper.from_array(np.array(pads, np.int64), pads_name)], padded)


def undilated(weight: Any, dilations: list[int]) -> Any:
    """A depthwise filter [C, 1, kh, kw] of these dilations as the undilated one that computes the same: its taps
    spread out, zeros between them (NNFusion's DepthwiseConv2dNative takes no dilation)."""
    import numpy as np

    if all(d == 1 for d in dilations):
        return weight
    taps = weight.shape[2:]
    spread = np.zeros((*weight.shape[:2], *[d * (k - 1) + 1 for d, k in zip(dilations, taps, strict=True)]),
                      weight.dtype)
    spread[:, :, ::dilations[0], ::dilations[1]] = weight
    return spread


def _depthwise_padding(node: Any, cx: _Context) -> Made | None:
    """A 2-D depthwise convolution the importer aborts on for its dilation (a TCN's) or for padding alike before and
    after but neither SAME nor VALID: its filter undilated (zeros between the taps), its padding a Pad of zeros and
    the VALID convolution."""
    from onnx import numpy_helper

    attrs = attributes(node)
    shape, weight = cx.shapes.get(node.input[0]), cx.shapes.get(node.input[1]) if len(node.input) > 1 else None
    if shape is None or weight is None or len(shape) != 4 or int(attrs.get("group", 1)) != shape[1] \
            or weight[:2] != [shape[1], 1]:
        return None
    pads, dilations = list(attrs.get("pads", [0] * 4)), list(attrs.get("dilations", [1, 1]))
    dilated = any(d != 1 for d in dilations)
    if dilated and node.input[1] not in cx.initializers:
        return None
    kernel = [d * (k - 1) + 1 for d, k in zip(dilations, weight[2:], strict=True)]
    padded_ok = depthwise_padding_ok(pads, [1, 1], kernel)
    if not dilated and padded_ok:
        return None
    base = node.name or node.output[0]
    made, initializers, inputs = [], [], list(node.input)
    if dilated:
        inputs[1] = cx.namer(f"{base}/undilated")
        spread = undilated(numpy_helper.to_array(cx.initializers[node.input[1]]), dilations)
        initializers.append(numpy_helper.from_array(spread, inputs[1]))
    if not padded_ok:
        written = _zero_pad(node.input[0], [0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]], base, cx)
        assert written is not None  # (eight pads: a Pad of every opset takes them)
        pad, pads_init, inputs[0] = written
        made, pads = [pad], [0, 0, 0, 0]
        initializers += pads_init
    conv = _like("Conv", inputs, list(node.output), node.name, pads=pads, kernel_shape=kernel, dilations=[1, 1])
    conv.attribute.extend(a for a in node.attribute if a.name not in ("pads", "auto_pad", "kernel_shape",
                                                                      "dilations"))
    what = " and ".join([*(["dilation as zeros between its taps"] if dilated else []),
                         *(["padding as a Pad"] if not padded_ok else [])])
    return f"depthwise convolution's {what}", [*made, conv], initializers


def _depthwise_1d(node: Any, cx: _Context) -> Made | None:
    """A 1-D depthwise convolution (a Conformer's conv module; the importer's DepthwiseConv2dNative takes 4-D only) as
    the 2-D one it is: the input Reshaped to [N, C, 1, L], the filter [C, 1, 1, k], a 1 x k kernel, then back."""
    from onnx import numpy_helper

    attrs = attributes(node)
    shape, out = cx.shapes.get(node.input[0]), cx.shapes.get(node.output[0])
    weight = node.input[1] if len(node.input) > 1 else ""
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if shape is None or out is None or len(shape) != 3 or weight not in cx.initializers:
        return None
    w = numpy_helper.to_array(cx.initializers[weight])
    if int(attrs.get("group", 1)) != shape[1] or w.shape[:2] != (shape[1], 1):  # (depthwise, one filter a channel)
        return None
    import numpy as np

    base = node.name or node.output[0]
    n = {k: cx.namer(f"{base}/{k}") for k in ("to_2d", "input_2d", "weight_2d", "output_2d", "to_1d")}
    pads = list(attrs.get("pads", [0, 0]))
    w = undilated(w[:, :, None, :], [1, *attrs.get("dilations", [1])])[:, :, 0, :]  # (the importer takes no dilation)
    made_attrs = {"group": shape[1], "kernel_shape": [1, int(w.shape[2])], "pads": [0, pads[0], 0, pads[1]],
                  "strides": [1, *attrs.get("strides", [1])], "dilations": [1, 1]}
    made, conv_input, initializers = [], n["input_2d"], []
    if not depthwise_padding_ok(made_attrs["pads"], made_attrs["dilations"], made_attrs["kernel_shape"]):
        written = _zero_pad(n["input_2d"], [0, 0, 0, pads[0], 0, 0, 0, pads[1]], base, cx)
        assert written is not None  # (eight pads: a Pad of every opset takes them)
        pad, initializers, conv_input = written
        made, made_attrs["pads"] = [pad], [0, 0, 0, 0]  # (a causal conv's k - 1 each side)
    made = [_like("Reshape", [node.input[0], n["to_2d"]], [n["input_2d"]], cx.namer(f"{base}/Reshape_2d")), *made,
            _like("Conv", [conv_input, n["weight_2d"], *([bias] if bias else [])], [n["output_2d"]],
                  cx.namer(f"{base}/Conv_2d"), **made_attrs),
            _like("Reshape", [n["output_2d"], n["to_1d"]], list(node.output), node.name)]
    initializers += [numpy_helper.from_array(np.array([shape[0], shape[1], 1, shape[2]], np.int64), n["to_2d"]),
                     numpy_helper.from_array(w.reshape(w.shape[0], 1, 1, w.shape[2]), n["weight_2d"]),
                     numpy_helper.from_array(np.array(out, np.int64), n["to_1d"])]
    return "1-D depthwise convolution written as a 2-D one", made, initializers


def _grouped_conv(node: Any, cx: _Context) -> Made | None:
    """A grouped convolution that is not depthwise (ResNeXt's, RegNet's: the importer aborts on all of them) as one
    convolution a group: the input's channels Sliced per group (constant bounds), the filter and bias cut into
    initializers, the outputs Concatenated over channels. BlockFusion can run the groups' kernels side by side."""
    import numpy as np
    from onnx import numpy_helper

    attrs = attributes(node)
    groups, shape = int(attrs.get("group", 1)), cx.shapes.get(node.input[0])
    names = [node.input[1] if len(node.input) > 1 else "", node.input[2] if len(node.input) > 2 else ""]
    if groups == 1 or shape is None or names[0] not in cx.initializers or (names[1] and names[1] not in
                                                                         cx.initializers):
        return None
    weight = numpy_helper.to_array(cx.initializers[names[0]])
    bias = numpy_helper.to_array(cx.initializers[names[1]]) if names[1] else None
    channels, filters = shape[1], weight.shape[0]
    if groups == channels or channels % groups or filters % groups:  # (depthwise: the importer takes it)
        return None
    base, each, per = node.name or node.output[0], channels // groups, filters // groups
    made, initializers, outputs = [], [], []
    kept = {k: v for k, v in attrs.items() if k != "group"}
    for k in range(groups):
        n = {w: cx.namer(f"{base}/{w}_{k}") for w in ("starts", "ends", "axes", "input", "weight", "bias", "output")}
        initializers += [numpy_helper.from_array(np.array([k * each], np.int64), n["starts"]),
                         numpy_helper.from_array(np.array([(k + 1) * each], np.int64), n["ends"]),
                         numpy_helper.from_array(np.array([1], np.int64), n["axes"]),
                         numpy_helper.from_array(weight[k * per:(k + 1) * per], n["weight"])]
        made.append(_like("Slice", [node.input[0], n["starts"], n["ends"], n["axes"]], [n["input"]],
                          cx.namer(f"{base}/Slice_{k}")))
        inputs = [n["input"], n["weight"]]
        if bias is not None:
            initializers.append(numpy_helper.from_array(bias[k * per:(k + 1) * per], n["bias"]))
            inputs.append(n["bias"])
        made.append(_like("Conv", inputs, [n["output"]], cx.namer(f"{base}/Conv_{k}"), **kept))
        outputs.append(n["output"])
    made.append(_like("Concat", outputs, list(node.output), node.name, axis=1))
    return "grouped convolution written as one a group", made, initializers


def _lstm(node: Any, cx: _Context) -> Made | None:
    """An LSTM (NNFusion imports it but has no CUDA kernel for it) unrolled as ONNX defines it: each step of each
    direction a MatMul of the step's input by W^T and of the state by R^T (the weights transposed into initializers),
    the biases added, the gates (i, o, f, c) Sliced, C = f * C + i * tanh(c~), H = o * tanh(C); Y, Y_h and Y_c
    Concatenated as the node gives them. Left alone: peepholes, sequence_lens, clip, other activations, layout 1,
    input_forget (the importer has nothing of these to compare with)."""
    import numpy as np
    from onnx import numpy_helper

    attrs = attributes(node)
    inputs = [*node.input, *[""] * (8 - len(node.input))]
    x_shape = cx.shapes.get(inputs[0])
    if (x_shape is None or len(x_shape) != 3 or inputs[1] not in cx.initializers or inputs[2] not in cx.initializers
            or (inputs[3] and inputs[3] not in cx.initializers) or inputs[4] or inputs[7]
            or any(attrs.get(k) for k in ("activations", "activation_alpha", "activation_beta", "clip", "layout",
                                          "input_forget"))):
        return None
    steps, batch, _ = x_shape
    w, r = (numpy_helper.to_array(cx.initializers[t]) for t in inputs[1:3])
    directions, hidden = w.shape[0], w.shape[1] // 4
    b = numpy_helper.to_array(cx.initializers[inputs[3]]) if inputs[3] else np.zeros((directions, 8 * hidden), w.dtype)
    base = node.name or node.output[0]
    made, inits = [], []

    def name(what: str) -> str:
        return cx.namer(f"{base}/{what}")

    def const(what: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), t := name(what)))
        return t

    def op(op_type: str, ins: list[str], what: str, out: str | None = None, **kw: Any) -> str:
        made.append(_like(op_type, ins, [out or (t := name(what))], name(f"{what}_node"), **kw))
        return out or t

    def sliced(tensor: str, start: int, end: int, axis: int, what: str) -> str:
        return op("Slice", [tensor, const(f"{what}_s", [start]), const(f"{what}_e", [end]), const(f"{what}_a", [axis])],
                  what)

    def state(index: int, d: int, what: str) -> str:
        if not inputs[index]:
            return const(f"{what}0_d{d}", np.zeros((batch, hidden), w.dtype))
        return op("Reshape", [sliced(inputs[index], d, d + 1, 0, f"{what}0_d{d}_slice"),
                              const(f"{what}0_d{d}_shape", [batch, hidden])], f"{what}0_d{d}")

    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    ys, hs, cs = [], [], []
    for d in range(directions):
        backwards = direction == "reverse" or (direction == "bidirectional" and d == 1)
        wt, rt = const(f"W_d{d}", w[d].T.copy()), const(f"R_d{d}", r[d].T.copy())
        bias = const(f"B_d{d}", b[d, :4 * hidden] + b[d, 4 * hidden:])
        h, c, outs = state(5, d, "h"), state(6, d, "c"), {}
        for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
            p = f"d{d}_t{t}"
            x = op("Reshape", [sliced(inputs[0], t, t + 1, 0, f"x_{p}"), const(f"x_{p}_shape", [batch, x_shape[2]])],
                   f"x_{p}_2d")
            gates = op("Add", [op("Add", [op("MatMul", [x, wt], f"xw_{p}"), op("MatMul", [h, rt], f"hr_{p}")],
                                  f"sum_{p}"), bias], f"gates_{p}")
            i, o, f, g = (sliced(gates, k * hidden, (k + 1) * hidden, 1, f"{gate}_{p}")
                          for k, gate in enumerate("iofc"))
            i, o, f = (op("Sigmoid", [v], f"{gate}_act_{p}") for v, gate in ((i, "i"), (o, "o"), (f, "f")))
            c = op("Add", [op("Mul", [f, c], f"fc_{p}"), op("Mul", [i, op("Tanh", [g], f"g_{p}")], f"ig_{p}")],
                   f"c_{p}")
            h = op("Mul", [o, op("Tanh", [c], f"tc_{p}")], f"h_{p}")
            outs[t] = op("Reshape", [h, const(f"y_{p}_shape", [1, 1, batch, hidden])], f"y_{p}")
        ys.append(op("Concat", [outs[t] for t in range(steps)], f"y_d{d}", axis=0) if steps > 1 else outs[0])
        hs.append(op("Reshape", [h, const(f"h_d{d}_shape", [1, batch, hidden])], f"h_d{d}"))
        cs.append(op("Reshape", [c, const(f"c_d{d}_shape", [1, batch, hidden])], f"c_d{d}"))
    for out, parts, axis in zip(node.output, (ys, hs, cs), (1, 0, 0), strict=False):
        if out:
            op("Concat", parts, f"{out}_concat", out=out, axis=axis) if len(parts) > 1 else \
                op("Identity", parts, f"{out}_identity", out=out)
    return "LSTM unrolled as ONNX defines it", made, inits


def _instance_norm(node: Any, cx: _Context) -> Made | None:
    """InstanceNormalization (torch's GroupNorm and InstanceNorm export it; the importer has no translator) as its
    formula over the spatial axes (_normalised), each mean as importable_reduce writes it (a ReduceMean of an axes
    attribute below opset 18, a MatMul from 18 on). A half one is computed in float between two Casts: NNFusion's mean
    is a Sum, then a Divide, and a half Sum of a long row overflows (a GroupNorm(1, 512) over 200 steps gave zeros)."""
    import numpy as np

    shape, scale, bias = cx.shapes.get(node.input[0]), cx.values.get(node.input[1]), cx.values.get(node.input[2])
    if shape is None or len(shape) < 3 or scale is None or bias is None:
        return None
    axes, broadcast = list(range(2, len(shape))), [shape[1]] + [1] * (len(shape) - 2)
    kept = [*shape[:2], *[1] * (len(shape) - 2)]
    made, initializers, how = _normalised(node, cx, shape, axes, kept, scale.reshape(broadcast).astype(np.float32),
                                          bias.reshape(broadcast).astype(np.float32), node.name)
    in_float = " in float, between Casts" if cx.types.get(node.input[0]) == HALF else ""
    return f"InstanceNormalization written as its formula{in_float} (its means with {how})", made, initializers


_REWRITES: dict[str, Rewrite] = {
    "InstanceNormalization": _instance_norm, "Conv": _conv, "LSTM": _lstm,
    "Constant": _constant, "Squeeze": _squeeze, "Unsqueeze": _squeeze,
    "MaxPool": _max_pool, "Pad": _pad, "AveragePool": _average_pool, "ConvTranspose": _conv_transpose,
    "Einsum": _einsum, "ReduceLogSumExp": _log_sum_exp,
    "Flatten": _flatten, "Min": _min_max, "Max": _min_max, "Gather": _gather, "Slice": _slice,
    "Transpose": _transpose, "LayerNormalization": _layer_norm, "DepthToSpace": _depth_to_space, "Gelu": _gelu,
    "Reciprocal": _reciprocal, "Resize": _resize_by_sizes, "ReduceSum": _reduce_of_axes_input, "Split": _split,
    "Where": _where,
    "ReduceMean": _reduce_of_axes_input, "ReduceL2": _reduce_l2, "ReduceMax": _reduce_extreme,
    "ReduceMin": _reduce_extreme,
}

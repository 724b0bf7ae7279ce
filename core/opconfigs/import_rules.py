"""More of what NNFusion's ONNX importer does to a node, beside core/opconfigs/nnfusion_import.py's checks: the inputs
it evaluates while importing, the element-wise ops it reads only two inputs of, the Flatten axis it compares unsigned,
the pads it gives a MaxPool of auto_pad, and graph inputs of a dynamic size. Each rule cites the importer's source
(microsoft/nnfusion main, frontend/onnx_import/); each was seen with the compiler in ../shared/nnfusion (the tests
in tests/test_import_rules.py hold them against it). `kdb model expand` rewrites what these rules find where it can
(core/opconfigs/import_rewrites.py)."""

from __future__ import annotations

import math
from typing import Any

Shapes = dict[str, list[int]]

# Inputs the importer needs the value of while it imports (GetValueFromNGraphOp): op type -> their indices. A value
# computed in the graph is evaluated by compiling a CUDA program for compute_60 and running it on the GPU
# (frontend/util/evaluator.hpp, engine/profiler/cuda_runtime.cpp).
VALUE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Slice": (1, 2, 3, 4), "Range": (0, 1, 2),
    "CumSum": (1,), "OneHot": (1, 2),
}
EXPAND_HINT = "`kdb model expand IN OUT` rewrites it"


def constant_values(graph: Any, name: str) -> list[float] | None:
    """The values of a graph's initializer or Constant node output (None: neither)."""
    from onnx import numpy_helper

    for t in graph.initializer:
        if t.name == name:
            return [float(v) for v in numpy_helper.to_array(t).ravel()]
    for n in graph.node:
        if n.op_type == "Constant" and name in n.output:
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            return None if value is None else [float(v) for v in numpy_helper.to_array(value).ravel()]
    return None


def constant_tensors(graph: Any) -> set[str]:
    """The tensors the importer holds as constants: initializers, Constant nodes' outputs, and Shape nodes' outputs
    (op/shape.cpp makes a Constant of the input's static shape; it reads no start or end, so a Shape that has them
    is left out)."""
    shapes = {o for n in graph.node if n.op_type == "Shape" and not any(a.name in ("start", "end") for a in n.attribute)
              for o in n.output}
    return {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output} \
        | shapes


RANDOM_OPS = frozenset(["RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"])  # (other each run)
# elements: what `kdb model expand` folds at most into one initializer (a causal mask of 1,024 x 1,024; 4 MB in float)
FOLD_LIMIT = 1 << 20


def constant_computed(graph: Any, shapes: dict[str, list[int]]) -> set[str]:
    """The tensors computed from constants and static shapes alone (a causal mask's Trilu of ones, `x.size(-1)`'s
    Gather of a Shape): what `kdb model expand` folds into initializers, where ONNX's reference evaluates them."""
    known = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    outputs = {o.name for o in graph.output}  # (expand leaves a graph output a node's)
    for node in graph.node:
        if outputs.intersection(node.output):
            continue
        if node.op_type == "Shape" and node.input and node.input[0] in shapes:
            known.update(node.output)
        elif node.input and node.op_type not in RANDOM_OPS and all(not t or t in known for t in node.input) \
                and all(o in shapes and math.prod(shapes[o]) <= FOLD_LIMIT for o in node.output if o):
            known.update(o for o in node.output if o)
    return known


def computed_value_input(node: Any, constants: set[str]) -> str:
    """Why the import aborts on a node whose shape-like input is computed in the graph (a torch export's
    `x.view(x.size(0), -1)`: Shape, Gather, Unsqueeze, Concat, then Reshape); "" when every such input is a constant."""
    computed = [node.input[i] for i in VALUE_INPUTS.get(node.op_type, ())
                if i < len(node.input) and node.input[i] and node.input[i] not in constants]
    if not computed:
        return ""
    return (f"{node.op_type} whose input {computed[0]!r} is computed in the graph: the importer evaluates it while "
            "importing, by building a CUDA program for compute_60 and running it on the GPU (frontend/util/"
            "evaluator.hpp); CUDA 13's nvcc builds no compute_60, and without a GPU nothing runs, so the import "
            "aborts (NNFusion's ONNX Runtime pre-pass folds it only where the python3 it runs has onnxruntime); "
            f"{EXPAND_HINT}: it folds what depends on static shapes into a constant")


def min_max_arity(node: Any) -> tuple[str, str]:
    """(blocker, wrong numbers) of a Min or Max: the importer's binary translators read inputs 0 and 1 only
    (op/binaryop.hpp), so one input aborts and a third is dropped."""
    if node.op_type not in ("Min", "Max") or node.domain not in ("", "ai.onnx"):
        return "", ""
    inputs = [i for i in node.input if i]
    if len(inputs) == 1:
        return (f"{node.op_type} of one input: the importer reads inputs 0 and 1 (op/binaryop.hpp) and aborts; "
                f"{EXPAND_HINT} as the Identity it is"), ""
    if len(inputs) > 2:
        return "", (f"{node.op_type} of {len(inputs)} inputs: the importer reads inputs 0 and 1 only (op/binaryop.hpp) "
                    f"and drops the rest; {EXPAND_HINT} as a chain of two-input {node.op_type}s")
    return "", ""


def legacy_broadcast(left: list[int], right: list[int], axis: int = 0) -> tuple[bool, bool]:
    """(imports, numpy's numbers) of NNFusion's legacy broadcast of `right` into `left` (util/broadcasting.cpp's
    legacy_style_broadcast_for_binary_operation, which Min's translator uses): the right operand's trailing and then
    leading ones are dropped, and what is left must match the left shape from `axis` + the leading ones on."""
    if left == right:
        return True, True
    core = list(right)
    while core and core[-1] == 1:
        core.pop()
    ones = next((k for k, d in enumerate(core) if d != 1), len(core))
    core, start = core[ones:], axis + ones
    if start + len(core) > len(left) or left[start:start + len(core)] != core:
        return False, False
    numpy_out = numpy_broadcast(left, right)
    # numpy aligns `right` to the last axis, the legacy rule at `axis`: the same wherever the ranks are equal
    return True, numpy_out == left and (not core or len(right) + axis == len(left))


def numpy_broadcast(a: list[int], b: list[int]) -> list[int] | None:
    """numpy's broadcast of two shapes; None when they do not broadcast."""
    rank = max(len(a), len(b))
    a, b = [1] * (rank - len(a)) + a, [1] * (rank - len(b)) + b
    if any(x != y and 1 not in (x, y) for x, y in zip(a, b, strict=True)):
        return None
    return [max(x, y) for x, y in zip(a, b, strict=True)]


def min_broadcast(node: Any, shapes: Shapes) -> tuple[str, str]:
    """(blocker, wrong numbers) of a two-input Min whose operands differ in shape: its translator broadcasts the old
    way (TranslateLegacyBinaryOp, from axis 0), not as numpy (Max, Add and the rest broadcast as numpy)."""
    inputs = [i for i in node.input if i]
    if node.op_type != "Min" or node.domain not in ("", "ai.onnx") or len(inputs) != 2:
        return "", ""
    left, right = shapes.get(inputs[0]), shapes.get(inputs[1])
    if left is None or right is None:
        return "", ""
    imports, same = legacy_broadcast(left, right)
    why = (f"Min of {left} and {right}: its translator broadcasts the second operand the old way, from axis 0 "
           "(op/binaryop.hpp's TranslateLegacyBinaryOp, util/broadcasting.cpp), not as numpy aligns it")
    if not imports:
        return f"{why}: the import aborts ('Broadcast argument shape ... incompatible'); {EXPAND_HINT} as Max", ""
    return ("", "") if same else ("", f"{why}: the numbers are not ONNX's; {EXPAND_HINT} as Max")


def flatten_axis_negative(node: Any, shapes: Shapes) -> str:
    """A Flatten of a negative axis: op/flatten.hpp compares the unsigned index with it (`i < axis`), so every axis
    goes into the first dimension: [N, 1] where ONNX gives another shape."""
    if node.op_type != "Flatten" or node.domain not in ("", "ai.onnx"):
        return ""
    from onnx import helper

    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    shape = shapes.get(node.input[0]) if node.input else None
    if axis >= 0 or shape is None:
        return ""
    onnx_out = [math.prod(shape[:axis]), math.prod(shape[axis:])]
    ours = [math.prod(shape), 1]
    if ours == onnx_out:
        return ""
    return (f"Flatten of axis {axis}: the importer compares it unsigned (op/flatten.hpp), so it flattens {shape} to "
            f"{ours} where ONNX gives {onnx_out}: what follows aborts where the shapes meet, or computes another "
            f"network; {EXPAND_HINT} (axis {len(shape) + axis})")


def dynamic_inputs(graph: Any) -> list[tuple[str, str]]:
    """(input, why) for each graph input with a dimension of no fixed size: the importer aborts on a dim_param it is
    not given a value for ('unknown input dim_param', core/value_info.hpp; nnfusion's -params flag gives one)."""
    constants = {t.name for t in graph.initializer}
    found = []
    for vi in graph.input:
        if vi.name in constants or not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim
        named = [d.dim_param for d in dims if d.HasField("dim_param") and d.dim_param]
        unknown = sum(1 for d in dims if not d.HasField("dim_param") and not d.HasField("dim_value"))
        if named:
            pins = " ".join(f"--dim {p}=N" for p in dict.fromkeys(named))
            found.append((vi.name, f"graph input {vi.name!r} has dimensions of no fixed size ({', '.join(named)}): "
                                   "the importer aborts ('unknown input dim_param'); `kdb model expand IN OUT "
                                   f"{pins}` pins them"))
        elif unknown:
            found.append((vi.name, f"graph input {vi.name!r} has {unknown} dimension(s) of no size at all: the "
                                   "importer cannot size it; export it with fixed sizes"))
    return found


def onnx_same_pads(size: list[int], out: list[int], window: list[int], strides: list[int],
                   auto_pad: str) -> tuple[list[int], list[int]]:
    """The pads below and above ONNX gives a window of auto_pad SAME_UPPER or SAME_LOWER (the total a stride and the
    input's size need, the odd one after or before); `window` dilated where the op dilates it."""
    total = [max(0, (o - 1) * s + w - n) for n, o, w, s in zip(size, out, window, strides, strict=True)]
    small, big = [t // 2 for t in total], [t - t // 2 for t in total]
    return (small, big) if auto_pad == "SAME_UPPER" else (big, small)


def max_pool_auto_pads(window: list[int], auto_pad: str) -> tuple[list[int], list[int]]:
    """The pads below and above NNFusion's importer gives a MaxPool of auto_pad SAME_UPPER or SAME_LOWER
    (util/util.cpp's get_auto_pads): from the window alone, floor and ceil of (k - 1) / 2, whatever the strides
    and the input's size (ONNX's SAME pads depend on both)."""
    small, big = [(k - 1) // 2 for k in window], [k // 2 for k in window]
    return (small, big) if auto_pad == "SAME_UPPER" else (big, small)


def negative_input(node: Any, op_type: str, index: int, graph: Any) -> int | None:
    """The least value of input `index` of an `op_type` node, where it is a constant with a negative value (indices,
    axes or steps the importer reads unsigned); None otherwise."""
    if node.op_type != op_type or len(node.input) <= index or not node.input[index]:
        return None
    value = constant_values(graph, node.input[index])
    return int(min(value)) if value and min(value) < 0 else None


def gather_negative_index(node: Any, graph: Any) -> str:
    """A Gather of constant negative indices (a torch export's `x[:, -1]`): op/gather.cpp normalises a negative axis
    but passes the indices as they are, and NNFusion's GatherV2 kernel reads them as unsigned: out of range, so
    zeros where ONNX counts from the end."""
    if node.domain not in ("", "ai.onnx") or (least := negative_input(node, "Gather", 1, graph)) is None:
        return ""
    return (f"Gather of the negative index {least}: NNFusion's GatherV2 kernel reads indices unsigned "
            "(op/gather.cpp passes them as they are), so it gathers zeros where ONNX counts from the end; "
            f"{EXPAND_HINT} (the index counted from 0)")


def gelu_approximation(node: Any) -> str:
    """A Gelu of approximate "tanh" (opset 20): the importer reads no attribute (TranslateUnaryOp<op::Gelu>) and its
    kernel is the exact erf form (x * normcdf(x))."""
    if node.op_type != "Gelu" or node.domain not in ("", "ai.onnx"):
        return ""
    from onnx import helper

    approximate = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "approximate"), b"none")
    if (approximate.decode() if isinstance(approximate, bytes) else approximate) != "tanh":
        return ""
    return ("Gelu of approximate \"tanh\": the importer reads no attribute (ops_bridge.cpp's TranslateUnaryOp) and "
            f"NNFusion computes the exact erf Gelu, 6e-4 apart relative; {EXPAND_HINT} (ONNX's tanh formula)")


def reduce_l2_unsquared(node: Any) -> str:
    """A ReduceL2 of keepdims 0: the importer's Sum reads the input, not the Square it made (op/reducel2.hpp), so the
    network computes sqrt(sum(x)) (torch.norm(x, dim=d), F.normalize's norm keeps its dims and is right)."""
    if node.op_type != "ReduceL2" or node.domain not in ("", "ai.onnx"):
        return ""
    if next((a.i for a in node.attribute if a.name == "keepdims"), 1):
        return ""
    return ("ReduceL2 of keepdims 0: NNFusion's importer sums the input, not its squares (op/reducel2.hpp: the Sum "
            f"reads input_index), so it computes sqrt(sum(x)); {EXPAND_HINT} (a sum of squares, then a Sqrt)")


def layer_norm_without_bias(node: Any) -> str:
    if node.op_type != "LayerNormalization" or (len(node.input) > 2 and node.input[2]):
        return ""
    return ("LayerNormalization without its bias input (torch's LayerNorm(bias=False)): the importer hands the inputs "
            "on as they are and NNFusion's LayerNorm checks three (generic_op_define/LayerNorm.cpp): it aborts; "
            f"{EXPAND_HINT} (a zero bias)")


def slice_negative_axis(node: Any, graph: Any) -> str:
    if (least := negative_input(node, "Slice", 3, graph)) is None:
        return ""
    return (f"Slice of the negative axis {least}: the importer takes it unsigned (op/slice.cpp's "
            f"`size_t axis = axes.at(idx)`) and aborts (vector::_M_range_check); {EXPAND_HINT} (axes counted from 0)")


def slice_negative_step(node: Any, graph: Any) -> str:
    """A Slice stepping backwards (torch's `x.flip`, a causal pad's reversed pads): op/slice.cpp makes the steps
    Strides (unsigned) and bounds lower <= upper; the Slice op's validation aborts."""
    if (least := negative_input(node, "Slice", 4, graph)) is None:
        return ""
    return (f"Slice of step {least}: the importer takes steps unsigned and bounds a slice lower to upper "
            "(op/slice.cpp), and the Slice's validation aborts ('m_lower_bounds[i] <= m_upper_bounds[i]'); "
            f"{EXPAND_HINT} (a Gather of the indices ONNX's Slice takes)")


def transpose_without_perm(node: Any) -> str:
    if node.op_type != "Transpose" or any(a.name == "perm" for a in node.attribute):
        return ""
    return ("Transpose without its perm attribute: the importer reads perm with no default (op/transpose.cpp) and "
            f"aborts ('unknown attribute'); {EXPAND_HINT} (the reversed axes, ONNX's default)")


CONSTANT_TYPES = {1: "float", 11: "double", 6: "int32", 7: "int64", 12: "uint32", 13: "uint64"}  # op/constant.hpp's


def constant(node: Any, attrs: dict[str, Any]) -> str:
    """A Constant the importer cannot make: op/constant.hpp reads the `value` attribute alone (a value_float,
    value_ints ... Constant aborts, 'unknown attribute') and makes only the element types of its ONNX_CONST_MAP (a
    half one, which `kdb model fp16` of a torch export's Constants gives, aborts in `map::at`)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
        return ""
    value = attrs.get("value")
    if value is None:
        given = next(iter(attrs), "no attribute")
        return (f"Constant given by {given}: the importer reads only its `value` tensor (op/constant.hpp) and aborts "
                f"('unknown attribute'); {EXPAND_HINT} (an initializer of the same value)")
    if value.data_type in CONSTANT_TYPES:
        return ""
    import onnx

    name = onnx.TensorProto.DataType.Name(value.data_type).lower()
    return (f"Constant of {name}: the importer makes Constants of {', '.join(CONSTANT_TYPES.values())} only "
            f"(op/constant.hpp's ONNX_CONST_MAP) and aborts ('map::at'); {EXPAND_HINT} (an initializer of the same "
            "value, which the importer takes in any type)")


def gru(node: Any, attrs: dict[str, Any]) -> str:
    """What op/gru.cpp does not translate: it returns both Y and Y_h (`node_proto.output(1)`, a protobuf CHECK
    without the second: torch's export writes both) and CHECKs away sequence_lens, activations and their alpha and
    beta, clip and layout 1."""
    if node.op_type != "GRU":
        return ""
    if len(node.output) < 2:
        return ("GRU of one output: the importer returns Y and Y_h and aborts reading a second output (a protobuf "
                "CHECK, op/gru.cpp); export both outputs (torch's nn.GRU does)")
    unsupported = [name for name in ("activations", "activation_alpha", "activation_beta") if attrs.get(name)]
    unsupported += ["clip"] if attrs.get("clip", 0) else []
    unsupported += ["layout 1"] if attrs.get("layout", 0) else []
    unsupported += ["sequence_lens"] if len(node.input) > 4 and node.input[4] else []
    if not unsupported:
        return ""
    return (f"GRU with {', '.join(unsupported)}: the importer CHECKs each away (op/gru.cpp: '... not supported') and "
            "aborts; export without them (torch's nn.GRU writes none)")

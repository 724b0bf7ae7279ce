"""What NNFusion cannot compile whatever its kernel DB holds: ONNX nodes its importer aborts or crashes on, and ops
it imports but has no CUDA kernel for. Learnt from NNFusion's sources (main, 00c1317: frontend/onnx_import/
ops_bridge.cpp, op/*.hpp, util/graph_convert.cpp, core/operators/generic_op/) and each pattern below seen with the
compiler in ../shared/nnfusion on a one-node model (tests/test_nnfusion_import.py holds them against it).

The importer translates a node by its op type, with the translator registered for the highest opset version not
above the model's. A node without one becomes NNFusion's generic op of the same name, which exists only for the
names NNFusion defines (GENERIC_OPS): any other aborts the compile ("No translator for Elu, try to convert to
generic op", then "No infershape or Antares IR found for op type: Elu"). Some translators read attributes that newer
opsets moved into inputs, or assume inputs that are optional: those patterns abort or crash too (BLOCKERS' checks).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from core.opconfigs import import_rules

# domain -> ONNX op -> the first opset version NNFusion's importer has a translator for (ops_bridge.cpp)
TRANSLATED: dict[str, dict[str, int]] = {
    "": {op: 1 for op in (
        "Abs", "Acos", "AdamOptimizer", "Add", "And", "ArgMin", "Asin", "Atan", "AveragePool", "BatchNormalization",
        "Cast", "Ceil", "Clip", "Concat", "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "CumSum",
        "DepthToSpace", "Div", "DivGrad", "Dropout", "Equal", "Erf", "ErfGrad", "Exp", "Expand", "Flatten", "Floor",
        "Gather", "GatherGrad", "GatherND", "GatherNDGrad", "Gelu", "Gemm", "GlobalAveragePool", "GlobalMaxPool",
        "Greater", "GRU", "Identity", "LayerNormalization", "LayerNormalizationGrad", "LeakyRelu", "Less", "Log",
        "LogSoftmax", "LSTM", "MatMul", "Max", "MaxPool", "MemcpyFromHost", "MemcpyToHost", "Min", "Mul", "Neg",
        "NonZero", "Not", "OneHot", "Or", "Pad", "Pow", "ReduceL2", "ReduceMean", "ReduceSum", "Relu", "Reshape",
        "ReshapeGrad", "Resize", "Shape", "Sigmoid", "Sin", "Slice", "Softmax", "SoftmaxCrossEntropyLoss",
        "SoftmaxGrad", "SparseSoftmaxCrossEntropy", "SparseSoftmaxCrossEntropyGrad", "Split", "Sqrt", "Squeeze",
        "Sub", "Sum", "Tan", "Tanh", "TanhGrad", "Tile", "TrainableDropout", "Transpose", "Unsqueeze", "Upsample",
        "Where")} | {"Range": 11, "ScatterND": 11},
    "com.microsoft": {op: 1 for op in ("Attention", "BiasGelu", "EmbedLayerNormalization", "SkipLayerNormalization",
                                       "TrainableDropoutGrad", "TransposeMatMul")},
    "org.pytorch.aten": {"roll": 1},
}
# Op types NNFusion defines as generic ops (generic_op_define/): a node without a translator imports as one of these
GENERIC_OPS = frozenset((
    "Abs", "Acos", "AdamOptimizer", "Add", "AddN", "All", "And", "ApplyAdam", "ApplyGradient", "ApplyGradientDescent",
    "ApplyMomentum", "Assign", "AssignSub", "Atan", "Attention", "AvgPool", "BatchMatMul", "BatchNormInference",
    "Broadcast", "BroadcastGradientArgs", "Ceiling", "Concat", "ConcatOffset", "ConvTranspose", "Convert",
    "Convolution", "ConvolutionGradData", "ConvolutionGradFilter", "Cos", "Cosh", "CrossEntropyAvgLossWithLabels",
    "CrossEntropyFwdBwdWithSoftmaxBwd", "CrossEntropyFwdBwdWithSoftmaxBwdLarge", "CumSum", "DepthToSpace",
    "DepthwiseConv2dNative", "DivNoNan", "Divide", "Dot", "DropoutTraining", "DropoutTrainingGrad", "DynamicStitch",
    "ElementWiseFused", "EmbedLayerNorm", "Equal", "Erf", "Exp", "Floor", "FloorMod", "GatherGrad", "GatherND",
    "GatherNDGrad", "GatherV2", "Gelu", "Greater", "GreaterEq", "InvertPermutation", "LayerNorm", "Less", "LessEq",
    "Log", "Lstm", "MatMulAdd", "MaxPool", "Maximum", "Minimum", "Multiply", "Negative", "Not", "NotEqual", "OneHot",
    "Or", "Pack", "Pad", "Power", "PowerBackwardBase", "PowerBackwardExponent", "Range", "Relu", "Relu6",
    "Relu6Backprop", "ReluBackprop", "Reshape", "Resize", "Reverse", "ReverseSequence", "Roll", "Rsqrt", "ScatterAdd",
    "ScatterMax", "ScatterMin", "ScatterND", "ScatterSub", "Select", "SelectNode", "Shape", "Sigmoid",
    "SigmoidBackprop", "Sign", "Sin", "Sinh", "SkipLayerNorm", "Slice", "Softmax", "SparseApplyMomentum", "Sqrt",
    "Square", "StopGradient", "StridedSliceGrad", "Subtract", "Sum", "Tan", "Tanh", "Tile", "Transpose",
    "UnsortedSegmentSum", "Where", "Zeros"))
ANY_OPSET = 10**6  # a model importing no default-domain opset: the importer takes its own, the newest
Shapes = import_rules.Shapes  # tensor -> its static shape, as ONNX (shape inference) has it


class Blocker(NamedTuple):
    """A node NNFusion cannot compile, whatever the kernel DB holds."""

    node: str
    op_type: str
    reason: str
    aborts_at: str = ""  # the node the compile stops at, where another (a pool whose shape meets the model's there)


def attributes(node: Any) -> dict[str, Any]:
    """A node's attributes by name, as onnx.helper gives their values (strings as bytes)."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _flatten(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    return "" if "axis" in attrs else ("Flatten without its axis attribute: the importer aborts ('unknown attribute "
                                       "axis'); write axis=1 (the default) out")


def _gemm(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    # The importer reads C only for a beta other than 0 (gemm.cpp): with beta 0 it makes the Dot alone.
    if (len(node.input) > 2 and node.input[2]) or float(attrs.get("beta", 1.0)) == 0:
        return ""
    return "Gemm without its C input: the importer crashes on it (segmentation fault); export it as MatMul"


def _unsqueeze(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    return "" if "axes" in attrs else ("Unsqueeze without an axes attribute (opset 13 made axes an input): the "
                                       "importer reads only the attribute and aborts ('unknown attribute axes'); "
                                       f"{import_rules.EXPAND_HINT} (a Reshape to its output's shape), or export at "
                                       "opset 11")


def _dropout(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    ratio = attrs.get("ratio", 0.5)  # the importer's default when the attribute is absent (opset 12 on: always)
    if ratio == 0:
        return ""
    given = (" (its ratio is an input, which the importer does not read)" if len(node.input) > 1 and node.input[1]
             else " (no ratio attribute)" if "ratio" not in attrs else "")
    return (f"Dropout with ratio {ratio:g}{given}: the importer aborts ('please set dropout ratio to 0'); `kdb model "
            "expand IN OUT` writes an inference Dropout as the identity it is (or export in inference mode, which "
            "leaves Dropout out)")


def _conv(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if auto_pad != "NOTSET":
        return f"Conv with auto_pad {auto_pad}: the importer aborts ('auto_pad not supported'); `kdb model expand IN " \
               "OUT` writes it as pads"
    groups = int(attrs.get("group", 1))
    data, filters = (shapes.get(t) for t in node.input[:2]) if len(node.input) > 1 else (None, None)
    if (rank := len(data or filters or [])) > 4:
        return (f"{rank - 2}-D Conv: the importer takes 1-D and 2-D convolutions only and aborts ('Convolution with "
                f"dimensions of {rank} not implemented yet', op/conv.cpp)")
    if "kernel_shape" not in attrs and filters and len(filters) != 4:
        # conv.cpp: a missing kernel_shape is the filter's last two axes, and strides, dilations and pads follow it
        return (f"{len(filters) - 2}-D Conv without kernel_shape: the importer takes the filter's last two axes as "
                "a 2-D kernel and aborts; write kernel_shape out")
    if groups == 1 or not data or not filters or len(data) < 2:
        return ""
    padding_ok = depthwise_padding_ok(list(attrs.get("pads", [])), list(attrs.get("dilations", [])), filters[2:])
    reason, compiles = grouped_conv_reason(groups, data[1], filters[0], padding_ok, list(attrs.get("dilations", [])),
                                           spatial=len(data) - 2)
    return "" if compiles else reason


def grouped_conv_reason(groups: int, channels: int, filters: int, padding_ok: bool = True,
                        dilations: list[int] | tuple[int, ...] = (), spatial: int = 2) -> tuple[str, bool]:
    """Why a grouped convolution is never a kernel-DB lookup (what NNFusion does with it instead), and whether the
    compiler gets past it at all (frontend/onnx_import/op/conv.cpp). `padding_ok`: depthwise_padding_ok; `spatial`:
    the input's spatial axes."""
    if groups == channels and filters == groups and spatial != 2:
        return (f"{spatial}-D depthwise convolution (group={groups}): NNFusion's importer makes every depthwise conv "
                "a DepthwiseConv2dNative, whose filter Reshape takes 4-D only: it aborts ('Input axis order is not a "
                f"permutation', axis order {{2, 3, 0, 1}} of the {spatial + 2}-D filter; seen with the compiler)"
                + (f"; {import_rules.EXPAND_HINT} (as a 2-D conv: a Reshape to [N, C, 1, L] and a 1 x k kernel)"
                   if spatial == 1 else ""), False)
    if groups != channels:
        return (f"grouped convolution (group={groups}, not depthwise): NNFusion's ONNX importer aborts on it (its "
                "CHECK 'n_filters_channels & groups == 0' in frontend/onnx_import/op/conv.cpp fails for every group "
                f"count: & binds after ==), so the model does not compile; {import_rules.EXPAND_HINT} (one "
                "convolution a group, Concatenated)", False)
    if filters != groups:
        return (f"depthwise convolution with {filters} filters for {groups} channels: NNFusion's ONNX importer aborts "
                "on it (DepthwiseConv2dNative takes a depth multiplier of 1 only)", False)
    if not padding_ok:
        return ("depthwise convolution whose padding is neither SAME nor VALID: NNFusion's ONNX importer aborts on it "
                f"(DepthwiseConv2dNative takes those two only); {import_rules.EXPAND_HINT} (a Pad of zeros, then the "
                "VALID convolution)", False)
    if any(d != 1 for d in dilations):
        return (f"depthwise convolution with dilation {list(dilations)}: NNFusion aborts importing it "
                "(core/operators/generic_op/generic_op_define/DepthwiseConv2dNative.cpp: 'Not support other dilation "
                f"yet'; seen with the compiler), so the model does not compile; {import_rules.EXPAND_HINT} (the filter "
                "undilated: zeros between its taps)", False)
    return (f"depthwise convolution (group={groups}): NNFusion runs it as DepthwiseConv2dNative and fetches that "
            "identifier (DepthwiseConv2dNative<input>;<filter as kh,kw,C,1>;<output><types>), not a grouped "
            "Convolution's: write it as a cudnn_depthwise_conv2d_op line, its filter [kh, kw, C, 1] (`kdb opconfig "
            "extract` does)", True)


# core/kernels/cuda_gpu/kernels/depthwise_conv2d.cpp writes `float *input = input0;` whatever the element type
HALF_DEPTHWISE = ("NNFusion's own DepthwiseConv2dNative kernel does not compile in half: its emitter "
                  "(core/kernels/cuda_gpu/kernels/depthwise_conv2d.cpp) writes `float *input = input0;` of a half* "
                  "input, so nvcc rejects nnfusion_rt.cu. A DB row of the op stands in for it (`kdb codegen` makes "
                  "one), or keep it in float, between Casts (`kdb model fp16` does so for every depthwise "
                  "convolution)")


def depthwise_padding_ok(pads: list[int], dilations: list[int], kernel: list[int]) -> bool:
    """Whether NNFusion's importer takes a depthwise conv's padding: pads that differ before and after become a Pad
    node (the conv then pads nothing: VALID); even ones must be VALID (none) or SAME (2 x pad = dilation x (k - 1))."""
    spatial = len(kernel)
    pads = pads or [0] * 2 * spatial
    dilations = dilations or [1] * spatial
    before, after = pads[:len(pads) // 2], pads[len(pads) // 2:]
    if before != after or not any(before):
        return True
    return all(2 * p == d * (k - 1) for p, d, k in zip(before, dilations, kernel, strict=False))


def _average_pool(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    if "strides" not in attrs:
        return ("AveragePool without its strides attribute: the importer aborts ('unknown attribute strides'); write "
                f"strides out (1 per axis, the default): {import_rules.EXPAND_HINT}")
    window = list(attrs.get("kernel_shape", []))
    return "" if len(window) == 2 else (f"AveragePool over {len(window)} spatial axes: the importer gives every "
                                        "AveragePool two axes of padding, and AvgPool's shape check aborts on the "
                                        "rank (validation_util.cpp)")


# The order op/pad.hpp reads a Pad's attributes in where it has more than one (pads an attribute, before opset 11)
PAD_ATTRIBUTES = ["mode", "pads", "value"]


def pad_attributes_readable(node: Any, shapes: Shapes) -> bool:
    """Whether the importer reads this Pad of attributes (before opset 11) right: by position, attribute 0 the mode
    (only "constant"), 1 eight pads (a 4-D Pad), 2 the value. Checked with the real compiler: pads first aborts
    ('unsupported padding type'), without value it crashes (SIGSEGV)."""
    attrs, shape = attributes(node), shapes.get(node.input[0]) if node.input else None
    mode = attrs.get("mode", b"")
    return ([a.name for a in node.attribute] == PAD_ATTRIBUTES and mode in (b"constant", "constant")
            and len(attrs["pads"]) == 8 and shape is not None and len(shape) == 4)


def _pad(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    # op/pad.hpp reads the pads from the second input when the node has exactly one attribute (opset 11 on), else the
    # attributes by position (pad_attributes_readable)
    if len(attrs) == 1 and len(node.input) > 1 and node.input[1]:
        return ""
    if "pads" not in attrs:
        if len(node.input) > 1 and node.input[1]:
            return (f"Pad of pads as an input and attributes {sorted(attrs) or 'none'}: the importer takes that form "
                    f"with exactly one attribute, mode, and crashes otherwise; {import_rules.EXPAND_HINT} (mode "
                    "written out)")
        return "Pad without pads: the importer crashes"
    if pad_attributes_readable(node, shapes):
        return ""
    shape = shapes.get(node.input[0]) if node.input else None
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    cause = (f"Pad of attributes {[a.name for a in node.attribute]}: the importer reads them by position (op/pad.hpp: "
             "the mode, eight pads, the value), aborting on another mode than constant ('unsupported padding type') "
             "and crashing without a value")
    if mode == "constant" and shape is not None and len(shape) == 4:
        return f"{cause}; {import_rules.EXPAND_HINT} (its attributes in that order)"
    return f"{cause}; it pads 4-D tensors only, in constant mode (this one: {mode}, {shape}): write it another way"


def _split(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    # op/split.cpp: without a `split` attribute it cuts equal parts of input_shape.at(axis), the raw axis (the sizes
    # input of opset 13 on is never read)
    if "split" in attrs:
        return ""
    axis, parts = int(attrs.get("axis", 0)), len(node.output)
    shape = shapes.get(node.input[0]) if node.input else None
    if axis < 0:
        write = f"axis={len(shape) + axis}" if shape else "the axis counted from 0"
        return (f"Split on axis {axis} without a split attribute: the importer reads the axis' length at index "
                f"{axis} (vector::_M_range_check) and aborts; {import_rules.EXPAND_HINT} ({write})")
    if shape and axis < len(shape) and shape[axis] % parts:
        return (f"Split of {shape[axis]} into {parts} without a split attribute: the importer cuts equal parts only "
                "and aborts (axis_length % num_splits == 0)")
    return ""


def softmax_axis(attrs: dict[str, Any], shape: list[int] | None) -> int | None:
    """The axis NNFusion's importer gives a Softmax (frontend/onnx_import/op/softmax.cpp: `axis`, -1 when absent,
    whatever the opset), counted from 0; None when the input's rank is unknown."""
    if shape is None:
        return None
    axis = int(attrs.get("axis", -1))
    return axis + len(shape) if axis < 0 else axis


def _softmax(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    shape = shapes.get(node.input[0]) if node.input else None
    axis = softmax_axis(attrs, shape)
    if shape is None or axis == len(shape) - 1:
        return ""
    return (f"Softmax over axis {axis} of a rank-{len(shape)} input: NNFusion's Softmax takes the last axis only and "
            "aborts ('softmax only support computing on the last dim', core/operators/op_define/softmax.cpp); "
            "transpose the axis last around it")


def softmax_axis_ignored(node: Any, shapes: Shapes, opset: int) -> str:
    """A Softmax of opset < 13 without an axis attribute on an input of rank > 2: ONNX means axis 1, the axes from it
    on as one row; NNFusion's importer takes the last axis (another network, no abort). '' when they agree."""
    shape = shapes.get(node.input[0]) if node.op_type == "Softmax" and node.input else None
    if shape is None or opset >= 13 or "axis" in attributes(node) or len(shape) <= 2:
        return ""
    return (f"Softmax of opset {opset} without an axis on a {shape} input: ONNX means axis 1 with every axis after it "
            "in one softmax, NNFusion's importer takes the last axis alone (op/softmax.cpp reads -1 when the "
            "attribute is absent): the compiled network is not the model's; write axis out, or export at opset 13")


def split_sizes_ignored(node: Any, shapes: Shapes) -> str:
    """A Split whose parts are unequal by a sizes input (opset 13 on): the importer never reads it and cuts equal
    parts (another network, no abort); '' when it cuts what the model asks."""
    if node.op_type != "Split" or len(node.input) < 2 or not node.input[1] or "split" in attributes(node):
        return ""
    outs = [shapes.get(o) for o in node.output]
    axis = int(attributes(node).get("axis", 0))
    if not all(outs):
        return ""
    sizes = [o[axis] for o in outs]  # type: ignore[index]
    if len(set(sizes)) == 1:
        return ""
    return (f"Split into sizes {sizes}: NNFusion's importer ignores the sizes input (op/split.cpp) and cuts "
            f"{len(sizes)} equal parts: the compiled network is not the model's")


def where_not_broadcast(node: Any, shapes: Shapes) -> str:
    """A Where whose condition and values differ in shape: NNFusion's importer (op/where.cpp) makes a Select of the
    three inputs as they are, with no broadcast, and its kernel reads each at the output's index: past the end of
    the smaller ones ('' where the shapes are one, or not known)."""
    if node.op_type != "Where" or len(node.input) != 3:
        return ""
    found = [shapes.get(t) for t in node.input]
    if any(f is None for f in found) or len({tuple(f) for f in found if f is not None}) == 1:
        return ""
    return (f"Where of shapes {', '.join(str(f) for f in found)}: NNFusion's importer (op/where.cpp) makes a Select "
            "of them without broadcasting, and its kernel reads each at the output's index, past the end of the "
            f"smaller ones: the numbers are not the model's; {import_rules.EXPAND_HINT} (each given the output's "
            "shape)")


# Initializer types the importer reads (frontend/onnx_import/util/util.hpp's get_data: double, float, half, int32,
# int64, uint64); any other aborts the import ('<name> unsupported data type: <type>')
READABLE_INITIALIZERS = frozenset((1, 6, 7, 10, 11, 13))
_TYPE_NAMES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 9: "bool", 12: "uint32", 16: "bfloat16"}


def unreadable_initializers(model: Any) -> list[Blocker]:
    """A Blocker for each node fed an initializer of a type the importer cannot read (a bool attention mask), or for the
    initializer itself where no node reads it."""
    found = []
    for tensor in model.graph.initializer:
        if tensor.data_type in READABLE_INITIALIZERS:
            continue
        what = _TYPE_NAMES.get(tensor.data_type, f"type {tensor.data_type}")
        reason = (f"its input {tensor.name} is a {what} initializer: NNFusion's importer reads initializers of double, "
                  f"float, half, int32, int64 and uint64 only (util.hpp's get_data) and aborts ('{tensor.name} "
                  f"unsupported data type: {tensor.data_type}'); {import_rules.EXPAND_HINT} (stored as int32, "
                  "and a Cast)")
        users = [(node.name or f"{node.op_type}#{i}", node.op_type) for i, node in enumerate(model.graph.node)
                 if tensor.name in node.input]
        found += [Blocker(name, op, reason) for name, op in users] or [Blocker(tensor.name, "initializer", reason)]
    return found


def _crashes(what: str) -> Callable[[Any, dict[str, Any], Shapes], str]:
    return lambda node, attrs, shapes: what


def _no_cuda_kernel(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    return (f"NNFusion imports {node.op_type} but has no CUDA kernel for it: kernel selection aborts ('No valid kernel "
            "found')")


def resize_unserved(node: Any, attrs: dict[str, Any], shapes: Shapes, scales: list[float] | None,
                    float_data: bool) -> str:
    """Why kdb makes no row for this ONNX Resize ('' when it makes one). NNFusion's importer (op/resize.cpp) passes
    the input and its scales (input 2, a constant), and reads the mode only (nearest or linear): a row computes what
    the model says (ops.RESIZE_*)."""
    import numpy as np

    from core.kernels.ops import RESIZE_SAMPLING, resize_sampling_problem

    if len(node.input) < 3 or not node.input[2]:
        return "no scales input (input 2): NNFusion's importer reads its scales there"
    if len(node.input) > 3 and node.input[3]:
        return ("its output size given as sizes (int64): a row's tensors have one element type, and so does an op "
                "config; export it with scales instead (torch: F.interpolate(x, scale_factor=2), not size=...)")
    if scales is None:
        return "its scales are no constant (NNFusion takes only a constant)"
    said = resize_attributes(attrs)
    if key := resize_sampling_problem(said):
        return f"{key} {said[key]}: kdb's rows take {', '.join(RESIZE_SAMPLING[key])}"
    data, out = shapes.get(node.input[0]), shapes.get(node.output[0])
    if data is None or out is None or len(data) != 4 or len(out) != 4 or len(scales) != 4:
        return "not a 4-D input of known shape with 4 scales: kdb's rows resize NCHW tensors"
    # kdb's rows compute the output size given, at the scale output / input (as ONNX's sizes do): a scale that is
    # that ratio, to float32's rounding, whose product NNFusion truncates to the output size (Resize.cpp:
    # output_shape[i] = input_shape[i] * scales[i]): kdb model expand writes sizes so
    if scales[:2] != [1.0, 1.0] or any(int(np.float32(d) * np.float32(s)) != o or abs(d * s - o) > 1e-5 * o
                                       for d, s, o in zip(data[2:], scales[2:], out[2:], strict=True)):
        return (f"scales {scales} on {data}: kdb's rows resize the spatial axes by scales that give whole sizes "
                f"({out})")
    if not float_data:
        return ("not float: its scales stay float, a row's tensors have one element type, and so does an op config "
                "(a half Resize would be Resize...halffloathalf)")
    return ""


def resize_attributes(attrs: dict[str, Any]) -> dict[str, str]:
    """The op config's parameters of a Resize kdb serves (resize_unserved gave ''): ONNX's defaults where absent."""
    def text(key: str, default: str) -> str:
        value = attrs.get(key, default)
        return value.decode() if isinstance(value, bytes) else str(value)

    return {"mode": text("mode", "nearest"), "coordinate_transformation_mode": text("coordinate_transformation_mode",
                                                                                    "half_pixel"),
            "nearest_mode": text("nearest_mode", "round_prefer_floor")}


def conv_transpose_sliceable(node: Any, attrs: dict[str, Any], shapes: Shapes) -> bool:
    """Whether a 2-D ConvTranspose is its unpadded one's whole output, sliced: its padding below plus its output fit
    in (in - 1) * stride + k (an output_padding past that would be rows of the bias alone). `kdb model expand` writes
    it so (import_rewrites._conv_transpose)."""
    data, filt, out = (shapes.get(t) for t in (node.input[0], node.input[1], node.output[0]))
    if data is None or filt is None or out is None or len(data) != 4 or len(filt) != 4 or "output_shape" in attrs \
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or int(attrs.get("group", 1)) != 1 \
            or any(d != 1 for d in attrs.get("dilations", [1, 1])):
        return False
    pads, strides = list(attrs.get("pads", [0, 0, 0, 0])), list(attrs.get("strides", [1, 1]))
    return all(b + o <= (n - 1) * s + k for b, o, n, s, k in zip(pads[:2], out[2:], data[2:], strides, filt[2:],
                                                                 strict=True))


def conv_transpose_unserved(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    """Why kdb makes no row for this ONNX ConvTranspose ('' when it makes one); NNFusion's importer takes group 1 and
    its op a square kernel (op/conv_trans.cpp, generic_op_define/ConvTranspose.cpp), and its output shape leaves
    output_padding out."""
    data, filt, out = (shapes.get(t) for t in (node.input[0], node.input[1], node.output[0]))
    if data is not None and len(data) == 3:
        return ("a 1-D ConvTranspose: NNFusion's importer takes NCHW only (a CHECK fails); "
                f"{import_rules.EXPAND_HINT} as zeros between its samples and a Conv1d of the flipped filter (group "
                "1, no dilation, a constant filter)")
    if data is None or filt is None or out is None or len(data) != 4 or len(filt) != 4:
        return "not a 2-D ConvTranspose of known shapes"
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if int(attrs.get("group", 1)) != 1:
        return f"group {attrs.get('group')}: NNFusion's importer takes group 1 only (a CHECK fails)"
    if filt[2] != filt[3]:
        return f"a {filt[2]}x{filt[3]} kernel: NNFusion's ConvTranspose takes square ones only (a CHECK fails)"
    if any(v != 1 for v in attrs.get("dilations", [1, 1])):
        return f"dilations {list(attrs['dilations'])}: kdb's ConvTranspose kernels dilate not"
    sliced = (f"; {import_rules.EXPAND_HINT} as the ConvTranspose without padding and a Slice of its output"
              if conv_transpose_sliceable(node, attrs, shapes) else "")
    if pads[:2] != pads[2:]:
        return f"pads {pads}: kdb's ConvTranspose kernels pad each side alike{sliced}"
    if any(attrs.get("output_padding", [0, 0])) or "output_shape" in attrs or attrs.get("auto_pad", b"NOTSET") not in (
            b"NOTSET", "NOTSET"):
        return ("output_padding, output_shape or auto_pad: NNFusion's output shape is (in - 1) * stride + k - 2 * pad, "
                f"which they change{sliced}")
    return ""


_NO_KERNEL_NO_ROW = ("NNFusion imports {} but has no CUDA kernel for it: kernel selection aborts ('No valid kernel "
                     "found') unless the DB has a row of it, and kdb makes none for this one: ")


def _conv_transpose(node: Any, attrs: dict[str, Any], shapes: Shapes) -> str:
    why = conv_transpose_unserved(node, attrs, shapes)
    return _NO_KERNEL_NO_ROW.format("ConvTranspose") + why if why else ""


def _resize(node: Any, graph: Any, shapes: Shapes, floats: set[str]) -> str:
    """A Resize's blocker ('' where kdb makes its row): its check reads the model's constants, so import_faults makes
    it beside BLOCKERS' checks."""
    attrs = attributes(node)
    mode = resize_attributes(attrs)["mode"]
    if mode not in ("nearest", "linear"):
        return (f"Resize of mode {mode}: NNFusion's importer translates nearest and linear only, and makes no node of "
                "it (op/resize.cpp returns none): the node reading its output aborts the import ('Input Ngraph op "
                "not found', seen with the compiler), and where nothing reads it the compiled network lacks it")
    by_sizes = ("; `kdb model expand IN OUT` gives it constant scales where its sizes are constant or computed from "
                "static shapes (F.interpolate(x, size=y.shape[-2:])), else export it with scales (torch: "
                "F.interpolate(x, scale_factor=2), not size=...)")
    if (len(node.input) < 3 or not node.input[2]) and mode == "linear":  # (op/resize.cpp reads the sizes then)
        return ("Resize sized by sizes, not scales: with constant sizes NNFusion imports it and has no kernel for it "
                "(kernel selection aborts: 'No valid kernel found'; kdb makes rows of Resizes by scales), with "
                "computed ones the importer aborts ('We only accept the Resize input \"scales\" as Constant')"
                + by_sizes)
    if len(node.input) < 3 or not node.input[2]:
        return ("Resize without scales (input 2; its size given as sizes): the importer reads its scales there and "
                "crashes (segmentation fault while importing it, seen with the compiler)" + by_sizes)
    scales = import_rules.constant_values(graph, node.input[2])
    why = resize_unserved(node, attrs, shapes, scales, node.input[0] in floats)
    return _NO_KERNEL_NO_ROW.format("Resize") + why if why else ""


# Seen with the compiler (tests/test_nnfusion_import.py); each check says why the node cannot compile, '' when it can.
# (A Resize's check reads the model's constants: import_faults makes it, _resize.)
BLOCKERS: dict[str, Callable[[Any, dict[str, Any], Shapes], str]] = {
    "Flatten": _flatten, "Gemm": _gemm, "Unsqueeze": _unsqueeze, "Dropout": _dropout, "Conv": _conv,
    "AveragePool": _average_pool, "Pad": _pad, "Split": _split, "Softmax": _softmax,
    "GRU": lambda node, attrs, shapes: import_rules.gru(node, attrs),
    "Constant": lambda node, attrs, shapes: import_rules.constant(node, attrs),
    "DepthToSpace": _crashes("DepthToSpace: NNFusion imports it as a generic op defined for Antares only "
                             "(generic_op_define/DepthToSpace.cpp) and has no CUDA kernel for it: kernel selection "
                             "aborts ('No valid kernel found'); `kdb model expand IN OUT` writes it as the Reshape, "
                             "Transpose and Reshape ONNX defines it as"),
    "CumSum": _crashes("CumSum: this NNFusion aborts importing it ('No infershape or Antares IR found for op type: "
                       "CumSum', seen with the compiler)"),
    "LayerNormalization": lambda node, attrs, shapes: import_rules.layer_norm_without_bias(node),
    "LeakyRelu": lambda node, attrs, shapes: "" if 0 <= float(attrs.get("alpha", 0.01)) <= 1 else (
        f"LeakyRelu with alpha {float(attrs['alpha']):g}: the importer checks 0 <= alpha <= 1 and aborts "
        "(op/leaky_relu.hpp); write it as Max(x, x * alpha)"),
    "Transpose": lambda node, attrs, shapes: import_rules.transpose_without_perm(node),
    "Upsample": _crashes("Upsample: the importer crashes on it (segmentation fault); export Resize instead"),
    "LSTM": lambda node, attrs, shapes: _no_cuda_kernel(node, attrs, shapes) + (
        f"; {import_rules.EXPAND_HINT} (unrolled as ONNX defines it)"),
    "ConvTranspose": _conv_transpose,
    "ArgMin": _no_cuda_kernel,  # (a VQ-VAE's nearest code, held out in session 33)
}


class ShapeWarning(NamedTuple):
    """A node NNFusion compiles into a network that is not the model's (no abort): the numbers come out wrong."""

    node: str
    text: str
    kind: str = "wrong shape"  # or "wrong numbers": the shapes hold, the math is another

    def describe(self) -> str:
        return f"{self.kind}: node {self.node}: {self.text}"


def import_blockers(model: Any) -> list[Blocker]:
    """The nodes of an ONNX ModelProto NNFusion cannot compile, in graph order (names as extraction gives them)."""
    return import_faults(model)[0]


def with_shapes(model: Any) -> Any:
    """`model` as extraction sees it: a copy with its shapes inferred (the model itself where inference fails on it:
    what needs no shapes is still found)."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # shape inference fails on malformed models
        return model


def inferred_faults(model: Any) -> tuple[list[Blocker], list[ShapeWarning]]:
    """import_faults of `model` as extraction sees it (with_shapes)."""
    return import_faults(with_shapes(model))


def import_faults(model: Any) -> tuple[list[Blocker], list[ShapeWarning]]:
    """The nodes NNFusion cannot compile (graph order), and those it compiles into another network (wrong shapes)."""
    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in model.opset_import}
    opsets.setdefault("", ANY_OPSET)
    shapes = static_shapes(model.graph)
    found = []
    floats = _float_tensors(model)
    folded = import_rules.constant_computed(model.graph, shapes)
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}#{i}"
        reason = _blocker(node, opsets, shapes)
        if not reason and node.op_type == "Resize" and node.domain in ("", "ai.onnx"):
            reason = _resize(node, model.graph, shapes, floats)
        if reason and "kdb model expand" not in reason and node.output and node.output[0] in folded:
            reason += (f"; its inputs are constants or static shapes: {import_rules.EXPAND_HINT} (folds it into an "
                       "initializer)")
        if reason:
            found.append(Blocker(name, node.op_type, reason))
    blocked = {b.node for b in found}
    found += [b for b in unreadable_initializers(model) if b.node not in blocked]
    blocked = {b.node for b in found}
    found += [b for b in _value_and_arity_blockers(model, shapes) if b.node not in blocked]
    blocked = {b.node for b in found}
    pooled, warnings = _PoolShapes(model, shapes, opsets[""]).run(blocked)
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}#{i}"
        if name in blocked:
            continue
        if said := split_sizes_ignored(node, shapes):
            warnings.append(ShapeWarning(name, said))
        if said := softmax_axis_ignored(node, shapes, opsets[""]):
            warnings.append(ShapeWarning(name, said, "wrong numbers"))
        if said := where_not_broadcast(node, shapes):
            warnings.append(ShapeWarning(name, said, "wrong numbers"))
        if said := squeeze_axes_ignored(node, shapes):
            warnings.append(ShapeWarning(name, said))
        if said := pad_mode_ignored(node, model.graph, shapes):
            warnings.append(ShapeWarning(name, said, "wrong numbers"))
        if said := (import_rules.min_max_arity(node)[1] or import_rules.min_broadcast(node, shapes)[1]):
            warnings.append(ShapeWarning(name, said, "wrong numbers"))
        if said := import_rules.flatten_axis_negative(node, shapes):
            warnings.append(ShapeWarning(name, said))
        if said := (import_rules.gather_negative_index(node, model.graph) or import_rules.gelu_approximation(node)
                    or import_rules.reduce_l2_unsquared(node)):
            warnings.append(ShapeWarning(name, said, "wrong numbers"))
        if reduce_axes_ignored(node, shapes.get(node.output[0]) if node.output else None):
            source = "op/reducel2.hpp" if node.op_type == "ReduceL2" else "op/reduce.hpp"
            warnings.append(ShapeWarning(name, f"{node.op_type}'s axes are an input, which NNFusion's importer does "
                                         f"not read ({source} reads the axes attribute): it reduces every axis; "
                                         f"{import_rules.EXPAND_HINT} where the axes are constant"))
        if node.op_type == "BatchNormalization" and attributes(node).get("training_mode", 0):
            warnings.append(ShapeWarning(name, "training_mode=1 normalises by the batch's own statistics; NNFusion's "
                                         "BatchNormInference (folded into a conv or not) uses the running mean and "
                                         "variance", "wrong numbers"))
    return sorted(found + pooled, key=lambda b: _order(model, b.node)), warnings


def _value_and_arity_blockers(model: Any, shapes: Shapes) -> list[Blocker]:
    """Nodes whose shape-like input is computed in the graph, Mins and Maxes the importer cannot take, and the first
    reader of each graph input of a dynamic size (import_rules)."""
    graph, found = model.graph, []
    constants = import_rules.constant_tensors(graph)
    for i, node in enumerate(graph.node):
        name = node.name or f"{node.op_type}#{i}"
        if node.domain not in ("", "ai.onnx"):
            continue
        reason = (import_rules.computed_value_input(node, constants) or import_rules.min_max_arity(node)[0]
                  or import_rules.min_broadcast(node, shapes)[0] or import_rules.slice_negative_axis(node, graph)
                  or import_rules.slice_negative_step(node, graph))
        if reason:
            found.append(Blocker(name, node.op_type, reason))
    for tensor, reason in import_rules.dynamic_inputs(graph):
        reader = next(((n.name or f"{n.op_type}#{i}", n.op_type) for i, n in enumerate(graph.node)
                       if tensor in n.input), None)
        if reader is not None:
            found.append(Blocker(*reader, reason))
    return found


def pad_mode_ignored(node: Any, graph: Any, shapes: Shapes) -> str:
    """A Pad the importer reads that is not a zero pad: it reads only the pads and pads with a constant 0 (op/pad.hpp),
    whatever the mode and the constant_value input (opset 11 on: one attribute) or the value attribute (before)."""
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx"):
        return ""
    if len(node.attribute) != 1:
        value = float(attributes(node)["value"]) if pad_attributes_readable(node, shapes) else 0.0
        return "" if value == 0 else (f"Pad with the value {value}: NNFusion's importer pads with zeros (op/pad.hpp "
                                      "reads the value and never uses it)")
    mode = attributes(node).get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode != "constant":
        return (f"Pad in {mode} mode: NNFusion's importer reads only the pads and pads with zeros (op/pad.hpp), so the "
                "border is not the model's" + (f"; {import_rules.EXPAND_HINT} (a Gather of each padded axis' indices)"
                                               if mode in ("reflect", "edge") else ""))
    value = import_rules.constant_values(graph, node.input[2]) if len(node.input) > 2 and node.input[2] else [0.0]
    if value is None or any(v != 0 for v in value):
        return (f"Pad with the constant {value[0] if value else 'of a computed input'}: NNFusion's importer pads with "
                "zeros (op/pad.hpp reads only the pads)")
    return ""


def squeeze_axes_ignored(node: Any, shapes: Shapes) -> str:
    """A Squeeze given its axes as an input (opset 13 on): the importer reads only the attribute and, without it,
    removes every axis of size 1 (op/squeeze.cpp). Wrong where the input has another axis of size 1 (batch 1)."""
    if node.op_type != "Squeeze" or len(node.input) < 2 or not node.input[1] or "axes" in attributes(node):
        return ""
    given, out = shapes.get(node.input[0]), shapes.get(node.output[0]) if node.output else None
    if given is None:
        return ""
    ours = [d for d in given if d != 1]
    if ours == out:
        return ""
    return (f"Squeeze's axes are an input, which NNFusion's importer does not read (op/squeeze.cpp reads the axes "
            f"attribute): it removes every axis of size 1, {given} -> {ours}, where ONNX gives {out} (what follows may "
            f"then abort); {import_rules.EXPAND_HINT} (a Reshape to ONNX's shape), or export at opset 11")


def reduce_axes_ignored(node: Any, out: list[int] | None) -> bool:
    """A ReduceSum, ReduceMean or ReduceL2 given its axes as an input, whose output is not of one element: the importer
    reduces every axis instead (an output of one element is the same either way)."""
    return (node.op_type in ("ReduceSum", "ReduceMean", "ReduceL2") and node.domain in ("", "ai.onnx")
            and len(node.input) > 1 and bool(node.input[1]) and "axes" not in attributes(node)
            and (out is None or math.prod(out) != 1))


def importable(op_type: str) -> bool:
    """Whether the importer has a translator for this default-domain op."""
    return op_type in TRANSLATED[""]


# Ops ONNX defines as a function only from a later opset, whose version there computes what the earlier one did (only
# types were added: PRelu-16 adds bfloat16): a model of the earlier opset is written with the later definition.
LATER_FUNCTION = {"PRelu": 16}


def function_schema(op_type: str, opset: int) -> Any | None:
    """ONNX's schema of a default-domain op at this opset where it defines the op as a function (a body of other ops
    that does not depend on its inputs' types), else None."""
    from onnx import defs

    try:
        schema = defs.get_schema(op_type, min(opset, defs.onnx_opset_version()), "")
        if not schema.has_function and op_type in LATER_FUNCTION and opset < LATER_FUNCTION[op_type]:
            schema = defs.get_schema(op_type, LATER_FUNCTION[op_type], "")
    except Exception:  # onnx.defs.SchemaError: no such op at that opset
        return None
    return schema if schema.has_function else None


def function_ops(op_type: str, opset: int) -> list[str] | None:
    """The ops ONNX's definition of `op_type` (at this opset) is made of, None where it is no function."""
    schema = function_schema(op_type, opset)
    return None if schema is None else [n.op_type for n in function_body(schema, opset).node]


def function_body(schema: Any, opset: int) -> Any:
    """The schema's function body for the model's opset (bodies are versioned by the opset their ops come from)."""
    from onnx import FunctionProto

    versions = [v for v in schema.function_opset_versions if v <= opset]
    body = FunctionProto()
    body.ParseFromString(schema.get_function_with_opset_version(max(versions)) if versions
                         else schema.function_body.SerializeToString())
    return body


# ops with no translator import_rewrites writes out, and what it writes
REWRITTEN = {"InstanceNormalization": "its formula", "Reciprocal": "Div(1, x)",
             "Einsum": "Transposes, Reshapes and a MatMul a pair of operands, where its shapes are static",
             "ReduceLogSumExp": "the stable formula: Log(ReduceSum(Exp(x - max))) + max, its max a MaxPool",
             "ReduceMax": "a MaxPool of the reduced axes", "ReduceMin": "a MaxPool of the negated input, negated"}


def _expandable(op_type: str, opset: int) -> str:
    """What `kdb model expand` does with an op ONNX defines as a function (a hint for the blocker's reason)."""
    ops = [op for op in function_ops(op_type, opset) or () if op not in ("Constant", "CastLike")]  # (initializers)
    return (f"; `kdb model expand IN OUT` writes it as ONNX's own definition ({', '.join(dict.fromkeys(ops))})"
            if ops else "")


def _float_tensors(model: Any) -> set[str]:
    """The model's tensors declared or inferred float32."""
    graph = model.graph
    typed = [(t.name, t.data_type) for t in graph.initializer]
    typed += [(vi.name, vi.type.tensor_type.elem_type) for vi in (*graph.input, *graph.value_info, *graph.output)
              if vi.type.HasField("tensor_type")]
    return {name for name, elem in typed if elem == 1}


def _order(model: Any, name: str) -> int:
    return next((i for i, n in enumerate(model.graph.node) if (n.name or f"{n.op_type}#{i}") == name), 0)


def static_shapes(graph: Any) -> Shapes:
    """Static shapes of a graph's tensors: declared, inferred (extraction gives a model ONNX's shape inference has
    been through) and of its initializers."""
    shapes: Shapes = {t.name: list(t.dims) for t in graph.initializer}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        typed = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if typed is None or not typed.HasField("shape"):  # (no shape known; a scalar's is known and empty)
            continue
        if all(d.HasField("dim_value") and d.dim_value > 0 for d in typed.shape.dim):
            shapes.setdefault(vi.name, [d.dim_value for d in typed.shape.dim])
    return shapes


# ONNX ops whose output has their (first) input's shape in NNFusion too, and numpy-broadcasting binary ops (opset 7 on)
_SAME_SHAPE = frozenset(("Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Erf", "Ceil", "Floor", "Sin",
                         "Cos", "Tan", "Asin", "Acos", "Atan", "Gelu", "LeakyRelu", "Identity", "Dropout", "Cast",
                         "Clip", "Softmax", "Not"))
_BROADCASTING = frozenset(("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Greater", "Less", "And", "Or"))


AVERAGE_POOL_HINT = f"{import_rules.EXPAND_HINT} as a Pad of zeros, the pool, and a Mul by ONNX's divisors"


class _PoolShapes:
    """NNFusion's ONNX importer translates AveragePool with the first translator registered for it (ops_bridge.cpp
    registers two at version 1, and std::map::emplace keeps the first): TranslateAveragePoolOp reads kernel_shape and
    strides only, so pads, auto_pad and ceil_mode are dropped and it pools without padding. MaxPool's translator
    (pool.hpp's TranslatePoolOp) keeps the pads and drops ceil_mode: its windows round down. Where that changes the
    pool's shape, the smaller tensor flows on: the compile aborts where it meets a
    tensor of the model's shape (an element-wise op: 'Auto-broadcast not possible'; a Concat: its shape check), and
    goes through silently elsewhere, computing another network. Followed here through the ops whose shapes are plain
    to follow (element-wise, Concat); beyond them, and at the network's outputs, a warning says so."""

    def __init__(self, model: Any, shapes: Shapes, opset: int) -> None:
        self.model, self.shapes, self.opset = model, shapes, opset
        self.wrong: dict[str, tuple[list[int], frozenset[str]]] = {}  # tensor -> NNFusion's shape, the pools behind it
        self.cause: dict[str, str] = {}  # pool -> what NNFusion makes of it
        self.op_type: dict[str, str] = {}  # pool -> AveragePool or MaxPool
        self.blockers: dict[str, Blocker] = {}
        self.warnings: dict[str, ShapeWarning] = {}

    def run(self, blocked: set[str]) -> tuple[list[Blocker], list[ShapeWarning]]:
        for i, node in enumerate(self.model.graph.node):
            name = node.name or f"{node.op_type}#{i}"
            if name in blocked or node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type in ("AveragePool", "MaxPool"):
                self._pool(name, node)
            elif any(t in self.wrong for t in node.input):
                self._follow(name, node)
        for out in self.model.graph.output:
            if out.name in self.wrong:
                shape, pools = self.wrong[out.name]
                self._warn(pools, f"the network's output {out.name} comes out {shape} where the model has "
                                  f"{self.shapes.get(out.name)}")
        return list(self.blockers.values()), [w for n, w in self.warnings.items() if n not in self.blockers]

    def _shape(self, tensor: str) -> list[int] | None:
        return self.wrong[tensor][0] if tensor in self.wrong else self.shapes.get(tensor)

    def _pool(self, name: str, node: Any) -> None:
        from onnx import helper

        attrs = {a.name: (v.decode() if isinstance(v, bytes) else v)
                 for a in node.attribute for v in [helper.get_attribute_value(a)]}
        window = list(attrs.get("kernel_shape", []))
        strides = list(attrs.get("strides", [1] * len(window)))  # (an AveragePool without strides is a blocker)
        data, onnx_out = self._shape(node.input[0]), self.shapes.get(node.output[0])
        if len(window) != 2 or len(strides) != 2 or data is None or len(data) != 4 or onnx_out is None:
            return
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        if node.op_type == "MaxPool":
            auto_pad = attrs.get("auto_pad", "NOTSET")
            if len(pads) != 4 or auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
                if node.input[0] in self.wrong:
                    self._follow(name, node)
                return
            dropped = ["ceil_mode 1 (its windows round down)"] if attrs.get("ceil_mode", 0) else []
            if any(d != 1 for d in attrs.get("dilations", [])):
                dropped.append(f"dilations {list(attrs['dilations'])} (read, never passed on)")
            if auto_pad.startswith("SAME"):  # the model's windows start where ONNX's SAME pads put them
                below, above = import_rules.max_pool_auto_pads(window, auto_pad)
                onnx_below = import_rules.onnx_same_pads(data[2:], onnx_out[2:], window, strides, auto_pad)[0]
                pads = [*below, *above]
                if below != onnx_below:
                    dropped.append(f"auto_pad {auto_pad}'s pads (util.cpp's get_auto_pads pads {below} before and "
                                   f"{above} after from the window alone, ONNX {onnx_below} before)")
            elif auto_pad == "VALID":
                pads = [0, 0, 0, 0]
            ours = [*data[:2], *((n + below + above - k) // s + 1 for n, k, s, below, above
                                 in zip(data[2:], window, strides, pads[:2], pads[2:], strict=True))]
            if not dropped:  # the model's own windows: only a wrong input makes it wrong
                if node.input[0] in self.wrong and ours != onnx_out:
                    self.wrong[node.output[0]] = (ours, self.wrong[node.input[0]][1])
                return
            cause = (f"NNFusion's importer drops MaxPool's {'; '.join(dropped)} (pool.hpp's TranslatePoolOp) and pools "
                     f"{data} to {ours} where ONNX gives {onnx_out}"
                     + ("" if any(d.startswith("dilations") for d in dropped) else
                        f" ({import_rules.EXPAND_HINT}: ONNX's pads, ceil_mode as pads above)"))
            if ours == onnx_out and any(not d.startswith("ceil_mode") for d in dropped):
                self.warnings[name] = ShapeWarning(name, f"{cause}: the shape holds, but its windows are not the "
                                                         "model's, so the numbers differ", "wrong numbers")
        else:
            ours = [*data[:2], *((n - k) // s + 1 for n, k, s in zip(data[2:], window, strides, strict=True))]
            dropped = ", ".join(f"{k} {v}" for k, v in (("pads", pads),
                                                         ("auto_pad", attrs.get("auto_pad", "NOTSET")),
                                                         ("ceil_mode", attrs.get("ceil_mode", 0)))
                                if v not in ([0, 0, 0, 0], "NOTSET", 0))
            cause = (f"NNFusion's importer drops AveragePool's {dropped or 'padding'} (its first translator reads "
                     f"kernel_shape and strides only) and pools {data} to {ours} where ONNX gives {onnx_out} "
                     f"({AVERAGE_POOL_HINT})")
        origins = self.wrong[node.input[0]][1] if node.input[0] in self.wrong else frozenset()
        if ours != onnx_out:
            self.wrong[node.output[0]] = (ours, origins | {name})
            self.cause[name] = cause
            self.op_type[name] = node.op_type
        elif node.op_type == "AveragePool" and any(pads[:2]):
            self.warnings[name] = ShapeWarning(name, f"NNFusion's importer drops AveragePool's pads {pads}: the "
                                               f"shape stays {ours}, but its windows start {pads[:2]} later than "
                                               f"ONNX's, so the numbers differ ({AVERAGE_POOL_HINT})")

    def _follow(self, name: str, node: Any) -> None:
        wrong = [t for t in node.input if t in self.wrong]
        pools = frozenset().union(*(self.wrong[t][1] for t in wrong))
        onnx_out = self.shapes.get(node.output[0]) if node.output else None
        shapes = [self._shape(t) for t in node.input if t]
        out: list[int] | None
        if node.op_type in _SAME_SHAPE:
            out = shapes[0]
        elif node.op_type in _BROADCASTING and self.opset >= 7 and len(shapes) == 2 and None not in shapes:
            a, b = shapes
            assert a is not None and b is not None
            out = import_rules.numpy_broadcast(a, b)
            if out is None:
                self._abort(pools, name, f"at node {name} ({node.op_type}) the compiler aborts: 'Auto-broadcast not "
                                   f"possible for these input shapes: shape1={a} shape2={b}'")
                return
        elif node.op_type == "Concat" and None not in shapes:
            from onnx import helper

            axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
            known = [s for s in shapes if s is not None]
            axis %= len(known[0])
            if any(len(s) != len(known[0]) or [d for k, d in enumerate(s) if k != axis]
                   != [d for k, d in enumerate(known[0]) if k != axis] for s in known):
                distinct = list(dict.fromkeys(map(tuple, known)))
                self._abort(pools, name, f"at node {name} (Concat) the compiler aborts: its inputs of shapes "
                                   f"{', '.join(str(list(d)) for d in distinct)} differ off the axis {axis} (Concat's "
                                   "shape check, concat.cpp)")
                return
            out = [*known[0][:axis], sum(s[axis] for s in known), *known[0][axis + 1:]]
        else:
            self._warn(pools, f"its {self.wrong[wrong[0]][0]} tensor flows into node {name} ({node.op_type}), which "
                              "kdb does not follow: NNFusion compiles a network whose shapes are not the model's (it "
                              "may abort there; if not, its numbers are wrong)")
            return
        if out is not None and out != onnx_out and node.output:
            self.wrong[node.output[0]] = (out, pools)

    def _abort(self, pools: frozenset[str], at: str, where: str) -> None:
        for pool in sorted(pools):
            if pool not in self.blockers:
                self.blockers[pool] = Blocker(pool, self.op_type[pool], f"{self.cause[pool]}; {where}", at)

    def _warn(self, pools: frozenset[str], what: str) -> None:
        for pool in sorted(pools):
            if pool not in self.warnings:
                self.warnings[pool] = ShapeWarning(pool, f"{self.cause[pool]}; {what}")


def _blocker(node: Any, opsets: dict[str, int], shapes: Shapes) -> str:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain not in opsets:
        return (f"op of the {domain!r} domain, which the model imports no opset of: the importer aborts looking up "
                "its version")
    first = TRANSLATED.get(domain, {}).get(node.op_type)
    if first is None or first > opsets[domain]:
        if node.op_type in GENERIC_OPS:
            return ""
        at = f" at opset {opsets[domain]}" if first is not None else ""
        return (f"the importer has no translator for {node.op_type}{at} and NNFusion no generic op of that name: it "
                f"aborts ('No infershape or Antares IR found for op type: {node.op_type}')"
                + (_expandable(node.op_type, opsets[domain]) if domain == "" else "")
                + (f"; {import_rules.EXPAND_HINT} ({REWRITTEN[node.op_type]})" if node.op_type in REWRITTEN else ""))
    check = BLOCKERS.get(node.op_type) if domain == "" else None
    return check(node, attributes(node), shapes) if check is not None else ""

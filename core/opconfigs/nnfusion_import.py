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

from collections.abc import Callable
from typing import Any, NamedTuple

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


class Blocker(NamedTuple):
    """A node NNFusion cannot compile, whatever the kernel DB holds."""

    node: str
    op_type: str
    reason: str


def _attributes(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _flatten(node: Any, attrs: dict[str, Any]) -> str:
    return "" if "axis" in attrs else ("Flatten without its axis attribute: the importer aborts ('unknown attribute "
                                       "axis'); write axis=1 (the default) out")


def _gemm(node: Any, attrs: dict[str, Any]) -> str:
    return "" if len(node.input) > 2 and node.input[2] else (
        "Gemm without its C input: the importer crashes on it (segmentation fault); export it as MatMul")


def _unsqueeze(node: Any, attrs: dict[str, Any]) -> str:
    return "" if "axes" in attrs else ("Unsqueeze without an axes attribute (opset 13 made axes an input): the "
                                       "importer reads only the attribute and aborts ('unknown attribute axes'); "
                                       "export at opset 11, or use a Reshape")


def _dropout(node: Any, attrs: dict[str, Any]) -> str:
    ratio = attrs.get("ratio", 0.5)  # the importer's default when the attribute is absent (opset 12 on: always)
    return "" if ratio == 0 else (f"Dropout with ratio {ratio:g}{' (no ratio attribute)' * ('ratio' not in attrs)}: "
                                  "the importer aborts ('please set dropout ratio to 0'); export in inference mode, "
                                  "which leaves Dropout out")


def _conv(node: Any, attrs: dict[str, Any]) -> str:
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    return "" if auto_pad == "NOTSET" else (f"Conv with auto_pad {auto_pad}: the importer aborts ('auto_pad not "
                                            "supported'); write the pads out")


def _average_pool(node: Any, attrs: dict[str, Any]) -> str:
    return "" if "strides" in attrs else ("AveragePool without its strides attribute: the importer aborts ('unknown "
                                          "attribute strides'); write strides out (1 per axis, the default)")


def _pad(node: Any, attrs: dict[str, Any]) -> str:
    # The translator reads pads from the second input when the node has exactly one attribute, else attribute 0
    # as the mode: the pads-as-attribute form (before opset 11) and a node without attributes both crash it.
    if len(attrs) == 1 and len(node.input) > 1 and node.input[1]:
        return ""
    return ("Pad: the importer takes only pads as an input with exactly one attribute, mode (opset 11 on, mode "
            f"written out); with attributes {sorted(attrs) or 'none'} it crashes")


def _crashes(what: str) -> Callable[[Any, dict[str, Any]], str]:
    return lambda node, attrs: what


def _no_cuda_kernel(node: Any, attrs: dict[str, Any]) -> str:
    return (f"NNFusion imports {node.op_type} but has no CUDA kernel for it: kernel selection aborts ('No valid kernel "
            "found')")


# Seen with the compiler (tests/test_nnfusion_import.py); each check says why the node cannot compile, '' when it can.
BLOCKERS: dict[str, Callable[[Any, dict[str, Any]], str]] = {
    "Flatten": _flatten, "Gemm": _gemm, "Unsqueeze": _unsqueeze, "Dropout": _dropout, "Conv": _conv,
    "AveragePool": _average_pool, "Pad": _pad,
    "GRU": _crashes("GRU: the importer aborts in its translator (a protobuf CHECK on the node's inputs)"),
    "Upsample": _crashes("Upsample: the importer crashes on it (segmentation fault); export Resize instead"),
    "ConvTranspose": _no_cuda_kernel, "LSTM": _no_cuda_kernel, "Resize": _no_cuda_kernel,
}


def import_blockers(model: Any) -> list[Blocker]:
    """The nodes of an ONNX ModelProto NNFusion cannot compile, in graph order (names as extraction gives them)."""
    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in model.opset_import}
    opsets.setdefault("", ANY_OPSET)
    found = []
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}#{i}"
        reason = _blocker(node, opsets)
        if reason:
            found.append(Blocker(name, node.op_type, reason))
    return found


def _blocker(node: Any, opsets: dict[str, int]) -> str:
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
                f"aborts ('No infershape or Antares IR found for op type: {node.op_type}')")
    check = BLOCKERS.get(node.op_type) if domain == "" else None
    return check(node, _attributes(node)) if check is not None else ""

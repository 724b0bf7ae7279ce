"""What NNFusion's compiler accepts in its kernel DB: op types, their tensors and parameter orders."""

from __future__ import annotations

from dataclasses import dataclass

# NNFusion's CUDA element-op map (cuda_common_ops.hpp), with each op's number of inputs.
ELEMENTWISE_ARITY: dict[str, int] = {
    **dict.fromkeys(
        [
            "Abs", "Acos", "Asin", "Atan", "Ceiling", "Cos", "Cosh", "Erf", "Exp", "Floor", "Log",
            "Sin", "Sinh", "Sqrt", "Rsqrt", "Square", "Tan", "Tanh", "Sign", "Convert", "Gelu",
            "Relu", "Relu6", "Not", "Negative", "Sigmoid", "Nop",
        ],
        1,
    ),
    **dict.fromkeys(
        [
            "Max", "Min", "Power", "PowerBackwardBase", "PowerBackwardExponent", "Subtract",
            "Divide", "DivNoNan", "Equal", "NotEqual", "Greater", "GreaterEq", "Less", "LessEq",
            "ReluBackprop", "Relu6Backprop", "And", "Or", "Add", "Multiply", "Minimum", "Maximum",
            "SigmoidBackprop", "GeluGrad",
        ],
        2,
    ),
    "Select": 3,
}  # fmt: skip

# Element-wise ops of the map that no kernel-DB row can serve, and why (read in NNFusion's sources).
_BOOLEAN = ("NNFusion gives it boolean (char) tensors, and an op config has one element type for all its tensors "
            "(float, half or double): kdb cannot describe its row")
ELEMENTWISE_NO_ROW: dict[str, str] = {
    **dict.fromkeys(["Equal", "NotEqual", "Greater", "GreaterEq", "Less", "LessEq"],
                    "a comparison: its output is boolean (char) while its inputs are not; " + _BOOLEAN),
    **dict.fromkeys(["And", "Or", "Not"], "a logical op: " + _BOOLEAN),
    "Select": "its condition input is boolean (char) and its values are not; " + _BOOLEAN,
    **dict.fromkeys(["Max", "Min"], "in NNFusion's graphs Max and Min are reductions (ArithmeticReduction), which "
                    "use this entry of the element-op map inside their own kernels: no two-input element-wise node "
                    "of that name is ever looked up (the element-wise ops are Maximum and Minimum)"),
    "Nop": "no NNFusion operator is named Nop: the element-op map's entry is never a node of a graph, so nothing "
           "looks it up",
}  # fmt: skip

CONV_FAMILY = ("Convolution", "Fused_Convolution_Relu", "Fused_Convolution_Add_Relu")
# Kernels of NNFusion's fusion patterns (Convolution+Relu, Convolution+Add+Relu).
FUSED_OP_TYPES = ("Fused_Convolution_Relu", "Fused_Convolution_Add_Relu")
POOLS = ("AvgPool", "MaxPool")

# The compiler's SupportOpList: a row of any other OpType poisons every fetch of its identifier.
SUPPORTED_OP_TYPES: frozenset[str] = frozenset(
    [*ELEMENTWISE_ARITY, "Dot", *CONV_FAMILY, *POOLS, "Matched_Pattern"]
)

# Ops outside the SupportOpList that the compiler still fetches by identifier, and the OpType their rows carry: its
# fetch_all drops a fetch only for a row's OpType column, and kernel selection matches the identifier alone
# (docs/NNFUSION-RULES.md, "The OpType column gates a fetch"). A BatchMatMul (an ONNX MatMul of a right operand of
# rank > 2) is served by a row of OpType Dot under BatchMatMul's identifier, and a Softmax alike.
BATCH_MATMUL = "BatchMatMul"
# A Softmax over its last axis: the identifier carries no axis (kernel_emitter.cpp's generate_identifier), so kdb's
# rows serve the last axis only, the one attention and classifiers take (core/opconfigs/onnx_extract.py)
SOFTMAX = "Softmax"
# A Sum (ReduceMean's, a LayerNorm's): the identifier has no axes either, so kdb serves only shapes that tell the
# reduced axes apart (sum_axes)
SUM = "Sum"
# A depthwise convolution (an ONNX Conv of group = channels, one filter each): its identifier is the input, the filter
# as the importer transposes it ([kh, kw, C, 1]) and the output, with no stride, padding or dilation; kdb's row
# computes its op config's, which the row's Attributes keep (coverage names a row made for another: WRONG NUMBERS)
DEPTHWISE = "DepthwiseConv2dNative"
# A Concat: its identifier is the inputs' shapes and the output's, no axis; the one axis whose sizes add up tells it
# (concat_axis). kdb serves only those NNFusion copies with a kernel: where every axis before the joined one has size
# 1 it writes the inputs in place into the output and runs nothing (concat_in_place)
CONCAT = "Concat"
# An ONNX Resize (nearest or linear, its scales a constant): NNFusion imports it and has no CUDA kernel of its own, so a
# network with one compiles only with a row. The identifier is the input's shape, the scales' ([4]) and the output's:
# no mode, which the row's Attributes keep (coverage names a row made for another: WRONG NUMBERS)
RESIZE = "Resize"
# An ONNX ConvTranspose (group 1, a square kernel: what NNFusion's importer takes), its bias an Add after: NNFusion
# has no CUDA kernel of its own either. Its identifier is the input, the filter ([Cin, Cout, kh, kw], ONNX's) and the
# output, no stride or padding, which the row's Attributes keep
CONV_TRANSPOSE = "ConvTranspose"
# How a Resize samples (ONNX's attributes) -> the values kdb's rows take
RESIZE_SAMPLING: dict[str, tuple[str, ...]] = {
    "mode": ("nearest", "linear"),
    "coordinate_transformation_mode": ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"),
    "nearest_mode": ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"),
}
# Op types NNFusion has no CUDA kernel of its own for: only a DB row runs them (without one, kernel selection aborts)
ROW_ONLY_OP_TYPES = (RESIZE, CONV_TRANSPOSE)
ROW_OP_TYPE: dict[str, str] = {BATCH_MATMUL: "Dot", SOFTMAX: "Dot", SUM: "Dot", DEPTHWISE: "Dot", CONCAT: "Dot",
                               RESIZE: "Dot", CONV_TRANSPOSE: "Dot"}
# Inputs NNFusion passes that an op's kernel may leave out of its own parameters (TVM drops a tensor its computation
# never reads: a Resize's scales); the row's signature lists them all the same
UNREAD_INPUTS: dict[str, tuple[str, ...]] = {RESIZE: ("input1",)}

# Op types the injection pipeline can turn into rows (Matched_Pattern has no kernel-JSON form).
INJECTABLE_OP_TYPES: tuple[str, ...] = (*CONV_FAMILY, DEPTHWISE, CONV_TRANSPOSE, "Dot", BATCH_MATMUL, *POOLS, SOFTMAX,
                                        SUM, CONCAT, RESIZE, *ELEMENTWISE_ARITY)
# Matrix products (the tensor cores' ops; a TF32 run's)
MATRIX_OP_TYPES = (*CONV_FAMILY, "Dot", BATCH_MATMUL)


def sum_axes(input_shape: tuple[int, ...] | list[int],
             output_shape: tuple[int, ...] | list[int]) -> list[tuple[int, ...]]:
    """Every set of axes whose removal from `input_shape` leaves `output_shape` (NNFusion's Sum drops the axes it
    reduces): one where the shapes tell the reduction, several where they do not ([4, 4] -> [4]), none where no Sum
    gives them."""
    found: list[tuple[int, ...]] = []

    def walk(i: int, j: int, dropped: tuple[int, ...]) -> None:
        if j == len(output_shape):
            found.append(dropped + tuple(range(i, len(input_shape))))
            return
        if i == len(input_shape):
            return
        if input_shape[i] == output_shape[j]:
            walk(i + 1, j + 1, dropped)
        walk(i + 1, j, (*dropped, i))

    walk(0, 0, ())
    return sorted({axes for axes in found if len(axes) == len(input_shape) - len(output_shape) and axes})


def concat_axis(input_shapes: list[list[int]] | tuple[tuple[int, ...], ...],
                output_shape: list[int] | tuple[int, ...]) -> int | None:
    """The axis a Concat of these inputs joins to give `output_shape`: the inputs agree with the output on every other
    axis and their sizes on it add up to the output's. None where no axis does. One input is a copy: axis 0. Two
    axes can never both do, since the inputs' sizes add up on one axis only where the others are equal."""
    rank = len(output_shape)
    if not input_shapes or any(len(s) != rank for s in input_shapes):
        return None
    if len(input_shapes) == 1:
        return 0 if list(input_shapes[0]) == list(output_shape) else None
    for axis in range(rank):
        others = all(s[d] == output_shape[d] for s in input_shapes for d in range(rank) if d != axis)
        if others and sum(s[axis] for s in input_shapes) == output_shape[axis]:
            return axis
    return None


def concat_in_place(input_shapes: list[list[int]] | tuple[tuple[int, ...], ...], axis: int) -> bool:
    """Whether NNFusion writes this Concat's inputs in place into its output instead of copying them: every axis
    before the joined one has size 1, so each input is one contiguous piece of the output (its Concat emitter's
    is_memcpy, kernels/cuda_gpu/kernels/concat.cpp; inplace_tensor_analysis.cpp then lays the inputs out there)."""
    return all(s[d] == 1 for s in input_shapes for d in range(axis))


def resize_sampling_problem(sampling: dict[str, object]) -> str:
    """The first of a Resize's sampling attributes whose value kdb's rows do not take ('' when all are taken)."""
    return next((key for key, allowed in RESIZE_SAMPLING.items() if sampling.get(key) not in allowed), "")


def op_of_row(op_type_column: str, identifier: str) -> str:
    """kdb's op type of a row: its OpType column, or the op its identifier names where the column stands in for it
    (ROW_OP_TYPE: a BatchMatMul row says Dot)."""
    for op, column in ROW_OP_TYPE.items():
        if op_type_column == column and identifier.startswith(op) and identifier[len(op):len(op) + 1].isdigit():
            return op
    return op_type_column

# C type names the compiler writes into identifiers (element_type.c_type_string()).
DTYPES = ("float", "half", "double")
# Element types an op config or a row may name that no kernel-DB row can serve, and why (read in NNFusion's
# sources, main at 00c1317). Said plainly wherever one turns up (op-config files, kernel JSON, ONNX models).
_BF16 = ("bfloat16 is not served: NNFusion's ONNX importer has no BFLOAT16 element type "
         "(ONNXDataTypeToNNFusionElementType CHECK-fails with 'unsupported onnx element type'), so no bf16 network "
         "reaches kernel selection and no bf16 row is ever looked up; convert the model to fp16 instead "
         "(kdb model fp16 IN OUT)")
UNSERVED_DTYPES: dict[str, str] = {"bfloat16": _BF16, "bf16": _BF16}


def dtype_problem(dtype: object) -> str | None:
    """Why `dtype` cannot be an op config's or row's element type (None when it is one of DTYPES)."""
    if dtype in DTYPES:
        return None
    if isinstance(dtype, str) and dtype.lower() in UNSERVED_DTYPES:
        return UNSERVED_DTYPES[dtype.lower()]
    return f"{dtype!r} is not an element type NNFusion's kernel DB knows ({', '.join(DTYPES)})"

DEVICE_TYPE = "CUDA_GPU"
# The pattern-substitution pass asks for a fusion pattern under this DeviceType, and only when a row is
# there does it make the Matched_Pattern node whose kernel it then fetches under DEVICE_TYPE: a fused kernel
# is used only as a pair of rows, and a PATTERN_DEVICE_TYPE row alone makes the compiler abort.
PATTERN_DEVICE_TYPE = "CUDA"
EXTERNAL_SOURCE = "External"
BASE_TAGS = ("KernelEmitter", "CudaEmitter", "BlockCudaEmitter")
BLOCK_TAG = "BlockCudaEmitter"  # what BlockFusion fuses; a row without it runs on its own launch
# A row of this Source without BLOCK_TAG runs standalone: BlockFusion never fuses it (core/db/standalone.py)
STANDALONE_SOURCE = "Antares"
DEFAULT_PRODUCT = "default"  # NNFusion's -fproduct_name when none is given


@dataclass(frozen=True, slots=True)
class ParameterOrder:
    """Where each tensor sits in a kernel's own parameter list, by NNFusion's convention.

    `kernel_order` names the canonical tensor at each position of the kernel's signature
    (TVM puts the fused conv+add bias after the output); the stored signature always lists
    inputs first, then outputs.
    """

    kernel_order: tuple[str, ...]

    @property
    def canonical(self) -> tuple[str, ...]:
        inputs = sorted(n for n in self.kernel_order if n.startswith("input"))
        outputs = sorted(n for n in self.kernel_order if n.startswith("output"))
        return (*inputs, *outputs)


def parameter_order(op_type: str, inputs: int | None = None) -> ParameterOrder:
    """`inputs`: how many inputs the op has, for an op that takes any number (a Concat)."""
    if op_type == "Fused_Convolution_Add_Relu":
        return ParameterOrder(("input0", "input1", "output0", "input2"))
    if op_type in (*MATRIX_OP_TYPES, DEPTHWISE, CONV_TRANSPOSE, RESIZE):  # (a Resize's input1: its unread scales)
        return ParameterOrder(("input0", "input1", "output0"))
    if op_type in (*POOLS, SOFTMAX, SUM):
        return ParameterOrder(("input0", "output0"))
    if op_type in ELEMENTWISE_ARITY:
        n = ELEMENTWISE_ARITY[op_type]
        return ParameterOrder((*(f"input{i}" for i in range(n)), "output0"))
    if op_type == CONCAT and inputs:
        return ParameterOrder((*(f"input{i}" for i in range(inputs)), "output0"))
    raise ValueError(f"no parameter convention for op type {op_type!r}")


def tags_for(op_type: str, transpose_a: bool = False, transpose_b: bool = False) -> str:
    tags = list(BASE_TAGS)
    if op_type == "Dot":
        if transpose_a:
            tags.append("transA")
        if transpose_b:
            tags.append("transB")
    return ",".join(tags)

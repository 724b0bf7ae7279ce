"""An op's signature (type, tensor shapes, dtype, parameters) and the identifier NNFusion builds from it.

The identifier is what the compiler looks a kernel up by; it must be byte-for-byte what the compiler
generates for the node, or the row is never fetched. Rules (from NNFusION-KERNEL-DB.md):

    base        = OpType + in shapes (dims ',' tensors ';') + ';' + out shapes + one C type per tensor
    Convolution = base + Strides{s..}Strides{d..}CoordinateDiff{pad below..}
    Pools       = base + Shape{window}Strides{stride}Shape{pad below}Shape{pad above}
    Fused conv  = Convolution identifier (data, filter) + Add<out;out;out> and/or Relu<out;out> members
    Dot, element-wise = base (Dot transposes travel in Tags; a Dot's left operand may have rank > 2)
    DepthwiseConv2dNative = base of (input, filter as [kh, kw, C, 1]), output: no stride, padding or dilation
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import InputError
from core.kernels.ops import (
    CONV_FAMILY,
    CONV_TRANSPOSE,
    DEPTHWISE,
    ELEMENTWISE_ARITY,
    POOLS,
    RESIZE,
    ROW_OP_TYPE,
    SUPPORTED_OP_TYPES,
    dtype_problem,
)

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ConvParams:
    strides: Shape
    dilations: Shape
    pad_below: Shape
    pad_above: Shape | None = None  # not part of the identifier; kept when known


@dataclass(frozen=True, slots=True)
class PoolParams:
    window: Shape
    strides: Shape
    pad_below: Shape
    pad_above: Shape


@dataclass(frozen=True, slots=True)
class DotParams:
    transpose_a: bool = False
    transpose_b: bool = False


@dataclass(frozen=True, slots=True)
class ResizeParams:
    """How a Resize samples (ONNX's attributes): not in its identifier, kept in the row's Attributes."""

    mode: str
    coordinate_transformation_mode: str
    nearest_mode: str

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode, "coordinate_transformation_mode": self.coordinate_transformation_mode,
                "nearest_mode": self.nearest_mode}


Params = ConvParams | PoolParams | DotParams | ResizeParams | None


def dot_mkn(a: Sequence[int], b: Sequence[int], transpose_a: bool = False,
            transpose_b: bool = False) -> tuple[int, int, int]:
    """(M, K, N) of a Dot as one matrix product, its shapes as stored (validated: kernel_json._dot).

    NNFusion makes a Dot of a left operand of rank > 2 from an ONNX MatMul by a 2-D weight (never transposed):
    the leading axes are its rows, so M is their product. A rank-2 Dot may be transposed (ONNX Gemm)."""
    if transpose_a:
        m, k = a[1], a[0]
    else:
        m, k = math.prod(a[:-1]), a[-1]
    n = b[0] if transpose_b else b[1]
    return m, k, n


@dataclass(frozen=True, slots=True)
class OpSignature:
    """One op instance as the compiler sees it: enough to build its identifier and Attributes."""

    op_type: str
    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    params: Params = None
    dtype: str = "float"
    # "tf32": a float kernel computing on the tensor cores in TF32 (kept in Attributes, not the identifier: NNFusion
    # fetches it as the float op it is; verification and `kdb nnfusion --run` judge it by TF32's bound)
    math: str = ""

    @property
    def identifier(self) -> str:
        return build_identifier(self)

    def attributes(self) -> dict[str, Any]:
        """The Attributes column, in the layout NNFusion's own import tool writes."""
        attrs: dict[str, Any] = {
            "input_shape": [list(s) for s in self.inputs],
            "output_shape": [list(s) for s in self.outputs],
        }
        p = self.params
        if isinstance(p, ConvParams):
            attrs["parameters"] = {
                "window_movement_strides": list(p.strides),
                "window_dilation_strides": list(p.dilations),
                "padding_below_diff": list(p.pad_below),
            }
        elif isinstance(p, PoolParams):
            attrs["parameters"] = {
                "window_shape": list(p.window),
                "window_stride": list(p.strides),
                "padding_below": list(p.pad_below),
                "padding_above": list(p.pad_above),
            }
        elif isinstance(p, DotParams):
            attrs["parameters"] = {"transpose_A": p.transpose_a, "transpose_B": p.transpose_b}
        elif isinstance(p, ResizeParams):
            attrs["parameters"] = p.as_dict()
        if self.dtype != "float":
            attrs["dtype"] = self.dtype
        if self.math:
            attrs["math"] = self.math
        return attrs


def _shapes(shapes: Sequence[Sequence[int]]) -> str:
    return ";".join(",".join(str(d) for d in s) for s in shapes)


def _braced(kind: str, values: Sequence[int]) -> str:
    return kind + "{" + ", ".join(str(v) for v in values) + "}"


def _base(op: str, inputs: Sequence[Shape], outputs: Sequence[Shape], dtype: str) -> str:
    return op + _shapes(inputs) + ";" + _shapes(outputs) + dtype * (len(inputs) + len(outputs))


def build_identifier(sig: OpSignature) -> str:
    op, p, dt = sig.op_type, sig.params, sig.dtype
    if op in CONV_FAMILY:
        assert isinstance(p, ConvParams)
        data, filt = sig.inputs[0], sig.inputs[1]
        out = sig.outputs[0]
        ident = (
            _base("Convolution", (data, filt), (out,), dt)
            + _braced("Strides", p.strides)
            + _braced("Strides", p.dilations)
            + _braced("CoordinateDiff", p.pad_below)
        )
        if op == "Fused_Convolution_Add_Relu":
            ident += _base("Add", (out, out), (out,), dt)
        if op in ("Fused_Convolution_Relu", "Fused_Convolution_Add_Relu"):
            ident += _base("Relu", (out,), (out,), dt)
        return ident
    if op in POOLS:
        assert isinstance(p, PoolParams)
        return (
            _base(op, sig.inputs, sig.outputs, dt)
            + _braced("Shape", p.window)
            + _braced("Strides", p.strides)
            + _braced("Shape", p.pad_below)
            + _braced("Shape", p.pad_above)
        )
    return _base(op, sig.inputs, sig.outputs, dt)


# ---------------------------------------------------------------------------------------------
# Reading a signature back from a row's Attributes (for lint: does the Identifier match?)


def _shape_list(value: Any, field: str) -> tuple[Shape, ...]:
    if not isinstance(value, list) or not all(
        isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in s)
        for s in value
    ):
        raise InputError(f"{field} must be a list of integer lists", where="Attributes")
    return tuple(tuple(s) for s in value)


def _int_tuple(params: dict[str, Any], key: str) -> Shape:
    v = params.get(key)
    if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
        raise InputError(f"parameters.{key} must be a list of integers", where="Attributes")
    return tuple(v)


def signature_from_attributes(op_type: str, attrs: Any) -> OpSignature:
    """Rebuild the OpSignature an Attributes column describes (`op_type`: kdb's op of the row, KernelRow.op);
    InputError when it cannot."""
    if op_type not in SUPPORTED_OP_TYPES and op_type not in ROW_OP_TYPE:
        raise InputError(f"op type {op_type!r} is not supported by the compiler", where="OpType")
    if not isinstance(attrs, dict):
        raise InputError("Attributes is not a JSON object", where="Attributes")
    inputs = _shape_list(attrs.get("input_shape"), "input_shape")
    outputs = _shape_list(attrs.get("output_shape"), "output_shape")
    dtype = attrs.get("dtype", "float")
    if (problem := dtype_problem(dtype)) is not None:
        raise InputError(f"dtype: {problem}", where="Attributes")
    raw = attrs.get("parameters") or {}
    if not isinstance(raw, dict):
        raise InputError("parameters is not a JSON object", where="Attributes")
    params: Params = None
    if op_type in (*CONV_FAMILY, DEPTHWISE, CONV_TRANSPOSE):
        params = ConvParams(
            _int_tuple(raw, "window_movement_strides"),
            _int_tuple(raw, "window_dilation_strides"),
            _int_tuple(raw, "padding_below_diff"),
        )
        want = 3 if op_type == "Fused_Convolution_Add_Relu" else 2
        if len(inputs) < 2 or len(inputs) > want or len(outputs) != 1:
            raise InputError(
                f"{op_type} needs {want} input shapes and 1 output shape", where="Attributes"
            )
    elif op_type in POOLS:
        params = PoolParams(
            _int_tuple(raw, "window_shape"),
            _int_tuple(raw, "window_stride"),
            _int_tuple(raw, "padding_below"),
            _int_tuple(raw, "padding_above"),
        )
    elif op_type == "Dot":
        params = DotParams(bool(raw.get("transpose_A", False)), bool(raw.get("transpose_B", False)))
    elif op_type == RESIZE and all(isinstance(raw.get(k), str) for k in ResizeParams.__slots__):
        params = ResizeParams(*(raw[k] for k in ResizeParams.__slots__))
    elif op_type in ELEMENTWISE_ARITY and len(inputs) != ELEMENTWISE_ARITY[op_type]:
        raise InputError(
            f"{op_type} takes {ELEMENTWISE_ARITY[op_type]} input(s), Attributes list {len(inputs)}",
            where="Attributes",
        )
    tensor_math = attrs.get("math", "")
    if tensor_math not in ("", "tf32"):
        raise InputError(f"math {tensor_math!r}: only tf32 (or none)", where="Attributes")
    return OpSignature(op_type, inputs, outputs, params, dtype, tensor_math)

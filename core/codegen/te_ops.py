"""Tensor-expression definitions of the ops NNFusion fetches from its kernel DB (TVM 0.27, `tvm.te`).

Tensors are named as the kernel DB wants them: inputs input0.., the result output0, so the generated
kernel's parameters need no renaming beyond TVM's `_ptr` suffix. Layout NCHW; fp32 or fp16 (tvm_dtype).
Semantics worth knowing: AvgPool excludes padding from the average (ONNX's count_include_pad=0);
Fused_Convolution_Add_Relu adds a full output-shaped tensor (input2) before the ReLU; element-wise ops compute
what NNFusion's own kernel for them computes (its element-op map), and those no row can serve say why.
"""

from __future__ import annotations

import functools
from typing import Any

from core.errors import InputError
from core.kernels.ops import (
    BATCH_MATMUL,
    CONCAT,
    CONV_FAMILY,
    CONV_TRANSPOSE,
    DEPTHWISE,
    ELEMENTWISE_NO_ROW,
    POOLS,
    RESIZE,
    SOFTMAX,
    SUM,
    concat_axis,
    sum_axes,
)
from core.opconfigs.opconfig import OpConfig, planar

# Bumped when an op's definition changes its TVM workload: a tuning work dir holds one workload's trials, so
# the new definition tunes in a dir of its own instead of resuming trials of the old one (core/tuning/job.py).
REVISIONS = {"MaxPool": 2, "AvgPool": 2}  # 2: the reduction is the output (_pool)
# The op configs' element types kdb generates kernels in, by TVM's names (double has no tuned use in NNFusion).
TVM_DTYPES = {"float": "float32", "half": "float16"}


def revision(op_type: str) -> int:
    return REVISIONS.get(op_type, 1)


def define(config: OpConfig) -> tuple[list[Any], Any]:
    """(inputs, output) tensors for the op; output named output0. InputError if TVM cannot express it."""
    from tvm import te, topi

    config = planar(config)  # a 1-D convolution or pool is the 2-D one of height 1
    p, op = config.params, config.op_type
    if op in (*CONV_FAMILY, *POOLS) and len(p["input_shape"]) != 4:
        raise InputError(f"kdb generates 1-D and 2-D {op} kernels; this one is {len(p['input_shape']) - 2}-D "
                         f"(input {p['input_shape']})", where=config.source)
    dtype = tvm_dtype(config)
    want = list(_out_shape(config))
    if op in CONV_FAMILY:
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        weight = te.placeholder(tuple(p["filter_shape"]), dtype, name="input1")
        pb = list(p["padding_below_diff"])
        pa = list(p.get("padding_above_diff", pb))
        padding = [*pb, *pa]
        if config.groups == 1:
            out = topi.nn.conv2d_nchw(data, weight, p["window_movement_strides"], padding,
                                      p["window_dilation_strides"])
        else:
            out = topi.nn.group_conv2d_nchw(data, weight, p["window_movement_strides"], padding,
                                            p["window_dilation_strides"], config.groups)
        inputs = [data, weight]
        if op == "Fused_Convolution_Add_Relu":
            bias = te.placeholder(tuple(p["output_shape"]), dtype, name="input2")
            inputs.append(bias)
            out = topi.add(out, bias)
        if op != "Convolution":
            out = topi.nn.relu(out) if dtype == "float32" else _in_float32(topi.nn.relu, [out])
    elif op == CONV_TRANSPOSE:  # the filter [Cin, Cout, kh, kw] as ONNX (and topi) lay it out
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        weight = te.placeholder(tuple(p["filter_shape"]), dtype, name="input1")
        pad = list(p["padding_below_diff"])
        inputs = [data, weight]
        out = topi.nn.conv2d_transpose_nchw(data, weight, list(p["window_movement_strides"]), pad + pad, dtype, (0, 0))
    elif op == DEPTHWISE:
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        weight = te.placeholder(tuple(p["filter_shape"]), dtype, name="input1")  # [kh, kw, C, 1]: NNFusion's
        inputs, out = [data, weight], _depthwise(data, weight, p)
    elif op == "Dot":
        # One [M, K] x [K, N] product whatever the left operand's rank: its leading axes are rows (the kernel's
        # buffers are flat), so a [1,128,768] x [768,768] Dot is the 2-D GEMM TVM and MetaSchedule know best.
        m, k, n = config.matrix_dims()
        ta, tb = bool(p.get("transpose_A")), bool(p.get("transpose_B"))
        a = te.placeholder((k, m) if ta else (m, k), dtype, name="input0")
        b = te.placeholder((n, k) if tb else (k, n), dtype, name="input1")
        inputs, out = [a, b], topi.nn.matmul(a, b, transpose_a=ta, transpose_b=tb)
        want = [m, n]
    elif op == BATCH_MATMUL:
        # [batch, M, K] x [batch, K, N] whatever the batch axes (the kernel's buffers are flat)
        m, k, n = config.matrix_dims()
        a = te.placeholder((config.batch, m, k), dtype, name="input0")
        b = te.placeholder((config.batch, k, n), dtype, name="input1")
        inputs, out = [a, b], topi.nn.batch_matmul(a, b, transpose_a=False, transpose_b=False)
        want = [config.batch, m, n]
    elif op in POOLS:
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        inputs, out = [data], _pool(data, p, op)
    elif op == SOFTMAX:
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        inputs, out = [data], _softmax(data)
    elif op == SUM:  # summed in float32 whatever the element type, as the softmax (a half sum of many terms drifts)
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        (axes,) = sum_axes(p["input_shape"], p["output_shape"])  # validated: the shapes tell the axes
        total = topi.sum(te.compute(data.shape, lambda *i: data[i].astype("float32"), name="as_float"),
                         axis=list(axes), keepdims=False)
        inputs, out = [data], te.compute(total.shape, lambda *i: total[i].astype(dtype), name="output0")
    elif op == RESIZE:  # input1, the scales NNFusion passes, is a parameter the kernel never reads
        data = te.placeholder(tuple(p["input_shape"]), dtype, name="input0")
        inputs, out = [data, te.placeholder((4,), dtype, name="input1")], _resize(data, p)
    else:
        shapes = p.get("input_shapes") or [p["input_shape"]]
        inputs = [te.placeholder(tuple(s), dtype, name=f"input{i}") for i, s in enumerate(shapes)]
        if op == CONCAT:  # validated: the shapes tell the axis
            out = topi.concatenate(inputs, concat_axis(shapes, p["output_shape"]))
        else:
            out = _elementwise(op, inputs)
    output = out if out.op.name == "output0" else te.compute(out.shape, lambda *i: out(*i), name="output0")
    if [int(d) for d in output.shape] != want:
        raise InputError(f"TVM's {op} gives shape {[int(d) for d in output.shape]}, the op config says "
                         f"{want}", where=config.source)
    return inputs, output


def tvm_dtype(config: OpConfig) -> str:
    """TVM's name for the op config's element type; InputError for one kdb does not generate.

    Every tensor of the op has this type, and so does every reduction's accumulator: NNFusion's own half kernels
    accumulate in half (cublasHgemm for Dot, cuDNN convolutions with a CUDNN_DATA_HALF compute type), so a half row
    computes what the library call it replaces computes (core/codegen/reference.py bounds the error it brings)."""
    if config.dtype not in TVM_DTYPES:
        raise InputError(f"kdb generates float and half kernels; this {config.op_type} op config is "
                         f"{config.dtype}", where=config.source)
    return TVM_DTYPES[config.dtype]


def _softmax(data: Any) -> Any:
    """Softmax over the last axis: each row's max and its sum of exp(x - max), both in float32 whatever the element
    type (NNFusion's own half softmax, ONNX Runtime's dispatch_softmax_forward<half, half, float>, accumulates in
    float: a half sum of a thousand terms would lose its last digits), then exp(x - max) / sum in the element type.
    Two reductions over the same rows: core/codegen/schedule.py gives each row a block of threads."""
    from tvm import te

    *rows, width = (int(d) for d in data.shape)
    k = te.reduce_axis((0, width), name="k")
    row_max = te.compute(tuple(rows), lambda *r: te.max(data[(*r, k)].astype("float32"), axis=k), name="row_max")
    j = te.reduce_axis((0, width), name="j")
    row_sum = te.compute(tuple(rows), lambda *r: te.sum(te.exp(data[(*r, j)].astype("float32") - row_max[r]), axis=j),
                         name="row_sum")
    return te.compute(data.shape, lambda *i: (te.exp(data[i].astype("float32") - row_max[i[:-1]])
                                              / row_sum[i[:-1]]).astype(data.dtype), name="output0")


def _resize(data: Any, p: dict[str, Any]) -> Any:
    """ONNX's Resize of the two spatial axes, as TVM's ONNX frontend computes it (topi.image.resize2d: the output size
    given, so the scale is output / input, the op config's exactly: extraction takes no scale that truncates)."""
    from tvm import topi

    nearest = p["mode"] == "nearest"
    return topi.image.resize2d(data, (0.0, 0.0, 0.0, 0.0), tuple(p["output_shape"][2:]), layout="NCHW",
                               method="nearest_neighbor" if nearest else "linear",
                               coordinate_transformation_mode=p["coordinate_transformation_mode"],
                               rounding_method=p["nearest_mode"] if nearest else "")


def _depthwise(data: Any, weight: Any, p: dict[str, Any]) -> Any:
    """Each channel convolved with its own window, the filter read as NNFusion's importer lays it out: weight[ky, kx,
    c, 0] (frontend/onnx_import/op/conv.cpp transposes ONNX's [C, 1, kh, kw] so); padding symmetric."""
    from tvm import te, topi

    (sh, sw), (dh, dw), (ph, pw) = p["window_movement_strides"], p["window_dilation_strides"], p["padding_below_diff"]
    kh, kw = p["filter_shape"][:2]
    padded = topi.nn.pad(data, [0, 0, ph, pw], [0, 0, ph, pw], name="data_pad") if ph or pw else data
    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    return te.compute(tuple(p["output_shape"]),
                      lambda n, c, y, x: te.sum(padded[n, c, y * sh + ry * dh, x * sw + rx * dw] * weight[ry, rx, c, 0],
                                                axis=[ry, rx]), name="output0")


def _pool(data: Any, p: dict[str, Any], op: str) -> Any:
    """A pooling whose reduction is the output itself; its padding is an injective stage that inlines.

    topi's pool2d ends in a stage after its reduction (a copy, or the average's division), and such a stage
    cannot be inlined back into a reduction: MetaSchedule's CUDA rules bind the two apart, two kernels, which
    no DB row can hold (the 30 fastest of the 67 MaxPool trials of ResNet-18 on the H200 were all such
    schedules). The average divides each term by its window's count of real (unpadded) elements instead,
    as ONNX's count_include_pad=0 counts them."""
    from tvm import te, tirx, topi

    (kh, kw), (sh, sw) = p["window_shape"], p["window_stride"]
    (pt, pl), (pb, pr) = p["padding_below"], p["padding_above"]
    n, c, h, w = (int(d) for d in data.shape)
    is_max = op == "MaxPool"
    fill = te.min_value(data.dtype) if is_max else tirx.const(0.0, data.dtype)
    padded = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr], pad_value=fill, name="pad_temp") \
        if (pt, pl, pb, pr) != (0, 0, 0, 0) else data
    rh, rw = te.reduce_axis((0, kh), name="rh"), te.reduce_axis((0, kw), name="rw")
    # A max of halves as a select: TVM writes te.max of halves as max(half, half), a helper of its own CUDA prelude
    # that NNFusion's generated code lacks (a max is exact in any type, so nothing else changes).
    maximum = te.max if data.dtype == "float32" else te.comm_reducer(
        lambda a, b: tirx.Select(a > b, a, b), lambda t: te.min_value(t), name="select_max")
    shape = (n, c, (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1)

    def real(start: Any, size: int, window: int) -> Any:  # elements of [start, start + window) inside [0, size)
        return tirx.min(start + window, size) - tirx.max(start, 0)

    def value(b: Any, k: Any, y: Any, x: Any) -> Any:
        term = padded[b, k, y * sh + rh, x * sw + rw]
        if is_max:
            return maximum(term, axis=[rh, rw])
        count = real(y * sh - pt, h, kh) * real(x * sw - pl, w, kw)
        return te.sum(term / count.astype(data.dtype), axis=[rh, rw])

    return te.compute(shape, value, name="output0")


def _out_shape(config: OpConfig) -> list[int]:
    """The output's shape ([] for a scalar: a Pow of two scalars, torch's `head_dim ** -0.5` of a traced shape)."""
    params = config.params
    return list(params["output_shape"] if "output_shape" in params else params["out_shape"])


def _elementwise(op: str, inputs: list[Any]) -> Any:
    """NNFusion's CUDA definition of the op (its element-op map, cuda_common_ops.hpp), one element at a time."""
    from tvm import te

    if op in ELEMENTWISE_NO_ROW:
        raise InputError(f"no kernel-DB row for {op}: {ELEMENTWISE_NO_ROW[op]}")
    scalar = elementwise_definitions("float32").get(op)
    if scalar is None:
        raise InputError(f"no TVM definition for the element-wise op {op}")
    if inputs[0].dtype != "float32":
        return _in_float32(lambda *xs: te.compute(xs[0].shape, lambda *i: scalar(*(t(*i) for t in xs))), inputs)
    return te.compute(inputs[0].shape, lambda *i: scalar(*(t(*i) for t in inputs)), name="output0")


def _in_float32(op: Any, inputs: list[Any]) -> Any:
    """`op` of half tensors computed as NNFusion's own half element-wise kernels compute it: each input widened to
    float, the float function (expf, erff, fmaxf...), the result rounded to half once. It also keeps TVM's half
    helpers (herf, htanh, hpow, max(half, half)), which only its own CUDA prelude defines, out of the kernel."""
    from tvm import te

    dtype = inputs[0].dtype
    widened = op(*(_widen(t) for t in inputs))
    return te.compute(widened.shape, lambda *i: widened(*i).astype(dtype), name="output0")


def _widen(tensor: Any) -> Any:
    from tvm import te

    return te.compute(tensor.shape, lambda *i: tensor(*i).astype("float32"), name=f"{tensor.op.name}_f32")


@functools.cache
def elementwise_definitions(dtype: str) -> dict[str, Any]:
    """op -> a function of the inputs' scalars (tirx expressions), as NNFusion's kernel computes them (built on
    first use: `tvm` is imported only when code is generated)."""
    from tvm import tirx

    def const(value: float) -> Any:
        return tirx.const(value, dtype)

    def flag(cond: Any) -> Any:  # C's int(cond) as a number of the tensor's type
        return tirx.Select(cond, const(1.0), const(0.0))

    def gelu(x: Any) -> Any:  # x * normcdf(x) (NNFusion's _Gelu)
        return x * const(0.5) * (const(1.0) + tirx.erf(x * const(0.7071067811865476)))

    def power_backward_exponent(x0: Any, x1: Any) -> Any:
        # NNFusion's 1.0/0.0 and 0.0/0.0 made at run time: TVM would print constants as CUDART_INF_F / CUDART_NAN_F,
        # which need a header NNFusion's generated code does not include.
        at_zero = tirx.Select(x1 >= const(0.0), const(0.0), const(1.0) / tirx.abs(x0))  # x0 == 0: +inf
        return tirx.Select(x0 > const(0.0), tirx.power(x0, x1) * tirx.log(x0),
                           tirx.Select(x0 == const(0.0), at_zero, tirx.log(x0)))  # x0 < 0: log gives NaN

    unary = {name: getattr(tirx, fn) for name, fn in (
        ("Abs", "abs"), ("Acos", "acos"), ("Asin", "asin"), ("Atan", "atan"), ("Ceiling", "ceil"), ("Cos", "cos"),
        ("Cosh", "cosh"), ("Erf", "erf"), ("Exp", "exp"), ("Floor", "floor"), ("Log", "log"), ("Sin", "sin"),
        ("Sinh", "sinh"), ("Sqrt", "sqrt"), ("Rsqrt", "rsqrt"), ("Tan", "tan"), ("Tanh", "tanh"))}
    return {
        **unary,
        "Square": lambda x: x * x,
        "Sign": lambda x: flag(x > const(0.0)) - flag(x < const(0.0)),
        "Convert": lambda x: x,  # one element type in and out: a copy
        "Gelu": gelu,
        "Relu": lambda x: tirx.max(x, const(0.0)),
        "Relu6": lambda x: tirx.min(tirx.max(x, const(0.0)), const(6.0)),
        "Negative": lambda x: -x,
        "Sigmoid": lambda x: const(1.0) / (const(1.0) + tirx.exp(-x)),
        "Power": tirx.power,
        "PowerBackwardBase": lambda x0, x1: tirx.Select(
            x1 != const(0.0), x1 * tirx.power(x0, x1 - const(1.0)), const(0.0)),
        "PowerBackwardExponent": power_backward_exponent,
        "Subtract": lambda x0, x1: x0 - x1,
        "Divide": lambda x0, x1: x0 / x1,
        "DivNoNan": lambda x0, x1: tirx.Select(x1 != const(0.0), x0 / x1, const(0.0)),
        "ReluBackprop": lambda x0, x1: x1 * flag(x0 > const(0.0)),
        "Relu6Backprop": lambda x0, x1: x1 * flag(x0 > const(0.0)) * flag(x0 < const(6.0)),
        "Add": lambda x0, x1: x0 + x1,
        "Multiply": lambda x0, x1: x0 * x1,
        "Minimum": lambda x0, x1: tirx.Select(x0 > x1, x1, x0),
        "Maximum": lambda x0, x1: tirx.Select(x0 > x1, x0, x1),
        "SigmoidBackprop": lambda x0, x1: x1 / (const(2.0) + tirx.exp(-x0) + tirx.exp(x0)),
        "GeluGrad": lambda x0, x1: x1 * (const(0.5) * (const(1.0) + tirx.erf(x0 * const(0.7071067811865476)))
                                         + x0 * const(0.3989422804014327) * tirx.exp(const(-0.5) * x0 * x0)),
    }

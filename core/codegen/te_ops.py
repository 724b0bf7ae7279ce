"""Tensor-expression definitions of the ops NNFusion fetches from its kernel DB (TVM 0.27, `tvm.te`).

Tensors are named as the kernel DB wants them: inputs input0.., the result output0, so the generated
kernel's parameters need no renaming beyond TVM's `_ptr` suffix. Layout NCHW; fp32.
Semantics worth knowing: AvgPool excludes padding from the average (ONNX's count_include_pad=0);
Fused_Convolution_Add_Relu adds a full output-shaped tensor (input2) before the ReLU.
"""

from __future__ import annotations

from typing import Any

from core.errors import InputError
from core.kernels.ops import CONV_FAMILY, POOLS
from core.opconfigs.opconfig import OpConfig

# Bumped when an op's definition changes its TVM workload: a tuning work dir holds one workload's trials, so
# the new definition tunes in a dir of its own instead of resuming trials of the old one (core/tuning/job.py).
REVISIONS = {"MaxPool": 2, "AvgPool": 2}  # 2: the reduction is the output (_pool)


def revision(op_type: str) -> int:
    return REVISIONS.get(op_type, 1)


# NNFusion element-wise op -> how TVM computes it (names of tvm.topi functions, or te lambdas).
_UNARY = {"Relu": "nn.relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Abs": "abs", "Negative": "negative", "Erf": "erf", "Floor": "floor", "Ceiling": "ceil", "Sin": "sin",
          "Cos": "cos", "Rsqrt": "rsqrt", "Square": None, "Relu6": None, "Gelu": None}
_BINARY = {"Add": "add", "Subtract": "subtract", "Multiply": "multiply", "Divide": "divide",
           "Maximum": "maximum", "Minimum": "minimum", "Power": "power"}


def define(config: OpConfig) -> tuple[list[Any], Any]:
    """(inputs, output) tensors for the op; output named output0. InputError if TVM cannot express it."""
    from tvm import te, topi

    p, op = config.params, config.op_type
    want = list(_out_shape(config))
    if op in CONV_FAMILY:
        data = te.placeholder(tuple(p["input_shape"]), name="input0")
        weight = te.placeholder(tuple(p["filter_shape"]), name="input1")
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
            bias = te.placeholder(tuple(p["output_shape"]), name="input2")
            inputs.append(bias)
            out = topi.add(out, bias)
        if op != "Convolution":
            out = topi.nn.relu(out)
    elif op == "Dot":
        # One [M, K] x [K, N] product whatever the left operand's rank: its leading axes are rows (the kernel's
        # buffers are flat), so a [1,128,768] x [768,768] Dot is the 2-D GEMM TVM and MetaSchedule know best.
        m, k, n = config.matrix_dims()
        ta, tb = bool(p.get("transpose_A")), bool(p.get("transpose_B"))
        a = te.placeholder((k, m) if ta else (m, k), name="input0")
        b = te.placeholder((n, k) if tb else (k, n), name="input1")
        inputs, out = [a, b], topi.nn.matmul(a, b, transpose_a=ta, transpose_b=tb)
        want = [m, n]
    elif op in POOLS:
        data = te.placeholder(tuple(p["input_shape"]), name="input0")
        inputs, out = [data], _pool(data, p, op)
    else:
        shapes = p.get("input_shapes") or [p["input_shape"]]
        inputs = [te.placeholder(tuple(s), name=f"input{i}") for i, s in enumerate(shapes)]
        out = _elementwise(op, inputs)
    output = out if out.op.name == "output0" else te.compute(out.shape, lambda *i: out(*i), name="output0")
    if [int(d) for d in output.shape] != want:
        raise InputError(f"TVM's {op} gives shape {[int(d) for d in output.shape]}, the op config says "
                         f"{want}", where=config.source)
    return inputs, output


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
    shape = (n, c, (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1)

    def real(start: Any, size: int, window: int) -> Any:  # elements of [start, start + window) inside [0, size)
        return tirx.min(start + window, size) - tirx.max(start, 0)

    def value(b: Any, k: Any, y: Any, x: Any) -> Any:
        term = padded[b, k, y * sh + rh, x * sw + rw]
        if is_max:
            return te.max(term, axis=[rh, rw])
        count = real(y * sh - pt, h, kh) * real(x * sw - pl, w, kw)
        return te.sum(term / count.astype(data.dtype), axis=[rh, rw])

    return te.compute(shape, value, name="output0")


def _out_shape(config: OpConfig) -> list[int]:
    return list(config.params.get("output_shape") or config.params["out_shape"])


def _elementwise(op: str, inputs: list[Any]) -> Any:
    from tvm import te, tirx, topi

    if op in _BINARY:
        return getattr(topi, _BINARY[op])(inputs[0], inputs[1])
    x = inputs[0]
    if op == "Square":
        return te.compute(x.shape, lambda *i: x(*i) * x(*i), name="square")
    if op == "Relu6":
        return te.compute(x.shape, lambda *i: tirx.min(tirx.max(x(*i), 0.0), 6.0), name="relu6")
    if op == "Gelu":
        return te.compute(x.shape, lambda *i: x(*i) * 0.5 * (1.0 + tirx.erf(x(*i) * 0.7071067811865476)),
                          name="gelu")
    name = _UNARY.get(op)
    if name is None:
        raise InputError(f"no TVM definition for the element-wise op {op} yet")
    fn: Any = topi
    for part in name.split("."):
        fn = getattr(fn, part)
    return fn(x)

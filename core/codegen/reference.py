"""Check an op's math on the CPU (its definition, or a schedule of it): TVM's llvm build against a float64
numpy reference."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from core.errors import InputError
from core.kernels.ops import (
    BATCH_MATMUL,
    CONCAT,
    CONV_FAMILY,
    CONV_TRANSPOSE,
    DEPTHWISE,
    POOLS,
    RESIZE,
    SOFTMAX,
    SUM,
    concat_axis,
    sum_axes,
)
from core.opconfigs.opconfig import OpConfig, planar

TOLERANCE = 1e-4  # the fp32 floor of tolerance(): relative error (max |a-b| / max |b|) allowed against fp64 numpy
MAX_CHECK_ELEMENTS = 1 << 26  # skip configs whose tensors would take GBs on the CPU
# Unit roundoff of each element type kdb generates: the largest relative error of one rounding to nearest.
UNIT_ROUNDOFF = {"float": 2.0**-24, "half": 2.0**-11, "double": 2.0**-53,
                 # TF32 keeps 10 bits of each operand's mantissa (kdb's rows round them, as cuDNN does); sums in fp32
                 "tf32": 2.0**-11}
NUMPY_DTYPES = {"float": np.float32, "half": np.float16, "double": np.float64}
# The fixed bounds that predate the policy, kept as its floor (a double kernel is only ever injected, never generated).
_FLOOR = {"float": TOLERANCE, "double": 1e-10}


def reduction_length(config: OpConfig) -> int:
    """K, the terms each output of the op sums (1 for an element-wise op): what its rounding error grows with."""
    p = config.params
    if config.op_type in CONV_FAMILY:
        return math.prod(p["filter_shape"][1:])  # input channels (per group) x window
    if config.op_type == DEPTHWISE:
        return math.prod(p["filter_shape"][:2])  # the window
    if config.op_type in ("Dot", BATCH_MATMUL):
        return config.matrix_dims()[1]
    if config.op_type in POOLS:
        return math.prod(p["window_shape"])
    if config.op_type == SOFTMAX:  # each row's sum of exponentials
        return p["input_shape"][-1]
    if config.op_type == SUM:
        return math.prod(p["input_shape"]) // max(1, math.prod(p["output_shape"]))
    if config.op_type == CONV_TRANSPOSE:  # input channels x the window's taps that land on one output
        _, _, kh, kw = p["filter_shape"]
        sh, sw = p["window_movement_strides"]
        return p["filter_shape"][0] * -(-kh // sh) * -(-kw // sw)
    if config.op_type == RESIZE:  # a linear one weighs four inputs
        return 4 if p["mode"] == "linear" else 1
    return 1


def tolerance(dtype: str, k: int) -> float:
    """The largest max |got - want| / max |want| allowed for a kernel of `dtype` whose outputs each sum `k` terms,
    against the float64 reference computed from the same (rounded) inputs. The policy, for both element types:

        tolerance = max(floor, u * (2 + 2 * sqrt(k)))        u: the type's unit roundoff (half 2^-11, float 2^-24)

    - 2u: the result's rounding, and a product's (the inputs' own rounding is not counted: the reference reads them);
    - 2u * sqrt(k): a sum of k terms accumulated in the type rounds each partial sum; with the check's random-signed
      inputs those errors add like a random walk, and the largest output is about sqrt(k) terms in size, so relative
      to it the error grows as u * sqrt(k) (0.4 u sqrt(k) expected: the factor 2 is the margin; tests/test_fp16.py
      measures ResNet-50's and BERT's largest reductions in half against it).
    - floor: fp32 keeps the fixed 1e-4 it always had (above the formula for k < 695,000); half has none (a wrong
      kernel is off by about 1, a right one by well under the bound).
    Half kernels accumulate in half (as NNFusion's cuBLAS/cuDNN half calls do): the bound at ResNet-50's k = 4608 is
    0.067, at BERT's 3072 0.055; an element-wise half op gets 0.002."""
    if dtype not in UNIT_ROUNDOFF:
        raise InputError(f"no tolerance policy for element type {dtype}: kdb verifies {', '.join(UNIT_ROUNDOFF)}")
    return max(_FLOOR.get(dtype, 0.0), UNIT_ROUNDOFF[dtype] * (2 + 2 * math.sqrt(k)))


def tolerance_for(config: OpConfig) -> float:
    """The bound of the op's element type, or of TF32 for a float op computed so (config.math)."""
    return tolerance(config.math or config.dtype, reduction_length(config))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| in float64 (NaN when got holds one: never within a tolerance)."""
    scale = max(float(np.abs(want).max()), 1e-30) if want.size else 1.0
    return float(np.abs(got.astype(np.float64).reshape(want.shape) - want).max()) / scale if want.size else 0.0


def _conv(x: np.ndarray, w: np.ndarray, strides, dil, pb, pa, groups: int) -> np.ndarray:
    n, _, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pb[0], pa[0]), (pb[1], pa[1])))
    oh = (h + pb[0] + pa[0] - dil[0] * (r - 1) - 1) // strides[0] + 1
    ow = (wd + pb[1] + pa[1] - dil[1] * (s - 1) - 1) // strides[1] + 1
    out = np.zeros((n, k, oh, ow))
    kg = k // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * kg:(g + 1) * kg]
        for i in range(r):
            for j in range(s):
                patch = xs[:, :, i * dil[0]: i * dil[0] + strides[0] * (oh - 1) + 1: strides[0],
                           j * dil[1]: j * dil[1] + strides[1] * (ow - 1) + 1: strides[1]]
                out[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch, ws[:, :, i, j])
    return out


def _pool(x: np.ndarray, kind: str, win, strides, pb, pa) -> np.ndarray:
    n, c, h, w = x.shape
    oh = (h + pb[0] + pa[0] - win[0]) // strides[0] + 1
    ow = (w + pb[1] + pa[1] - win[1]) // strides[1] + 1
    fill = -np.inf if kind == "MaxPool" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pb[0], pa[0]), (pb[1], pa[1])), constant_values=fill)
    ones = np.pad(np.ones((h, w)), ((pb[0], pa[0]), (pb[1], pa[1])))
    out = np.full((n, c, oh, ow), fill)
    count = np.zeros((oh, ow))
    for i in range(win[0]):
        for j in range(win[1]):
            sl = (slice(i, i + strides[0] * (oh - 1) + 1, strides[0]),
                  slice(j, j + strides[1] * (ow - 1) + 1, strides[1]))
            patch = xp[:, :, sl[0], sl[1]]
            out = np.maximum(out, patch) if kind == "MaxPool" else out + patch
            count += ones[sl]
    return out if kind == "MaxPool" else out / count


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _normcdf(a: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + _erf(a / math.sqrt(2)))


def _power_backward_exponent(x0: np.ndarray, x1: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        positive = np.power(x0, x1) * np.log(np.where(x0 > 0, x0, 1.0))
    return np.where(x0 > 0, positive, np.where(x0 == 0, np.where(x1 >= 0, 0.0, np.inf), np.nan))


def _div_no_nan(x0: np.ndarray, x1: np.ndarray) -> np.ndarray:
    return np.where(x1 != 0, x0 / np.where(x1 != 0, x1, 1.0), 0.0)


# NNFusion's element-op map (cuda_common_ops.hpp) in float64; te_ops.elementwise_definitions is the TVM side.
_ELEMENTWISE = {
    "Abs": np.abs, "Acos": np.arccos, "Asin": np.arcsin, "Atan": np.arctan, "Ceiling": np.ceil, "Cos": np.cos,
    "Cosh": np.cosh, "Erf": _erf, "Exp": np.exp, "Floor": np.floor,
    "Log": np.log, "Sin": np.sin, "Sinh": np.sinh, "Sqrt": np.sqrt, "Rsqrt": lambda a: 1 / np.sqrt(a),
    "Square": np.square, "Tan": np.tan, "Tanh": np.tanh, "Sign": np.sign, "Convert": lambda a: a.copy(),
    "Gelu": lambda a: a * _normcdf(a), "Relu": lambda a: np.maximum(a, 0), "Relu6": lambda a: np.clip(a, 0, 6),
    "Negative": np.negative, "Sigmoid": lambda a: 1 / (1 + np.exp(-a)),
    "Power": np.power,
    "PowerBackwardBase": lambda x0, x1: np.where(x1 != 0, x1 * np.power(x0, x1 - 1), 0.0),
    "PowerBackwardExponent": _power_backward_exponent,
    "Subtract": np.subtract, "Divide": np.divide, "DivNoNan": _div_no_nan,
    "ReluBackprop": lambda x0, x1: x1 * (x0 > 0), "Relu6Backprop": lambda x0, x1: x1 * (x0 > 0) * (x0 < 6),
    "Add": np.add, "Multiply": np.multiply, "Minimum": np.minimum, "Maximum": np.maximum,
    "SigmoidBackprop": lambda x0, x1: x1 / (2 + np.exp(-x0) + np.exp(x0)),
    "GeluGrad": lambda x0, x1: x1 * (_normcdf(x0) + x0 * np.exp(-0.5 * x0 * x0) / math.sqrt(2 * math.pi)),
}  # fmt: skip
# Inputs the check draws for an op (default: uniform in [-1, 1)): inside the op's domain, wide enough to reach
# every branch of its definition.
_INPUT_RANGES = {
    **dict.fromkeys(["Log", "Sqrt", "Rsqrt", "Power", "PowerBackwardBase", "PowerBackwardExponent"], (0.1, 2.0)),
    **dict.fromkeys(["Relu6", "Relu6Backprop"], (-8.0, 8.0)),
    "Softmax": (-8.0, 8.0),  # exponents far apart: a kernel that forgets the row's max overflows or loses terms
}


def reference(config: OpConfig, arrays: list[np.ndarray]) -> np.ndarray:
    config = planar(config)  # a 1-D convolution or pool as the 2-D one of height 1: the same elements
    p, op = config.params, config.op_type
    xs = [a.astype(np.float64) for a in arrays]
    if op in CONV_FAMILY:
        pb = p["padding_below_diff"]
        # (the tensor cores' definition takes the filter, and may take the input, flat: the same elements)
        out = _conv(xs[0].reshape(p["input_shape"]), xs[1].reshape(p["filter_shape"]), p["window_movement_strides"],
                    p["window_dilation_strides"], pb, p.get("padding_above_diff", pb), config.groups)
        if op == "Fused_Convolution_Add_Relu":
            out = out + xs[2].reshape(out.shape)
        return np.maximum(out, 0) if op != "Convolution" else out
    if op == DEPTHWISE:  # the filter back from NNFusion's [kh, kw, C, 1] to ONNX's [C, 1, kh, kw]: groups of one
        pb = p["padding_below_diff"]
        w = xs[1].reshape(p["filter_shape"]).transpose(2, 3, 0, 1)
        return _conv(xs[0].reshape(p["input_shape"]), w, p["window_movement_strides"], p["window_dilation_strides"],
                     pb, pb, w.shape[0])
    if op == "Dot":
        # The operands as matrices (a left operand of rank > 2 has its leading axes as rows, however the caller
        # shaped the arrays: the op config's shapes, or te_ops' 2-D ones); the result in the op config's shape.
        m, k, _ = config.matrix_dims()
        ta = bool(p.get("transpose_A"))
        a = xs[0].reshape((k, m) if ta else (m, k))
        b = xs[1]
        return ((a.T if ta else a) @ (b.T if p.get("transpose_B") else b)).reshape(p["out_shape"])
    if op == BATCH_MATMUL:  # the operands' batch axes as one (the kernel's buffers are flat)
        m, k, n = config.matrix_dims()
        a, b = xs[0].reshape(config.batch, m, k), xs[1].reshape(config.batch, k, n)
        return np.matmul(a, b).reshape(p["out_shape"])
    if op == SUM:
        (axes,) = sum_axes(p["input_shape"], p["output_shape"])
        return xs[0].reshape(p["input_shape"]).sum(axis=axes).reshape(p["output_shape"])
    if op == RESIZE:
        return _resize(xs[0].reshape(p["input_shape"]), p)
    if op == CONV_TRANSPOSE:
        return _conv_transpose(xs[0].reshape(p["input_shape"]), xs[1].reshape(p["filter_shape"]),
                               p["window_movement_strides"], p["padding_below_diff"], p["output_shape"])
    if op == CONCAT:
        axis = concat_axis(p["input_shapes"], p["output_shape"])
        return np.concatenate([x.reshape(s) for x, s in zip(xs, p["input_shapes"], strict=True)], axis=axis)
    if op == SOFTMAX:
        x = xs[0].reshape(p["input_shape"])
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    if op in POOLS:
        return _pool(xs[0].reshape(p["input_shape"]), op, p["window_shape"], p["window_stride"], p["padding_below"],
                     p["padding_above"])
    fn = _ELEMENTWISE.get(op)
    if fn is None:
        raise InputError(f"no numpy reference for {op}")
    return fn(*xs)


def inputs_for(config: OpConfig, shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    """Seeded random inputs in the config's element type (half ones are drawn, then rounded to half)."""
    rng = np.random.default_rng(seed)
    low, high = _INPUT_RANGES.get(config.op_type, (-1.0, 1.0))
    arrays = [rng.uniform(low, high, s).astype(NUMPY_DTYPES[config.dtype]) for s in shapes]
    if config.op_type == "DivNoNan" and arrays[1].size:
        arrays[1].flat[::7] = 0  # its other branch: a zero divisor gives 0
    return arrays


def check_on_cpu(config: OpConfig, mod: Any, shapes: list[tuple[int, ...]]) -> float | None:
    """Max relative error of TVM's llvm build against numpy; None when too big to check on a CPU.

    Raises InputError when the error is over tolerance_for(config): the module computes something else.
    """
    import tvm

    if max(int(np.prod(s)) for s in shapes) > MAX_CHECK_ELEMENTS:
        return None
    arrays = inputs_for(config, shapes[:-1])
    exe = tvm.compile(mod, target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(shapes[-1], NUMPY_DTYPES[config.dtype]), dev)
    exe["main"](*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    want = reference(config, arrays)
    err = relative_error(out.numpy(), want)  # a Dot's TVM output is 2-D, its op config's may not be
    limit = tolerance_for(config)
    if not err <= limit:
        raise InputError(f"TVM's result differs from numpy's by {err:.2e} (relative; the {config.dtype} limit for "
                         f"{reduction_length(config)} terms a sum is {limit:.2g})")
    return err


def _resize(x: np.ndarray, p: dict[str, Any]) -> np.ndarray:
    """ONNX's Resize (opset 11 on) of the last two axes, nearest or linear, by its spec's formulas: each output
    coordinate mapped back by coordinate_transformation_mode (the scale output / input), then the nearest input
    (nearest_mode) or the two around it, weighted; indices clamped inside the input."""
    ctm, nearest = p["coordinate_transformation_mode"], p["mode"] == "nearest"

    def original(size_in: int, size_out: int) -> np.ndarray:
        x_out, scale = np.arange(size_out, dtype=np.float64), size_out / size_in
        if ctm == "align_corners":
            return x_out * (size_in - 1) / (size_out - 1) if size_out > 1 else np.zeros(size_out)
        if ctm == "asymmetric":
            return x_out / scale
        if ctm == "pytorch_half_pixel" and size_out == 1:
            return np.zeros(size_out)
        return (x_out + 0.5) / scale - 0.5  # half_pixel, pytorch_half_pixel

    def taps(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each output coordinate: two input indices and the second's weight."""
        at = original(size_in, size_out)
        if nearest:
            mode, frac = p["nearest_mode"], at - np.floor(at)
            index = {"floor": np.floor(at), "ceil": np.ceil(at),
                     "round_prefer_floor": np.where(frac == 0.5, np.floor(at), np.round(at)),
                     "round_prefer_ceil": np.where(frac == 0.5, np.ceil(at), np.round(at))}[mode]
            index = np.clip(index, 0, size_in - 1).astype(int)
            return index, index, np.zeros(size_out)
        at = np.clip(at, 0, size_in - 1)
        low = np.floor(at).astype(int)
        return low, np.minimum(low + 1, size_in - 1), at - low

    (h0, h1, wh), (w0, w1, ww) = (taps(x.shape[a], p["output_shape"][a]) for a in (2, 3))
    rows = x[:, :, h0, :] * (1 - wh)[:, None] + x[:, :, h1, :] * wh[:, None]
    return rows[:, :, :, w0] * (1 - ww) + rows[:, :, :, w1] * ww


def _conv_transpose(x: np.ndarray, w: np.ndarray, strides: list[int], pads: list[int],
                    out_shape: list[int]) -> np.ndarray:
    """ONNX's ConvTranspose (group 1): each input pixel's channels, times the filter [Cin, Cout, kh, kw], added into
    the window at stride times its position; the padding then cut from each side."""
    n, _, h, wd = x.shape
    _, cout, kh, kw = w.shape
    (sh, sw), (ph, pw) = strides, pads
    full = np.zeros((n, cout, (h - 1) * sh + kh, (wd - 1) * sw + kw))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    return full[:, :, ph:ph + out_shape[2], pw:pw + out_shape[3]]

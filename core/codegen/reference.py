"""Check an op's math on the CPU (its definition, or a schedule of it): TVM's llvm build against a float64
numpy reference."""

from __future__ import annotations

from typing import Any

import numpy as np

from core.errors import InputError
from core.kernels.ops import CONV_FAMILY, POOLS
from core.opconfigs.opconfig import OpConfig

TOLERANCE = 1e-4  # relative error (max |a-b| / max |b|) allowed between fp32 TVM and fp64 numpy
MAX_CHECK_ELEMENTS = 1 << 26  # skip configs whose tensors would take GBs on the CPU


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


_ELEMENTWISE = {
    "Relu": lambda a: np.maximum(a, 0), "Sigmoid": lambda a: 1 / (1 + np.exp(-a)), "Tanh": np.tanh,
    "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Abs": np.abs, "Negative": np.negative, "Floor": np.floor,
    "Ceiling": np.ceil, "Sin": np.sin, "Cos": np.cos, "Rsqrt": lambda a: 1 / np.sqrt(a), "Square": np.square,
    "Relu6": lambda a: np.clip(a, 0, 6), "Add": np.add, "Subtract": np.subtract, "Multiply": np.multiply,
    "Divide": np.divide, "Maximum": np.maximum, "Minimum": np.minimum, "Power": np.power,
}


def reference(config: OpConfig, arrays: list[np.ndarray]) -> np.ndarray:
    p, op = config.params, config.op_type
    xs = [a.astype(np.float64) for a in arrays]
    if op in CONV_FAMILY:
        pb = p["padding_below_diff"]
        out = _conv(xs[0], xs[1], p["window_movement_strides"], p["window_dilation_strides"], pb,
                    p.get("padding_above_diff", pb), config.groups)
        if op == "Fused_Convolution_Add_Relu":
            out = out + xs[2]
        return np.maximum(out, 0) if op != "Convolution" else out
    if op == "Dot":
        # The operands as matrices (a left operand of rank > 2 has its leading axes as rows, however the caller
        # shaped the arrays: the op config's shapes, or te_ops' 2-D ones); the result in the op config's shape.
        m, k, _ = config.matrix_dims()
        ta = bool(p.get("transpose_A"))
        a = xs[0].reshape((k, m) if ta else (m, k))
        b = xs[1]
        return ((a.T if ta else a) @ (b.T if p.get("transpose_B") else b)).reshape(p["out_shape"])
    if op in POOLS:
        return _pool(xs[0], op, p["window_shape"], p["window_stride"], p["padding_below"], p["padding_above"])
    if op == "Gelu":
        from math import erf

        return xs[0] * 0.5 * (1 + np.vectorize(erf)(xs[0] / np.sqrt(2)))
    fn = _ELEMENTWISE.get(op)
    if fn is None:
        raise InputError(f"no numpy reference for {op}")
    return fn(*xs)


def inputs_for(config: OpConfig, shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    positive = config.op_type in ("Log", "Sqrt", "Rsqrt", "Power")
    return [(rng.uniform(0.1, 2.0, s) if positive else rng.uniform(-1.0, 1.0, s)).astype(np.float32)
            for s in shapes]


def check_on_cpu(config: OpConfig, mod: Any, shapes: list[tuple[int, ...]]) -> float | None:
    """Max relative error of TVM's llvm build against numpy; None when too big to check on a CPU.

    Raises InputError when the error is over TOLERANCE: the module computes something else.
    """
    import tvm

    if max(int(np.prod(s)) for s in shapes) > MAX_CHECK_ELEMENTS:
        return None
    arrays = inputs_for(config, shapes[:-1])
    exe = tvm.compile(mod, target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(shapes[-1], np.float32), dev)
    exe["main"](*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    want = reference(config, arrays)
    scale = max(float(np.abs(want).max()), 1e-30)
    got = out.numpy().astype(np.float64).reshape(want.shape)  # a Dot's TVM output is 2-D, its op config's may not be
    err = float(np.abs(got - want).max()) / scale
    if not err <= TOLERANCE:
        raise InputError(f"TVM's result differs from numpy's by {err:.2e} (relative; limit {TOLERANCE:g})")
    return err

"""Op configs: the ops to generate and tune kernels for, in the artifact's line format or TOML/JSON.

Line format (the Rammer artifact's, extended the same way for the other ops):

    cudnn_convolution_op_float|i+1_3_227_227|w+64_3_11_11|o+1_64_55_55|ws+4_4|wd+1_1|p+0_0
        the prefix ends in the element type: _op_float (the artifact's), _op_half (fp16), _op_double
        optional fields: g+G (groups: depthwise when G = channels), pa+.. (pad above),
        fuse+relu or fuse+add_relu (the fused op types NNFusion fetches)
    cublas_dot_op_float|a+M_K|b+K_N|o+M_N|ta+0|tb+0
        a+ may have rank > 2, untransposed (a BERT dense layer: a+1_128_768|b+768_768|o+1_128_768)
    cublas_batch_matmul_op_float|a+B_M_K|b+B_K_N|o+B_M_N
        NNFusion's BatchMatMul of a MatMul of 3-D or 4-D activations (attention's Q K^T): one batch shape for all
    cudnn_maxpool_op_float|i+..|o+..|win+3_3|ws+2_2|pb+1_1|pa+1_1      (cudnn_avgpool_op_float alike)
    cudnn_softmax_op_float|i+1_12_128_128|o+1_12_128_128
        NNFusion's Softmax over the last axis (attention's scores, a classifier's logits)
    cudnn_reduce_sum_op_float|i+1_128_768|o+1_128
        NNFusion's Sum (a ReduceMean's, a LayerNorm's): the reduced axes dropped, told by the shapes alone
    cudnn_conv_transpose_op_float|i+1_256_28_28|w+256_128_2_2|o+1_128_56_56|ws+2_2|wd+1_1|p+0_0
        an ONNX ConvTranspose (group 1, square kernel; its bias an Add of its own): the filter as ONNX lays it out
    cudnn_depthwise_conv2d_op_float|i+1_32_56_56|w+3_3_32_1|o+1_32_56_56|ws+1_1|wd+1_1|p+1_1
        NNFusion's DepthwiseConv2dNative (an ONNX Conv of group = channels): the filter as its importer transposes
        it, [kh, kw, C, 1]; the padding symmetric
    elementwise_relu_op_float|i+..|o+..                                 (one i+ per input)
    concat_op_float|i+1_2_4|i+1_2_3|o+1_2_7
        NNFusion's Concat (one i+ per input): the joined axis told by the shapes alone (the last one here)
    resize_op_float|i+1_256_28_28|o+1_256_56_56|mode+linear|ctm+align_corners|nm+floor
        an ONNX Resize of the spatial axes (its scales a constant): mode, coordinate_transformation_mode and
        nearest_mode as the model gives them

Every line keeps its own field order and prefix, so a file read and written back is byte for byte the
same. Validation reuses the kernel-JSON checks (shape arithmetic, caps), so the two never disagree.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.kernels.kernel_json import MAX_FILE_BYTES, validate_item
from core.kernels.ops import (
    BATCH_MATMUL,
    CONCAT,
    CONV_FAMILY,
    CONV_TRANSPOSE,
    DEPTHWISE,
    ELEMENTWISE_ARITY,
    MATRIX_OP_TYPES,
    POOLS,
    RESIZE,
    SOFTMAX,
    SUM,
    concat_axis,
    dtype_problem,
    sum_axes,
)
from core.kernels.opsig import OpSignature, dot_mkn
from core.opconfigs.nnfusion_import import depthwise_padding_ok, grouped_conv_reason

_DTYPE_BYTES = {"float": 4, "half": 2, "double": 8}
_FUSE = {"relu": "Fused_Convolution_Relu", "add_relu": "Fused_Convolution_Add_Relu"}
_FUSE_NAME = {v: k for k, v in _FUSE.items()}


@dataclass(frozen=True)
class OpConfig:
    """One op to generate a kernel for: the op type and its parameters in kernel-JSON naming."""

    op_type: str
    params: dict[str, Any] = field(hash=False, compare=False)
    groups: int = 1
    dtype: str = "float"
    line_format: tuple[str, tuple[str, ...]] | None = field(default=None, hash=False, compare=False)
    source: str = field(default="", hash=False, compare=False)  # where it came from (file:line, ONNX node)
    # How a float op may compute: "" strictly in fp32, "tf32" on the tensor cores in TF32 (`--math tf32`, the
    # `math` setting). Not the op's identity in NNFusion (its rows are float rows), but another kernel to generate.
    math: str = ""

    def __post_init__(self) -> None:
        # One spelling for a one-input element-wise op (kernel JSON allows two), so configs read from any
        # format compare equal and the line format, which writes i+ per input, reads back the same.
        p = self.params
        if self.op_type in ELEMENTWISE_ARITY and "input_shape" in p and "input_shapes" not in p:
            params = {("input_shapes" if k == "input_shape" else k): ([v] if k == "input_shape" else v)
                      for k, v in p.items()}
            object.__setattr__(self, "params", params)

    @property
    def key(self) -> str:
        """Identity for de-duplication: op type, dtype, groups, every parameter (and the math asked for, when any)."""
        identity = [self.op_type, self.dtype, self.groups, self.params] + ([self.math] if self.math else [])
        return json.dumps(identity, sort_keys=True)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpConfig) and other.key == self.key

    def signature(self) -> OpSignature:
        """The op as NNFusion's kernel DB knows it; InputError if the DB has no op type for it."""
        if self.groups != 1:
            raise InputError(self._grouped_reason(), where=self.source)
        return validate(self)

    def _grouped_reason(self) -> str:
        """What NNFusion does with this grouped convolution instead of a kernel-DB lookup."""
        p = self.params
        data, filt = p.get("input_shape"), p.get("filter_shape")
        if not (isinstance(data, list) and len(data) > 1 and isinstance(filt, list) and len(filt) > 2):
            return f"grouped convolution (groups={self.groups}): no kernel-DB op type in NNFusion"
        below = list(p.get("padding_below_diff") or [])
        pads = below + list(p.get("padding_above_diff") or below)
        padding_ok = depthwise_padding_ok(pads, list(p.get("window_dilation_strides") or []), filt[2:])
        return grouped_conv_reason(self.groups, data[1], filt[0], padding_ok,
                                   list(p.get("window_dilation_strides") or []))[0]

    @property
    def flops(self) -> int:
        """Multiply-adds counted as 2 FLOPs; element-wise ops one per output element."""
        p = self.params
        if self.op_type in CONV_FAMILY:
            out, filt = p["output_shape"], p["filter_shape"]
            return 2 * math.prod(out) * math.prod(filt[1:])
        if self.op_type == CONV_TRANSPOSE:  # each input element spread over a window of every output channel
            return 2 * math.prod(p["input_shape"]) * math.prod(p["filter_shape"][1:])
        if self.op_type == DEPTHWISE:  # each output its own channel's window
            return 2 * math.prod(p["output_shape"]) * math.prod(p["filter_shape"][:2])
        if self.op_type in ("Dot", BATCH_MATMUL):
            m, k, n = self.matrix_dims()
            return 2 * self.batch * m * n * k
        if self.op_type in POOLS:
            return math.prod(p["output_shape"]) * math.prod(p["window_shape"])
        if self.op_type == SOFTMAX:  # a max, a subtraction and exp, a sum, a division per element
            return 5 * math.prod(p["output_shape"])
        if self.op_type == SUM:
            return math.prod(p["input_shape"])
        return math.prod(p["output_shape"])

    def matrix_dims(self) -> tuple[int, int, int]:
        """A Dot's (M, K, N) as one matrix product: a left operand of rank > 2 gives its leading axes as rows. A
        BatchMatMul's of each of its `batch` products."""
        p = self.params
        if self.op_type == BATCH_MATMUL:
            a, b = p["arg0_shape"], p["arg1_shape"]
            return a[-2], a[-1], b[-1]
        return dot_mkn(p["arg0_shape"], p["arg1_shape"], bool(p.get("transpose_A")), bool(p.get("transpose_B")))

    @property
    def batch(self) -> int:
        """How many matrix products the op is: a BatchMatMul's batch axes, else 1."""
        return math.prod(self.params["arg0_shape"][:-2]) if self.op_type == BATCH_MATMUL else 1

    @property
    def memory_bound(self) -> bool:
        """Pools and element-wise ops do about one operation per byte: their speed is bytes moved, not FLOPs."""
        return self.op_type in (*POOLS, SOFTMAX, SUM, DEPTHWISE, CONCAT, RESIZE) or self.op_type in ELEMENTWISE_ARITY

    @property
    def bytes_moved(self) -> int:
        """Every input and output tensor read or written once: the least traffic a kernel for it can have."""
        p = self.params
        if self.op_type in (*CONV_FAMILY, DEPTHWISE, CONV_TRANSPOSE):
            shapes = [p["input_shape"], p["filter_shape"], p["output_shape"]]
            shapes += [p["output_shape"]] if self.op_type == "Fused_Convolution_Add_Relu" else []
        elif self.op_type in ("Dot", BATCH_MATMUL):
            shapes = [p["arg0_shape"], p["arg1_shape"], p["out_shape"]]
        elif self.op_type in (*POOLS, SOFTMAX, SUM, RESIZE):
            shapes = [p["input_shape"], p["output_shape"]]
        else:
            shapes = [*p["input_shapes"], p["output_shape"]]
        return sum(math.prod(s) for s in shapes) * _DTYPE_BYTES.get(self.dtype, 4)

    def speed(self, seconds: float) -> tuple[float, str]:
        """How fast a kernel taking `seconds` runs: GB/s for memory-bound ops, GFLOP/s for the others."""
        if self.memory_bound:
            return self.bytes_moved / seconds / 1e9, "GB/s"
        return self.flops / seconds / 1e9, "GFLOP/s"

    def speed_text(self, seconds: float) -> str:
        value, unit = self.speed(seconds)
        return f"{value:,.{1 if value < 100 else 0}f} {unit}"

    def describe(self) -> str:
        """The op in a few words; a half (or double) op says so, as its fp32 twin is another op."""
        text = self._shapes_text()
        text = text if self.dtype == "float" else f"{text} {self.dtype}"
        return f"{text} {self.math}" if self.math else text

    def _shapes_text(self) -> str:
        p = self.params
        if self.op_type in (*CONV_FAMILY, DEPTHWISE, CONV_TRANSPOSE):
            dilation = p.get("window_dilation_strides") or []
            text = (f"{self.op_type} in {_dims(p['input_shape'])} w {_dims(p['filter_shape'])} "
                    f"out {_dims(p['output_shape'])} s{_dims(p['window_movement_strides'])} "
                    f"p{_dims(p['padding_below_diff'])}"
                    + (f" d{_dims(dilation)}" if any(d != 1 for d in dilation) else ""))  # dilated convs apart
            return text + (f" g{self.groups}" if self.groups != 1 else "")
        if self.op_type == BATCH_MATMUL:
            return f"BatchMatMul {_dims(p['arg0_shape'])} x {_dims(p['arg1_shape'])}"
        if self.op_type == "Dot":
            return (f"Dot {_dims(p['arg0_shape'])} x {_dims(p['arg1_shape'])}"
                    f"{' (tA)' if p.get('transpose_A') else ''}{' (tB)' if p.get('transpose_B') else ''}")
        if self.op_type == SOFTMAX:
            return f"Softmax {_dims(p['input_shape'])} (last axis)"
        if self.op_type == SUM:
            axes = sum_axes(p["input_shape"], p["output_shape"])
            over = f" over axis {_dims(axes[0])}" if len(axes) == 1 else ""
            return f"Sum {_dims(p['input_shape'])}{over}"
        if self.op_type == RESIZE:
            how = p["mode"] + ("" if p["mode"] == "linear" else f" {p['nearest_mode']}")
            return (f"Resize {_dims(p['input_shape'])} -> {_dims(p['output_shape'][2:])} {how} "
                    f"{p['coordinate_transformation_mode']}")
        if self.op_type == CONCAT:
            axis = concat_axis(p["input_shapes"], p["output_shape"])
            return f"Concat {' + '.join(_dims(s) for s in p['input_shapes'])} on axis {axis}"
        if self.op_type in POOLS:
            return (f"{self.op_type} in {_dims(p['input_shape'])} out {_dims(p['output_shape'])} "
                    f"win {_dims(p['window_shape'])} s{_dims(p['window_stride'])}")
        return f"{self.op_type} {_dims(p['output_shape'])}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op_type": self.op_type, **self.params}
        if self.groups != 1:
            out["groups"] = self.groups
        if self.dtype != "float":
            out["dtype"] = self.dtype
        return out


def _dims(values: Iterable[int]) -> str:
    return "x".join(str(v) for v in values) or "scalar"


def validate(config: OpConfig) -> OpSignature:
    """Shape arithmetic and caps, exactly as for kernel JSON (one set of rules)."""
    if config.groups != 1:
        return _validate_grouped(config)
    item = {"tvm_func_name": "opconfig", "op_type": config.op_type, "parameters": config.params,
            "code": "__global__ void k() {}", "gridDim": [1], "blockDim": [1], "dtype": config.dtype}
    try:
        return validate_item(item).op
    except InputError as exc:
        raise InputError(str(exc), where=config.source) from None


def _validate_grouped(config: OpConfig) -> OpSignature:
    p = dict(config.params)
    g = config.groups
    data, filt, out = p.get("input_shape"), p.get("filter_shape"), p.get("output_shape")
    if config.op_type not in CONV_FAMILY or not all(isinstance(s, list) and len(s) == 4 for s in (data, filt, out)):
        raise InputError("groups apply to 2-D convolutions only", where=config.source)
    if not all(type(d) is int for s in (data, filt, out) for d in s):
        raise InputError("input, filter and output shapes must be lists of integers", where=config.source)
    if not isinstance(g, int) or g < 1 or data[1] % g or filt[0] % g or filt[1] * g != data[1]:
        raise InputError(f"groups={g} does not divide the channels (input {data[1]}, filter {filt[:2]})",
                         where=config.source)
    # The arithmetic is the ungrouped one with the filter seen over all input channels.
    check = OpConfig(config.op_type, {**p, "filter_shape": [filt[0], data[1], *filt[2:]]}, 1, config.dtype,
                     source=config.source)
    return validate(check)


# ---------------------------------------------------------------------------------------------
# The line format


def _shape(text: str, where: str) -> list[int]:
    if not text:
        return []  # rank 0: a scalar
    try:
        dims = [int(d) for d in text.split("_")]
    except ValueError:
        raise InputError(f"{text!r} is not a list of integers joined by '_'", where=where) from None
    return dims


def parse_line(line: str, where: str = "") -> OpConfig:
    parts = line.split("|")
    prefix, fields = parts[0], parts[1:]
    values: dict[str, list[str]] = {}
    order: list[str] = []
    for f in fields:
        name, sep, value = f.partition("+")
        if not sep or not name:
            raise InputError(f"field {f!r} is not NAME+VALUE", where=where)
        values.setdefault(name, []).append(value)
        order.append(name)

    def one(name: str) -> str:
        if name not in values:
            raise InputError(f"field {name}+ is missing", where=where)
        if len(values[name]) != 1:
            raise InputError(f"field {name}+ appears {len(values[name])} times", where=where)
        return values[name][0]

    kind, dtype = _split_prefix(prefix, where)
    groups = 1
    if kind.endswith(("depthwise_conv2d", "conv_transpose")):
        op_type = DEPTHWISE if kind.endswith("depthwise_conv2d") else CONV_TRANSPOSE
        params = {key: _shape(one(field), where) for field, key in _CONV_FIELDS}
    elif kind.endswith("convolution"):
        fuse = values.get("fuse", ["none"])[0]
        if fuse not in ("none", *_FUSE):
            raise InputError(f"fuse+{fuse}: expected relu or add_relu", where=where)
        op_type = _FUSE.get(fuse, "Convolution")
        params: dict[str, Any] = {key: _shape(one(field), where) for field, key in _CONV_FIELDS}
        if "pa" in values:
            params["padding_above_diff"] = _shape(one("pa"), where)
        if "g" in values:
            group_field = _shape(one("g"), where)
            if len(group_field) != 1:
                raise InputError(f"g+{one('g')}: expected one group count", where=where)
            groups = group_field[0]
    elif kind.endswith("batch_matmul"):
        op_type = BATCH_MATMUL
        params = {"arg0_shape": _shape(one("a"), where), "arg1_shape": _shape(one("b"), where),
                  "out_shape": _shape(one("o"), where)}
    elif kind.endswith("dot"):
        op_type = "Dot"
        params = {"arg0_shape": _shape(one("a"), where), "arg1_shape": _shape(one("b"), where),
                  "out_shape": _shape(one("o"), where), "transpose_A": one("ta") == "1" if "ta" in values else False,
                  "transpose_B": one("tb") == "1" if "tb" in values else False}
    elif kind.endswith(("maxpool", "avgpool")):
        op_type = "MaxPool" if kind.endswith("maxpool") else "AvgPool"
        params = {"input_shape": _shape(one("i"), where), "output_shape": _shape(one("o"), where),
                  "window_shape": _shape(one("win"), where), "window_stride": _shape(one("ws"), where),
                  "padding_below": _shape(one("pb"), where), "padding_above": _shape(one("pa"), where)}
    elif kind.endswith(("reduce_sum", "softmax")):
        op_type = SUM if kind.endswith("reduce_sum") else SOFTMAX
        params = {"input_shape": _shape(one("i"), where), "output_shape": _shape(one("o"), where)}
    elif kind == "resize":
        op_type = RESIZE
        params = {"input_shape": _shape(one("i"), where), "output_shape": _shape(one("o"), where), "mode": one("mode"),
                  "coordinate_transformation_mode": one("ctm"), "nearest_mode": one("nm")}
    elif kind == "concat":
        op_type = CONCAT
        inputs = [_shape(v, where) for v in values.get("i", [])]
        params = {"input_shapes": inputs, "output_shape": _shape(one("o"), where)}
    elif kind.startswith("elementwise_"):
        name = kind[len("elementwise_"):]
        op_type = next((op for op in ELEMENTWISE_ARITY if op.lower() == name), "")
        if not op_type:
            raise InputError(f"element-wise op {name!r} is not one NNFusion knows", where=where)
        inputs = [_shape(v, where) for v in values.get("i", [])]
        params = {"input_shapes": inputs, "output_shape": _shape(one("o"), where)}
    else:
        raise InputError(f"prefix {prefix!r}: not a convolution, depthwise convolution, dot, batch matmul, pool, "
                         "softmax, sum, concat, resize or element-wise op config", where=where)
    config = OpConfig(op_type, params, groups, dtype, (prefix, tuple(order)), where)
    validate(config) if groups == 1 else _validate_grouped(config)
    if format_line(config) != line:
        raise InputError("the line does not read back the same (unknown or repeated fields?)", where=where)
    return config


# A convolution line's fields and the parameters they hold, in the line's own order
_CONV_FIELDS = (("i", "input_shape"), ("w", "filter_shape"), ("o", "output_shape"), ("ws", "window_movement_strides"),
                ("wd", "window_dilation_strides"), ("p", "padding_below_diff"))


def _split_prefix(prefix: str, where: str) -> tuple[str, str]:
    """(kind, dtype) of a line's prefix `<kind>_op_<dtype>`: the artifact's `_op_float`, and `_op_half` (fp16),
    `_op_double` alike; InputError naming an element type no row can serve."""
    kind, sep, dtype = prefix.rpartition("_op_")
    if not sep or not kind:
        raise InputError(f"prefix {prefix!r}: expected <op>_op_<dtype> (dtype float, half or double)", where=where)
    if (problem := dtype_problem(dtype)) is not None:
        raise InputError(f"prefix {prefix!r}: {problem}", where=where)
    return kind, dtype


def format_line(config: OpConfig) -> str:
    """The config as one line (its prefix ends in `_op_<dtype>`)."""
    p = config.params
    op = config.op_type
    fields: dict[str, str] = {}

    def dims(values: list[int]) -> str:
        return "_".join(str(v) for v in values)

    if op in (*CONV_FAMILY, DEPTHWISE, CONV_TRANSPOSE):
        kind = {DEPTHWISE: "depthwise_conv2d", CONV_TRANSPOSE: "conv_transpose"}.get(op, "convolution")
        prefix, default = f"cudnn_{kind}_op_{config.dtype}", tuple(field for field, _ in _CONV_FIELDS)
        fields = {field: dims(p[key]) for field, key in _CONV_FIELDS}
        if "padding_above_diff" in p:
            fields["pa"] = dims(p["padding_above_diff"])
        if config.groups != 1:
            fields["g"] = str(config.groups)
        if op in _FUSE_NAME:
            fields["fuse"] = _FUSE_NAME[op]
    elif op == "Dot":
        prefix, default = f"cublas_dot_op_{config.dtype}", ("a", "b", "o", "ta", "tb")
        fields = {"a": dims(p["arg0_shape"]), "b": dims(p["arg1_shape"]), "o": dims(p["out_shape"]),
                  "ta": str(int(bool(p.get("transpose_A")))), "tb": str(int(bool(p.get("transpose_B"))))}
    elif op == BATCH_MATMUL:
        prefix, default = f"cublas_batch_matmul_op_{config.dtype}", ("a", "b", "o")
        fields = {"a": dims(p["arg0_shape"]), "b": dims(p["arg1_shape"]), "o": dims(p["out_shape"])}
    elif op in (SOFTMAX, SUM):
        prefix = f"cudnn_{'softmax' if op == SOFTMAX else 'reduce_sum'}_op_{config.dtype}"
        default, fields = ("i", "o"), {"i": dims(p["input_shape"]), "o": dims(p["output_shape"])}
    elif op == RESIZE:
        prefix, default = f"resize_op_{config.dtype}", ("i", "o", "mode", "ctm", "nm")
        fields = {"i": dims(p["input_shape"]), "o": dims(p["output_shape"]), "mode": p["mode"],
                  "ctm": p["coordinate_transformation_mode"], "nm": p["nearest_mode"]}
    elif op in POOLS:
        prefix = f"cudnn_{'maxpool' if op == 'MaxPool' else 'avgpool'}_op_{config.dtype}"
        default = ("i", "o", "win", "ws", "pb", "pa")
        fields = {"i": dims(p["input_shape"]), "o": dims(p["output_shape"]), "win": dims(p["window_shape"]),
                  "ws": dims(p["window_stride"]), "pb": dims(p["padding_below"]), "pa": dims(p["padding_above"])}
    else:
        kind = "concat" if op == CONCAT else f"elementwise_{op.lower()}"
        prefix, default = f"{kind}_op_{config.dtype}", ()
        shapes = p.get("input_shapes") or [p["input_shape"]]
        parts = [f"i+{dims(s)}" for s in shapes] + [f"o+{dims(p['output_shape'])}"]
        return "|".join([_read_prefix(config) or prefix, *parts])
    if config.line_format is not None:
        prefix, order = _read_prefix(config) or prefix, config.line_format[1]
    else:
        order = tuple(n for n in dict.fromkeys((*default, "pa", "g", "fuse")) if n in fields)
    extra = [n for n in fields if n not in order]
    return "|".join([prefix, *(f"{n}+{fields[n]}" for n in (*order, *extra) if n in fields)])


def _read_prefix(config: OpConfig) -> str | None:
    """The prefix the config was read with, its element type made the config's own (never a stale one)."""
    if config.line_format is None:
        return None
    kind = config.line_format[0].rpartition("_op_")[0]
    return f"{kind}_op_{config.dtype}" if kind else None


def with_math(config: OpConfig, math: str) -> OpConfig:
    """The config as a run asks it computed: math "tf32" makes a float Dot, BatchMatMul or convolution a TF32 one
    (the tensor cores take it); every other op, and "fp32", are left as they are."""
    if math == "tf32" and config.dtype == "float" and config.op_type in MATRIX_OP_TYPES:
        return replace(config, math="tf32")
    return config


# A 1-D op's parameters lifted to 2-D: what a height-1 axis adds to each (shapes get it before their last axis).
_PLANAR_SHAPES = ("input_shape", "filter_shape", "output_shape")
_PLANAR_ONE = ("window_movement_strides", "window_dilation_strides", "window_shape", "window_stride")
_PLANAR_ZERO = ("padding_below_diff", "padding_above_diff", "padding_below", "padding_above")


def planar(config: OpConfig) -> OpConfig:
    """A 1-D convolution or pool (N,C,L tensors) as the 2-D one of height 1 that computes it, element for element
    in the same order, so one 2-D definition generates both (the row keeps the 1-D config's identifier, which is
    what NNFusion looks up). Any other config is returned as it is."""
    p = config.params
    if config.op_type not in (*CONV_FAMILY, *POOLS) or len(p["input_shape"]) != 3:
        return config
    lifted = dict(p)
    for key in _PLANAR_SHAPES:
        if key in p:
            lifted[key] = [*p[key][:-1], 1, p[key][-1]]
    for key, fill in [*((k, 1) for k in _PLANAR_ONE), *((k, 0) for k in _PLANAR_ZERO)]:
        if key in p:
            lifted[key] = [fill, *p[key]]
    return replace(config, params=lifted)


@dataclass
class OpConfigFile:
    configs: list[OpConfig]
    errors: list[InputError]
    text_format: str = "lines"  # lines | toml | json
    trailing_newline: bool = True


def parse_lines(text: str, source: str = "") -> OpConfigFile:
    configs, errors = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            configs.append(parse_line(line, where=f"{source}:{number}"))
        except InputError as exc:
            errors.append(exc)
    return OpConfigFile(configs, errors, "lines", text.endswith("\n") or not text)


def format_lines(configs: Iterable[OpConfig], *, trailing_newline: bool = True) -> str:
    text = "\n".join(format_line(c) for c in configs)
    return text + ("\n" if trailing_newline and text else "")


# ---------------------------------------------------------------------------------------------
# TOML / JSON: [[op]] tables with the kernel-JSON parameter names


def from_dict(entry: Any, where: str) -> OpConfig:
    """One op config from a TOML table or JSON object (kernel-JSON parameter names), validated."""
    if not isinstance(entry, dict):
        raise InputError("each op config must be a table/object", where=where)
    entry = dict(entry)
    op_type = entry.pop("op_type", None)
    if not isinstance(op_type, str):
        raise InputError("op_type missing", where=where)
    groups = entry.pop("groups", 1)
    dtype = entry.pop("dtype", "float")
    config = OpConfig(op_type, entry, groups if isinstance(groups, int) else -1, dtype, None, where)
    validate(config) if config.groups == 1 else _validate_grouped(config)
    return config


def parse_structured(text: str, fmt: str, source: str = "") -> OpConfigFile:
    try:
        data = tomllib.loads(text) if fmt == "toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise InputError(f"malformed {fmt.upper()}: {exc}", where=source) from exc
    except RecursionError:
        raise InputError(f"malformed {fmt.upper()}: nested too deeply", where=source) from None
    entries = data.get("op", []) if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise InputError("expected a list of op configs (TOML: [[op]] tables)", where=source)
    configs, errors = [], []
    for i, entry in enumerate(entries):
        try:
            configs.append(from_dict(entry, f"{source}#{i}"))
        except InputError as exc:
            errors.append(exc)
    return OpConfigFile(configs, errors, fmt)


def format_structured(configs: Iterable[OpConfig], fmt: str) -> str:
    entries = [c.to_dict() for c in configs]
    if fmt == "json":
        return json.dumps(entries, indent=1) + "\n"
    # One [[op]] table per config, arrays inline: JSON scalars and arrays of them are valid TOML.
    return "\n".join("[[op]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in e.items()) for e in entries)


def write_opconfigs(configs: Iterable[OpConfig], path: Path) -> Path:
    """Write an op-config list in the form its extension picks (.toml, .json, else lines), whole or not at all: the
    Op configs view's export and `kdb opconfig extract -o` both write here. InputError naming the file when it
    cannot be written."""
    suffix = path.suffix.lower()
    text = format_structured(configs, suffix[1:]) if suffix in (".toml", ".json") else format_lines(configs)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # no half-written list left beside it
        raise InputError(f"cannot write: {exc.strerror or exc}", where=str(path)) from None
    return path


def read_opconfigs(path: Path) -> OpConfigFile:
    """An op-config file in any of the three forms (by extension: .toml, .json, else lines)."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"over the {MAX_FILE_BYTES:,}-byte cap", where=str(path))
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text: {exc.reason}", where=str(path)) from exc
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", where=str(path)) from exc
    suffix = path.suffix.lower()
    if suffix in (".toml", ".json"):
        return parse_structured(text, suffix[1:], str(path))
    return parse_lines(text, str(path))


_NUMBERED_SOURCE = re.compile(r"(.+)[:#](\d+)")


def source_location(source: str) -> tuple[str, int | None]:
    """The file of an op config's source and its line (line files, "ops.txt:3") or entry (TOML/JSON,
    "ops.toml#2"); a model's node ("model.onnx:conv1") or a typed-in config has no number."""
    model, onnx, _node = source.partition(".onnx:")  # node names may end in ":0"
    if onnx:
        return model + ".onnx", None
    numbered = _NUMBERED_SOURCE.fullmatch(source)
    return (numbered.group(1), int(numbered.group(2))) if numbered else (source, None)


def dedupe(configs: Iterable[OpConfig]) -> list[OpConfig]:
    """First occurrence of each distinct op config, in order."""
    seen: set[str] = set()
    out = []
    for c in configs:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out

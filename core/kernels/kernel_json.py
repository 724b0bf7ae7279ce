"""Kernel JSON (the artifact format) -> validated KernelSpec items.

A kernel JSON file holds one object or a list of objects:
    {"tvm_func_name", "op_type", "parameters", "code", "gridDim", "blockDim"}
Parameters per op type (the names NNFusion's tools use):
    conv family: input_shape, filter_shape, output_shape, window_movement_strides,
                 window_dilation_strides, padding_below_diff [, padding_above_diff]
    Dot:         arg0_shape, arg1_shape, out_shape, transpose_A, transpose_B (arg0 may have rank > 2,
                 untransposed: [d0.., K] x [K, N] = [d0.., N], as NNFusion makes it from ONNX MatMul)
    pools:       input_shape, output_shape, window_shape, window_stride, padding_below, padding_above
    element-wise: input_shape (one input) or input_shapes (several), output_shape
Every check names the field it rejects and why; the caps keep absurd input from exhausting memory.
"""

from __future__ import annotations

import json
import math
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.cuda.nvcc import MAX_THREADS_PER_BLOCK
from core.errors import InputError
from core.kernels.ops import (
    BATCH_MATMUL,
    CONCAT,
    CONV_FAMILY,
    CONV_TRANSPOSE,
    DEPTHWISE,
    ELEMENTWISE_ARITY,
    INJECTABLE_OP_TYPES,
    MATRIX_OP_TYPES,
    POOLS,
    RESIZE,
    RESIZE_SAMPLING,
    SOFTMAX,
    SUM,
    concat_axis,
    concat_in_place,
    dtype_problem,
    resize_sampling_problem,
    sum_axes,
)
from core.kernels.opsig import ConvParams, DotParams, OpSignature, PoolParams, ResizeParams, Shape

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_CODE_CHARS = 4 * 1024 * 1024
MAX_NAME_CHARS = 1024
MAX_RANK = 8
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**36  # 256 GiB of fp32: more than any GPU holds
BLOCK_LIMITS = (1024, 1024, 64)
GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """One validated kernel item, ready for CUDA parsing."""

    name: str
    op: OpSignature
    code: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    warnings: tuple[str, ...] = field(default=())

    @property
    def threads_per_block(self) -> int:
        return math.prod(self.block)

    @property
    def resource(self) -> int:
        """NNFusion's resource figure: warp-rounded threads per block times blocks in the grid."""
        return math.ceil(self.threads_per_block / 32) * 32 * math.prod(self.grid)


# ---------------------------------------------------------------------------------------------
# Reading files


def load_items(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> list[Any]:
    """The raw items of one kernel JSON file. InputError (whole file) when it cannot be read."""
    try:
        info = path.stat()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(info.st_mode):
        # Devices and FIFOs could be endless or block forever: refuse them before opening.
        raise InputError("not a regular file")
    if info.st_size > max_bytes:
        raise InputError(f"file is {info.st_size:,} bytes, over the {max_bytes:,}-byte cap")
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)  # never more than the cap, whatever stat said
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}") from exc
    if len(raw) > max_bytes:
        raise InputError(f"file is over the {max_bytes:,}-byte cap")
    return parse_items(raw)


def parse_items(raw: bytes | str) -> list[Any]:
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from exc
    else:
        text = raw
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
    except RecursionError as exc:
        raise InputError("JSON is nested too deeply") from exc
    except ValueError as exc:  # e.g. an integer literal of more than 4,300 digits
        raise InputError(f"JSON Python cannot read: {exc}") from exc
    if isinstance(data, dict):
        return [data]
    if isinstance(data, list):
        return data
    raise InputError(f"top level is a JSON {type(data).__name__}, expected an object or a list of objects")


def _reject_constant(name: str) -> Any:
    raise InputError(f"{name} is not JSON (NaN/Infinity are not allowed)")


# ---------------------------------------------------------------------------------------------
# Validation


def _fail(where: str, reason: str) -> InputError:
    return InputError(reason, where=where)


def _int(value: Any, where: str, *, minimum: int = 0, maximum: int = MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"must be an integer, got {_brief(value)}")
    if value < minimum or value > maximum:
        raise _fail(where, f"must be between {minimum} and {maximum}, got {value}")
    return value


def _check_unicode(text: str, where: str) -> None:
    """Lone surrogates (JSON "\\ud800") are not Unicode: SQLite and nlohmann::json both refuse them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        point = ord(text[exc.start])
        raise _fail(where, f"holds an invalid Unicode code point (U+{point:04X}) at line {line}") from None


def _brief(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):  # not a JSON value (a TOML date, say)
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ints(value: Any, where: str, *, length: int | None = None, minimum: int = 0) -> Shape:
    if not isinstance(value, list):
        raise _fail(where, f"must be a list of integers, got {_brief(value)}")
    if length is not None and len(value) != length:
        raise _fail(where, f"must have {length} entries, got {len(value)}")
    return tuple(_int(v, f"{where}[{i}]", minimum=minimum) for i, v in enumerate(value))


def _shape(params: dict[str, Any], key: str, *, rank: int | None = None, min_rank: int = 0) -> Shape:
    where = f"parameters.{key}"
    if key not in params:
        raise _fail(where, "missing")
    value = params[key]
    if not isinstance(value, list):
        raise _fail(where, f"must be a list of dimensions, got {_brief(value)}")
    if len(value) > MAX_RANK:
        raise _fail(where, f"rank {len(value)} is over the cap of {MAX_RANK}")
    if rank is not None and len(value) != rank:
        raise _fail(where, f"must have rank {rank}, got {len(value)}")
    if len(value) < min_rank:
        raise _fail(where, f"must have rank {min_rank} or more, got {len(value)}")
    shape = tuple(_int(v, f"{where}[{i}]", minimum=1) for i, v in enumerate(value))
    if math.prod(shape) > MAX_ELEMENTS:
        raise _fail(where, f"{math.prod(shape):,} elements is over the cap of {MAX_ELEMENTS:,}")
    return shape


def _bool(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise _fail(f"parameters.{key}", f"must be true or false, got {_brief(value)}")
    return value


def _dims(item: dict[str, Any], keys: tuple[str, str], limits: tuple[int, int, int]) -> tuple[int, int, int]:
    key = next((k for k in keys if k in item), None)
    if key is None:
        raise _fail(keys[0], "missing")
    value = item[key]
    if not isinstance(value, list) or not 1 <= len(value) <= 3:
        raise _fail(key, f"must be a list of 1 to 3 positive integers, got {_brief(value)}")
    dims = [_int(v, f"{key}[{i}]", minimum=1, maximum=limits[i]) for i, v in enumerate(value)]
    dims += [1] * (3 - len(dims))
    return (dims[0], dims[1], dims[2])


def validate_item(item: Any) -> KernelSpec:
    """Check one raw kernel JSON item; InputError names the field and the reason."""
    if not isinstance(item, dict):
        raise _fail("item", f"is a JSON {type(item).__name__}, expected an object")
    warnings: list[str] = []

    name = item.get("tvm_func_name", "")
    if not isinstance(name, str):
        raise _fail("tvm_func_name", f"must be a string, got {_brief(name)}")
    if len(name) > MAX_NAME_CHARS:
        raise _fail("tvm_func_name", f"is {len(name)} characters, over the cap of {MAX_NAME_CHARS}")

    op_type = item.get("op_type")
    if not isinstance(op_type, str) or not op_type:
        got = "missing" if op_type is None else f"must be a non-empty string, got {_brief(op_type)}"
        raise _fail("op_type", got)
    if op_type not in INJECTABLE_OP_TYPES:
        hint = (
            " (NNFusion's import script accepts it, the compiler does not)"
            if op_type.startswith("Fused_Convolution_Batchnorm")
            else ""
        )
        raise _fail("op_type", f"{op_type!r} is not an op type the compiler fetches from the kernel DB{hint}")

    dtype = item.get("dtype", "float")
    if (problem := dtype_problem(dtype)) is not None:
        raise _fail("dtype", problem)
    tensor_math = item.get("math", "")
    if tensor_math not in ("", "tf32"):
        raise _fail("math", f"{_brief(tensor_math)}: a float kernel is plain fp32 (no math) or \"tf32\"")
    if tensor_math and (dtype != "float" or op_type not in MATRIX_OP_TYPES):
        raise _fail("math", f"tf32 is a way to compute a float Dot, BatchMatMul or convolution, not a {dtype} "
                            f"{op_type}")

    code = item.get("code")
    if not isinstance(code, str) or not code.strip():
        raise _fail("code", "missing" if code is None else "must be a non-empty string of CUDA source")
    _check_unicode(name, "tvm_func_name")
    _check_unicode(code, "code")
    if len(code) > MAX_CODE_CHARS:
        raise _fail("code", f"is {len(code):,} characters, over the cap of {MAX_CODE_CHARS:,}")

    params = item.get("parameters")
    if not isinstance(params, dict):
        raise _fail("parameters", "missing" if params is None else "must be a JSON object")

    grid = _dims(item, ("gridDim", "grid_dim"), GRID_LIMITS)
    block = _dims(item, ("blockDim", "block_dim"), BLOCK_LIMITS)
    if math.prod(block) > MAX_THREADS_PER_BLOCK:
        raise _fail("blockDim", f"{math.prod(block)} threads per block, over CUDA's {MAX_THREADS_PER_BLOCK}")

    if op_type in CONV_FAMILY:
        op = _conv(op_type, params, dtype)
    elif op_type == DEPTHWISE:
        op = _depthwise(params, dtype)
    elif op_type == CONV_TRANSPOSE:
        op = _conv_transpose(params, dtype)
    elif op_type in POOLS:
        op = _pool(op_type, params, dtype)
    elif op_type == "Dot":
        op = _dot(params, dtype, warnings)
    elif op_type == BATCH_MATMUL:
        op = _batch_matmul(params, dtype)
    elif op_type == SOFTMAX:
        op = _softmax(params, dtype)
    elif op_type == SUM:
        op = _sum(params, dtype)
    elif op_type == CONCAT:
        op = _concat(params, dtype, warnings)
    elif op_type == RESIZE:
        op = _resize(params, dtype)
    else:
        op = _elementwise(op_type, params, dtype)
    if tensor_math:
        op = replace(op, math=tensor_math)
    return KernelSpec(name or "(unnamed)", op, code, grid, block, tuple(warnings))


def _conv(op_type: str, params: dict[str, Any], dtype: str) -> OpSignature:
    data = _shape(params, "input_shape", min_rank=3)
    rank = len(data)
    filt = _shape(params, "filter_shape", rank=rank)
    out = _shape(params, "output_shape", rank=rank)
    conv = _conv_params(params, rank - 2)
    if out[0] != data[0]:
        raise _fail("parameters.output_shape", f"batch {out[0]} differs from input batch {data[0]}")
    if filt[1] != data[1]:
        raise _fail("parameters.filter_shape",
                    f"{filt[1]} input channels, but input_shape has {data[1]} (NCHW, groups=1)")
    if out[1] != filt[0]:
        raise _fail("parameters.output_shape", f"{out[1]} channels, but filter_shape has {filt[0]} filters")
    _check_spatial(data, filt[2:], out, conv)
    inputs: tuple[Shape, ...] = (data, filt)
    if op_type == "Fused_Convolution_Add_Relu":
        inputs = (data, filt, out)
    return OpSignature(op_type, inputs, (out,), conv, dtype)


def _depthwise(params: dict[str, Any], dtype: str) -> OpSignature:
    """NNFusion's DepthwiseConv2dNative of an ONNX Conv with group = channels (ops.DEPTHWISE): NCHW input, the
    filter as its importer transposes it, [kh, kw, C, 1] (frontend/onnx_import/op/conv.cpp), and padding symmetric
    (its infershape pads both sides by padding_before)."""
    data = _shape(params, "input_shape", rank=4)
    filt = _shape(params, "filter_shape", rank=4)
    out = _shape(params, "output_shape", rank=4)
    conv = _conv_params(params, 2)
    if out[:2] != data[:2]:
        raise _fail("parameters.output_shape", f"{list(out[:2])} (batch, channels) differs from input_shape's "
                    f"{list(data[:2])}: a depthwise convolution keeps both")
    if filt[2:] != (data[1], 1):
        raise _fail("parameters.filter_shape", f"{list(filt)} is not [kh, kw, {data[1]}, 1]: NNFusion's depthwise "
                    "filter has the input's channels third and a depth multiplier of 1")
    if conv.pad_above is not None and conv.pad_above != conv.pad_below:
        raise _fail("parameters.padding_above_diff", "differs from padding_below_diff: NNFusion's depthwise "
                    "convolution pads both sides alike (its importer pads the input with a Pad node first)")
    _check_spatial(data, filt[:2], out, conv)
    return OpSignature(DEPTHWISE, (data, filt), (out,), conv, dtype)


def _conv_params(params: dict[str, Any], spatial: int) -> ConvParams:
    strides = _ints(params.get("window_movement_strides"), "parameters.window_movement_strides",
                    length=spatial, minimum=1)
    dilations = _ints(params.get("window_dilation_strides"), "parameters.window_dilation_strides",
                      length=spatial, minimum=1)
    pad_below = _ints(params.get("padding_below_diff"), "parameters.padding_below_diff", length=spatial)
    pad_above = None
    if "padding_above_diff" in params:
        pad_above = _ints(params["padding_above_diff"], "parameters.padding_above_diff", length=spatial)
    return ConvParams(strides, dilations, pad_below, pad_above)


def _check_spatial(data: Shape, kernel: Shape, out: Shape, conv: ConvParams) -> None:
    """That each output side follows from the input's, the window's, the stride and the padding."""
    strides, dilations, pad_below, pad_above = conv.strides, conv.dilations, conv.pad_below, conv.pad_above
    for i in range(len(kernel)):
        window = dilations[i] * (kernel[i] - 1) + 1
        # Without padding_above_diff the padding is symmetric, or one more above (TF "SAME").
        candidates = [pad_above[i]] if pad_above else [pad_below[i], pad_below[i] + 1]
        possible = [(data[2 + i] + pad_below[i] + pa - window) // strides[i] + 1 if data[2 + i] + pad_below[i] + pa
                    >= window else None for pa in candidates]
        if out[2 + i] not in possible:
            expected = possible[0] if possible[0] is not None else "none: the window is larger than the padded input"
            hint = "" if pad_above else "; for asymmetric padding give padding_above_diff"
            raise _fail(f"parameters.output_shape[{2 + i}]",
                        f"{out[2 + i]} does not follow from input {data[2 + i]}, window {window}, "
                        f"stride {strides[i]}, padding {pad_below[i]} (expected {expected}{hint})")


def _pool(op_type: str, params: dict[str, Any], dtype: str) -> OpSignature:
    data = _shape(params, "input_shape", min_rank=3)
    rank = len(data)
    out = _shape(params, "output_shape", rank=rank)
    spatial = rank - 2
    window = _ints(params.get("window_shape"), "parameters.window_shape", length=spatial, minimum=1)
    strides = _ints(params.get("window_stride"), "parameters.window_stride", length=spatial, minimum=1)
    pad_below = _ints(params.get("padding_below"), "parameters.padding_below", length=spatial)
    if "padding_above" not in params:
        raise _fail("parameters.padding_above",
                    "missing: the compiler's pool identifier includes the pad-above part")
    pad_above = _ints(params["padding_above"], "parameters.padding_above", length=spatial)
    if out[:2] != data[:2]:
        raise _fail("parameters.output_shape", f"N,C {list(out[:2])} differ from input's {list(data[:2])}")
    for i in range(spatial):
        padded = data[2 + i] + pad_below[i] + pad_above[i]
        expected = (padded - window[i]) // strides[i] + 1 if padded >= window[i] else None
        if out[2 + i] != expected:
            raise _fail(f"parameters.output_shape[{2 + i}]",
                        f"{out[2 + i]} does not follow from input {data[2 + i]}, window {window[i]}, "
                        f"stride {strides[i]}, padding {pad_below[i]}+{pad_above[i]} (expected {expected})")
    return OpSignature(op_type, (data,), (out,), PoolParams(window, strides, pad_below, pad_above), dtype)


def _dot(params: dict[str, Any], dtype: str, warnings: list[str]) -> OpSignature:
    # NNFusion's ONNX importer makes a Dot of a MatMul whose left operand has rank >= 2 and right rank 2 (a
    # BERT dense layer: [1,128,768] x [768,768]); a 1-D operand or a right one of rank > 2 becomes BatchMatMul.
    a = _shape(params, "arg0_shape")
    if len(a) < 2:
        raise _fail("parameters.arg0_shape", f"must have rank 2 or more, got {len(a)} (NNFusion makes a MatMul "
                    "with a 1-D left operand a BatchMatMul, which the kernel DB cannot hold)")
    b = _shape(params, "arg1_shape")
    if len(b) != 2:
        raise _fail("parameters.arg1_shape", f"must have rank 2, got {len(b)} (NNFusion makes a MatMul whose "
                    "right operand is not 2-D a BatchMatMul, which the kernel DB cannot hold)")
    out = _shape(params, "out_shape", rank=len(a))
    ta, tb = _bool(params, "transpose_A"), _bool(params, "transpose_B")
    if len(a) > 2:
        return _batched_rows_dot(a, b, out, ta, tb, dtype)
    m, n = out
    # The stored layouts the compiler sees: A is [M,K] ([K,M] when transposed), B is [K,N] ([N,K]).
    # Some tools declare the logical (already transposed) shape instead; accept it and say so.
    a_k = a[0] if ta else a[1]
    if (a[1] if ta else a[0]) != m:
        if ta and a[0] == m:
            a, a_k = (a[1], a[0]), a[1]
            warnings.append(f"arg0_shape {list((a[1], a[0]))} is the logical shape; stored as {list(a)} "
                            "for transpose_A")
        else:
            raise _fail("parameters.arg0_shape", f"{list(a)} does not give M={m} of out_shape {list(out)}")
    b_k, b_n = (b[1], b[0]) if tb else (b[0], b[1])
    if (b_k, b_n) != (a_k, n):
        logical = (b[0], b[1]) if tb else (b[1], b[0])
        if tb and logical == (a_k, n):
            b = (n, a_k)
            warnings.append(f"arg1_shape {list(logical)} is the logical [K, N] shape; stored as {list(b)} "
                            "for transpose_B")
        else:
            raise _fail("parameters.arg1_shape",
                        f"{list(b)} does not match K={a_k}, N={n} (transpose_B={str(tb).lower()})")
    return OpSignature("Dot", (a, b), (out,), DotParams(ta, tb), dtype)


def _batch_matmul(params: dict[str, Any], dtype: str) -> OpSignature:
    """NNFusion's BatchMatMul of an ONNX MatMul (op/matmul.cpp): both operands broadcast to one batch shape,
    [batch.., M, K] x [batch.., K, N] = [batch.., M, N], never transposed (the identifier carries no flag)."""
    a = _shape(params, "arg0_shape", min_rank=2)  # rank 2: a 1-D operand's product, no batch axis
    b = _shape(params, "arg1_shape", rank=len(a))
    out = _shape(params, "out_shape", rank=len(a))
    for key in ("transpose_A", "transpose_B", "adj_x", "adj_y"):
        if params.get(key):
            raise _fail(f"parameters.{key}", "must be false: an ONNX MatMul's BatchMatMul never transposes, and its "
                        "identifier could not say so")
    if a[:-2] != b[:-2]:
        raise _fail("parameters.arg1_shape", f"batch axes {list(b[:-2])} differ from arg0_shape's {list(a[:-2])} "
                    "(NNFusion broadcasts both to one batch shape first)")
    if b[-2] != a[-1]:
        raise _fail("parameters.arg1_shape", f"{list(b)} does not match K={a[-1]} of arg0_shape {list(a)}")
    want = (*a[:-1], b[-1])
    if out != want:
        raise _fail("parameters.out_shape", f"{list(out)} does not follow from {list(a)} x {list(b)} "
                    f"(expected {list(want)})")
    return OpSignature(BATCH_MATMUL, (a, b), (out,), None, dtype)


def _softmax(params: dict[str, Any], dtype: str) -> OpSignature:
    """NNFusion's Softmax over the last axis (ops.SOFTMAX): one input, an output of its shape."""
    data = _shape(params, "input_shape")
    out = _shape(params, "output_shape", rank=len(data))
    if out != data:
        raise _fail("parameters.output_shape", f"{list(out)} differs from input_shape {list(data)} (a softmax keeps "
                    "its input's shape)")
    for key in ("axis", "axes"):
        if key in params:
            raise _fail(f"parameters.{key}", "a kdb Softmax is over the last axis, and NNFusion's identifier cannot "
                        "say another: leave it out")
    return OpSignature(SOFTMAX, (data,), (out,), None, dtype)


def _sum(params: dict[str, Any], dtype: str) -> OpSignature:
    """NNFusion's Sum: the reduced axes dropped from the input's shape. Its identifier is the two shapes alone, so the
    shapes must tell which axes are reduced (ops.sum_axes): [1, 64, 256] -> [1, 64] can only be the last axis."""
    data = _shape(params, "input_shape")
    out = _shape(params, "output_shape", min_rank=1)
    ways = sum_axes(data, out)
    if not ways:
        raise _fail("parameters.output_shape", f"{list(out)} is not {list(data)} with some axes reduced (a Sum drops "
                    "the axes it reduces)")
    if len(ways) > 1:
        raise _fail("parameters.output_shape", f"{list(data)} -> {list(out)} reduces axes "
                    f"{' or '.join(str(list(w)) for w in ways)}: NNFusion's identifier (the shapes alone) cannot tell "
                    "them apart, so no row can serve one of them safely")
    return OpSignature(SUM, (data,), (out,), None, dtype)


MAX_CONCAT_INPUTS = 128  # a kernel's parameters: 8 bytes a pointer, well inside CUDA's 4 KB of them


def _concat(params: dict[str, Any], dtype: str, warnings: list[str]) -> OpSignature:
    """NNFusion's Concat: its identifier is the shapes alone, so they must tell the joined axis (ops.concat_axis)."""
    raw = params.get("input_shapes")
    if not isinstance(raw, list) or not raw:
        raise _fail("parameters.input_shapes", "missing: a Concat's inputs, one shape each")
    if len(raw) > MAX_CONCAT_INPUTS:
        raise _fail("parameters.input_shapes", f"{len(raw)} inputs, over kdb's cap of {MAX_CONCAT_INPUTS} for one "
                    "kernel's parameters")
    inputs = tuple(_shape({"input_shapes": s}, "input_shapes", min_rank=1) for s in raw)
    out = _shape(params, "output_shape", min_rank=1)
    axis = concat_axis(inputs, out)
    if axis is None:
        raise _fail("parameters.output_shape", f"{list(out)} is no concatenation of {[list(s) for s in inputs]} (the "
                    "inputs agree with it on every axis but one, and add up to it on that one)")
    if concat_in_place(inputs, axis):
        warnings.append(f"every axis before axis {axis} has size 1: NNFusion writes these inputs in place into the "
                        "output and runs no kernel, and a row makes it copy them (kernels/cuda_gpu/kernels/concat.cpp)")
    return OpSignature(CONCAT, inputs, (out,), None, dtype)


def _conv_transpose(params: dict[str, Any], dtype: str) -> OpSignature:
    """An ONNX ConvTranspose as NNFusion imports it (op/conv_trans.cpp: group 1; generic_op_define/ConvTranspose.cpp:
    a square kernel): the filter [Cin, Cout, kh, kw] as ONNX lays it out, padding symmetric, no dilation (kdb's
    kernel has none), each output side (in - 1) * stride + k - 2 * pad."""
    data = _shape(params, "input_shape", rank=4)
    filt = _shape(params, "filter_shape", rank=4)
    out = _shape(params, "output_shape", rank=4)
    conv = _conv_params(params, 2)
    strides, dilations, pads = conv.strides, conv.dilations, conv.pad_below
    if filt[0] != data[1]:
        raise _fail("parameters.filter_shape", f"{list(filt)} takes {filt[0]} input channels, the input has {data[1]}")
    if filt[2] != filt[3]:
        raise _fail("parameters.filter_shape", f"a {filt[2]}x{filt[3]} kernel: NNFusion's ConvTranspose takes square "
                    "kernels only (generic_op_define/ConvTranspose.cpp)")
    if dilations != (1, 1):
        raise _fail("parameters.window_dilation_strides", f"{list(dilations)}: kdb's ConvTranspose kernels dilate not")
    want = (data[0], filt[1], *((i - 1) * s + filt[2] - 2 * p for i, s, p in zip(data[2:], strides, pads, strict=True)))
    if out != want:
        raise _fail("parameters.output_shape", f"{list(out)}, expected {list(want)}")
    return OpSignature(CONV_TRANSPOSE, (data, filt), (out,), ConvParams(strides, dilations, pads), dtype)


def _resize(params: dict[str, Any], dtype: str) -> OpSignature:
    """An ONNX Resize as NNFusion imports it: its input and the scales ([4], a constant) it is given, an NCHW output of
    the same batch and channels; how it samples (mode, coordinate_transformation_mode, nearest_mode) as the model says,
    which the identifier does not."""
    data = _shape(params, "input_shape", rank=4)
    out = _shape(params, "output_shape", rank=4)
    if out[:2] != data[:2]:
        raise _fail("parameters.output_shape", f"{list(out)} resizes the batch or the channels of {list(data)}: kdb "
                    "generates Resizes of the spatial axes")
    if key := resize_sampling_problem(params):
        raise _fail(f"parameters.{key}", f"{_brief(params.get(key))}: one of {', '.join(RESIZE_SAMPLING[key])}")
    sampling = ResizeParams(*(params[k] for k in ResizeParams.__slots__))
    return OpSignature(RESIZE, (data, (4,)), (out,), sampling, dtype)


def _batched_rows_dot(a: Shape, b: Shape, out: Shape, ta: bool, tb: bool, dtype: str) -> OpSignature:
    """A Dot whose left operand has rank > 2: [d0.., K] x [K, N] = [d0.., N], the leading axes rows of one GEMM."""
    if ta or tb:
        key = "transpose_A" if ta else "transpose_B"
        raise _fail(f"parameters.{key}", f"must be false for a left operand of rank {len(a)}: NNFusion makes such a "
                    "Dot only from MatMul, which never transposes (its Dot shape inference gets transposes of "
                    "rank > 2 wrong, and ONNX's Gemm takes 2-D operands)")
    if b[0] != a[-1]:
        raise _fail("parameters.arg1_shape", f"{list(b)} does not match K={a[-1]} of arg0_shape {list(a)}")
    want = (*a[:-1], b[1])
    if out != want:
        raise _fail("parameters.out_shape", f"{list(out)} does not follow from {list(a)} x {list(b)} "
                    f"(expected {list(want)})")
    return OpSignature("Dot", (a, b), (out,), DotParams(False, False), dtype)


def _elementwise(op_type: str, params: dict[str, Any], dtype: str) -> OpSignature:
    arity = ELEMENTWISE_ARITY[op_type]
    out = _shape(params, "output_shape")
    if "input_shapes" in params:
        raw = params["input_shapes"]
        if not isinstance(raw, list) or len(raw) != arity:
            raise _fail("parameters.input_shapes", f"{op_type} takes {arity} input(s)")
        inputs = tuple(_shape({"input_shapes": s}, "input_shapes") for s in raw)
    elif arity == 1:
        inputs = (_shape(params, "input_shape"),)
    else:
        raise _fail("parameters.input_shapes", f"missing: {op_type} takes {arity} inputs")
    for i, s in enumerate(inputs):
        if s != out:
            raise _fail("parameters.output_shape",
                        f"{list(out)} differs from input {i} {list(s)} (element-wise ops do not broadcast)")
    return OpSignature(op_type, inputs, (out,), None, dtype)


def iter_json_files(paths: list[Path]) -> Iterator[Path]:
    """Files named directly, and *.json under directories (sorted; symlinked dirs not followed)."""
    for path in paths:
        if path.is_dir():
            for sub in sorted(path.rglob("*.json")):
                if sub.is_file():
                    yield sub
        else:
            yield path

"""A hostile corpus of kernel JSON files, written by code, with what `kdb inject` must make of each.

`write_corpus(dir)` writes every case under `dir` and returns, per file (path relative to `dir`), its
Expectation: either one whole-file outcome (index None) or one outcome per item. An outcome's stage
is where the file or item must fail, or "ok" (injected, or unchanged when it is already in the DB);
a failure's reason must contain one of `mentions` (case-insensitive), the thing that makes it
actionable: for a field problem the field's name, else the cap or the construct at fault.

Every "ok" item is distinct from the others (its own shapes, so its own Key), except where a case
repeats one on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OK = "ok"
MAX_FILE_BYTES = 64 * 1024 * 1024  # the documented size cap of one kernel JSON file

TRAVERSAL_NAME = "../../../../tmp/kdb_evil_x"
METACHAR_NAME = "$(touch /tmp/kdb_pwned_x); rm -rf ~ `id` | tee"
UNICODE_NAME = "kdb\tnul\u0000line\nname \u540d\u524d \u202eevil\U0001f600"
EVIL_NAMES = (TRAVERSAL_NAME, METACHAR_NAME, UNICODE_NAME)


@dataclass(frozen=True)
class Outcome:
    index: int | None  # None: the whole file
    stage: str  # OK or the stage it must fail at
    mentions: tuple[str, ...] = ()  # the reason names at least one of these


@dataclass(frozen=True)
class Expectation:
    outcomes: tuple[Outcome, ...]  # () : the file holds no items and must not fail

    @property
    def file_stage(self) -> str | None:
        """The stage the whole file fails at; None for a file of items."""
        whole = [o.stage for o in self.outcomes if o.index is None]
        return whole[0] if whole else None

    @property
    def items(self) -> list[tuple[int, str]]:
        """(index, stage or "ok") per item."""
        return [(o.index, o.stage) for o in self.outcomes if o.index is not None]

    @property
    def ok_items(self) -> int:
        return sum(o.stage == OK for o in self.outcomes)


Writer = Callable[[Path], None]
Cases = dict[str, tuple[Writer, Expectation]]
_CASES: Cases = {}
_SURROGATE_CASES: Cases = {}


def write_corpus(dir: Path) -> dict[str, Expectation]:
    """Write every case under `dir`; return {relative file name: Expectation}."""
    return _write(dir, _CASES)


def expectations() -> dict[str, Expectation]:
    """The same table without writing anything (for test parametrization)."""
    return {name: expectation for name, (_, expectation) in _CASES.items()}


def write_surrogate_corpus(dir: Path) -> dict[str, Expectation]:
    """Lone UTF-16 surrogates in items (`"\\ud800"`: valid JSON, not encodable as UTF-8) and a file
    name that is not UTF-8: kept out of write_corpus because today they take the whole batch down."""
    return _write(dir, _SURROGATE_CASES)


def _write(dir: Path, cases: Cases) -> dict[str, Expectation]:
    for name, (write, _) in cases.items():
        path = dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    return {name: expectation for name, (_, expectation) in cases.items()}


# ---------------------------------------------------------------------------------------------
# Valid items to start from. Kernel bodies need not compute the right thing: no GPU runs them.

_DOT_CODE = """extern "C" __global__ void hostile_dot_k{k}_n{n}({params})
{{
    int warp_id = threadIdx.x >> 5;
    int lane_id = threadIdx.x & 31;
    int col_id = blockIdx.x * blockDim.x / 4 + lane_id;
    if (col_id < {n})
    {{
        float val = 0;
        for (int i = warp_id * {kw}; i < (warp_id + 1) * {kw}; i++)
        {{
            val = fma(input0[i], input1[i * {n} + col_id], val);
        }}
        __syncthreads();
        atomicAdd(output0 + col_id, val);
    }}
}}
"""
_DOT_PARAMS = "float* input0, float* input1, float* output0"


def dot(n: int, *, k: int = 256, name: str | None = None, params: str = _DOT_PARAMS,
        code: str | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid Dot [1,k] x [k,n] item (the artifact's manual kernel, resized)."""
    item = {
        "tvm_func_name": name if name is not None else f"hostile_dot_m1_k{k}_n{n}_kernel0",
        "op_type": "Dot",
        "parameters": {"arg0_shape": [1, k], "arg1_shape": [k, n], "out_shape": [1, n],
                       "transpose_A": False, "transpose_B": False},
        "code": code if code is not None else _DOT_CODE.format(k=k, n=n, kw=k // 4, params=params),
        "gridDim": [n // 32, 1, 1],
        "blockDim": [128, 1, 1],
    }
    item.update(overrides)
    return item


def relu(size: int, *, shape: Any = None, name: str | None = None, code: str | None = None,
         **overrides: Any) -> dict[str, Any]:
    """A valid element-wise Relu over [1, size]; `shape` replaces both shapes (absurd-shape cases)."""
    shape = [1, size] if shape is None else shape
    item = {
        "tvm_func_name": name if name is not None else f"hostile_relu_{size}_kernel0",
        "op_type": "Relu",
        "parameters": {"input_shape": shape, "output_shape": shape},
        "code": code if code is not None else (
            f'extern "C" __global__ void hostile_relu_{size}(float* input0, float* output0)\n'
            "{\n"
            "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"    if (i < {size}) output0[i] = input0[i] > 0.0f ? input0[i] : 0.0f;\n"
            "}\n"),
        "gridDim": [max(1, size // 64), 1, 1],
        "blockDim": [64, 1, 1],
    }
    item.update(overrides)
    return item


def conv(channels: int, *, size: int = 27, kernel: int = 5, pad: int = 2, stride: int = 1,
         out_size: int | None = None, fused_add: bool = False, **overrides: Any) -> dict[str, Any]:
    """A valid NCHW Convolution (or Fused_Convolution_Add_Relu, with its 4 parameters)."""
    expected = (size + 2 * pad - (kernel - 1) - 1) // stride + 1
    out = expected if out_size is None else out_size
    op = "Fused_Convolution_Add_Relu" if fused_add else "Convolution"
    params = ("float* __restrict__ input0, float* __restrict__ input1, float* __restrict__ compute, "
              "float* __restrict__ input2" if fused_add else "float* input0, float* input1, float* output0")
    result = "compute" if fused_add else "output0"
    bias = " + input2[threadIdx.x]" if fused_add else ""
    item = {
        "tvm_func_name": f"hostile_{op.lower()}_c{channels}_s{size}_o{out}_kernel0",
        "op_type": op,
        "parameters": {"input_shape": [1, channels, size, size],
                       "filter_shape": [8, channels, kernel, kernel], "output_shape": [1, 8, out, out],
                       "window_movement_strides": [stride, stride],
                       "window_dilation_strides": [1, 1], "padding_below_diff": [pad, pad]},
        "code": (f'extern "C" __global__ void hostile_conv_c{channels}({params})\n'
                 "{\n"
                 "    __shared__ float tile[64];\n"
                 "    tile[threadIdx.x] = input0[threadIdx.x] * input1[threadIdx.x];\n"
                 "    __syncthreads();\n"
                 f"    {result}[threadIdx.x] = tile[63 - threadIdx.x]{bias};\n"
                 "}\n"),
        "gridDim": [8, 1, 1],
        "blockDim": [64, 1, 1],
    }
    item.update(overrides)
    return item


def avg_pool(channels: int, *, out_size: int | None = None) -> dict[str, Any]:
    """A valid 3x3/2 AvgPool over [1, channels, 27, 27], padding 0+0: output 13x13."""
    out = 13 if out_size is None else out_size
    return {
        "tvm_func_name": f"hostile_avgpool_c{channels}_o{out}_kernel0",
        "op_type": "AvgPool",
        "parameters": {"input_shape": [1, channels, 27, 27], "output_shape": [1, channels, out, out],
                       "window_shape": [3, 3], "window_stride": [2, 2], "padding_below": [0, 0],
                       "padding_above": [0, 0]},
        "code": (f'extern "C" __global__ void hostile_avgpool_c{channels}(float* input0, float* output0)\n'
                 "{\n"
                 "    output0[threadIdx.x] = input0[2 * threadIdx.x] / 9.0f;\n"
                 "}\n"),
        "gridDim": [channels, 1, 1],
        "blockDim": [169, 1, 1],
    }


def without(item: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != key}


def with_params(item: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {**item, "parameters": {**item["parameters"], **params}}


# ---------------------------------------------------------------------------------------------
# Registering cases


def _text(content: str | bytes) -> Writer:
    data = content.encode("utf-8") if isinstance(content, str) else content
    return lambda path: path.write_bytes(data)


def whole_file(name: str, content: str | bytes | Writer, stage: str, *mentions: str) -> None:
    write = content if callable(content) else _text(content)
    _CASES[name] = (write, Expectation((Outcome(None, stage, mentions),)))


def items(name: str, *cases: tuple[Any, str, tuple[str, ...]], single: bool = False,
          into: Cases = _CASES) -> None:
    """A file of items, each with its outcome; `single` writes one object rather than a list.

    Non-ASCII text is written as UTF-8, except lone surrogates, which only a \\u escape can carry.
    """
    raw = [c[0] for c in cases]
    try:
        text = json.dumps(raw[0] if single else raw, indent=1, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(raw[0] if single else raw, indent=1, ensure_ascii=True)
    outcomes = tuple(Outcome(i, stage, mentions) for i, (_, stage, mentions) in enumerate(cases))
    into[name] = (_text(text), Expectation(outcomes))


def ok(item: Any) -> tuple[Any, str, tuple[str, ...]]:
    return (item, OK, ())


def bad(item: Any, stage: str, *mentions: str) -> tuple[Any, str, tuple[str, ...]]:
    return (item, stage, mentions)


def _sparse_over_cap(path: Path) -> None:
    """A file one byte over the cap, costing no disk: it must be refused by its size, unread."""
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)


# ---------------------------------------------------------------------------------------------
# Whole files that cannot be read

_GOOD_TEXT = json.dumps([dot(64)])
whole_file("read/truncated.json", _GOOD_TEXT[: len(_GOOD_TEXT) // 2], "read", "JSON")
whole_file("read/top_level_string.json", '"extern \\"C\\" __global__ void k() {}"', "read", "object")
whole_file("read/top_level_number.json", "42", "read", "object")
whole_file("read/top_level_null.json", "null", "read", "object")
whole_file("read/empty.json", "", "read", "empty", "JSON")
whole_file("read/whitespace_only.json", " \n\t\n", "read", "empty", "JSON")
whole_file("read/not_utf8.json", b'{"tvm_func_name": "caf\xe9 \xff\xfe", "op_type": "Dot"}', "read", "UTF-8")
whole_file("read/utf16_bom.json", '[{"op_type": "Dot"}]'.encode("utf-16"), "read", "UTF-8", "BOM")
whole_file("read/nan_in_field.json", json.dumps(dot(96, gridDim=[float("nan"), 1, 1])), "read", "NaN")
whole_file("read/infinity_in_shape.json",
           json.dumps(with_params(dot(96), out_shape=[1, float("inf")])), "read", "Infinity")
whole_file("read/deeply_nested.json", "[" * 100_000 + "]" * 100_000, "read", "nest", "deep", "depth")
whole_file("read/deeply_nested_unclosed.json", "[" * 100_000, "read", "nest", "deep", "depth", "JSON")
whole_file("read/deeply_nested_in_item.json",
           '{"op_type": "Dot", "parameters": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}",
           "read", "nest", "deep", "depth")
whole_file("read/over_the_size_cap.json", _sparse_over_cap, "read",
           "cap", "64 MiB", "67,108,864", "67108864", "too big", "too large")

# ---------------------------------------------------------------------------------------------
# Items with field problems

items("validate/missing_fields.json",
      bad(without(dot(128), "op_type"), "validate", "op_type"),
      bad(without(dot(160), "code"), "validate", "code"),
      bad(without(dot(192), "parameters"), "validate", "parameters"),
      bad(without(dot(224), "gridDim"), "validate", "gridDim"),
      bad(without(dot(256), "blockDim"), "validate", "blockDim"),
      bad(dot(288) | {"parameters": without(dot(288)["parameters"], "arg0_shape")}, "validate", "arg0_shape"))

items("validate/op_type.json",
      bad(conv(3) | {"op_type": "Fused_Convolution_Batchnorm"}, "validate", "op_type", "op type"),
      bad(dot(320) | {"op_type": "LayerNorm"}, "validate", "op_type", "op type"),
      bad(dot(352) | {"op_type": 7}, "validate", "op_type"),
      bad(dot(384) | {"op_type": ["Dot"]}, "validate", "op_type"),
      bad(dot(416) | {"op_type": ""}, "validate", "op_type"),
      bad(dot(448) | {"op_type": "dot"}, "validate", "op_type", "op type"))

items("validate/name_and_code_types.json",
      bad(dot(480) | {"tvm_func_name": 5}, "validate", "tvm_func_name"),
      bad(dot(512) | {"tvm_func_name": "n" * 5000}, "validate", "tvm_func_name"),
      bad(dot(544) | {"code": 12}, "validate", "code", "CUDA source"),
      bad(dot(576) | {"code": "   \n  "}, "validate", "code", "CUDA source"),
      bad(dot(608) | {"dtype": "int8"}, "validate", "dtype"),
      bad(dot(640) | {"parameters": [1, 256]}, "validate", "parameters"),
      bad(with_params(dot(672), transpose_A="no"), "validate", "transpose_A"))

items("validate/code_over_cap.json",
      bad(dot(704, code="//" + "x" * (4 * 1024 * 1024) + "\n" + dot(704)["code"]), "validate",
          "code"))

items("validate/absurd_shapes.json",
      bad(relu(1, shape=[2**40, 1]), "validate", "input_shape", "output_shape"),
      bad(relu(2, shape=[2**31 - 1] * 4), "validate", "input_shape", "output_shape"),
      bad(relu(3, shape=[-1, 256]), "validate", "input_shape", "output_shape"),
      bad(relu(4, shape=[0, 256]), "validate", "input_shape", "output_shape"),
      bad(relu(5, shape=[1] * 20), "validate", "input_shape", "output_shape"),
      bad(relu(6, shape="[1, 256]"), "validate", "input_shape", "output_shape"),
      bad(relu(7, shape=["1", "256"]), "validate", "input_shape", "output_shape"),
      bad(relu(8, shape=[True, 256]), "validate", "input_shape", "output_shape"),
      bad(relu(9, shape=[1.0, 256]), "validate", "input_shape", "output_shape"),
      bad(relu(10, shape=[2**64, 1]), "validate", "input_shape", "output_shape"),
      bad(with_params(dot(736), arg0_shape=[1, 2**40], arg1_shape=[2**40, 736]), "validate", "arg0_shape"),
      bad(with_params(dot(768), out_shape=[1, 768, 1]), "validate", "out_shape"))

items("validate/launch_dims.json",
      bad(relu(64, blockDim=[2048, 1, 1]), "validate", "blockDim"),
      bad(relu(65, blockDim=[32, 32, 2]), "validate", "blockDim", "threads per block"),
      bad(relu(66, blockDim=[0, 1, 1]), "validate", "blockDim"),
      bad(relu(67, blockDim=[-64, 1, 1]), "validate", "blockDim"),
      bad(relu(68, gridDim=[1, 70000, 1]), "validate", "gridDim"),
      bad(relu(69, gridDim=[1, 1, 1, 1]), "validate", "gridDim"),
      bad(relu(70, gridDim=[]), "validate", "gridDim"),
      bad(relu(71, gridDim=[1.5, 1, 1]), "validate", "gridDim"),
      bad(relu(72, gridDim=["1", "1", "1"]), "validate", "gridDim"),
      bad(relu(73, blockDim="64"), "validate", "blockDim"),
      bad(relu(74, gridDim=[2**40, 1, 1]), "validate", "gridDim"))

items("validate/op_arithmetic.json",
      ok(conv(3)),
      # The reason must give the right expected size: (27 + 2*2 - 4 - 1) // 1 + 1 = 27.
      bad(conv(4, out_size=55), "validate", "expected 27"),
      ok(conv(5, fused_add=True)),
      bad(conv(6, fused_add=True, out_size=26), "validate", "output_shape"),  # 27 by the formula
      bad(conv(7, size=4, kernel=11, pad=0, out_size=1), "validate", "output_shape"),  # 11x11 window > 4x4
      ok(avg_pool(16)),
      bad(avg_pool(17, out_size=14), "validate", "output_shape"),
      bad(with_params(conv(8), filter_shape=[8, 9, 5, 5]), "validate", "filter_shape"),
      bad(with_params(dot(800), arg1_shape=[128, 800]), "validate", "arg1_shape"))

# ---------------------------------------------------------------------------------------------
# CUDA source problems

_SIG = 'extern "C" __global__ void hostile_k(float* input0, float* input1, float* output0)'
_BODY = "{\n    output0[threadIdx.x] = input0[threadIdx.x] + input1[threadIdx.x];\n}\n"

items("parse/cuda_source.json",
      bad(dot(832, code=_SIG + "\n{\n    if (threadIdx.x < 4) {\n        output0[0] = 1.0f;\n}\n"),
          "parse", "brace"),
      bad(dot(864, code=_SIG + "\n{\n    output0[0] = 1.0f;\n}\n}\n"), "parse", "brace", "outside", "}"),
      bad(dot(896, code=_SIG.replace('__global__ ', "") + "\n" + _BODY), "parse", "__global__"),
      bad(dot(928, code=_SIG + "\n" + _BODY + _SIG.replace("hostile_k", "hostile_k2") + "\n" + _BODY),
          "parse", "__global__"),
      bad(dot(960, code="__device__ float helper(float x) { return x * 2.0f; }\n" + _SIG + "\n" + _BODY),
          "parse", "outside", "helper", "__device__"),
      bad(dot(992, code=_SIG + "\n" + _SIG + "\n" + _BODY), "parse", "__global__"),
      bad(dot(1024, code=_SIG + ";\n" + _SIG + "\n" + _BODY), "parse", "__global__"),
      bad(dot(1056, code=_SIG[: _SIG.index("input1") + 3]), "parse", "parenthes", "parameter"),
      bad(dot(1088, code=_SIG[: _SIG.index("input1") + 3] + "\n" + _BODY), "parse", "parenthes", "parameter"),
      bad(dot(1120, code=_SIG), "parse", "body"),
      bad(dot(1152, params="float* input0, float* output0"), "parse", "parameters"),
      bad(dot(1184, params="float* input0, float* input1, float* input2, float* output0"),
          "parse", "parameters"),
      bad(dot(1216, params="float* input0, double* input1, float* output0"), "parse", "double"),
      bad(dot(1248, params="float* input0, float input1, float* output0"), "parse", "input1"),
      bad(dot(1280, code=_SIG + "\n{\n    extern __shared__ float dyn[];\n    dyn[threadIdx.x] = input0[0];\n"
              "    output0[threadIdx.x] = dyn[0];\n}\n"), "parse", "extern __shared__", "dynamic"),
      bad(dot(1312, code=_SIG + "\n{\n    __shared__ float buf[blockDim.x];\n    output0[0] = buf[0];\n}\n"),
          "parse", "buf", "constant"),
      bad(dot(1344, code="template <int N>\n" + _SIG + "\n" + _BODY), "parse", "template"),
      bad(dot(1376, code="/* an unterminated comment " + _SIG + "\n" + _BODY),
          "parse", "__global__", "comment"))

items("barriers/while_loop.json",
      bad(dot(1408, code=_SIG + "\n{\n    int i = 0;\n    while (i < 4)\n    {\n        __syncthreads();\n"
              "        i++;\n    }\n    output0[threadIdx.x] = input0[i];\n}\n"), "barriers", "while"),
      bad(dot(1440, code=_SIG + "\n{\n    if (input0[0] > 0.0f)\n    {\n        __syncthreads();\n    }\n"
              "    output0[threadIdx.x] = input1[0];\n}\n"), "barriers", "input0"))

# ---------------------------------------------------------------------------------------------
# Names are data: never file names, never shell

_TRICKY_CODE = (
    '// __global__ void fake(float* a) { "unbalanced {{{ in a comment"\n'
    "/* __global__ void also_fake() { */\n"
    + _SIG + "\n{\n"
    '    const char* s = "__global__ } {{ \\" __syncthreads();";\n'
    "    output0[threadIdx.x] = input0[threadIdx.x] + input1[s[0]];\n}\n"
)
items("names/evil_names.json",
      ok(dot(1504, name=TRAVERSAL_NAME)),
      ok(dot(1536, name=METACHAR_NAME)),
      ok(dot(1568, name=UNICODE_NAME)),
      ok(dot(1600, name="hostile_tricky_comments", code=_TRICKY_CODE)))
items("names/names $(touch kdb_pwned_file) `id`; rm -rf ~.json", ok(relu(75, name="x; rm -rf /")),
      single=True)

# ---------------------------------------------------------------------------------------------
# Good and bad items alternating in one file: every good one must land

items("mix.json",
      ok(dot(1632)),
      bad(without(dot(1664), "gridDim"), "validate", "gridDim"),
      ok(relu(76)),
      bad(dot(1696, code=_SIG + "\n{\n"), "parse", "brace"),
      ok(conv(9)),
      bad(7, "validate", "object"),
      ok(avg_pool(18)),
      bad(dot(1728, code=_SIG + "\n{\n    while (1) { __syncthreads(); }\n}\n"), "barriers", "while"),
      ok(conv(10, fused_add=True)),
      bad(None, "validate", "object"),
      ok(dot(1632)),  # the first item again: unchanged, still not a failure
      bad("a string item", "validate", "object"),
      ok(relu(77)))

# ---------------------------------------------------------------------------------------------
# A directory inside the corpus: its files are found too

items("more/ok_single.json", ok(relu(78)), single=True)
items("more/deeper/still_more.json",
      ok(relu(79)),
      bad(relu(80, blockDim=[4096, 1, 1]), "validate", "blockDim"))
whole_file("more/deeper/truncated.json", '[{"op_type": "Relu", "parameters": {', "read", "JSON")
_CASES["more/deeper/empty_list.json"] = (_text("[]"), Expectation(()))

# ---------------------------------------------------------------------------------------------
# Lone surrogates: pure-ASCII JSON whose strings cannot be encoded as UTF-8 (nor stored in SQLite
# TEXT, nor read by NNFusion's nlohmann::json). Each such item must fail alone, naming the field.

items("lone_surrogates.json",
      bad(dot(1760, name="evil\ud800name"), "validate", "tvm_func_name"),
      ok(dot(1792)),
      bad(dot(1824, code=dot(1824)["code"].replace("float val = 0;", "float val = 0; // \udfff")),
          "validate", "code"),
      ok(relu(81)),
      bad(without(dot(1856, name="bad\udbff"), "gridDim"), "validate", "gridDim", "tvm_func_name"),
      ok(conv(11)),
      into=_SURROGATE_CASES)
# A file name that is not UTF-8 (byte 0xe9; Python spells it \udce9): legal on Linux, and only data.
items("caf\udce9.json", ok(dot(1888)), ok(relu(82)), into=_SURROGATE_CASES)
items("z_after.json", ok(dot(1920)), into=_SURROGATE_CASES)

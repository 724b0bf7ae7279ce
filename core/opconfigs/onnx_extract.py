"""An ONNX model -> the op configs NNFusion would look up in its kernel DB, and every node it would not.

Shapes come from ONNX shape inference (plus what the model declares and its initializers). Each
top-level node ends up in an op config (named in its `source`) or in `unmapped` with the reason.
The mapping follows NNFusion's ONNX importer and its pattern-substitution pass:

- Conv (NCHW, group=1) -> Convolution. pads [begins.., ends..] -> padding_below_diff = begins, with
  padding_above_diff = ends when they differ; auto_pad SAME_* / VALID is resolved from the shapes.
  (NNFusion's importer swaps the two halves of `pads`; for the usual symmetric pads that is moot.)
- Conv with group > 1 -> a Convolution op config with `groups`: NNFusion has no kernel-DB op type
  for it (it emits DepthwiseConv2dNative, or one Convolution per group), so coverage reports it
  as falling back.
- Conv with a bias input: NNFusion emits Convolution -> Add(Broadcast(bias)). That broadcast add is
  reported unmapped, unless a Relu follows: the chain is then Conv+Add+Relu and fuses (below).
- Fusion, as NNFusion's pattern substitution matches it (op types along single out-edges; a graph
  output is an out-edge too): Conv -> Add -> Relu gives Fused_Convolution_Add_Relu when the conv's
  only consumer is the Add and the Add's only consumer is the Relu (the Add's other input is the
  residual, or a bias NNFusion broadcasts first); else Conv -> Relu gives Fused_Convolution_Relu.
  The fused nodes are consumed. When two convs feed one Add, the first in node order takes it.
  The conv must be the Add's first input: the substitution takes the Add's second input as the residual,
  and with the conv there the compiler crashes (segfault). So a conv feeding an Add's second input stays
  a Convolution, and so does every conv of its shapes: the compiler would substitute the pattern there
  too (ResNet-50's first block: conv3 and the shortcut conv have one shape, the shortcut comes second).
  (The compiler substitutes only when the DB holds the fused kernel; coverage says what happens
  otherwise.)
- Gemm -> Dot with transA/transB on the stored shapes of A and B. The C add is reported unmapped when
  C is broadcast (the usual bias) or scaled (beta != 1); a full-shape C with beta = 1 is a plain Add.
  alpha != 1 is a separate Multiply in NNFusion and is reported unmapped; A and B must be 2-D (ONNX).
  MatMul whose left input has rank >= 2 and right input rank 2 -> Dot (the left input's leading axes are
  rows: a BERT dense layer [1,128,768] x [768,768]); any other MatMul (a 1-D input, a right input of rank
  > 2) becomes BatchMatMul in NNFusion and is unmapped.
- MaxPool / AveragePool -> MaxPool / AvgPool (ceil_mode only when it does not change the shape; no
  dilations); an AvgPool over padding gets a note, since the identifier does not say whether the
  padding counts. GlobalAveragePool / GlobalMaxPool -> a pool whose window is the spatial size.
- Element-wise ops NNFusion knows (Mul -> Multiply, Max -> Maximum, ...) with every input of the
  output's shape and one element type -> that op; broadcasting ones are unmapped (NNFusion puts a
  Broadcast node, which has no kernel-DB op type, in front of them).
- Everything else (layout/shape ops, Softmax, BatchNormalization, ...) is unmapped with its reason,
  as is any node whose shapes are unknown or dynamic, or whose element type is not float, half or
  double.

Needs the `onnx` package; it is imported when a model is read, so `core` imports without it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from core.errors import InputError
from core.kernels.ops import ELEMENTWISE_ARITY
from core.opconfigs.nnfusion_import import Blocker, import_blockers
from core.opconfigs.opconfig import OpConfig, dedupe, validate

# ONNX op -> NNFusion's element-wise op (as its ONNX importer translates them).
ONNX_ELEMENTWISE: dict[str, str] = {
    "Relu": "Relu", "Add": "Add", "Mul": "Multiply", "Sub": "Subtract", "Div": "Divide",
    "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt", "Abs": "Abs",
    "Neg": "Negative", "Max": "Maximum", "Min": "Minimum", "Pow": "Power", "Erf": "Erf",
    "Ceil": "Ceiling", "Floor": "Floor", "Sin": "Sin", "Cos": "Cos", "Tan": "Tan", "Asin": "Asin",
    "Acos": "Acos", "Atan": "Atan", "Sinh": "Sinh", "Cosh": "Cosh", "Sign": "Sign", "Gelu": "Gelu",
}  # fmt: skip

LAYOUT_OPS = frozenset([
    "Flatten", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
    "Gather", "Shape", "Size", "Expand", "Pad", "Tile", "Cast", "Dropout", "Constant", "ConstantOfShape",
])  # fmt: skip
CONTROL_FLOW = frozenset(["If", "Loop", "Scan"])
# Layout ops NNFusion turns into a non-transposing Reshape, which its element-wise fusion takes in.
RESHAPES = frozenset(["Flatten", "Reshape", "Squeeze", "Unsqueeze"])

# ONNX TensorProto element types the op configs cover.
DTYPES = {1: "float", 10: "half", 11: "double"}
FLOATING = frozenset([1, 10, 11, 16])  # float, float16, double, bfloat16


class Unmapped(NamedTuple):
    node: str
    op_type: str
    reason: str


class Note(NamedTuple):
    node: str
    text: str


@dataclass
class Extraction:
    model_name: str
    node_count: int
    configs: list[OpConfig]  # distinct, in model order
    nodes: dict[str, list[tuple[str, ...]]]  # config.key -> the ONNX nodes of each occurrence
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    # nodes NNFusion cannot compile whatever the DB holds (core/opconfigs/nnfusion_import.py)
    blockers: list[Blocker] = field(default_factory=list)
    # NNFusion's element-wise fusion works on its own graph: every element-wise node, non-transposing reshape and
    # the bias Add it puts after a Conv/Gemm with a bias ("<node>/bias") is a unit; links join a unit to the
    # units that read its output. (See core/nnfusion/coverage.py for what the compiler does with them.)
    units: frozenset[str] = frozenset()
    links: tuple[tuple[str, str], ...] = ()

    def count(self, config: OpConfig) -> int:
        return len(self.nodes.get(config.key, ()))

    def unit_of(self, config: OpConfig, members: tuple[str, ...]) -> str | None:
        """The fusion unit of one occurrence of an element-wise config (a Gemm's bias Add is its node's /bias)."""
        if not members:
            return None
        node = members[0]
        return node if node in self.units else (f"{node}/bias" if f"{node}/bias" in self.units else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "nodes": self.node_count,
            "configs": [{"config": c.to_dict(), "description": c.describe(), "count": self.count(c),
                         "nodes": ["+".join(n) for n in self.nodes[c.key]]} for c in self.configs],
            "unmapped": [u._asdict() for u in self.unmapped],
            "notes": [n._asdict() for n in self.notes],
            "blockers": [b._asdict() for b in self.blockers],
        }


class _NotMapped(Exception):
    """This node maps to no op config; the reason says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def extract(path: Path | str) -> Extraction:
    """The op configs of the model at `path`; InputError when it is not a readable ONNX model."""
    path = Path(path)
    model = _load(path)
    graph = model.graph
    extractor = _Extractor(graph)
    extractor.run()
    nodes: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for config, members in extractor.ops:
        nodes[config.key].append(members)
    units, links = extractor.fusion_graph()
    return Extraction(graph.name or path.stem, len(graph.node), dedupe(c for c, _ in extractor.ops), dict(nodes),
                      extractor.unmapped, extractor.notes, import_blockers(model), units, links)


def _load(path: Path) -> Any:
    try:
        import onnx
    except ImportError:
        raise InputError("reading ONNX models needs the onnx package (pip install onnx)", where=str(path)) from None
    try:
        # Weights kept in external files are not needed: shapes are in the initializers' dims.
        model = onnx.load(str(path), load_external_data=False)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", where=str(path)) from None
    except Exception as exc:  # protobuf's DecodeError and kin: the bytes are not a model
        raise InputError(f"not an ONNX model ({exc})", where=str(path)) from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise InputError("not an ONNX model (no IR version or graph; empty or truncated file?)", where=str(path))
    for tensor in model.graph.initializer:
        # Weight values never decide a shape (their dims stay); dropping them keeps shape inference from
        # copying the whole file twice. Small tensors (shapes, Resize scales) are kept.
        if tensor.data_type in FLOATING and math.prod(tensor.dims) > 1024:
            for name in ("raw_data", "float_data", "double_data", "int32_data"):
                tensor.ClearField(name)
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:
        raise InputError(f"ONNX shape inference failed: {exc}", where=str(path)) from None


class _Tensors:
    """Shape and element type of every tensor the model declares or shape inference found."""

    def __init__(self, graph: Any) -> None:
        self.types = {vi.name: vi.type.tensor_type for vi in (*graph.input, *graph.value_info, *graph.output)
                      if vi.type.HasField("tensor_type")}
        self.initializers = {t.name: (list(t.dims), t.data_type) for t in graph.initializer}

    def shape(self, name: str) -> list[int]:
        if name in self.initializers:
            return self.initializers[name][0]
        tensor = self.types.get(name)
        if tensor is None or not tensor.HasField("shape"):
            raise _NotMapped(f"the shape of {name!r} is unknown after shape inference")
        dims = []
        for d in tensor.shape.dim:
            if not d.HasField("dim_value") or d.dim_value <= 0:
                raise _NotMapped(f"dynamic shape: {name!r} has dimension {d.dim_param or '?'!r}")
            dims.append(d.dim_value)
        return dims

    def known_shape(self, name: str) -> list[int] | None:
        try:
            return self.shape(name)
        except _NotMapped:
            return None

    def elem_type(self, name: str) -> int:
        if name in self.initializers:
            return self.initializers[name][1]
        tensor = self.types.get(name)
        return tensor.elem_type if tensor is not None else 0

    def dtype(self, names: list[str]) -> str:
        """The one element type all these tensors share, as op configs name it."""
        elems = {self.elem_type(n) for n in names if n}
        if len(elems) != 1:
            raise _NotMapped(f"mixed or unknown element types ({', '.join(sorted(map(_elem_name, elems)))})")
        elem = elems.pop()
        if elem not in DTYPES:
            raise _NotMapped(f"element type {_elem_name(elem)}: op configs cover float, half and double")
        return DTYPES[elem]


def _elem_name(elem: int) -> str:
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(elem)
    except ValueError:
        return str(elem)


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


def _pads(attrs: dict[str, Any], size: list[int], out: list[int], window: list[int],
          strides: list[int]) -> tuple[list[int], list[int]]:
    """Padding below and above per spatial axis, with auto_pad resolved the way ONNX defines it."""
    auto_pad = attrs.get("auto_pad", "NOTSET")
    spatial = len(size)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (o - 1) * s + w - i) for i, o, w, s in zip(size, out, window, strides, strict=True)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        return (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    if auto_pad == "VALID":
        return [0] * spatial, [0] * spatial
    pads = list(attrs.get("pads", [0] * 2 * spatial))
    if len(pads) != 2 * spatial:
        raise _NotMapped(f"pads {pads} do not give two values per spatial axis")
    return pads[:spatial], pads[spatial:]


class _Extractor:
    def __init__(self, graph: Any) -> None:
        self.nodes = list(graph.node)
        self.names = [n.name or f"{n.op_type}#{i}" for i, n in enumerate(self.nodes)]
        self.t = _Tensors(graph)
        self.users: dict[str, list[int]] = defaultdict(list)  # tensor -> consuming node, once per input slot
        for i, node in enumerate(self.nodes):
            for name in node.input:
                if name:
                    self.users[name].append(i)
        self.graph_outputs = {o.name for o in graph.output}
        self.second_input_convs = self._convs_feeding_a_second_input()
        self.done: set[int] = set()
        self.ops: list[tuple[OpConfig, tuple[str, ...]]] = []
        self.unmapped: list[Unmapped] = []
        self.notes: list[Note] = []

    def run(self) -> None:
        for i, node in enumerate(self.nodes):
            if i in self.done:
                continue
            self.done.add(i)
            try:
                self._map(i, node)
            except _NotMapped as exc:
                self.unmapped.append(Unmapped(self.names[i], node.op_type, exc.reason))

    def fusion_graph(self) -> tuple[frozenset[str], tuple[tuple[str, ...], ...]]:
        """The units of NNFusion's element-wise fusion and their links (see Extraction.units)."""
        out_unit: dict[int, str] = {}
        units: set[str] = set()
        for i, node in enumerate(self.nodes):
            if node.op_type in ONNX_ELEMENTWISE or node.op_type in RESHAPES:
                out_unit[i] = self.names[i]
            elif node.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2] \
                    and float(_attrs(node).get("beta", 1.0)) != 0:
                out_unit[i] = f"{self.names[i]}/bias"  # NNFusion's Add after the Convolution / Dot
        units.update(out_unit.values())
        links: set[tuple[str, str]] = set()
        for i, node in enumerate(self.nodes):
            if i not in out_unit:
                continue
            for tensor in node.output:
                for j in self.users.get(tensor, []):
                    if self.nodes[j].op_type in ONNX_ELEMENTWISE or self.nodes[j].op_type in RESHAPES:
                        links.add((out_unit[i], self.names[j]))
        return frozenset(units), tuple(sorted(links))

    def _map(self, i: int, node: Any) -> None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise _NotMapped(f"op of the {node.domain!r} domain")
        if op == "Conv":
            self._conv(i, node)
        elif op == "Gemm":
            self._gemm(i, node)
        elif op == "MatMul":
            self._matmul(i, node)
        elif op in ("MaxPool", "AveragePool"):
            self._pool(i, node)
        elif op in ("GlobalAveragePool", "GlobalMaxPool"):
            self._global_pool(i, node)
        elif op in ONNX_ELEMENTWISE:
            self._elementwise(i, node)
        elif op in LAYOUT_OPS:
            raise _NotMapped("layout/shape op: no kernel-DB op type")
        elif op in CONTROL_FLOW:
            raise _NotMapped("control flow: its subgraphs are not analysed")
        elif op == "BatchNormalization":
            raise _NotMapped("no kernel-DB op type (fold it into the convolution before export)")
        else:
            raise _NotMapped("no kernel-DB op type")

    def _emit(self, config: OpConfig, members: list[int]) -> None:
        """Record a config for these nodes, or every one of them as unmapped when it does not validate."""
        self.done.update(members)
        try:
            validate(config)
        except InputError as exc:
            for m in members:
                self.unmapped.append(Unmapped(self.names[m], self.nodes[m].op_type, f"invalid op config: {exc.reason}"))
            return
        self.ops.append((config, tuple(self.names[m] for m in members)))

    def _sole_consumer(self, tensor: str, op_type: str) -> int | None:
        """The node of this op type that is the tensor's only out-edge, if it is one."""
        users = self.users.get(tensor, [])
        if len(users) != 1 or tensor in self.graph_outputs or users[0] in self.done:
            return None
        return users[0] if self.nodes[users[0]].op_type == op_type else None

    # -- convolutions ---------------------------------------------------------------------

    def _convs_feeding_a_second_input(self) -> dict[str, str]:
        """Conv -> Add -> Relu chains (single out-edges, as the compiler matches them) whose conv is the Add's second
        input: the conv's shapes (_conv_shapes) -> the Add's name."""
        found: dict[str, str] = {}
        for node in self.nodes:
            biased = len(node.input) > 2 and bool(node.input[2])  # its chain is Conv -> Add(bias) -> ...
            if node.op_type != "Conv" or biased or int(_attrs(node).get("group", 1)) != 1:
                continue
            add = self._only_user(node.output[0], "Add")
            if add is None or self.nodes[add].input[1] != node.output[0] \
                    or self._only_user(self.nodes[add].output[0], "Relu") is None:
                continue
            if (shapes := self._conv_shapes(node)) is not None:
                found.setdefault(shapes, self.names[add])
        return found

    def _only_user(self, tensor: str, op_type: str) -> int | None:
        """The node of this op type that is the tensor's only out-edge, mapped or not."""
        users = self.users.get(tensor, [])
        if len(users) != 1 or tensor in self.graph_outputs:
            return None
        return users[0] if self.nodes[users[0]].op_type == op_type else None

    def _conv_shapes(self, node: Any) -> str | None:
        """What the compiler's identifier of a convolution is made of (its input, filter and output shapes, strides,
        dilations, pads, element types) as the model writes them; None where shape inference left one unknown."""
        shapes = [self.t.known_shape(name) for name in node.output[:1] + node.input[:2]]
        if None in shapes:
            return None
        attrs = _attrs(node)
        spatial = len(shapes[0] or []) - 2
        return repr((shapes, list(attrs.get("strides", [1] * spatial)), list(attrs.get("dilations", [1] * spatial)),
                     list(attrs.get("pads", [0] * 2 * spatial)), attrs.get("auto_pad", "NOTSET"),
                     [self.t.elem_type(name) for name in node.input[:2]]))

    def _conv(self, i: int, node: Any) -> None:
        x, w, y = node.input[0], node.input[1], node.output[0]
        bias = node.input[2] if len(node.input) > 2 else ""
        xs, ws, ys = self.t.shape(x), self.t.shape(w), self.t.shape(y)
        dtype = self.t.dtype([x, w, bias, y])
        spatial = len(xs) - 2
        if spatial < 1 or len(ws) != len(xs) or len(ys) != len(xs):
            raise _NotMapped(f"input {xs}, filter {ws}: not an N,C,spatial.. convolution")
        attrs = _attrs(node)
        strides = list(attrs.get("strides", [1] * spatial))
        dilations = list(attrs.get("dilations", [1] * spatial))
        window = [d * (k - 1) + 1 for k, d in zip(ws[2:], dilations, strict=True)]
        below, above = _pads(attrs, xs[2:], ys[2:], window, strides)
        params: dict[str, Any] = {
            "input_shape": xs, "filter_shape": ws, "output_shape": ys, "window_movement_strides": strides,
            "window_dilation_strides": dilations, "padding_below_diff": below,
        }
        if above != below:
            params["padding_above_diff"] = above
        groups = int(attrs.get("group", 1))
        op_type, members = self._fuse(i, ys, dtype, bool(bias)) if groups == 1 else ("Convolution", [i])
        self._emit(OpConfig(op_type, params, groups, dtype, source="+".join(self.names[m] for m in members)), members)
        if bias and op_type == "Convolution":
            self.unmapped.append(Unmapped(
                self.names[i], "Conv", f"bias add: the {self.t.known_shape(bias)} bias is broadcast over {ys} "
                "(NNFusion adds Broadcast + Add after the Convolution; a broadcast has no kernel-DB op type)"))

    def _fuse(self, i: int, out: list[int], dtype: str, has_bias: bool) -> tuple[str, list[int]]:
        """NNFusion's Conv+Add+Relu, then Conv+Relu pattern: the op type and the nodes it consumes."""
        conv_out = self.nodes[i].output[0]
        relu = self._sole_consumer(conv_out, "Relu")
        if relu is not None and self._same(relu, out, dtype):
            # With a bias NNFusion's chain is already Convolution -> Add -> Relu.
            if has_bias and self._second_input_crash(i, self.names[relu], second=False):
                return "Convolution", [i]
            return ("Fused_Convolution_Add_Relu" if has_bias else "Fused_Convolution_Relu"), [i, relu]
        add = None if has_bias else self._sole_consumer(conv_out, "Add")
        if add is None or not self._same(add, out, dtype):
            return "Convolution", [i]
        a, b = self.nodes[add].input
        other = b if a == conv_out else a
        other_shape = self.t.known_shape(other)
        if other_shape is None or not _broadcasts_to(other_shape, out):
            return "Convolution", [i]
        relu = self._sole_consumer(self.nodes[add].output[0], "Relu")
        if relu is None or not self._same(relu, out, dtype):
            return "Convolution", [i]
        if self._second_input_crash(i, self.names[add], second=b == conv_out):
            return "Convolution", [i]
        if other_shape != out:
            self.notes.append(Note(self.names[add], f"the {other_shape} input is broadcast to {out} before the fused "
                                   "Conv+Add+Relu (a Broadcast node: no kernel-DB op type)"))
        return "Fused_Convolution_Add_Relu", [i, add, relu]

    def _second_input_crash(self, i: int, at: str, *, second: bool) -> bool:
        """Whether conv i's Conv+Add+Relu would crash the compiler (it, or a conv of its shapes, is an Add's second
        input); if so, a note at `at` says why it is not fused."""
        shapes = self._conv_shapes(self.nodes[i])
        add = self.second_input_convs.get(shapes) if shapes is not None else None
        if add is None:
            return False
        where = "it is" if second else f"a conv of its shapes is, at {add},"
        self.notes.append(Note(at, f"Conv+Add+Relu not fused: {where} the Add's second input, which NNFusion's pattern "
                               "substitution takes for the residual; the compiler crashes (segfault) on it when the DB "
                               "holds the fused kernel. Write Add(conv, residual) to fuse"))
        return True

    def _same(self, j: int, out: list[int], dtype: str) -> bool:
        """Node j's output has this shape and element type (so it can join a fused conv)."""
        name = self.nodes[j].output[0]
        return self.t.known_shape(name) == out and DTYPES.get(self.t.elem_type(name)) == dtype

    # -- Dot ------------------------------------------------------------------------------

    def _gemm(self, i: int, node: Any) -> None:
        a, b, y = node.input[0], node.input[1], node.output[0]
        c = node.input[2] if len(node.input) > 2 else ""
        a_shape, b_shape = self.t.shape(a), self.t.shape(b)
        if len(a_shape) != 2 or len(b_shape) != 2:
            # ONNX shape inference leaves such a Gemm's output unknown; NNFusion makes a Dot of it anyway and
            # aborts once transB is set (its Dot shape inference gets transposes of rank > 2 wrong).
            raise _NotMapped(f"Gemm {a_shape} x {b_shape}: ONNX's Gemm takes 2-D A and B (export a MatMul, "
                             "whose Dot may have a left operand of any rank >= 2)")
        out = self.t.shape(y)
        dtype = self.t.dtype([a, b, c, y])
        attrs = _attrs(node)
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        params = {"arg0_shape": a_shape, "arg1_shape": b_shape, "out_shape": out,
                  "transpose_A": bool(attrs.get("transA", 0)), "transpose_B": bool(attrs.get("transB", 0))}
        self._emit(OpConfig("Dot", params, 1, dtype, source=self.names[i]), [i])
        if alpha != 1:
            self.unmapped.append(Unmapped(self.names[i], "Gemm", f"alpha={alpha:g}: NNFusion scales the Dot's result "
                                          "in a separate Multiply by a constant"))
        if not c or beta == 0:
            return
        c_shape = self.t.known_shape(c)
        if c_shape == out and beta == 1:
            self._emit(OpConfig("Add", {"input_shapes": [out, out], "output_shape": out}, 1, dtype,
                                source=self.names[i]), [i])
        else:
            how = f"scaled by beta={beta:g} and " if beta != 1 else ""
            self.unmapped.append(Unmapped(self.names[i], "Gemm", f"bias add: C {c_shape} is {how}broadcast over {out} "
                                          "(NNFusion adds Broadcast + Add after the Dot; a broadcast has no kernel-DB "
                                          "op type)"))

    def _matmul(self, i: int, node: Any) -> None:
        # NNFusion's importer (matmul.cpp) makes a Dot when the left operand has rank >= 2 and the right rank 2
        # (a BERT dense layer [1,128,768] x [768,768]: Dot1,128,768;768,768;1,128,768...); every other MatMul
        # (a 1-D operand, a right operand of rank > 2) becomes Reshape + Broadcast + BatchMatMul.
        a, b, y = node.input[0], node.input[1], node.output[0]
        a_shape, b_shape = self.t.shape(a), self.t.shape(b)
        if len(a_shape) < 2 or len(b_shape) != 2:
            why = "a 1-D operand" if 1 in (len(a_shape), len(b_shape)) else "a right operand of rank > 2"
            raise _NotMapped(f"MatMul {a_shape} x {b_shape} has {why}: NNFusion emits BatchMatMul, which has no "
                             "kernel-DB op type (a Dot needs a left operand of rank 2 or more and a 2-D right one)")
        dtype = self.t.dtype([a, b, y])
        params = {"arg0_shape": a_shape, "arg1_shape": b_shape, "out_shape": self.t.shape(y),
                  "transpose_A": False, "transpose_B": False}
        self._emit(OpConfig("Dot", params, 1, dtype, source=self.names[i]), [i])

    # -- pools ----------------------------------------------------------------------------

    def _pool(self, i: int, node: Any) -> None:
        op_type = "MaxPool" if node.op_type == "MaxPool" else "AvgPool"
        if len([o for o in node.output if o]) > 1:
            raise _NotMapped("MaxPool with an Indices output has no kernel-DB op type")
        x, y = node.input[0], node.output[0]
        xs, ys = self.t.shape(x), self.t.shape(y)
        dtype = self.t.dtype([x, y])
        spatial = len(xs) - 2
        attrs = _attrs(node)
        window = list(attrs.get("kernel_shape", []))
        strides = list(attrs.get("strides", [1] * spatial))
        if spatial < 1 or len(window) != spatial or len(strides) != spatial:
            raise _NotMapped(f"input {xs}, kernel_shape {window}: not an N,C,spatial.. pool")
        if any(d != 1 for d in attrs.get("dilations", [])):
            raise _NotMapped(f"dilations {list(attrs['dilations'])}: NNFusion's pools have none")
        below, above = _pads(attrs, xs[2:], ys[2:], window, strides)
        floor = [(n + b + a - w) // s + 1 for n, b, a, w, s in zip(xs[2:], below, above, window, strides, strict=True)]
        if attrs.get("ceil_mode", 0) and floor != ys[2:]:
            raise _NotMapped(f"ceil_mode=1 gives spatial {ys[2:]}; NNFusion's pools round down ({floor})")
        if op_type == "AvgPool" and any(below + above):
            counted = "counts" if attrs.get("count_include_pad", 0) else "does not count"
            self.notes.append(Note(self.names[i], f"the padding {counted} in the average (count_include_pad); the "
                                   "identifier does not say, so a DB kernel must average the same way"))
        params = {"input_shape": xs, "output_shape": ys, "window_shape": window, "window_stride": strides,
                  "padding_below": below, "padding_above": above}
        self._emit(OpConfig(op_type, params, 1, dtype, source=self.names[i]), [i])

    def _global_pool(self, i: int, node: Any) -> None:
        x, y = node.input[0], node.output[0]
        xs, ys = self.t.shape(x), self.t.shape(y)
        dtype = self.t.dtype([x, y])
        spatial = len(xs) - 2
        if spatial < 1:
            raise _NotMapped(f"input {xs} has no spatial axes")
        params = {"input_shape": xs, "output_shape": ys, "window_shape": xs[2:], "window_stride": [1] * spatial,
                  "padding_below": [0] * spatial, "padding_above": [0] * spatial}
        op_type = "AvgPool" if node.op_type == "GlobalAveragePool" else "MaxPool"
        self._emit(OpConfig(op_type, params, 1, dtype, source=self.names[i]), [i])

    # -- element-wise ---------------------------------------------------------------------

    def _elementwise(self, i: int, node: Any) -> None:
        op_type = ONNX_ELEMENTWISE[node.op_type]
        inputs = [n for n in node.input if n]
        arity = ELEMENTWISE_ARITY[op_type]
        if len(inputs) != arity:
            raise _NotMapped(f"{len(inputs)} inputs: NNFusion's {op_type} takes {arity}")
        shapes = [self.t.shape(n) for n in inputs]
        out = self.t.shape(node.output[0])
        if any(s != out for s in shapes):
            raise _NotMapped(f"broadcast: inputs {' and '.join(map(str, shapes))} -> {out} (NNFusion puts a Broadcast "
                             "node, which has no kernel-DB op type, in front)")
        dtype = self.t.dtype([*inputs, node.output[0]])
        self._emit(OpConfig(op_type, {"input_shapes": shapes, "output_shape": out}, 1, dtype, source=self.names[i]),
                   [i])


def _broadcasts_to(shape: list[int], target: list[int]) -> bool:
    """Numpy-style: does `shape` broadcast to `target` without changing it?"""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))

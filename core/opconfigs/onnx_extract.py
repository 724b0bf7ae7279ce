"""An ONNX model -> the op configs NNFusion would look up in its kernel DB, and every node it would not.

Shapes come from ONNX shape inference (plus what the model declares and its initializers). Each
top-level node ends up in an op config (named in its `source`) or in `unmapped` with the reason.
The mapping follows NNFusion's ONNX importer and its pattern-substitution pass:

- Conv (NCHW, group=1) -> Convolution. Symmetric pads -> padding_below_diff. Asymmetric pads: NNFusion
  pads the input with a Pad node and looks up a convolution of the padded input without padding (its
  importer swaps the two halves of `pads`, so the padding lands on the wrong sides: a note says so).
  auto_pad other than NOTSET makes NNFusion's importer abort: unmapped, with that reason.
- Conv with group = channels (depthwise, one filter each, SAME or VALID padding) is NNFusion's
  DepthwiseConv2dNative: cudnn_depthwise_conv2d_op_<dtype>, the filter as the importer transposes it ([kh, kw,
  C, 1]); in half its row is what lets the network build (NNFusion's own half depthwise kernel does not
  compile: coverage says "does not build" until the DB has the row; `kdb model fp16` keeps it in float).
  On any other group count (ResNeXt's 32) NNFusion's importer aborts (a CHECK that fails for every group
  count): unmapped.
- Conv with a bias input: NNFusion emits Convolution -> Add(Broadcast(bias)); the Add is a full-shape Add
  ("<conv>/bias"), unless a Relu follows: the chain is then Conv+Add+Relu and fuses (below).
- Fusion, as NNFusion's pattern substitution matches it (op types along single out-edges; a graph
  output is an out-edge too): Conv -> Add -> Relu gives Fused_Convolution_Add_Relu when the conv's
  only consumer is the Add and the Add's only consumer is the Relu (the Add's other input is the
  residual, or a bias NNFusion broadcasts first); else Conv -> Relu gives Fused_Convolution_Relu.
  The fused nodes are consumed. When two convs feed one Add, the first in node order takes it.
  The conv must be the Add's first input: the substitution takes the Add's second input as the residual,
  and with the conv there the compiler crashes (segfault). So a conv feeding an Add's second input stays
  a Convolution, and so does every conv of its shapes: the compiler would substitute the pattern there
  too (ResNet-50's first block: conv3 and the shortcut conv have one shape, the shortcut comes second).
  With -fpattern_substitution=false nothing fuses. (The compiler substitutes only when the DB holds
  the fused kernel; coverage says what happens otherwise.)
- Gemm -> Dot with transA/transB on the stored shapes of A and B (2-D, as ONNX has them), then the
  element-wise ops NNFusion puts after it: a Multiply by alpha ("<gemm>/alpha", when not 1), a Multiply
  of C by beta ("<gemm>/beta"), and the Add of C broadcast to the output ("<gemm>/bias", a full-shape Add).
  MatMul whose left input has rank >= 2 and right input rank 2 -> Dot (the left input's leading axes are
  rows: a BERT dense layer [1,128,768] x [768,768]); any other MatMul (a 1-D input, a right input of rank
  > 2) becomes BatchMatMul in NNFusion and is unmapped.
- MaxPool -> MaxPool (ceil_mode only when it does not change the shape; no dilations). AveragePool -> AvgPool
  without padding: NNFusion's importer drops its pads, auto_pad and ceil_mode; where that changes the shape it
  is unmapped, and a blocker (the compile aborts downstream) or a wrong-shape note names it
  (core/opconfigs/nnfusion_import.py). GlobalAveragePool / GlobalMaxPool -> a pool whose window is the
  spatial size.
- Element-wise ops NNFusion knows (Mul -> Multiply, Max -> Maximum, ...) of one element type -> that op
  with every input of the output's shape (NNFusion reshapes and broadcasts a smaller input first). Clip
  -> Maximum ("<clip>/max") and Minimum; ReduceMean -> a Sum ("<node>/sum") and a Divide of the reduced
  shape ("<node>/mean"); ReduceSum (axes as an attribute) -> a Sum ("<node>/sum"). A Sum whose shapes do not
  tell its axes apart ([4, 4] -> [4]) is unmapped: its identifier is the shapes alone. Comparisons, logical
  ops and Where are unmapped: no row can serve them.
- Concat -> Concat (its axis told by the shapes) where NNFusion copies it with a kernel; one whose axes before the
  joined one all have size 1 is laid out in place (no kernel runs), and is unmapped saying so, unless a graph input
  or a repeated input makes NNFusion copy it after all.
- Which element-wise ops the compiler looks up depends on -fkernel_fusion_level: its kernel fusion,
  replayed on a model of the compiler's graph (`graph`, core/opconfigs/fusion.py), puts most of them
  into kernels of its own. `configs` holds every op; `looked_up()` those the compiler fetches at the
  flags given to extract() once the DB holds them, which is what is written and generated.
- Everything else (layout/shape ops, BatchNormalization, ...) is unmapped with its reason,
  as is any node whose shapes are unknown or dynamic, or whose element type is not float, half or
  double.

Needs the `onnx` package; it is imported when a model is read, so `core` imports without it.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from core.errors import InputError
from core.kernels.ops import (
    BATCH_MATMUL,
    CONCAT,
    CONV_TRANSPOSE,
    DEPTHWISE,
    ELEMENTWISE_ARITY,
    ELEMENTWISE_NO_ROW,
    FUSED_OP_TYPES,
    RESIZE,
    SOFTMAX,
    SUM,
    UNSERVED_DTYPES,
    concat_axis,
    concat_in_place,
)
from core.opconfigs import import_rules
from core.opconfigs.fusion import (
    BROADCAST,
    ELEMENTWISE,
    OTHER,
    RESHAPE,
    SOURCE,
    GraphNode,
    broadcast_fusible,
    fused_nodes,
    substitute,
)
from core.opconfigs.nnfusion_import import (
    Blocker,
    ShapeWarning,
    conv_transpose_unserved,
    depthwise_padding_ok,
    grouped_conv_reason,
    import_faults,
    reduce_axes_ignored,
    resize_attributes,
    resize_unserved,
    softmax_axis,
)
from core.opconfigs.opconfig import OpConfig, dedupe, validate

# ONNX op -> NNFusion's element-wise op (as its ONNX importer translates them).
ONNX_ELEMENTWISE: dict[str, str] = {
    "Relu": "Relu", "Add": "Add", "Mul": "Multiply", "Sub": "Subtract", "Div": "Divide",
    "Sigmoid": "Sigmoid", "Tanh": "Tanh", "Exp": "Exp", "Log": "Log", "Sqrt": "Sqrt", "Abs": "Abs",
    "Neg": "Negative", "Max": "Maximum", "Min": "Minimum", "Pow": "Power", "Erf": "Erf",
    "Ceil": "Ceiling", "Floor": "Floor", "Sin": "Sin", "Cos": "Cos", "Tan": "Tan", "Asin": "Asin",
    "Acos": "Acos", "Atan": "Atan", "Sinh": "Sinh", "Cosh": "Cosh", "Sign": "Sign", "Gelu": "Gelu",
}  # fmt: skip

# ONNX ops NNFusion imports as element-wise ops of its map that no kernel-DB row can serve.
ONNX_NO_ROW = {"Equal": "Equal", "Greater": "Greater", "Less": "Less", "Not": "Not", "And": "And", "Or": "Or",
               "Where": "Select"}

LAYOUT_OPS = frozenset([
    "Flatten", "Reshape", "Identity", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
    "Gather", "Shape", "Size", "Expand", "Pad", "Tile", "Cast", "Dropout", "Constant", "ConstantOfShape",
])  # fmt: skip
# Layout ops whose NNFusion node fetches its identifier all the same (its -min_log_level=0 log), and what kdb does
UNSERVED_LOOKUPS = {
    "Gather": ("NNFusion imports it as GatherV2 and fetches that identifier with its indices' type in it (for example "
               "GatherV210,4;1,3;1,3,4floatint64_tfloat), and a row of it under OpType Dot would be used (seen with "
               "the compiler: tests/test_row_op_type.py); kdb makes none, since an op config has one element type for "
               "all its tensors and the indices are int64_t: NNFusion's own kernel runs"),
    "Pad": ("NNFusion fetches it as Pad<input>;<pad value>;<output> (for example Pad1,4,6,6;;1,4,8,8floatfloatfloat), "
            "and a row of it under OpType Dot would be used (seen with the compiler: tests/test_row_op_type.py); kdb "
            "makes none: the identifier has no paddings (kernel_emitter.cpp's generate_identifier adds attributes for "
            "Convolution, AvgPool and MaxPool only), so one row would serve every Pad of those shapes, however padded: "
            "NNFusion's own kernel runs"),
    "Transpose": ("NNFusion imports it as a Reshape with an input order and fetches Reshape<input>;<output> (for "
                  "example Reshape1,4,8,8;1,8,8,4floatfloat), and a row of it under OpType Dot would be used (seen "
                  "with the compiler: tests/test_row_op_type.py); kdb makes none: the identifier has no order "
                  "(kernel_emitter.cpp's generate_identifier), so one row would serve every transpose of those shapes "
                  "([0, 2, 3, 1] and [0, 3, 2, 1] alike): NNFusion's own kernel runs"),
}
OWN_KERNEL = "kdb generates no kernel of that op type"
CONTROL_FLOW = frozenset(["If", "Loop", "Scan"])
# Layout ops NNFusion turns into a non-transposing Reshape, which its element-wise fusion takes in.
RESHAPES = frozenset(["Flatten", "Reshape", "Squeeze", "Unsqueeze"])

# ONNX TensorProto element types the op configs cover.
DTYPES = {1: "float", 10: "half", 11: "double"}
BFLOAT16 = 16
FLOATING = frozenset([1, 10, 11, BFLOAT16])  # float, float16, double, bfloat16


class Unmapped(NamedTuple):
    node: str
    op_type: str
    reason: str
    builds: bool = True  # False: NNFusion's own kernel for it is no valid CUDA, so the network cannot be built


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
    # A model of the compiler's own graph (core/opconfigs/fusion.py): which element-wise nodes its kernel fusion
    # leaves alone. Each element-wise op config's occurrence names its node first in `nodes`.
    graph: tuple[GraphNode, ...] = ()
    outputs: tuple[str, ...] = ()
    # The compiler flags the extraction was made for (what `looked_up` answers for).
    kernel_fusion_level: int = 3
    pattern_substitution: bool = True
    # What NNFusion's ONNX Runtime pre-pass did (core/opconfigs/ort_prepass.py; empty: extract() alone, not asked).
    prepass: dict[str, Any] = field(default_factory=dict)
    # Nodes NNFusion compiles, whatever the DB holds, into a network that is not the model's: wrong shapes or numbers
    miscompiles: list[ShapeWarning] = field(default_factory=list)

    def count(self, config: OpConfig) -> int:
        return len(self.nodes.get(config.key, ()))

    @property
    def units(self) -> frozenset[str]:
        """The graph's element-wise nodes (those kernel fusion may take)."""
        return frozenset(n.name for n in self.graph if n.kind == ELEMENTWISE)

    def unit_of(self, config: OpConfig, members: tuple[str, ...]) -> str | None:
        """The element-wise graph node of one occurrence of a config (None: not an element-wise node)."""
        return members[0] if members and members[0] in self.units else None

    def fused_units(self, level: int, substituted: Iterable[tuple[str, ...]]) -> set[str]:
        """Element-wise nodes NNFusion fuses into its own kernels at this level, with these patterns (each
        occurrence's nodes, the convolution first) substituted."""
        units = self.units
        patterns = [(m[0], *([f"{m[0]}/bias"] if f"{m[0]}/bias" in units else []), *m[1:]) for m in substituted]
        return fused_nodes(substitute(list(self.graph), patterns), list(self.outputs), level)

    def fused_away(self) -> dict[str, int]:
        """config.key -> occurrences fused away at the extraction's flags, its fused convolutions substituted
        (as they are once the DB holds the configs' kernels)."""
        substituted = [m for c in self.configs if c.op_type in FUSED_OP_TYPES and self.pattern_substitution
                       for m in self.nodes.get(c.key, [])]
        fused = self.fused_units(self.kernel_fusion_level, substituted)
        away = {c.key: sum(1 for m in self.nodes.get(c.key, []) if self.unit_of(c, m) in fused) for c in self.configs}
        return {k: n for k, n in away.items() if n}

    def looked_up(self) -> list[OpConfig]:
        """The op configs the compiler looks up at the extraction's flags once the DB holds them: what to write."""
        away = self.fused_away()
        return [c for c in self.configs if away.get(c.key, 0) < self.count(c)]

    def to_dict(self) -> dict[str, Any]:
        away = self.fused_away()
        return {
            "model": self.model_name,
            "nodes": self.node_count,
            "flags": {"kernel_fusion_level": self.kernel_fusion_level,
                      "pattern_substitution": self.pattern_substitution},
            "configs": [{"config": c.to_dict(), "description": c.describe(), "count": self.count(c),
                         "fused_away": away.get(c.key, 0), "nodes": ["+".join(n) for n in self.nodes[c.key]]}
                        for c in self.configs],
            "unmapped": [u._asdict() for u in self.unmapped],
            "notes": [n._asdict() for n in self.notes],
            "blockers": [b._asdict() for b in self.blockers],
            "prepass": self.prepass,
        }


class _NotMapped(Exception):
    """This node maps to no op config; the reason says why."""

    def __init__(self, reason: str, *, builds: bool = True) -> None:
        super().__init__(reason)
        self.reason, self.builds = reason, builds


class LookupFlags(Protocol):
    """The compiler flags that decide what it looks up (core/nnfusion/compiler.py's CompilerFlags has them)."""

    kernel_fusion_level: int
    pattern_substitution: bool


def extract(path: Path | str, flags: LookupFlags | None = None) -> Extraction:
    """The op configs of the model at `path` for these compiler flags (NNFusion's defaults unless given);
    InputError when it is not a readable ONNX model."""
    path = Path(path)
    level = flags.kernel_fusion_level if flags is not None else 3
    substitution = flags.pattern_substitution if flags is not None else True
    model = _load(path)
    graph = model.graph
    extractor = _Extractor(graph, substitution)
    extractor.run()
    extractor.ops, ambiguous = _one_row_serves_both(extractor.ops)
    extractor.unmapped += ambiguous
    nodes: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for config, members in extractor.ops:
        nodes[config.key].append(members)
    model_graph, outputs = _CompilerGraph(extractor).build()
    shared = _one_identifier_two_ops(extractor.ops)
    notes = [*extractor.notes, *(Note(w.node, f"{w.kind}: {w.text}") for w in shared)]
    if level in (1, 2):
        notes.append(Note("(model)", f"-fkernel_fusion_level={level} groups element-wise nodes by the compiler's "
                          "schedule, connected or not; kdb replays that schedule on its model of the graph, which the "
                          "real compiler was checked against at levels 0 and 3 only"))
    blockers, wrong_shapes = import_faults(model)
    notes += [Note(w.node, f"{w.kind}: {w.text}") for w in wrong_shapes]
    twice = sorted(name for name, count in Counter(n.name for n in graph.node if n.name).items() if count > 1)
    if twice:
        notes.append(Note(twice[0], f"node names used twice ({', '.join(twice[:5])}): ONNX Runtime refuses such a "
                          "model ('two nodes with same node name'), and it computes `kdb nnfusion --run`'s reference "
                          "and runs the compiler's pre-pass: give each node a name of its own"))
    return Extraction(graph.name or path.stem, len(graph.node), dedupe(c for c, _ in extractor.ops), dict(nodes),
                      extractor.unmapped, notes, blockers, tuple(model_graph), tuple(outputs), level, substitution,
                      miscompiles=[*extractor.miscompiles, *wrong_shapes, *shared])


def _one_row_serves_both(ops: list[tuple[OpConfig, tuple[str, ...]]]) -> tuple[list[tuple[OpConfig, tuple[str, ...]]],
                                                                              list[Unmapped]]:
    """Dots whose identifier another Dot of the model has with other transposes (X @ W beside a Linear's x Wᵀ, both
    64x64): NNFusion's Dot identifier has the shapes only, so the one row it fetches serves both and computes the
    wrong numbers for one of them. Neither gets an op config: cuBLAS, which reads each node's transposes, runs both."""
    transposes: dict[str, set[tuple[bool, bool]]] = defaultdict(set)
    for config, _ in ops:
        if config.op_type == "Dot":
            p = config.params
            transposes[config.signature().identifier].add((bool(p.get("transpose_A")), bool(p.get("transpose_B"))))
    clash = {identifier for identifier, kinds in transposes.items() if len(kinds) > 1}
    if not clash:
        return ops, []
    kept, dropped = [], []
    for config, members in ops:
        identifier = config.signature().identifier if config.op_type == "Dot" else ""
        if identifier not in clash:
            kept.append((config, members))
            continue
        dropped.append(Unmapped(members[0], "Dot", (
            f"another Dot of the model has its identifier ({identifier}) with other transposes: NNFusion's Dot "
            "identifier has the shapes only, so one row would serve both and compute wrong numbers for one; no op "
            "config is written, and cuBLAS (which reads each node's transposes) runs both")))
    return kept, dropped


# Ops whose identifier has their shapes only, which NNFusion runs from one row whatever else the node says (stride,
# padding, mode): the row computes what its op config said (the row's Attributes keep it)
SHAPES_ONLY_IDENTIFIERS = (DEPTHWISE, RESIZE, CONV_TRANSPOSE)


def extraction_miscompiles(model: Any) -> tuple[list[ShapeWarning], list[ShapeWarning]]:
    """The nodes of `model` (its shapes inferred) extraction finds NNFusion compiles into another network, as two
    lists: each node's own (a conv's pads the importer swaps), and nodes that fetch one identifier but compute
    differently (_one_identifier_two_ops). What `kdb model expand` and `kdb model fp16` say of the model they wrote."""
    extractor = _Extractor(model.graph)
    extractor.run()
    return extractor.miscompiles, _one_identifier_two_ops(extractor.ops)


def _one_identifier_two_ops(ops: list[tuple[OpConfig, tuple[str, ...]]]) -> list[ShapeWarning]:
    """Nodes of the model that fetch one identifier but compute differently (an HRNet's nearest and bilinear
    upsamplings of one size, depthwise convolutions of one shape and two strides): one row serves them all, so every
    one but the row's own computes wrong numbers, whatever the DB holds (coverage then names the row WRONG NUMBERS)."""
    by_identifier: dict[str, dict[str, tuple[OpConfig, list[str]]]] = defaultdict(dict)
    for config, members in ops:
        if config.op_type in SHAPES_ONLY_IDENTIFIERS:
            entry = by_identifier[config.signature().identifier].setdefault(config.key, (config, []))
            entry[1].append(members[0])
    found = []
    for identifier, kinds in by_identifier.items():
        if len(kinds) < 2:
            continue
        said = "; ".join(f"{', '.join(nodes)}: {config.describe()}" for config, nodes in kinds.values())
        # (a depthwise convolution without a row runs NNFusion's own kernel, which reads each node's stride and pads)
        op_type = next(iter(kinds.values()))[0].op_type
        cure = ("; with no row of it NNFusion's own kernel runs each right (`d` in the Kernels view deletes a row)"
                if op_type == DEPTHWISE else
                ", whatever the DB holds (`kdb model expand IN OUT` writes a nearest upsampling by whole factors as "
                "the repeat it is)" if op_type == "Resize" else ", whatever the DB holds")
        for _, nodes in kinds.values():
            found += [ShapeWarning(node, f"nodes that compute differently fetch one identifier ({identifier}: the "
                                   f"shapes only) and NNFusion runs one row for all of them, so all but one compute "
                                   f"wrong numbers{cure} ({said})", "wrong numbers") for node in nodes]
    return found


def write_model(model: Any, output: Path) -> None:
    """`model` saved as `output`, whole or not at all (a temporary name renamed)."""
    import onnx

    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
        os.close(fd)
        try:
            onnx.save(model, tmp)
            # mkstemp makes the file 0600; the model gets the mode any new file of the user's gets (umask)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, output)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", where=str(output)) from None


def read_model(path: Path, *, external_data: bool = True) -> Any:
    """The ModelProto in `path`; InputError naming the file when it is not one."""
    try:
        import onnx
    except ImportError:
        raise InputError("reading ONNX models needs the onnx package (pip install onnx)", where=str(path)) from None
    try:
        model = onnx.load(str(path), load_external_data=False)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", where=str(path)) from None
    except Exception as exc:  # protobuf's DecodeError and kin: the bytes are not a model
        raise InputError(f"not an ONNX model ({exc})", where=str(path)) from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise InputError("not an ONNX model (no IR version or graph; empty or truncated file?)", where=str(path))
    if missing := _missing_external_data(model, path.parent):  # (torch's dynamo exporter writes MODEL.onnx.data)
        raise InputError(f"its weights are in {', '.join(missing)} (ONNX external data), which is not beside it: copy "
                         "it with the model", where=str(path))
    if external_data:
        from onnx.external_data_helper import load_external_data_for_model

        try:
            load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read its external data: {exc}", where=str(path)) from None
    return model


def _missing_external_data(model: Any, folder: Path) -> list[str]:
    """The external data files the model's initializers name that are not in `folder`."""
    from onnx import TensorProto

    names = {entry.value for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL
             for entry in t.external_data if entry.key == "location"}
    return sorted(name for name in names if not (folder / name).is_file())


def _load(path: Path) -> Any:
    import onnx

    # Weights kept in external files are not needed: shapes are in the initializers' dims.
    model = read_model(path, external_data=False)
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
        if elem == BFLOAT16:
            raise _NotMapped(f"element type BFLOAT16: {UNSERVED_DTYPES['bfloat16']}")
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
        return import_rules.onnx_same_pads(size, out, window, strides, auto_pad)
    if auto_pad == "VALID":
        return [0] * spatial, [0] * spatial
    pads = list(attrs.get("pads", [0] * 2 * spatial))
    if len(pads) != 2 * spatial:
        raise _NotMapped(f"pads {pads} do not give two values per spatial axis")
    return pads[:spatial], pads[spatial:]


def sum_shape(shape: list[int] | None, attrs: dict[str, Any]) -> list[int] | None:
    """The shape of the Sum NNFusion's ReduceMean or ReduceSum makes (the reduced axes dropped: keepdims is a Reshape
    after)."""
    if shape is None:
        return None
    axes = {a % len(shape) for a in attrs.get("axes", range(len(shape)))} if shape else set()
    return [d for a, d in enumerate(shape) if a not in axes]


class _Extractor:
    def __init__(self, graph: Any, substitution: bool = True) -> None:
        self.graph = graph
        self.substitution = substitution  # the compiler's pattern substitution (-fpattern_substitution)
        self.nodes = list(graph.node)
        self.names = [n.name or f"{n.op_type}#{i}" for i, n in enumerate(self.nodes)]
        self.t = _Tensors(graph)
        self.users: dict[str, list[int]] = defaultdict(list)  # tensor -> consuming node, once per input slot
        for i, node in enumerate(self.nodes):
            for name in node.input:
                if name:
                    self.users[name].append(i)
        self.graph_outputs = {o.name for o in graph.output}
        self.graph_inputs = {t.name for t in graph.input} - set(self.t.initializers)  # NNFusion's Parameters
        self.folded = self._folded_batch_norms()
        self.second_input_convs = self._convs_feeding_a_second_input()
        self.done: set[int] = set()
        self.ops: list[tuple[OpConfig, tuple[str, ...]]] = []
        self.unmapped: list[Unmapped] = []
        self.notes: list[Note] = []
        self.miscompiles: list[ShapeWarning] = []  # nodes NNFusion compiles into another network

    def run(self) -> None:
        for i, node in enumerate(self.nodes):
            if i in self.done:
                continue
            self.done.add(i)
            try:
                self._map(i, node)
            except _NotMapped as exc:
                self.unmapped.append(Unmapped(self.names[i], node.op_type, exc.reason, exc.builds))

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
        elif op == "GRU":
            self._gru(i, node)
        elif op in ("MaxPool", "AveragePool"):
            self._pool(i, node)
        elif op in ("GlobalAveragePool", "GlobalMaxPool"):
            self._global_pool(i, node)
        elif op in ONNX_ELEMENTWISE:
            self._elementwise(i, node)
        elif op == "Clip":
            self._clip(i, node)
        elif op == "LeakyRelu":
            self._leaky_relu(i, node)
        elif op == "ReduceMean":
            self._reduce_mean(i, node)
        elif op == "ReduceSum":
            self._reduce_sum(i, node)
        elif op == "ReduceL2":
            self._reduce_l2(i, node)
        elif op == "Concat":
            self._concat(i, node)
        elif op == "Resize":
            self._resize(i, node)
        elif op == "ConvTranspose":
            self._conv_transpose(i, node)
        elif op in ONNX_NO_ROW:
            raise _NotMapped(f"NNFusion's {ONNX_NO_ROW[op]}: {ELEMENTWISE_NO_ROW[ONNX_NO_ROW[op]]}")
        elif op in UNSERVED_LOOKUPS:
            raise _NotMapped(UNSERVED_LOOKUPS[op])
        elif op in LAYOUT_OPS:
            raise _NotMapped("layout/shape op: no kernel-DB op type")
        elif op in CONTROL_FLOW:
            raise _NotMapped("control flow: its subgraphs are not analysed")
        elif op == "BatchNormalization":
            raise _NotMapped(self._batch_norm_reason(i))
        elif op == "LayerNormalization":
            raise _NotMapped(f"NNFusion looks it up as LayerNorm<input>;<scale>;<bias>;<output>;<mean>;<inv std dev> "
                             f"({OWN_KERNEL})")
        elif op == "Softmax":
            self._softmax(i, node)
        elif op == "LogSoftmax":  # the importer's Softmax, then a Log (op/log_softmax.hpp)
            self._softmax(i, node)
            out = self.t.shape(node.output[0])
            self._emit_elementwise("Log", [out], out, self.t.dtype([node.output[0]]), f"{self.names[i]}/log")
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

    def _folded_batch_norms(self) -> dict[int, int]:
        """Conv -> BatchNormalization pairs NNFusion's batchnorm_inference_folding_pass folds (conv -> BN, by node
        index): the BN goes into the filter and a bias, and the compiler then has a Conv -> Add(Broadcast(bias)), as
        a Conv with a bias input imports, and looks up the same kernels (checked with the compiler)."""
        folded = {}
        for i, node in enumerate(self.nodes):
            bn = self._only_user(node.output[0], "BatchNormalization") if node.op_type == "Conv" else None
            if bn is not None and self._fold_blocker(i, bn) is None:
                folded[i] = bn
        return folded

    def _fold_blocker(self, conv: int, bn: int) -> str | None:
        """Why the folding pass leaves BN `bn` after conv `conv` (batchnorm_inference_folding_pass.cpp), or None."""
        c, b = self.nodes[conv], self.nodes[bn]
        if len(c.input) > 2 and c.input[2]:
            return ("the convolution has a bias, which the pass finds behind a Broadcast, not a constant ('Convolution "
                    "bias is not constant ... Fallback')")
        if int(_attrs(c).get("group", 1)) != 1:
            return "a grouped (depthwise) convolution is not the Convolution node the pass matches"
        if DTYPES.get(self.t.elem_type(c.input[1])) not in ("float", "double"):
            return "the pass folds float and double filters only"
        if self._only_user(c.output[0], "BatchNormalization") != bn:
            return "the convolution's output has other users"
        if len(b.input) < 5 or not all(t in self.t.initializers for t in (c.input[1], *b.input[1:5])):
            return "the filter or the BN's scale, bias, mean or variance is not a constant"
        return None  # (training_mode is not read: a training BN is folded with its running statistics)

    def _batch_norm_reason(self, i: int) -> str:
        """Why a BatchNormalization stays a node of its own (NNFusion's BatchNormInference, with its own kernel)."""
        node = self.nodes[i]
        conv = next((j for j, n in enumerate(self.nodes) if node.input[0] in n.output and n.op_type == "Conv"), None)
        if conv is None:
            return ("no kernel-DB op type: NNFusion looks it up as BatchNormInference and runs its own (its folding "
                    f"pass folds a BN into the convolution before it only; {OWN_KERNEL})")
        if (blocker := self._fold_blocker(conv, i)) is None:  # (folded, but its conv is not mapped)
            return f"NNFusion folds it into {self.names[conv]} (batchnorm_inference_folding_pass): see that node"
        return (f"no kernel-DB op type: NNFusion looks it up as BatchNormInference and runs its own ({OWN_KERNEL}). "
                f"Its batchnorm_inference_folding_pass does not fold it into {self.names[conv]}: {blocker}")

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
        for i, node in enumerate(self.nodes):
            biased = (len(node.input) > 2 and bool(node.input[2])) or i in self.folded  # Conv -> Add(bias) -> ...
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
        if spatial > 2:
            raise _NotMapped(f"{spatial}-D convolution: NNFusion's importer takes 1-D and 2-D ones only (a blocker)")
        attrs = _attrs(node)
        if attrs.get("auto_pad", "NOTSET") != "NOTSET":
            raise _NotMapped(f"auto_pad={attrs['auto_pad']}: NNFusion's ONNX importer aborts on it (a blocker): "
                             "nothing is looked up; `kdb model expand IN OUT` writes it as pads")
        strides = list(attrs.get("strides", [1] * spatial))
        dilations = list(attrs.get("dilations", [1] * spatial))
        window = [d * (k - 1) + 1 for k, d in zip(ws[2:], dilations, strict=True)]
        below, above = _pads(attrs, xs[2:], ys[2:], window, strides)
        groups = int(attrs.get("group", 1))
        if groups != 1:
            reason, compiles = self._grouped_conv(i, ws, groups, below, xs[1])
            if not compiles or spatial != 2:
                raise _NotMapped(reason)
            self._depthwise(i, xs, ws, ys, strides, dilations, below, above, dtype)
            if bias:
                self._emit_elementwise("Add", [ys, ys], ys, dtype, f"{self.names[i]}/bias")
            return
        if above != below:
            xs, below = self._padded_first(i, xs, below, above, "convolution")
        params: dict[str, Any] = {
            "input_shape": xs, "filter_shape": ws, "output_shape": ys, "window_movement_strides": strides,
            "window_dilation_strides": dilations, "padding_below_diff": below,
        }
        bn = self.folded.get(i)  # a BN folded into the filter and a bias: then as a Conv with a bias input
        has_bias = bool(bias) or bn is not None
        op_type, members = self._fuse(i, ys, dtype, has_bias) if self.substitution else ("Convolution", [i])
        self._emit(OpConfig(op_type, params, 1, dtype, source="+".join(self.names[m] for m in members)), members)
        if has_bias and op_type == "Convolution":  # NNFusion's bias Add (after a Broadcast of the bias), not fused
            self._emit_elementwise("Add", [ys, ys], ys, dtype, self._bias_unit(i))
            if bn is not None:
                self.done.add(bn)

    def _bias_unit(self, conv: int) -> str:
        """The name of a conv's bias Add in the graph model: "<conv>/bias", or the folded BN's own."""
        bn = self.folded.get(conv)
        return self.names[bn] if bn is not None else f"{self.names[conv]}/bias"

    def _padded_first(self, i: int, xs: list[int], below: list[int], above: list[int],
                      what: str) -> tuple[list[int], list[int]]:
        """The importer pads the input with a Pad node and convolves without padding: the input shape looked up and
        the padding (none)."""
        self.notes.append(Note(self.names[i], f"pads {below} before and {above} after differ: NNFusion pads the "
                               f"input with a Pad node (no kernel-DB op type) and looks up a {what} of the "
                               "padded input without padding (its importer swaps the two halves of `pads`, so the "
                               "padded input is shifted against ONNX's)"))
        self.miscompiles.append(ShapeWarning(
            self.names[i], f"NNFusion's importer swaps the two halves of its pads (conv.cpp: padding_above takes the "
            f"first): its Pad node pads {above} before and {below} after where ONNX pads {below} before and {above} "
            "after, so the input is shifted and the output's numbers are not the model's", "wrong numbers"))
        return [*xs[:2], *(n + b + a for n, b, a in zip(xs[2:], below, above, strict=True))], [0] * len(below)

    def _depthwise(self, i: int, xs: list[int], ws: list[int], ys: list[int], strides: list[int],
                   dilations: list[int], below: list[int], above: list[int], dtype: str) -> None:
        """NNFusion's DepthwiseConv2dNative (frontend/onnx_import/op/conv.cpp): pads that differ before and after
        become a Pad node, and the convolution pads nothing; the filter transposed to [kh, kw, C, 1]. Its identifier
        has no stride or padding: the row kdb makes computes this node's (a dilated one aborts the import: a
        blocker, grouped_conv_reason)."""
        if above != below:
            xs, below = self._padded_first(i, xs, below, above, "depthwise convolution")
        params = {"input_shape": xs, "filter_shape": [*ws[2:], ws[0], 1], "output_shape": ys,
                  "window_movement_strides": strides, "window_dilation_strides": dilations,
                  "padding_below_diff": below}
        self._emit(OpConfig(DEPTHWISE, params, 1, dtype, source=self.names[i]), [i])

    def _grouped_conv(self, i: int, ws: list[int], groups: int, below: list[int], channels: int) -> tuple[str, bool]:
        attrs = _attrs(self.nodes[i])
        padding_ok = depthwise_padding_ok(list(attrs.get("pads", [])), list(attrs.get("dilations", [])), ws[2:])
        return grouped_conv_reason(groups, channels, ws[0], padding_ok, list(attrs.get("dilations", [])),
                                   spatial=len(ws) - 2)

    def _fuse(self, i: int, out: list[int], dtype: str, has_bias: bool) -> tuple[str, list[int]]:
        """NNFusion's Conv+Add+Relu, then Conv+Relu pattern: the op type and the nodes it consumes."""
        bn = self.folded.get(i)
        conv_out = self.nodes[bn if bn is not None else i].output[0]
        relu = self._sole_consumer(conv_out, "Relu")
        if relu is not None and self._same(relu, out, dtype):
            # With a bias NNFusion's chain is already Convolution -> Add -> Relu.
            if has_bias and self._second_input_crash(i, self.names[relu], second=False):
                return "Convolution", [i]
            return ("Fused_Convolution_Add_Relu" if has_bias else "Fused_Convolution_Relu"), [
                i, *([bn] if bn is not None else []), relu]
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
        self._gemm_elementwise(i, out, self.t.known_shape(c) if c else None, alpha, beta, dtype)

    def _gemm_elementwise(self, i: int, out: list[int], c_shape: list[int] | None, alpha: float, beta: float,
                          dtype: str) -> None:
        """The element-wise nodes NNFusion's Gemm puts after its Dot: x alpha, C x beta, + C (broadcast first)."""
        name = self.names[i]
        if alpha != 1:
            self._emit_elementwise("Multiply", [out, out], out, dtype, f"{name}/alpha")
        if c_shape is None or beta == 0:
            return
        if beta != 1:
            self._emit_elementwise("Multiply", [c_shape, c_shape], c_shape, dtype, f"{name}/beta")
        self._emit_elementwise("Add", [out, out], out, dtype, f"{name}/bias")

    def _emit_elementwise(self, op_type: str, shapes: list[list[int]], out: list[int], dtype: str, unit: str) -> None:
        """An element-wise node NNFusion adds itself (named `unit` in its graph model)."""
        self._emit_added(OpConfig(op_type, {"input_shapes": shapes, "output_shape": out}, 1, dtype, source=unit), unit)

    def _emit_added(self, config: OpConfig, unit: str) -> None:
        """A node NNFusion adds itself (named `unit` in its graph model), or unmapped when it does not validate."""
        try:
            validate(config)
        except InputError as exc:
            self.unmapped.append(Unmapped(unit, config.op_type, f"invalid op config: {exc.reason}"))
            return
        self.ops.append((config, (unit,)))

    def _matmul(self, i: int, node: Any) -> None:
        # NNFusion's importer (matmul.cpp) makes a Dot when the left operand has rank >= 2 and the right rank 2
        # (a BERT dense layer [1,128,768] x [768,768]: Dot1,128,768;768,768;1,128,768...); every other MatMul
        # (a 1-D operand, a right operand of rank > 2) becomes Reshape + Broadcast + BatchMatMul, looked up with the
        # operands broadcast to one batch shape (batch_matmul_shapes).
        a, b, y = node.input[0], node.input[1], node.output[0]
        a_shape, b_shape = self.t.shape(a), self.t.shape(b)
        dtype = self.t.dtype([a, b, y])
        if len(a_shape) < 2 or len(b_shape) != 2:
            left, right, out = batch_matmul_shapes(a_shape, b_shape)
            params = {"arg0_shape": left, "arg1_shape": right, "out_shape": out}
            self._emit(OpConfig(BATCH_MATMUL, params, 1, dtype, source=self.names[i]), [i])
            return
        params = {"arg0_shape": a_shape, "arg1_shape": b_shape, "out_shape": self.t.shape(y),
                  "transpose_A": False, "transpose_B": False}
        self._emit(OpConfig("Dot", params, 1, dtype, source=self.names[i]), [i])

    def _gru(self, i: int, node: Any) -> None:
        """NNFusion's importer (op/gru.cpp, forwardGRU) unrolls a GRU into Dots, four each step of each direction:
        the step's input by the z and r gates' input weights ([batch, input] x [input, 2h]), the state by theirs
        ([batch, h] x [h, 2h]), the input by the candidate's ([input, h]) and the state, reset before or after, by its
        recurrent weights ([h, h]); the weights are sliced and transposed by Reshapes first, so no Dot is transposed.
        The rest (bias Adds, Sigmoid, Tanh, the blend) is element-wise: NNFusion's own fused kernels."""
        x, w = node.input[0], node.input[1]
        xs, ws = self.t.shape(x), self.t.shape(w)
        if len(xs) != 3 or len(ws) != 3 or ws[1] % 3:
            raise _NotMapped(f"input {xs}, W {ws}: not a [seq, batch, input] GRU with [directions, 3 * hidden, input] "
                             "weights (layout 1 is not imported)")
        (steps, batch, width), (directions, hidden) = xs, (ws[0], ws[1] // 3)
        dtype = self.t.dtype([x, w])
        for left, right in ((width, 2 * hidden), (hidden, 2 * hidden), (width, hidden), (hidden, hidden)):
            params = {"arg0_shape": [batch, left], "arg1_shape": [left, right], "out_shape": [batch, right],
                      "transpose_A": False, "transpose_B": False}
            for _ in range(steps * directions):
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
        if spatial > 2:
            raise _NotMapped(f"{spatial}-D pool: kdb generates 1-D and 2-D pools; NNFusion's own (cuDNN) kernel runs "
                             "it")
        if any(d != 1 for d in attrs.get("dilations", [])):
            raise _NotMapped(f"dilations {list(attrs['dilations'])}: NNFusion's pools have none")
        below, above = _pads(attrs, xs[2:], ys[2:], window, strides)
        if op_type == "MaxPool" and attrs.get("auto_pad", "NOTSET").startswith("SAME"):
            # the compiler looks it up with its own SAME pads, from the window alone (a wrong-numbers note says so)
            below, above = import_rules.max_pool_auto_pads(window, attrs["auto_pad"])
        floor = [(n + b + a - w) // s + 1 for n, b, a, w, s in zip(xs[2:], below, above, window, strides, strict=True)]
        if op_type == "AvgPool":
            # NNFusion's importer drops an AveragePool's pads, auto_pad and ceil_mode (nnfusion_import.py)
            # and looks up the pool without padding, of its own output shape.
            ours = [(n - w) // s + 1 for n, w, s in zip(xs[2:], window, strides, strict=True)]
            if ours != ys[2:]:
                raise _NotMapped(f"NNFusion pools it to spatial {ours} without padding, where ONNX gives {ys[2:]}: the "
                                 "compiler's network is not the model's (a blocker or a wrong-shape note says where)")
            below, above = [0] * spatial, [0] * spatial
        elif floor != ys[2:]:
            given = "ceil_mode=1 gives" if attrs.get("ceil_mode", 0) else "ONNX gives"
            raise _NotMapped(f"{given} spatial {ys[2:]}; NNFusion's pools round down, with their own SAME pads "
                             f"({floor})")
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
        if spatial > 2:  # (as _pool says of a 3-D pool: kdb would promise a row it cannot generate)
            raise _NotMapped(f"{spatial}-D global pool: kdb generates 1-D and 2-D pools; NNFusion's own (cuDNN) "
                             "kernel runs it")
        if spatial == 1:
            # NNFusion's importer reshapes a 3-D input of a global pool to N,C,L,1 and pools that (pool.hpp).
            xs, ys, spatial = [*xs, 1], [*ys, 1], 2
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
        for n in inputs:
            self.t.shape(n)  # known and static, or not mapped
        out = self.t.shape(node.output[0])
        dtype = self.t.dtype([*inputs, node.output[0]])
        # An input of another shape is reshaped and broadcast to the output's first (nodes of no kernel-DB op type):
        # the op itself is looked up with every input of the output's shape.
        self._emit(OpConfig(op_type, {"input_shapes": [out] * arity, "output_shape": out}, 1, dtype,
                            source=self.names[i]), [i])

    def _reduce_mean(self, i: int, node: Any) -> None:
        """NNFusion's ReduceMean: a Sum (frontend/onnx_import/op/reduce.hpp), then a Divide by the count, both
        looked up with the reduced shape (a Reshape puts kept axes back after)."""
        x, y = node.input[0], node.output[0]
        self._axes_attribute_only(node)
        reduced = sum_shape(self.t.shape(x), _attrs(node))
        dtype = self.t.dtype([x, y])
        self.done.add(i)
        self._emit_sum(i, self.t.shape(x), reduced, dtype)
        if reduced is not None:
            self._emit_elementwise("Divide", [reduced, reduced], reduced, dtype, f"{self.names[i]}/mean")

    def _reduce_sum(self, i: int, node: Any) -> None:
        """NNFusion's ReduceSum: a Sum of the `axes` attribute (every axis without it: the importer never reads the
        axes input of opset 13 on), a Reshape after where the axes are kept."""
        x, y = node.input[0], node.output[0]
        self._axes_attribute_only(node)
        self.done.add(i)
        self._emit_sum(i, self.t.shape(x), sum_shape(self.t.shape(x), _attrs(node)), self.t.dtype([x, y]))

    def _reduce_l2(self, i: int, node: Any) -> None:
        """NNFusion's ReduceL2 (op/reducel2.hpp): a Square, a Sum of it and a Sqrt, all looked up (the Sqrt fuses with
        the element-wise op after it); keepdims is a Reshape after. Of keepdims 0 the importer sums the input instead
        (a wrong-numbers note says so), and none of it is served."""
        x, y = node.input[0], node.output[0]
        if said := import_rules.reduce_l2_unsquared(node):
            raise _NotMapped(said)
        self._axes_attribute_only(node)
        shape, dtype = self.t.shape(x), self.t.dtype([x, y])
        reduced = sum_shape(shape, _attrs(node))
        self.done.add(i)
        self._emit_elementwise("Square", [shape], shape, dtype, f"{self.names[i]}/square")
        self._emit_sum(i, shape, reduced, dtype)
        if reduced:
            self._emit_elementwise("Sqrt", [reduced], reduced, dtype, f"{self.names[i]}/sqrt")

    def _axes_attribute_only(self, node: Any) -> None:
        if reduce_axes_ignored(node, self.t.known_shape(node.output[0])):
            raise _NotMapped(f"{node.op_type} with its axes as an input (ReduceSum from opset 13, ReduceMean from 18): "
                             "NNFusion's importer reads only the axes attribute and reduces every axis without it "
                             "(op/reduce.hpp; a wrong-shape note says so)")

    def _emit_sum(self, i: int, shape: list[int], reduced: list[int] | None, dtype: str) -> None:
        """The Sum NNFusion adds for a ReduceMean or ReduceSum (named "<node>/sum" in the graph model)."""
        unit = f"{self.names[i]}/sum"
        if reduced is None:
            self.unmapped.append(Unmapped(unit, "Sum", "its input's shape is unknown"))
            return
        if not reduced:
            self.unmapped.append(Unmapped(unit, "Sum", f"a Sum of every axis (to a scalar): NNFusion looks it up as "
                                          f"Sum{','.join(map(str, shape))};{dtype}{dtype}, and kdb makes no row of a "
                                          "rank-0 output"))
            return
        self._emit_added(OpConfig(SUM, {"input_shape": shape, "output_shape": reduced}, 1, dtype, source=unit), unit)

    def _softmax(self, i: int, node: Any) -> None:
        """NNFusion's Softmax, always over the last axis (op_define/softmax.cpp aborts on any other: a blocker), so
        its identifier needs no axis: Softmax<in>;<out><types>."""
        x, y = node.input[0], node.output[0]
        shape = self.t.shape(x)
        if softmax_axis(_attrs(node), shape) != len(shape) - 1:
            raise _NotMapped("not over the last axis: NNFusion aborts on it (op_define/softmax.cpp)")
        params = {"input_shape": shape, "output_shape": self.t.shape(y)}
        self._emit(OpConfig(SOFTMAX, params, 1, self.t.dtype([x, y]), source=self.names[i]), [i])

    def _concat(self, i: int, node: Any) -> None:
        """NNFusion's Concat (frontend/onnx_import/op/concat.hpp), fetched as Concat<inputs>;<output><types>: served
        where NNFusion copies the inputs with a kernel; where it lays them out in place in the output, no kernel runs
        and a row would only add a copy (seen with the compiler: tests/test_row_op_type.py). Its in-place analysis
        declines a graph input, and an input given twice: NNFusion's own kernel copies those, and may be skipped
        wrongly (generated.SkippedCopy), where a row is always run."""
        xs, y = [x for x in node.input if x], node.output[0]
        shapes, out = [self.t.shape(x) for x in xs], self.t.shape(y)
        dtype = self.t.dtype([*xs, y])
        axis = concat_axis(shapes, out)
        declined = any(x in self.graph_inputs for x in xs) or len(set(xs)) < len(xs)
        if axis is not None and concat_in_place(shapes, axis) and not declined:
            raise _NotMapped(f"every axis before the joined one (axis {axis}) has size 1, so NNFusion writes the "
                             "inputs in place into the output and runs no kernel for it (its Concat emitter's "
                             "is_memcpy, kernels/cuda_gpu/kernels/concat.cpp; inplace_tensor_analysis.cpp), unless "
                             "an input is already in place in another Concat: its own kernel copies that one; a row "
                             "would make every Concat of its identifier copy, so kdb makes none")
        self._emit(OpConfig(CONCAT, {"input_shapes": shapes, "output_shape": out}, 1, dtype, source=self.names[i]),
                   [i])

    def _conv_transpose(self, i: int, node: Any) -> None:
        """An ONNX ConvTranspose (frontend/onnx_import/op/conv_trans.cpp): NNFusion has no CUDA kernel of its own for
        it, so the network compiles only with its row; its bias is an Add after (attach_bias_gnode, "<node>/bias").
        One kdb makes no row for is a blocker too (nnfusion_import.conv_transpose_unserved says why)."""
        x, w, y = node.input[0], node.input[1], node.output[0]
        bias = node.input[2] if len(node.input) > 2 else ""
        shapes = {t: self.t.shape(t) for t in (x, w, y)}
        dtype = self.t.dtype([x, w, bias, y])
        attrs = _attrs(node)
        if why := conv_transpose_unserved(node, attrs, shapes):
            raise _NotMapped(why)
        pads = list(attrs.get("pads", [0, 0, 0, 0]))[:2]
        params = {"input_shape": shapes[x], "filter_shape": shapes[w], "output_shape": shapes[y],
                  "window_movement_strides": list(attrs.get("strides", [1, 1])), "window_dilation_strides": [1, 1],
                  "padding_below_diff": pads}
        self._emit(OpConfig(CONV_TRANSPOSE, params, 1, dtype, source=self.names[i]), [i])
        if bias:
            self._emit_elementwise("Add", [shapes[y], shapes[y]], shapes[y], dtype, f"{self.names[i]}/bias")

    def _resize(self, i: int, node: Any) -> None:
        """An ONNX Resize (frontend/onnx_import/op/resize.cpp: its input and scales): NNFusion has no CUDA kernel of
        its own for it, so the network compiles only with its row; one kdb makes no row for is a blocker too
        (nnfusion_import.resize_unserved says why)."""
        x, y = node.input[0], node.output[0]
        given = len(node.input) > 2 and node.input[2]
        scales = import_rules.constant_values(self.graph, node.input[2]) if given else None
        shapes = {x: self.t.shape(x), y: self.t.shape(y)}
        dtype = self.t.dtype([x, y])
        if why := resize_unserved(node, _attrs(node), shapes, scales, dtype == "float"):
            raise _NotMapped(why)
        params = {"input_shape": shapes[x], "output_shape": shapes[y], **resize_attributes(_attrs(node))}
        self._emit(OpConfig(RESIZE, params, 1, dtype, source=self.names[i]), [i])

    def _clip(self, i: int, node: Any) -> None:
        """NNFusion's Clip: Maximum(x, min) then Minimum(max, that), each bound a broadcast scalar."""
        self._two_elementwise(i, node, ("Maximum", "max"), "Minimum")

    def _two_elementwise(self, i: int, node: Any, first: tuple[str, str], second: str) -> None:
        """An ONNX node the importer writes as two element-wise nodes of its output's shape: `first` (op type, the
        suffix of its unit's name), then `second`, which has the node's own name."""
        x, y = node.input[0], node.output[0]
        out = self.t.shape(y)
        dtype = self.t.dtype([x, y])
        self.done.add(i)
        self._emit_elementwise(first[0], [out, out], out, dtype, f"{self.names[i]}/{first[1]}")
        self._emit_elementwise(second, [out, out], out, dtype, self.names[i])

    def _leaky_relu(self, i: int, node: Any) -> None:
        """NNFusion's LeakyRelu (op/leaky_relu.hpp): Maximum(x, Multiply(x, alpha)), alpha a broadcast scalar; an
        alpha outside [0, 1] fails the importer's check."""
        alpha = float(_attrs(node).get("alpha", 0.01))
        if not 0 <= alpha <= 1:
            raise _NotMapped(f"LeakyRelu with alpha {alpha:g}: NNFusion's importer checks 0 <= alpha <= 1 and aborts "
                             "(op/leaky_relu.hpp)")
        self._two_elementwise(i, node, ("Multiply", "scaled"), "Maximum")


def batch_matmul_shapes(a: list[int], b: list[int]) -> tuple[list[int], list[int], list[int]]:
    """The shapes NNFusion's BatchMatMul of an ONNX MatMul has (frontend/onnx_import/op/matmul.cpp): each operand
    padded to the output's rank (a 1-D left one as [1, K], a 1-D right one as [K, 1]), both broadcast to one batch
    shape; the output is that batch shape and [M, N] (reshaped back after). _NotMapped where the batch axes do not
    broadcast (the importer aborts)."""
    rank = max(len(a), len(b), 2)
    left = [1, *a] if len(a) == 1 else list(a)
    right = [*b, 1] if len(b) == 1 else list(b)
    left, right = [1] * (rank - len(left)) + left, [1] * (rank - len(right)) + right
    batch = []
    for x, z in zip(left[:-2], right[:-2], strict=True):
        if x != z and 1 not in (x, z):
            raise _NotMapped(f"MatMul {a} x {b}: batch axes {x} and {z} do not broadcast (NNFusion's importer aborts: "
                             "'broadcast dim mismatch')")
        batch.append(max(x, z))
    return [*batch, *left[-2:]], [*batch, *right[-2:]], [*batch, left[-2], right[-1]]


def _broadcasts_to(shape: list[int], target: list[int]) -> bool:
    """Numpy-style: does `shape` broadcast to `target` without changing it?"""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))


class _CompilerGraph:
    """A model of the graph NNFusion's ONNX importer builds (the nodes kernel fusion tells apart, named after the
    ONNX nodes: "<node>/bias" is the Add after a Conv or Gemm, "<clip>/max" the Maximum of a Clip), for
    core/opconfigs/fusion.py. Node order follows the importer's; shapes the extractor's."""

    def __init__(self, ex: _Extractor) -> None:
        self.ex = ex
        self.folded = {ex.names[bn] for bn in ex.folded.values()}
        self.nodes: list[GraphNode] = []
        self.producer: dict[str, str] = {}  # tensor -> graph node
        self.taken: set[str] = set()

    def build(self) -> tuple[list[GraphNode], list[str]]:
        ex = self.ex
        for tensor in (*(vi.name for vi in ex.graph.input), *ex.t.initializers):
            if tensor not in self.producer:
                self._add(GraphNode(f"tensor:{tensor}", SOURCE), [tensor])  # tensors and nodes are named apart
        for i, node in enumerate(ex.nodes):
            self._node(ex.names[i], node)
        outputs = []
        for o in ex.graph.output:
            if o.name in self.producer:
                outputs.append(f"{o.name}/result")
                self._add(GraphNode(outputs[-1], OTHER, inputs=(self.producer[o.name],)), [])
        return self.nodes, outputs

    def _add(self, node: GraphNode, tensors: list[str]) -> str:
        """Add a node (renamed "<name>#<n>" if the name is taken: a model may repeat a node name) and say which
        tensors it produces."""
        if node.name in self.taken:
            node = replace(node, name=f"{node.name}#{len(self.nodes)}")
        self.taken.add(node.name)
        self.nodes.append(node)
        for t in tensors:
            self.producer[t] = node.name
        return node.name

    def _size(self, shape: list[int] | None) -> int:
        return math.prod(shape) if shape is not None else 0

    def _input(self, tensor: str) -> str | None:
        return self.producer.get(tensor)

    def _broadcast_to(self, source: str, shape: list[int] | None, out: list[int] | None, name: str) -> str:
        """NNFusion's numpy-style broadcast of one operand: a Reshape dropping its broadcast dims of 1 (when it
        has any), then a Broadcast to the output's shape."""
        if shape is None or out is None or shape == out:
            return source
        rank = len(out)
        padded = [1] * (rank - len(shape)) + shape
        axes = [a for a in range(rank) if padded[a] == 1 and out[a] != 1]
        kept = [d for a, d in enumerate(padded) if a not in axes]
        if kept != shape:
            source = self._add(GraphNode(f"{name}/reshape", RESHAPE, self._size(kept), (source,)), [])
        if not axes:  # only dims of 1 were missing: the Reshape alone makes the shape
            return source
        return self._add(GraphNode(f"{name}/broadcast", BROADCAST, self._size(out), (source,),
                                   broadcast_fusible(out, axes)), [])

    def _node(self, name: str, node: Any) -> None:
        ex, op = self.ex, node.op_type
        inputs = [self._input(t) for t in node.input if t]
        known = [i for i in inputs if i is not None]
        outs = [o for o in node.output if o]
        out_shape = ex.t.known_shape(outs[0]) if outs else None
        if op == "Constant":
            self._add(GraphNode(name, SOURCE), outs)
        elif op in ("Identity", "Dropout") and known:
            self.producer[outs[0]] = known[0]  # no node of its own in an inference graph
        elif op in ("Conv", "ConvTranspose") and len(known) == len([t for t in node.input if t]) >= 2:
            self._conv(name, node, known, out_shape)
        elif op == "BatchNormalization" and name in self.folded and known:  # its folded bias, as a Conv's
            self._bias(name, known[0], out_shape, outs)
        elif op == "LogSoftmax" and known:  # the importer's Softmax, then a Log
            softmax = self._add(GraphNode(f"{name}/softmax", OTHER, self._size(out_shape), (known[0],)), [])
            self._add(GraphNode(f"{name}/log", ELEMENTWISE, self._size(out_shape), (softmax,)), outs)
        elif op == "Gemm" and len(known) == len([t for t in node.input if t]) >= 2:
            self._gemm(name, node, known, out_shape)
        elif op == "Clip" and known:
            self._clip(name, node, out_shape, outs)
        elif op == "LeakyRelu" and known:  # Maximum(x, Multiply(x, alpha)), alpha a scalar constant broadcast
            alpha = self._broadcast_to(self._add(GraphNode(f"{name}/alpha_value", SOURCE), []), [], out_shape,
                                       f"{name}/alpha")
            scaled = self._add(GraphNode(f"{name}/scaled", ELEMENTWISE, self._size(out_shape), (known[0], alpha)), [])
            self._add(GraphNode(name, ELEMENTWISE, self._size(out_shape), (known[0], scaled)), outs)
        elif op in ONNX_ELEMENTWISE and len(known) == len(node.input):
            operands = tuple(self._broadcast_to(src, ex.t.known_shape(t), out_shape, f"{name}/{k}")
                             for k, (src, t) in enumerate(zip(known, node.input, strict=True)))
            self._add(GraphNode(name, ELEMENTWISE, self._size(out_shape), operands), outs)
        elif op == "MatMul" and len(known) == 2:
            self._matmul(name, node, known, out_shape)
        elif op in ("ReduceMean", "ReduceSum") and known:
            self._reduction(name, node, known[0], out_shape, mean=op == "ReduceMean")
        elif op == "ReduceL2" and known:
            self._reduce_l2(name, node, known[0], out_shape)
        elif op == "Expand" and known and out_shape is not None:  # numpy_broadcast of the input (op/expand.cpp)
            self.producer[outs[0]] = self._broadcast_to(known[0], ex.t.known_shape(node.input[0]), out_shape, name)
        elif op in RESHAPES and known:
            self._add(GraphNode(name, RESHAPE, self._size(out_shape), (known[0],)), outs)
        else:  # one node of no interest to kernel fusion (Softmax among them: the pass keeps it out by name)
            self._add(GraphNode(name, OTHER, self._size(out_shape), tuple(known)), outs)

    def _clip(self, name: str, node: Any, out: list[int] | None, outs: list[str]) -> None:
        """Maximum(x, min) then Minimum(max, that), each bound (an input, else a constant) broadcast first."""
        bounds = []
        for slot, kind in ((1, "min"), (2, "max")):
            given = self._input(node.input[slot]) if len(node.input) > slot and node.input[slot] else None
            bound = given or self._add(GraphNode(f"{name}/{kind}_value", SOURCE), [])
            bounds.append(self._add(GraphNode(f"{name}/{kind}_broadcast", BROADCAST, self._size(out), (bound,), True),
                                    []))
        data = self._input(node.input[0]) or ""
        low = self._add(GraphNode(f"{name}/max", ELEMENTWISE, self._size(out), (data, bounds[0])), [])
        self._add(GraphNode(name, ELEMENTWISE, self._size(out), (bounds[1], low)), outs)

    def _conv(self, name: str, node: Any, known: list[str], out: list[int] | None) -> None:
        attrs = _attrs(node)
        data, weight = known[0], known[1]
        groups = int(attrs.get("group", 1))
        pads = list(attrs.get("pads", []))
        if groups == 1 and pads[:len(pads) // 2] != pads[len(pads) // 2:]:
            value = self._add(GraphNode(f"{name}/pad_value", SOURCE), [])
            data = self._add(GraphNode(f"{name}/pad", OTHER, inputs=(data, value)), [])
        elif groups != 1:  # depthwise: its filter transposed first
            weight = self._add(GraphNode(f"{name}/filter", OTHER, inputs=(weight,)), [])
        conv = self._add(GraphNode(name, OTHER, self._size(out), (data, weight)), [])
        if len(known) > 2 and len(node.input) > 2 and node.input[2]:
            conv = self._bias(f"{name}/bias", conv, out, [], known[2])
        self.producer[node.output[0]] = conv

    def _bias(self, name: str, conv: str, out: list[int] | None, outs: list[str], value: str | None = None) -> str:
        """A conv's bias: Add(conv, Broadcast(bias)) over the channel axis (the importer's for a bias input, the
        folding pass's for a BN it folds, whose bias is a constant of its own)."""
        rank = len(out) if out is not None else 0
        value = value or self._add(GraphNode(f"{name}/bias_value", SOURCE), [])
        bias = self._add(GraphNode(f"{name}/bias_broadcast", BROADCAST, self._size(out), (value,),
                                   out is not None and broadcast_fusible(out, [0, *range(2, rank)])), [])
        return self._add(GraphNode(name, ELEMENTWISE, self._size(out), (conv, bias)), outs)

    def _matmul(self, name: str, node: Any, known: list[str], out: list[int] | None) -> None:
        """A Dot when the right side is a matrix and the left has rank 2 or more; else NNFusion's BatchMatMul
        between Reshapes and Broadcasts of both sides, and a Reshape back."""
        shapes = [self.ex.t.known_shape(t) for t in node.input[:2]]
        if shapes[0] is None or shapes[1] is None or (len(shapes[0]) >= 2 and len(shapes[1]) == 2):
            self._add(GraphNode(name, OTHER, self._size(out), tuple(known)), [node.output[0]])
            return
        sides = []
        for k, (src, shape) in enumerate(zip(known, shapes, strict=True)):
            sides.append(self._add(GraphNode(f"{name}/reshape{k}", RESHAPE, self._size(shape), (src,)), []))
        for k, side in enumerate(list(sides)):
            sides[k] = self._add(GraphNode(f"{name}/broadcast{k}", BROADCAST, 0, (side,)), [])
        batched = self._add(GraphNode(f"{name}/batch_matmul", OTHER, self._size(out), tuple(sides)), [])
        self._add(GraphNode(name, RESHAPE, self._size(out), (batched,)), [node.output[0]])

    def _reduction(self, name: str, node: Any, data: str, out: list[int] | None, *, mean: bool) -> None:
        """Sum; for a ReduceMean then a Divide by the count (a broadcast scalar); a Reshape when the reduced axes are
        kept."""
        reduced = sum_shape(self.ex.t.known_shape(node.input[0]), _attrs(node))
        last = self._add(GraphNode(f"{name}/sum", OTHER, self._size(reduced), (data,)), [])
        if mean:
            count = self._add(GraphNode(f"{name}/count", SOURCE), [])
            count = self._add(GraphNode(f"{name}/count/broadcast", BROADCAST, self._size(reduced), (count,), True),
                              [])
            last = self._add(GraphNode(f"{name}/mean", ELEMENTWISE, self._size(reduced), (last, count)), [])
        if _attrs(node).get("keepdims", 1):
            self._add(GraphNode(name, RESHAPE, self._size(out), (last,)), [node.output[0]])
        else:
            self.producer[node.output[0]] = last

    def _reduce_l2(self, name: str, node: Any, data: str, out: list[int] | None) -> None:
        """Square, Sum, Sqrt and, keeping the reduced axes, a Reshape (op/reducel2.hpp). Of keepdims 0 the Sum reads
        the input, and the Square is left unread."""
        shape = self.ex.t.known_shape(node.input[0])
        reduced = sum_shape(shape, _attrs(node))
        square = self._add(GraphNode(f"{name}/square", ELEMENTWISE, self._size(shape), (data,)), [])
        keep = _attrs(node).get("keepdims", 1)
        total = self._add(GraphNode(f"{name}/sum", OTHER, self._size(reduced), (square if keep else data,)), [])
        root = self._add(GraphNode(f"{name}/sqrt", ELEMENTWISE, self._size(reduced), (total,)), [])
        if keep:
            self._add(GraphNode(name, RESHAPE, self._size(out), (root,)), [node.output[0]])
        else:
            self.producer[node.output[0]] = root

    def _gemm(self, name: str, node: Any, known: list[str], out: list[int] | None) -> None:
        attrs = _attrs(node)
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        result = self._add(GraphNode(name, OTHER, self._size(out), tuple(known[:2])), [])
        if alpha != 1:
            value = self._add(GraphNode(f"{name}/alpha_value", SOURCE), [])
            result = self._add(GraphNode(f"{name}/alpha", ELEMENTWISE, self._size(out), (result, value)), [])
        if beta != 0 and len(known) > 2:
            c_shape = self.ex.t.known_shape(node.input[2])
            bias = known[2]
            if beta != 1:
                value = self._add(GraphNode(f"{name}/beta_value", SOURCE), [])
                bias = self._add(GraphNode(f"{name}/beta", ELEMENTWISE, self._size(c_shape), (bias, value)), [])
            bias = self._broadcast_to(bias, c_shape, out, f"{name}/c")
            result = self._add(GraphNode(f"{name}/bias", ELEMENTWISE, self._size(out), (result, bias)), [])
        self.producer[node.output[0]] = result

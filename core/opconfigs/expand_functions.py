"""ONNX ops NNFusion's importer has no translator for, written out as ONNX's own definition of them, so that the
compiler imports the model (`kdb model expand`).

Many ONNX ops are functions: their schema carries a body of simpler ops (HardSwish is HardSigmoid then Mul; HardSigmoid
is Mul, Add, Min and Max of constants; Mish is Softplus, Tanh and Mul). Softplus is written in a form that does not
overflow (ONNX's log(exp(x) + 1) is inf for a large x). NNFusion's importer aborts on such an op when it
has no translator of its own ('No infershape or Antares IR found for op type: HardSwish': a MobileNetV3). Each one is
replaced by the body of its schema at the model's opset, its attributes (alpha, beta) put in, and again for an op of
the body that is itself such a function; the body's constants, which it casts to the input's type (CastLike), become
initializers of that type. A node whose definition needs an op NNFusion cannot import either is left as it is, with
the reason. A Dropout the importer aborts on (its ratio an input, as opset 12 on exports it) that is not training is
written as the Identity ONNX defines it to be then. The numbers are ONNX's own definition's, and the file is written
whole or not at all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.opconfigs.import_rewrites import (
    drop_orphans,
    element_types,
    fresh_name,
    input_dim_names,
    nearest_as_repeats,
    outputs_as_inferred,
    pin_dims,
    reads,
    rewrite_for_import,
)
from core.opconfigs.import_rules import constant_values
from core.opconfigs.nnfusion_import import (
    ANY_OPSET,
    function_body,
    function_ops,
    function_schema,
    import_faults,
    importable,
    static_shapes,
    with_shapes,
)
from core.opconfigs.onnx_extract import extraction_miscompiles, read_model, write_model

FLOAT = 1  # ONNX TensorProto.FLOAT: a constant's type where its input's is not known


@dataclass(frozen=True)
class Expansion:
    source: Path
    output: Path
    expanded: dict[str, int]  # op type -> nodes written out
    nodes_added: int
    left: tuple[tuple[str, str, str], ...] = ()  # (node, op type, why) of nodes left as they are
    rewritten: dict[str, int] = field(default_factory=dict)  # import_rewrites' kind -> nodes
    pinned: int = 0  # dimensions given their size (--dim)
    blocked: tuple[tuple[str, str, str], ...] = ()  # (node, op type, why) the written model still cannot compile
    miscompiled: tuple[tuple[str, str, str], ...] = ()  # (node, kind, why) it compiles into another network

    def report_lines(self) -> list[str]:
        done = ", ".join(f"{count} {op}" for op, count in sorted(self.expanded.items()))
        lines = [f"written: {self.output} ({done}; {self.nodes_added} nodes in their place, ONNX's own definitions)"
                 if done else f"written: {self.output} (no function to expand; rewritten as below)"]
        if not (self.expanded or self.rewritten or self.pinned):
            lines[0] = f"written unchanged: {self.output} (nothing to expand or rewrite)"
        if self.pinned:
            lines.append(f"pinned: {self.pinned} dimension(s) of the graph's inputs and outputs")
        lines += [f"rewritten for NNFusion's importer: {count} x {kind}"
                  for kind, count in sorted(self.rewritten.items())]
        lines += [f"left as it is: node {node} ({op}): {why}" for node, op, why in self.left]
        lines += [f"still cannot compile: node {node} ({op}): {why}" for node, op, why in self.blocked]
        lines += [f"still compiles into another network: node {node}: {kind}: {why}"
                  for node, kind, why in self.miscompiled]
        return lines

    def as_dict(self) -> dict[str, object]:
        return {"source": str(self.source), "output": str(self.output), "expanded": self.expanded,
                "nodes_added": self.nodes_added, "rewritten": self.rewritten, "pinned": self.pinned,
                "left": [{"node": n, "op_type": op, "reason": why} for n, op, why in self.left],
                "blocked": [{"node": n, "op_type": op, "reason": why} for n, op, why in self.blocked],
                "miscompiled": [{"node": n, "kind": kind, "reason": why} for n, kind, why in self.miscompiled]}


class _Unexpandable(Exception):
    pass


def expand_functions(source: Path, output: Path, dims: dict[str, int] | None = None) -> Expansion:
    """Write `source` with every node NNFusion cannot import and ONNX defines as a function written out as that
    function's body, after import_rewrites' rewrites (`dims`: sizes for named dynamic dimensions); InputError naming
    the file when it cannot be read or written, or a dimension given is not the model's."""
    import onnx

    if output.resolve() == source.resolve():
        raise InputError("the expanded model would overwrite the model it is made from: give another OUT path",
                         where=str(output))
    model = read_model(source)
    unknown = sorted(set(dims or {}) - set(input_dim_names(model.graph)))
    if unknown:
        raise InputError(f"no input has a dimension named {', '.join(unknown)} (--dim gives the inputs' named "
                         "dimensions their sizes; an output's follow from them)", where=str(source))
    pinned = pin_dims(model, dims or {})
    read_before = reads(model.graph)  # (an initializer only a folded shape computation read goes too)
    rewritten = rewrite_for_import(model)
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), ANY_OPSET)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shape inference fails on malformed models; the types it would give are then unknown
        inferred = model
    writer = _Writer(opset, element_types(inferred.graph), {n.name for n in model.graph.node} | _tensor_names(model))
    nodes, expanded, left = [], Counter(), []
    used = reads(model.graph)
    for node in model.graph.node:
        if _inference_dropout(node, model.graph, used):  # ONNX's Dropout outside training is its input
            nodes.append(_identity(node))
            expanded[node.op_type] += 1
            continue
        if node.domain not in ("", "ai.onnx") or importable(node.op_type) or function_ops(node.op_type, opset) is None:
            nodes.append(node)
            continue
        mark = len(writer.initializers)
        try:
            nodes += writer.expand(node)
            expanded[node.op_type] += 1
        except _Unexpandable as exc:
            del writer.initializers[mark:]
            nodes.append(node)
            left.append((node.name or node.op_type, node.op_type, str(exc)))
    added = len(nodes) - len(model.graph.node) + sum(expanded.values())  # (a Dropout's Identity counts as one)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(writer.initializers)
    drop_orphans(model.graph, read_before | used)
    shaped = with_shapes(model)
    own, clashes = extraction_miscompiles(shaped)
    if clashes and (repeats := nearest_as_repeats(model, {w.node for w in clashes}, static_shapes(shaped.graph))):
        rewritten["nearest upsampling sharing a Resize identifier written as a repeat"] = repeats
        shaped = with_shapes(model)
        own, clashes = extraction_miscompiles(shaped)
    if outputs_as_inferred(model, static_shapes(shaped.graph)):
        rewritten["outputs' dimensions no input names written as inferred"] = 1
    write_model(model, output)
    blockers, warnings = import_faults(shaped)
    blocked = tuple((b.node, b.op_type, b.reason) for b in blockers)
    miscompiled = tuple((w.node, w.kind, w.text) for w in (*warnings, *own, *clashes))
    return Expansion(source, output, dict(expanded), added, tuple(left), dict(rewritten), pinned, blocked, miscompiled)


def _inference_dropout(node: Any, graph: Any, used: set[str]) -> bool:
    """A Dropout the importer aborts on (any ratio but an attribute of 0) that is not training (no training_mode input,
    or a constant false one) and whose mask nothing reads: the identity, by ONNX's definition."""
    mask_read = len(node.output) > 1 and node.output[1] in used
    if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx") or mask_read:
        return False
    attrs = {a.name: a for a in node.attribute}
    if "ratio" in attrs and attrs["ratio"].f == 0:
        return False  # the importer takes it as it is
    training = node.input[2] if len(node.input) > 2 else ""
    return not training or constant_values(graph, training) in ([0.0], [])


def _identity(node: Any) -> Any:
    from onnx import helper

    return helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name or None)


def _tensor_names(model: Any) -> set[str]:
    graph = model.graph
    return ({t.name for t in graph.initializer} | {v.name for v in (*graph.input, *graph.output)}
            | {name for n in graph.node for name in (*n.input, *n.output)})


@dataclass
class _Writer:
    opset: int
    types: dict[str, int]  # tensor -> ONNX element type (the model's, as shape inference gives them)
    taken: set[str]  # node and tensor names in use
    initializers: list[Any] = field(default_factory=list)

    def expand(self, node: Any, depth: int = 0) -> list[Any]:
        """The nodes of `node`'s definition, with fresh names for its inner tensors."""
        from onnx import helper

        if depth > 8:
            raise _Unexpandable("its definition nests functions too deep")
        if node.op_type == "Softplus":
            return self._softplus(node)
        schema = function_schema(node.op_type, self.opset)
        assert schema is not None  # (callers expand only what function_ops found a body for)
        body = function_body(schema, self.opset)
        given = {a.name: a for a in node.attribute}
        defaults = {name: a.default_value for name, a in schema.attributes.items() if a.default_value.name}
        prefix = node.name or node.output[0]
        names = dict(zip(body.input, node.input, strict=False)) | dict(zip(body.output, node.output, strict=False))
        input_type = next((self.types[t] for t in node.input if t in self.types), FLOAT)
        constants: dict[str, Any] = {}
        out: list[Any] = []
        for k, inner in enumerate(body.node):
            for tensor in inner.output:
                names.setdefault(tensor, self._fresh(f"{prefix}/{tensor}"))
            attrs = [self._attribute(a, given, defaults) for a in inner.attribute]
            if inner.op_type == "Constant":
                constants[inner.output[0]] = _constant_value(attrs)
                continue
            if inner.op_type == "CastLike" and inner.input[0] in constants:
                target = self.types.get(names.get(inner.input[1], ""), input_type)
                self._initializer(names[inner.output[0]], constants[inner.input[0]], target)
                continue
            for tensor in inner.input:
                if tensor in constants and tensor not in names:  # a constant used as it is, of its own type
                    names[tensor] = self._fresh(f"{prefix}/{tensor}")
                    self._initializer(names[tensor], constants[tensor], None)
            made = helper.make_node(inner.op_type, [names.get(t, t) if t else "" for t in inner.input],
                                    [names[t] for t in inner.output], name=self._fresh(f"{prefix}/{inner.op_type}_{k}"),
                                    domain=inner.domain)
            made.attribute.extend(attrs)
            for tensor in made.output:
                self.types.setdefault(tensor, input_type)
            if inner.domain not in ("", "ai.onnx"):
                raise _Unexpandable(f"its definition uses {inner.op_type} of the {inner.domain!r} domain")
            if importable(inner.op_type):
                out.append(made)
            elif function_ops(inner.op_type, self.opset) is not None:
                out += self.expand(made, depth + 1)
            else:
                raise _Unexpandable(f"its definition uses {inner.op_type}, which NNFusion's importer does not "
                                    "import either")
        return out

    def _softplus(self, node: Any) -> list[Any]:
        """Softplus (Mish's too) as max(x, 0) + log(1 + exp(-|x|)): ONNX's body, log(exp(x) + 1), is inf where exp
        overflows (x > 88 in float; in half, where NNFusion stores exp in a half, x > 11), while softplus(x) is x."""
        import numpy as np
        from onnx import helper

        x, prefix = node.input[0], node.name or node.output[0]
        dtype = self.types.get(x, FLOAT)
        t = {k: self._fresh(f"{prefix}/{k}") for k in ("relu", "abs", "neg", "exp", "one", "sum", "log")}
        self._initializer(t["one"], np.array(1.0), dtype)
        steps = [("Relu", [x], "relu"), ("Abs", [x], "abs"), ("Neg", [t["abs"]], "neg"), ("Exp", [t["neg"]], "exp"),
                 ("Add", [t["exp"], t["one"]], "sum"), ("Log", [t["sum"]], "log")]
        made = [helper.make_node(op, ins, [t[out]], name=self._fresh(f"{prefix}/{op}")) for op, ins, out in steps]
        made.append(helper.make_node("Add", [t["relu"], t["log"]], list(node.output),
                                     name=self._fresh(f"{prefix}/Add")))
        for tensor in (*t.values(), *node.output):
            self.types.setdefault(tensor, dtype)
        return made

    def _attribute(self, attribute: Any, given: dict[str, Any], defaults: dict[str, Any]) -> Any:
        """A body node's attribute, with a reference to the function's own attribute (`@alpha`) filled in."""
        from onnx import AttributeProto

        if not attribute.ref_attr_name:
            return attribute
        source = given.get(attribute.ref_attr_name) or defaults.get(attribute.ref_attr_name)
        if source is None:
            raise _Unexpandable(f"its definition reads attribute {attribute.ref_attr_name}, which it lacks")
        resolved = AttributeProto()
        resolved.CopyFrom(source)
        resolved.name = attribute.name
        return resolved

    def _initializer(self, name: str, value: Any, elem_type: int | None) -> None:
        import numpy as np
        from onnx import helper, numpy_helper

        if elem_type is not None:
            value = value.astype(helper.tensor_dtype_to_np_dtype(elem_type))
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        self.types[name] = elem_type or helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype)

    def _fresh(self, name: str) -> str:
        return fresh_name(self.taken, name)


def _constant_value(attributes: list[Any]) -> Any:
    """A Constant node's value, as a numpy array."""
    import numpy as np
    from onnx import helper, numpy_helper

    (attribute,) = attributes
    value = helper.get_attribute_value(attribute)
    if attribute.name == "value":
        return numpy_helper.to_array(value)
    dtype = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}.get(attribute.name)
    if dtype is None:
        raise _Unexpandable(f"its definition has a Constant of {attribute.name}")
    return np.asarray(value, dtype=dtype)

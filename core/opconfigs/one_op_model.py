"""An op config -> an ONNX model of that op alone, which NNFusion compiles into a network that looks up exactly the
op's identifier (`kdb nnfusion MODEL --op-times`: each op timed on its own, with its DB row and with the library).

The model is what NNFusion's ONNX importer turns back into the op (core/opconfigs/onnx_extract.py maps the other
way): a Conv for a Convolution, Conv -> Relu for Fused_Convolution_Relu, and for Fused_Convolution_Add_Relu the
form the network had, Conv with its bias -> Relu or Conv -> Add(residual) -> Relu (the library runs them
differently: a broadcast bias or a full residual); MatMul for an untransposed Dot of any rank, Gemm with beta 0 (a
Dot alone: NNFusion adds no C) for a transposed 2-D one; MaxPool / AveragePool with every attribute written (the
importer aborts on a missing one); an element-wise op of the ONNX op NNFusion imports as it, every input a graph
input of the output's shape. Data inputs are graph inputs, filters and weights seeded initializers, as in a network.
What cannot be rebuilt so raises InputError with the reason (the op stays untimed).
"""

from __future__ import annotations

import math
from typing import Any

from core.errors import InputError
from core.kernels.ops import concat_axis, sum_axes
from core.opconfigs.onnx_extract import ONNX_ELEMENTWISE
from core.opconfigs.opconfig import OpConfig

# NNFusion's element-wise op -> the ONNX op its importer makes it of (the extraction's map, turned round).
ELEMENTWISE_ONNX = {nnfusion: onnx for onnx, nnfusion in ONNX_ELEMENTWISE.items()}
_TENSOR_TYPES = {"float": "FLOAT", "half": "FLOAT16", "double": "DOUBLE"}
_NUMPY_TYPES = {"float": "float32", "half": "float16", "double": "float64"}
DATA = "x"  # the op's data input; a second one (a residual, an element-wise op's others) is x1, x2, ...


def one_op_model(config: OpConfig, *, bias: bool = False, opset: int = 17, ir_version: int = 10,
                 seed: int = 0) -> Any:
    """The ModelProto of `config` alone (`bias`: a Fused_Convolution_Add_Relu whose Add is the conv's bias, as
    NNFusion makes of Conv(bias) -> Relu); InputError naming the op and why it cannot be one."""
    from onnx import TensorProto, helper

    if config.groups != 1:
        raise InputError(f"a convolution of {config.groups} groups: never served by a DB row", where=config.source)
    if config.dtype not in _TENSOR_TYPES:
        raise InputError(f"element type {config.dtype}: no ONNX tensor of it here", where=config.source)
    builder = _Builder(config, getattr(TensorProto, _TENSOR_TYPES[config.dtype]), seed)
    output = builder.build(bias)
    graph = helper.make_graph(builder.nodes, f"one_{config.op_type}", builder.inputs,
                              [helper.make_tensor_value_info(output, builder.elem, None)],
                              initializer=builder.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    _check_output_shape(model, config)
    return model


def _check_output_shape(model: Any, config: OpConfig) -> None:
    """ONNX's shape inference must give the op's output shape (a config whose padding no ONNX op has does not)."""
    from onnx import shape_inference

    p = config.params
    expected = list(p.get("output_shape") or p.get("out_shape") or [])
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type.shape
    except Exception as exc:  # onnx's InferenceError and kin: the model is not a valid op
        raise InputError(f"rebuilt as one ONNX node, it is not valid: {exc}", where=config.source) from None
    got = [d.dim_value for d in inferred.dim]
    if got != expected:
        raise InputError(f"rebuilt as one ONNX node it gives the shape {got}, where the op's output is {expected}",
                         where=config.source)


class _Builder:
    def __init__(self, config: OpConfig, elem: int, seed: int) -> None:
        import numpy as np

        self.config, self.params, self.elem = config, config.params, elem
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inputs: list[Any] = []
        self.initializers: list[Any] = []

    def build(self, bias: bool) -> str:
        op = self.config.op_type
        if op in ("Convolution", "Fused_Convolution_Relu", "Fused_Convolution_Add_Relu"):
            return self._conv(op, bias)
        if op == "DepthwiseConv2dNative":
            return self._depthwise()
        if op == "Dot":
            return self._dot()
        if op == "BatchMatMul":
            return self._batch_matmul()
        if op in ("MaxPool", "AvgPool"):
            return self._pool(op)
        if op == "Softmax":  # over the last axis, the only one NNFusion's Softmax takes
            return self._node("Softmax", [self._input(self.params["input_shape"])], axis=-1)
        if op == "Sum":  # a ReduceMean (axes still an attribute at opset 17): its Divide runs with and without the row
            (axes,) = sum_axes(self.params["input_shape"], self.params["output_shape"])
            return self._node("ReduceMean", [self._input(self.params["input_shape"])], axes=list(axes), keepdims=0)
        if op == "Resize":
            return self._resize()
        if op == "Concat":
            shapes = self.params["input_shapes"]
            axis = concat_axis(shapes, self.params["output_shape"])
            return self._node("Concat", [self._input(s) for s in shapes], axis=axis)
        if op in ELEMENTWISE_ONNX:
            shapes = self.params["input_shapes"]
            return self._node(ELEMENTWISE_ONNX[op], [self._input(s) for s in shapes])
        raise InputError(f"{op}: no ONNX op that NNFusion's importer makes into it", where=self.config.source)

    def _input(self, shape: list[int]) -> str:
        from onnx import helper

        name = DATA if not self.inputs else f"{DATA}{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, self.elem, list(shape)))
        return name

    def _weight(self, name: str, shape: list[int], fan_in: int) -> str:
        """Normal values of He's scale (activations neither vanish nor blow up, in half too)."""
        from onnx import numpy_helper

        values = self.rng.standard_normal(shape) * math.sqrt(2.0 / max(fan_in, 1))
        self.initializers.append(numpy_helper.from_array(values.astype(_NUMPY_TYPES[self.config.dtype]), name))
        return name

    def _resize(self) -> str:
        """A Resize of the op config's sampling, its roi empty and its scales (output / input) constants."""
        import numpy as np
        from onnx import numpy_helper

        p = self.params
        scales = [o / i for o, i in zip(p["output_shape"], p["input_shape"], strict=True)]
        self.initializers += [numpy_helper.from_array(np.array([], np.float32), "roi"),
                              numpy_helper.from_array(np.array(scales, np.float32), "scales")]
        return self._node("Resize", [self._input(p["input_shape"]), "roi", "scales"], mode=p["mode"],
                          coordinate_transformation_mode=p["coordinate_transformation_mode"],
                          nearest_mode=p["nearest_mode"])

    def _node(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper

        output = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def _conv(self, op: str, bias: bool) -> str:
        p = self.params
        filt, spatial = p["filter_shape"], len(p["input_shape"]) - 2
        inputs = [self._input(p["input_shape"]), self._weight("w", filt, math.prod(filt[1:]))]
        with_bias = bias and op == "Fused_Convolution_Add_Relu"
        if with_bias:
            inputs.append(self._weight("b", [filt[0]], 0))
        pads = list(p.get("padding_below_diff", [0] * spatial))
        y = self._node("Conv", inputs, kernel_shape=filt[2:], strides=p["window_movement_strides"],
                       dilations=p["window_dilation_strides"], pads=pads + pads, group=1)
        if op == "Convolution":
            return y
        if op == "Fused_Convolution_Add_Relu" and not with_bias:  # the conv first: NNFusion takes input 2 as residual
            y = self._node("Add", [y, self._input(p["output_shape"])])
        return self._node("Relu", [y])

    def _depthwise(self) -> str:
        """A Conv of group = channels, its filter [C, 1, kh, kw] as ONNX has it (the importer transposes it to the
        identifier's [kh, kw, C, 1])."""
        p = self.params
        kh, kw, channels, _ = p["filter_shape"]
        weight = self._weight("w", [channels, 1, kh, kw], kh * kw)
        pads = list(p["padding_below_diff"])
        return self._node("Conv", [self._input(p["input_shape"]), weight], kernel_shape=[kh, kw],
                          strides=p["window_movement_strides"], dilations=p["window_dilation_strides"],
                          pads=pads + pads, group=channels)

    def _dot(self) -> str:
        p = self.params
        a, b = p["arg0_shape"], p["arg1_shape"]
        trans_a, trans_b = bool(p.get("transpose_A")), bool(p.get("transpose_B"))
        if len(b) != 2:
            raise InputError(f"Dot {a} x {b}: the right operand must be 2-D", where=self.config.source)
        weight = self._weight("w", b, b[1] if trans_b else b[0])
        if not trans_a and not trans_b:
            return self._node("MatMul", [self._input(a), weight])
        # ONNX's Gemm is 2-D (validation refuses a transposed Dot of a higher rank; shape inference would too)
        return self._node("Gemm", [self._input(a), weight], transA=int(trans_a), transB=int(trans_b), beta=0.0)

    def _batch_matmul(self) -> str:
        """A MatMul of two activations already of one batch shape (attention's): the importer's BatchMatMul of the
        same shapes. One of rank 2 came from a 1-D operand, which a one-op model cannot give back its shape."""
        a, b = self.params["arg0_shape"], self.params["arg1_shape"]
        if len(a) < 3:
            raise InputError(f"BatchMatMul {a} x {b} comes from a MatMul of a 1-D operand: not rebuilt alone",
                             where=self.config.source)
        return self._node("MatMul", [self._input(a), self._input(b)])

    def _pool(self, op: str) -> str:
        p = self.params
        below, above = list(p["padding_below"]), list(p["padding_above"])
        if op == "AvgPool" and any(below + above):  # NNFusion's importer drops an AveragePool's pads
            raise InputError(f"AvgPool padded {below}/{above}: NNFusion's ONNX importer makes no padded AvgPool",
                             where=self.config.source)
        return self._node("MaxPool" if op == "MaxPool" else "AveragePool", [self._input(p["input_shape"])],
                          kernel_shape=p["window_shape"], strides=p["window_stride"], pads=below + above)

"""Small ONNX models built with onnx.helper for the extraction and coverage tests (no downloads).

BatchNorm is folded away as an exporter does for inference: convolutions carry no BN, and the
ResNet ones no bias either. Weights are random (seeded) float32 initializers.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper, save

OPSET = 17
# The IR version exporters write (torch.onnx: 8-10): onnx >= 1.20 writes 13+ by default, past what older ONNX Runtimes
# (1.30: 13 at most) and NNFusion read.
IR_VERSION = 10


class GraphBuilder:
    """Nodes and weights of one graph; every helper returns the name of the tensor it produced."""

    def __init__(self, inputs: dict[str, list[Any]], seed: int = 0) -> None:
        self.inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.rng = np.random.default_rng(seed)
        self.used: Counter[str] = Counter()

    def unique(self, prefix: str) -> str:
        self.used[prefix] += 1
        return prefix if self.used[prefix] == 1 else f"{prefix}_{self.used[prefix]}"

    def weight(self, prefix: str, shape: list[int], fan_in: int | None = None, mean: float = 0.0) -> str:
        """Normal values: of He's scale sqrt(2 / fan_in) for a layer's weights (so that activations neither vanish
        nor blow up through a deep network: `kdb nnfusion --run` compares outputs that depend on the input), else
        of std 0.01 (biases), around `mean` (1 for a norm's scale)."""
        name = self.unique(prefix)
        std = math.sqrt(2.0 / fan_in) if fan_in else 0.01
        data = (mean + self.rng.standard_normal(shape) * std).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(data, name))
        return name

    def constant(self, prefix: str, values: list[Any], dtype: Any = np.int64) -> str:
        """An initializer of these values (axes, pads, split sizes: what newer opsets take as inputs)."""
        name = self.unique(prefix)
        self.initializers.append(numpy_helper.from_array(np.array(values, dtype=dtype), name))
        return name

    def node(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: Any) -> str:
        name = self.unique(name or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [f"{name}_out"], name=name, **attrs))
        return f"{name}_out"

    def conv(self, x: str, cin: int, cout: int, k: int, *, stride: int = 1, pad: int | None = None, group: int = 1,
             bias: bool = False, name: str = "conv") -> str:
        pad = k // 2 if pad is None else pad
        inputs = [x, self.weight(f"{name}_w", [cout, cin // group, k, k], fan_in=cin // group * k * k)]
        if bias:
            inputs.append(self.weight(f"{name}_b", [cout]))
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                         group=group)

    def model(self, output: str, name: str = "model", opset: int = OPSET) -> ModelProto:
        # The output's shape is left to shape inference, as for most exported models.
        graph = helper.make_graph(self.nodes, name, self.inputs,
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                                  initializer=self.initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def basic_block(g: GraphBuilder, x: str, cin: int, cout: int, stride: int = 1, prefix: str = "") -> str:
    """ResNet's BasicBlock: conv-relu, conv, + shortcut (a strided 1x1 conv when the shape changes), relu."""
    y = g.node("Relu", [g.conv(x, cin, cout, 3, stride=stride, name=f"{prefix}conv1")], f"{prefix}relu1")
    y = g.conv(y, cout, cout, 3, name=f"{prefix}conv2")
    shortcut = x if stride == 1 and cin == cout else g.conv(x, cin, cout, 1, stride=stride, name=f"{prefix}down")
    return g.node("Relu", [g.node("Add", [y, shortcut], f"{prefix}add")], f"{prefix}relu2")


def resnet_block(channels: int = 64, size: int = 56) -> ModelProto:
    """One basic block: conv1, relu1, conv2, add (the residual), relu2."""
    g = GraphBuilder({"x": [1, channels, size, size]})
    return g.model(basic_block(g, "x", channels, channels), "resnet_block")


def mlp(batch: int = 8, sizes: tuple[int, ...] = (784, 256, 128, 10)) -> ModelProto:
    """Gemm+Relu twice (PyTorch's Linear: transB=1 with a bias), then a bias-free MatMul."""
    g = GraphBuilder({"x": [batch, sizes[0]]})
    y = "x"
    for i, (n_in, n_out) in enumerate(pairwise(sizes[:-1]), start=1):
        y = g.node("Gemm", [y, g.weight(f"fc{i}_w", [n_out, n_in]), g.weight(f"fc{i}_b", [n_out])], f"gemm{i}",
                   transB=1)
        y = g.node("Relu", [y], f"relu{i}")
    y = g.node("MatMul", [y, g.weight("head_w", [sizes[-2], sizes[-1]])], "matmul")
    return g.model(y, "mlp")


def depthwise_block(channels: int = 32, out: int = 64, size: int = 56) -> ModelProto:
    """MobileNet's separable conv: depthwise 3x3 (group = channels), relu, pointwise 1x1, relu."""
    g = GraphBuilder({"x": [1, channels, size, size]})
    y = g.node("Relu", [g.conv("x", channels, channels, 3, group=channels, name="dw")], "relu1")
    y = g.node("Relu", [g.conv(y, channels, out, 1, name="pw")], "relu2")
    return g.model(y, "depthwise_block")


def bottleneck_block(g: GraphBuilder, x: str, cin: int, width: int, stride: int = 1, prefix: str = "") -> str:
    """ResNet-50's Bottleneck as torchvision builds it (v1.5: the stride on the 3x3): 1x1 conv-relu, 3x3
    conv-relu, 1x1 conv to 4 x width, + shortcut (a strided 1x1 conv when the shape changes), relu."""
    cout = 4 * width
    y = g.node("Relu", [g.conv(x, cin, width, 1, name=f"{prefix}conv1")], f"{prefix}relu1")
    y = g.node("Relu", [g.conv(y, width, width, 3, stride=stride, name=f"{prefix}conv2")], f"{prefix}relu2")
    y = g.conv(y, width, cout, 1, name=f"{prefix}conv3")
    shortcut = x if stride == 1 and cin == cout else g.conv(x, cin, cout, 1, stride=stride, name=f"{prefix}down")
    return g.node("Relu", [g.node("Add", [y, shortcut], f"{prefix}add")], f"{prefix}relu3")


def resnet(widths: tuple[int, ...] = (64, 128, 256, 512), blocks: tuple[int, ...] = (3, 4, 10, 3), size: int = 224,
           classes: int = 1000, bottleneck: bool = False) -> ModelProto:
    """A ResNet of basic blocks (the default has 109 nodes), or of bottlenecks (blocks (3, 4, 6, 3): ResNet-50):
    stem, stages, global pool, classifier."""
    g = GraphBuilder({"x": [1, 3, size, size]})
    y = g.node("Relu", [g.conv("x", 3, widths[0], 7, stride=2, name="stem")], "stem_relu")
    y = g.node("MaxPool", [y], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = widths[0]
    for stage, (width, count) in enumerate(zip(widths, blocks, strict=True), start=1):
        for block in range(count):
            stride = 2 if block == 0 and stage > 1 else 1
            if bottleneck:
                y = bottleneck_block(g, y, cin, width, stride, prefix=f"s{stage}b{block}_")
                cin = 4 * width
            else:
                y = basic_block(g, y, cin, width, stride, prefix=f"s{stage}b{block}_")
                cin = width
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y], "pool")], "flatten", axis=1)  # NNFusion needs axis
    y = g.node("Gemm", [y, g.weight("fc_w", [classes, cin]), g.weight("fc_b", [classes])], "fc", transB=1)
    return g.model(y, "resnet")


def write(model: ModelProto, path: Path) -> Path:
    save(model, str(path))
    return path


def small_cnn() -> ModelProto:
    """Conv+Relu twice with one shape (one op config, count 2), a MaxPool, and a Sigmoid and a Relu NNFusion fuses
    into one kernel of its own (a lone element-wise op it would look up): a network small enough to tune on the CPU
    in a test."""
    g = GraphBuilder({"x": [1, 8, 8, 8]})
    y = g.node("Relu", [g.conv("x", 8, 8, 3, name="a")], "relu_a")
    y = g.node("Relu", [g.conv(y, 8, 8, 3, name="b")], "relu_b")
    y = g.node("Sigmoid", [g.node("MaxPool", [y], "pool", kernel_shape=[2, 2], strides=[2, 2])], "sigmoid")
    y = g.node("Relu", [y], "relu_out")
    return g.model(y, "small")


def attention_block(tokens: int = 64, width: int = 64) -> ModelProto:
    """A BERT encoder's attention and its layer norm, small: Q, K, V projections (MatMul by [width, width] weights:
    Dots), scores Q x K^T (a batched MatMul), Softmax, context, + residual, LayerNormalization. NNFusion writes
    its softmax and layer-norm helpers at file scope (`const int GPU_WARP_SIZE = 32;` and templates using it)."""
    g = GraphBuilder({"x": [1, tokens, width]})
    q, k, v = (g.node("MatMul", ["x", g.weight(f"w{n}", [width, width])], n) for n in ("q", "k", "v"))
    scores = g.node("MatMul", [q, g.node("Transpose", [k], "kt", perm=[0, 2, 1])], "scores")
    context = g.node("MatMul", [g.node("Softmax", [scores], "softmax", axis=-1), v], "context")
    y = g.node("Add", [context, "x"], "residual")
    y = g.node("LayerNormalization", [y, g.weight("ln_g", [width]), g.weight("ln_b", [width])], "ln", axis=-1,
               epsilon=1e-5)
    return g.model(y, "attention_block")


def unrolled_lstm(steps: int = 4, hidden: int = 32) -> ModelProto:
    """An LSTM unrolled over `steps` inputs, one MatMul per gate for the input and for the state, weights shared
    across steps: 8 x steps MatMuls of one shape ([1, hidden] x [hidden, hidden]), which NNFusion runs as one
    kernel launched 8 x steps times."""
    g = GraphBuilder({**{f"x{t}": [1, hidden] for t in range(steps)}, "h0": [1, hidden], "c0": [1, hidden]})
    gates = ("i", "f", "g", "o")
    w = {gate: g.weight(f"w_{gate}", [hidden, hidden]) for gate in gates}
    u = {gate: g.weight(f"u_{gate}", [hidden, hidden]) for gate in gates}
    h, c = "h0", "c0"
    for t in range(steps):
        act = {}
        for gate in gates:
            pre = g.node("Add", [g.node("MatMul", [f"x{t}", w[gate]], f"xw_{gate}{t}"),
                                 g.node("MatMul", [h, u[gate]], f"hu_{gate}{t}")], f"pre_{gate}{t}")
            act[gate] = g.node("Tanh" if gate == "g" else "Sigmoid", [pre], f"{gate}{t}")
        c = g.node("Add", [g.node("Mul", [act["f"], c], f"fc{t}"), g.node("Mul", [act["i"], act["g"]], f"ig{t}")],
                   f"c{t}")
        h = g.node("Mul", [act["o"], g.node("Tanh", [c], f"tc{t}")], f"h{t}")
    return g.model(h, "unrolled_lstm")


# -- helpers for the network zoo (tests/zoo.py) --------------------------------------------------------------

def constant(g: GraphBuilder, prefix: str, values: list[int] | list[float], dtype: type = np.int64) -> str:
    """A constant initializer (a Reshape's shape, a Clip's bound, a scale): what exporters write for them."""
    name = g.unique(prefix)
    g.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
    return name


def scalar(g: GraphBuilder, prefix: str, value: float) -> str:
    """A float32 scalar initializer (rank 0), as exporters write `x / 8.0` or `x * 0.5`."""
    name = g.unique(prefix)
    g.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
    return name


def node_outputs(g: GraphBuilder, op_type: str, inputs: list[str], count: int, name: str, **attrs: Any) -> list[str]:
    """A node of several outputs (Split): the names of its outputs."""
    name = g.unique(name)
    outputs = [f"{name}_out{i}" for i in range(count)]
    g.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
    return outputs


def onnx_runtime_one_node(op_type: str, x: np.ndarray, constants: dict[str, np.ndarray], inputs: list[str],
                          **attrs: Any) -> np.ndarray:
    """ONNX Runtime's output (CPU, opset 13) of one node on x: `inputs` names its inputs in order ("x" and the
    `constants`' names); what kdb's references are checked against (the network's judge on the GPU)."""
    import onnxruntime

    node = helper.make_node(op_type, inputs, ["y"], **attrs)
    graph = helper.make_graph([node], op_type.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]

"""A zoo of real networks as exporters write them, built with onnx.helper (no downloads): batch 1, fp32, random
(seeded) weights, BatchNorm folded away as in tests/onnx_models.py (convs of BN networks carry neither BN nor
bias; AlexNet and GoogLeNet's convs their bias). Where a network repeats a block of one shape, fewer repeats are
built (each docstring says so): every distinct op shape and pattern of the full network is still there, and those
are what the kernel DB and the compiler see. tests/test_zoo.py runs each through the README's commands.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from onnx import ModelProto
from onnx_models import GraphBuilder, bottleneck_block, constant, node_outputs, scalar


def _classifier(g: GraphBuilder, y: str, features: int, classes: int = 1000) -> str:
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y], "pool")], "flatten", axis=1)  # NNFusion needs axis
    return g.node("Gemm", [y, g.weight("fc_w", [classes, features], fan_in=features), g.weight("fc_b", [classes])], "fc", transB=1)


def resnet50(blocks: tuple[int, ...] = (2, 2, 2, 2)) -> ModelProto:
    """ResNet-50 (torchvision v1.5, BN folded) at 224x224. Each stage's first block downsamples and the rest
    repeat one shape: two blocks per stage (the full network has 3, 4, 6, 3) hold every op shape of it."""
    g = GraphBuilder({"x": [1, 3, 224, 224]})
    y = g.node("Relu", [g.conv("x", 3, 64, 7, stride=2, name="stem")], "stem_relu")
    y = g.node("MaxPool", [y], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, count) in enumerate(zip((64, 128, 256, 512), blocks, strict=True), start=1):
        for block in range(count):
            y = bottleneck_block(g, y, cin, width, 2 if block == 0 and stage > 1 else 1, prefix=f"s{stage}b{block}_")
            cin = 4 * width
    return g.model(_classifier(g, y, cin), "resnet50")


def _relu6(g: GraphBuilder, x: str, name: str) -> str:
    # torch.onnx writes ReLU6 as Clip with its bounds as constant inputs (opset >= 11)
    return g.node("Clip", [x, scalar(g, f"{name}_min", 0.0), scalar(g, f"{name}_max", 6.0)], name)


def mobilenet_v2(max_repeats: int = 2) -> ModelProto:
    """MobileNetV2 (torchvision, width 1.0, BN folded, ReLU6 as Clip) at 224x224: inverted residuals (1x1 expand,
    3x3 depthwise, 1x1 linear projection, + input where the shape allows). Of each stage's n blocks only the
    first `max_repeats` are built (the later ones repeat the second's shapes)."""
    g = GraphBuilder({"x": [1, 3, 224, 224]})
    y = _relu6(g, g.conv("x", 3, 32, 3, stride=2, name="stem"), "stem_relu6")
    cin = 32
    settings = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))
    for stage, (t, c, n, s) in enumerate(settings, start=1):
        for block in range(min(n, max_repeats)):
            stride = s if block == 0 else 1
            p = f"s{stage}b{block}_"
            hidden = cin * t
            h = y if t == 1 else _relu6(g, g.conv(y, cin, hidden, 1, name=f"{p}expand"), f"{p}expand_relu6")
            h = _relu6(g, g.conv(h, hidden, hidden, 3, stride=stride, group=hidden, name=f"{p}dw"), f"{p}dw_relu6")
            h = g.conv(h, hidden, c, 1, name=f"{p}project")
            y = g.node("Add", [h, y], f"{p}add") if stride == 1 and cin == c else h
            cin = c
    y = _relu6(g, g.conv(y, cin, 1280, 1, name="last"), "last_relu6")
    return g.model(_classifier(g, y, 1280), "mobilenet_v2")


def alexnet() -> ModelProto:
    """AlexNet (torchvision) at 224x224, whole: five biased convs with Relu, three max pools, three dense layers
    (9216 -> 4096 -> 4096 -> 1000; Dropout is gone in an inference export, and the 6x6 adaptive pool is an
    identity at this size, which exporters drop)."""
    g = GraphBuilder({"x": [1, 3, 224, 224]})
    y = g.node("Relu", [g.conv("x", 3, 64, 11, stride=4, pad=2, bias=True, name="conv1")], "relu1")
    y = g.node("MaxPool", [y], "pool1", kernel_shape=[3, 3], strides=[2, 2])
    y = g.node("Relu", [g.conv(y, 64, 192, 5, pad=2, bias=True, name="conv2")], "relu2")
    y = g.node("MaxPool", [y], "pool2", kernel_shape=[3, 3], strides=[2, 2])
    y = g.node("Relu", [g.conv(y, 192, 384, 3, bias=True, name="conv3")], "relu3")
    y = g.node("Relu", [g.conv(y, 384, 256, 3, bias=True, name="conv4")], "relu4")
    y = g.node("Relu", [g.conv(y, 256, 256, 3, bias=True, name="conv5")], "relu5")
    y = g.node("MaxPool", [y], "pool5", kernel_shape=[3, 3], strides=[2, 2])
    y = g.node("Flatten", [y], "flatten", axis=1)
    for i, (n_in, n_out) in enumerate(((9216, 4096), (4096, 4096)), start=6):
        y = g.node("Gemm", [y, g.weight(f"fc{i}_w", [n_out, n_in], fan_in=n_in), g.weight(f"fc{i}_b", [n_out])], f"fc{i}", transB=1)
        y = g.node("Relu", [y], f"relu{i}")
    y = g.node("Gemm", [y, g.weight("fc8_w", [1000, 4096], fan_in=4096), g.weight("fc8_b", [1000])], "fc8", transB=1)
    return g.model(y, "alexnet")


def _dense(g: GraphBuilder, x: str, n_in: int, n_out: int, name: str) -> str:
    """torch's Linear on a [1, seq, n_in] activation as exported: MatMul by the [n_in, n_out] weight, then the bias Add."""
    y = g.node("MatMul", [x, g.weight(f"{name}_w", [n_in, n_out], fan_in=n_in)], f"{name}_matmul")
    return g.node("Add", [y, g.weight(f"{name}_b", [n_out])], f"{name}_bias")


def _layer_norm(g: GraphBuilder, x: str, hidden: int, name: str, eps: float = 1e-12) -> str:
    """LayerNorm as torch.onnx's TorchScript exporter writes it: ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div,
    * gamma + beta. (NNFusion's importer takes opset 17's LayerNormalization too, as a LayerNorm op of its own
    kernel; the decomposed form gives the kernel DB more to look up: its element-wise ops.)"""
    mean = g.node("ReduceMean", [x], f"{name}_mean", axes=[-1], keepdims=1)
    centred = g.node("Sub", [x, mean], f"{name}_sub")
    var = g.node("ReduceMean", [g.node("Pow", [centred, scalar(g, f"{name}_two", 2.0)], f"{name}_pow")],
                 f"{name}_var", axes=[-1], keepdims=1)
    std = g.node("Sqrt", [g.node("Add", [var, scalar(g, f"{name}_eps", eps)], f"{name}_addeps")], f"{name}_sqrt")
    y = g.node("Div", [centred, std], f"{name}_div")
    y = g.node("Mul", [y, g.weight(f"{name}_gamma", [hidden], mean=1.0)], f"{name}_scale")
    return g.node("Add", [y, g.weight(f"{name}_beta", [hidden])], f"{name}_shift")


def _gelu(g: GraphBuilder, x: str, name: str) -> str:
    """The exact Gelu as torch.onnx writes it: x * 0.5 * (1 + Erf(x / sqrt(2)))."""
    erf = g.node("Erf", [g.node("Div", [x, scalar(g, f"{name}_sqrt2", math.sqrt(2.0))], f"{name}_div")], f"{name}_erf")
    y = g.node("Mul", [x, g.node("Add", [erf, scalar(g, f"{name}_one", 1.0)], f"{name}_add")], f"{name}_mul")
    return g.node("Mul", [y, scalar(g, f"{name}_half", 0.5)], f"{name}_half")


def bert_encoder(layers: int = 2, seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072) -> ModelProto:
    """BERT-base's encoder layers as HuggingFace's export writes them, from the embeddings' output [1, seq, hidden]
    and the extended attention mask [1, 1, 1, seq]: Q/K/V dense layers, heads split by Reshape/Transpose, scores
    MatMul / sqrt(d) + mask, Softmax, context MatMul, heads merged, output dense + residual + LayerNorm, then the
    FFN (dense to 3072, Erf Gelu, dense back) + residual + LayerNorm. Two layers of BERT-base's twelve (the
    others repeat their shapes)."""
    head = hidden // heads
    g = GraphBuilder({"x": [1, seq, hidden], "mask": [1, 1, 1, seq]})
    split = constant(g, "split_heads", [1, seq, heads, head])
    merge = constant(g, "merge_heads", [1, seq, hidden])
    y = "x"
    for layer in range(layers):
        p = f"l{layer}_"
        q, k, v = (g.node("Reshape", [_dense(g, y, hidden, hidden, f"{p}{n}"), split], f"{p}{n}_split")
                   for n in ("query", "key", "value"))
        q = g.node("Transpose", [q], f"{p}q_heads", perm=[0, 2, 1, 3])
        k = g.node("Transpose", [k], f"{p}k_heads", perm=[0, 2, 3, 1])
        v = g.node("Transpose", [v], f"{p}v_heads", perm=[0, 2, 1, 3])
        scores = g.node("Div", [g.node("MatMul", [q, k], f"{p}scores"), scalar(g, f"{p}sqrt_d", math.sqrt(head))],
                        f"{p}scale")
        probs = g.node("Softmax", [g.node("Add", [scores, "mask"], f"{p}masked")], f"{p}softmax", axis=-1)
        context = g.node("Transpose", [g.node("MatMul", [probs, v], f"{p}context")], f"{p}merge", perm=[0, 2, 1, 3])
        context = g.node("Reshape", [context, merge], f"{p}merge_reshape")
        attn = g.node("Add", [_dense(g, context, hidden, hidden, f"{p}attn_out"), y], f"{p}attn_residual")
        y = _layer_norm(g, attn, hidden, f"{p}attn_ln")
        inner = _gelu(g, _dense(g, y, hidden, ffn, f"{p}ffn_in"), f"{p}gelu")
        y = _layer_norm(g, g.node("Add", [_dense(g, inner, ffn, hidden, f"{p}ffn_out"), y], f"{p}ffn_residual"),
                        hidden, f"{p}ffn_ln")
    return g.model(y, "bert_encoder")


def lstm(layers: int = 2, steps: int = 8, features: int = 256, hidden: int = 256) -> ModelProto:
    """A two-layer LSTM unrolled over `steps` time steps, as a loop of LSTMCell exports: per step and layer
    gates = x W + h R + b ([1, 4 hidden]), Split into i, f, g, o, then c = sigmoid(f) c + sigmoid(i) tanh(g),
    h = sigmoid(o) tanh(c). One input per time step ([1, features]), initial states as inputs."""
    inputs = {f"x{t}": [1, features] for t in range(steps)}
    inputs |= {f"{s}0_l{i}": [1, hidden] for i in range(layers) for s in ("h", "c")}
    g = GraphBuilder(inputs)
    seq = [f"x{t}" for t in range(steps)]
    for layer in range(layers):
        n_in = features if layer == 0 else hidden
        w, r = (g.weight(f"l{layer}_W", [n_in, 4 * hidden], fan_in=n_in),
                g.weight(f"l{layer}_R", [hidden, 4 * hidden], fan_in=hidden))
        b = g.weight(f"l{layer}_b", [4 * hidden])
        h, c, out = f"h0_l{layer}", f"c0_l{layer}", []
        for t, x in enumerate(seq):
            p = f"l{layer}t{t}_"
            gates = g.node("Add", [g.node("MatMul", [x, w], f"{p}xw"), g.node("MatMul", [h, r], f"{p}hr")], f"{p}sum")
            gates = g.node("Add", [gates, b], f"{p}bias")
            i, f, cell, o = node_outputs(g, "Split", [gates], 4, f"{p}split", axis=1)
            i, f, o = (g.node("Sigmoid", [v], f"{p}sig") for v in (i, f, o))
            cell = g.node("Tanh", [cell], f"{p}tanh_g")
            c = g.node("Add", [g.node("Mul", [f, c], f"{p}fc"), g.node("Mul", [i, cell], f"{p}ig")], f"{p}c")
            h = g.node("Mul", [o, g.node("Tanh", [c], f"{p}tanh_c")], f"{p}h")
            out.append(h)
        seq = out
    return g.model(seq[-1], "lstm")


def resnext_blocks(size: int = 56) -> ModelProto:
    """ResNeXt-50 32x4d's first stage (BN folded): from the 64-channel stem output, a downsampling-free block whose
    shortcut is a 1x1 conv to 256, then a repeated block: 1x1 conv to 128, 3x3 grouped conv (group 32, 4 channels
    a group), 1x1 conv to 256, + shortcut, Relu."""
    g = GraphBuilder({"x": [1, 64, size, size]})
    y, cin = "x", 64
    for block in range(2):
        p = f"b{block}_"
        h = g.node("Relu", [g.conv(y, cin, 128, 1, name=f"{p}conv1")], f"{p}relu1")
        h = g.node("Relu", [g.conv(h, 128, 128, 3, group=32, name=f"{p}conv2")], f"{p}relu2")
        h = g.conv(h, 128, 256, 1, name=f"{p}conv3")
        shortcut = y if cin == 256 else g.conv(y, cin, 256, 1, name=f"{p}down")
        y, cin = g.node("Relu", [g.node("Add", [h, shortcut], f"{p}add")], f"{p}relu3"), 256
    return g.model(y, "resnext_blocks")



def _separable(g: GraphBuilder, x: str, channels: int, k: int, name: str) -> str:
    """NASNet's separable conv, applied twice: Relu, depthwise k x k, pointwise 1x1 (BN folded)."""
    for rep in range(2):
        x = g.node("Relu", [x], f"{name}_relu{rep}")
        x = g.conv(x, channels, channels, k, group=channels, name=f"{name}_dw{rep}")
        x = g.conv(x, channels, channels, 1, name=f"{name}_pw{rep}")
    return x


def nasnet_cell(channels: int = 44, size: int = 28, previous: int = 264) -> ModelProto:
    """NASNet-A Mobile's normal cell at its first stage (28x28, 44 filters) from the two previous cells' outputs
    (264 channels each: six branches of 44): each input Relu + 1x1 conv to 44, then the five blocks of the paper
    (sep 3x3 + identity, sep 3x3 + sep 5x5, avg 3x3 + identity, avg 3x3 + avg 3x3, sep 5x5 + sep 3x3), joined with
    the previous input by Concat."""
    g = GraphBuilder({"h": [1, previous, size, size], "h_prev": [1, previous, size, size]})
    h = g.conv(g.node("Relu", ["h"], "h_relu"), previous, channels, 1, name="h_adjust")
    p = g.conv(g.node("Relu", ["h_prev"], "prev_relu"), previous, channels, 1, name="prev_adjust")

    def avg(x: str, name: str) -> str:
        return g.node("AveragePool", [x], name, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                      count_include_pad=0)

    blocks = [
        g.node("Add", [_separable(g, h, channels, 3, "b0_sep3"), h], "b0_add"),
        g.node("Add", [_separable(g, p, channels, 3, "b1_sep3"), _separable(g, h, channels, 5, "b1_sep5")], "b1_add"),
        g.node("Add", [avg(h, "b2_avg"), p], "b2_add"),
        g.node("Add", [avg(p, "b3_avg_a"), avg(p, "b3_avg_b")], "b3_add"),
        g.node("Add", [_separable(g, p, channels, 5, "b4_sep5"), _separable(g, p, channels, 3, "b4_sep3")], "b4_add"),
    ]
    return g.model(g.node("Concat", [p, *blocks], "concat", axis=1), "nasnet_cell")

def _inception_module(g: GraphBuilder, x: str, cin: int, widths: tuple[int, int, int, int, int, int], name: str) -> str:
    """GoogLeNet's Inception module (BN folded into biased convs): 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | 3x3 max pool ->
    1x1, joined by Concat over channels."""
    c1, r3, c3, r5, c5, pool = widths

    def conv_relu(y: str, n_in: int, n_out: int, k: int, part: str) -> str:
        return g.node("Relu", [g.conv(y, n_in, n_out, k, bias=True, name=f"{name}_{part}")], f"{name}_{part}_relu")

    b1 = conv_relu(x, cin, c1, 1, "1x1")
    b2 = conv_relu(conv_relu(x, cin, r3, 1, "3x3_reduce"), r3, c3, 3, "3x3")
    b3 = conv_relu(conv_relu(x, cin, r5, 1, "5x5_reduce"), r5, c5, 5, "5x5")
    b4 = g.node("MaxPool", [x], f"{name}_pool", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b4 = conv_relu(b4, cin, pool, 1, "pool_proj")
    return g.node("Concat", [b1, b2, b3, b4], f"{name}_concat", axis=1)


def inception() -> ModelProto:
    """GoogLeNet's modules 3a and 3b at 28x28 (from the 192-channel stem output), then the stride-2 max pool
    that follows them."""
    g = GraphBuilder({"x": [1, 192, 28, 28]})
    y = _inception_module(g, "x", 192, (64, 96, 128, 16, 32, 32), "3a")
    y = _inception_module(g, y, 256, (128, 128, 192, 32, 96, 64), "3b")
    y = g.node("MaxPool", [y], "pool3", kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    return g.model(y, "inception")


def _conv1d(g: GraphBuilder, x: str, cin: int, cout: int, k: int, dilation: int, name: str) -> str:
    """torch's Conv1d as exported: kernel_shape, strides, dilations and pads all written out, a bias."""
    w = g.weight(f"{name}_w", [cout, cin, k], fan_in=cin * k)
    pad = dilation * (k - 1) // 2
    return g.node("Conv", [x, w, g.weight(f"{name}_b", [cout])], name, kernel_shape=[k], strides=[1],
                  dilations=[dilation], pads=[pad, pad])


def tcn(features: int = 32, channels: int = 64, steps: int = 256, levels: int = 3, classes: int = 10) -> ModelProto:
    """A temporal convolutional network (Bai et al., 2018; weight norm folded, non-causal padding) on [1, features,
    steps]: per level two dilated 3-tap Conv1d with Relu (dilation 1, 2, 4..) and a residual (a 1x1 Conv1d where the
    width changes); then a 2-step MaxPool1d, the global average over time and a linear classifier. Its 1-D ops are
    looked up 1-D, all but the global pool, which the importer pools as N,C,L,1."""
    g = GraphBuilder({"x": [1, features, steps]})
    y, width = "x", features
    for level in range(levels):
        d, name = 2 ** level, f"l{level}"
        h = g.node("Relu", [_conv1d(g, y, width, channels, 3, d, f"{name}_conv1")], f"{name}_relu1")
        h = g.node("Relu", [_conv1d(g, h, channels, channels, 3, d, f"{name}_conv2")], f"{name}_relu2")
        skip = y if width == channels else _conv1d(g, y, width, channels, 1, 1, f"{name}_down")
        y, width = g.node("Relu", [g.node("Add", [h, skip], f"{name}_add")], f"{name}_out"), channels
    y = g.node("MaxPool", [y], "pool", kernel_shape=[2], strides=[2])
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y], "gap")], "flatten", axis=1)
    y = g.node("Gemm", [y, g.weight("fc_w", [classes, channels], fan_in=channels), g.weight("fc_b", [classes])], "fc",
               transB=1)
    return g.model(y, "tcn")


ZOO: dict[str, Callable[[], ModelProto]] = {
    "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "alexnet": alexnet, "bert_encoder": bert_encoder,
    "lstm": lstm, "resnext_blocks": resnext_blocks, "nasnet_cell": nasnet_cell, "inception": inception,
    "tcn": tcn,
}

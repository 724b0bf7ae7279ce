"""A zoo of real networks as exporters write them, built with onnx.helper (no downloads): batch 1, fp32, random
(seeded) weights, BatchNorm folded away as in tests/onnx_models.py (convs of BN networks carry neither BN nor
bias; AlexNet and GoogLeNet's convs their bias, and so do convs with a bias of their own or a BN folded into one:
SE's, ConvNeXt's, DenseNet's 1x1; a BN that follows no conv stays a BatchNormalization node, as in DenseNet).
Where a network repeats a block of one shape, fewer repeats are built (each docstring says so): every distinct op
shape and pattern of the full network is still there, and those are what the kernel DB and the compiler see.
tests/test_zoo.py runs each through the README's commands.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper
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


def gru(layers: int = 2, steps: int = 6, features: int = 128, hidden: int = 256) -> ModelProto:
    """A two-layer GRU unrolled over `steps` time steps, as a loop of GRUCell exports (ATen's gru_cell, no ONNX GRU
    op): per step and layer gi = x W_ih^T + b_ih, gh = h W_hh^T + b_hh (Gemms, [1, 3 hidden]), each Split into its
    r, z, n thirds (the split sizes an input, as opset 13+ writes chunk), r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z
    + gh_z), n = tanh(gi_n + r gh_n), h' = (h - n) z + n. One input per time step ([1, features]), the initial
    states as inputs."""
    inputs = {f"x{t}": [1, features] for t in range(steps)} | {f"h0_l{i}": [1, hidden] for i in range(layers)}
    g = GraphBuilder(inputs)
    thirds = constant(g, "chunk3", [hidden] * 3)
    seq = [f"x{t}" for t in range(steps)]
    for layer in range(layers):
        n_in = features if layer == 0 else hidden
        w_ih, w_hh = (g.weight(f"l{layer}_w_ih", [3 * hidden, n_in], fan_in=n_in),
                      g.weight(f"l{layer}_w_hh", [3 * hidden, hidden], fan_in=hidden))
        b_ih, b_hh = g.weight(f"l{layer}_b_ih", [3 * hidden]), g.weight(f"l{layer}_b_hh", [3 * hidden])
        h, out = f"h0_l{layer}", []
        for t, x in enumerate(seq):
            p = f"l{layer}t{t}_"
            gi = node_outputs(g, "Split", [g.node("Gemm", [x, w_ih, b_ih], f"{p}gi", transB=1), thirds], 3,
                              f"{p}gi_chunk", axis=1)
            gh = node_outputs(g, "Split", [g.node("Gemm", [h, w_hh, b_hh], f"{p}gh", transB=1), thirds], 3,
                              f"{p}gh_chunk", axis=1)
            r = g.node("Sigmoid", [g.node("Add", [gh[0], gi[0]], f"{p}r_sum")], f"{p}r")
            z = g.node("Sigmoid", [g.node("Add", [gh[1], gi[1]], f"{p}z_sum")], f"{p}z")
            n = g.node("Tanh", [g.node("Add", [gi[2], g.node("Mul", [gh[2], r], f"{p}rh")], f"{p}n_sum")], f"{p}n")
            h = g.node("Add", [g.node("Mul", [g.node("Sub", [h, n], f"{p}h_minus_n"), z], f"{p}zh"), n], f"{p}h")
            out.append(h)
        seq = out
    return g.model(seq[-1], "gru")


def gru_layers(steps: int = 6, features: int = 64, hidden: int = 128) -> ModelProto:
    """torch's nn.GRU(features, hidden, num_layers=2, bidirectional=True) as torch.onnx exports it: an ONNX GRU node a
    layer (linear_before_reset=1, both directions, no sequence_lens, the initial state an input [2, 1, hidden]), its
    output Y [steps, 2, 1, hidden] transposed and reshaped to [steps, 1, 2 hidden] for the next layer. NNFusion's
    importer unrolls each node into Dots (op/gru.cpp), four a step and direction."""
    g = GraphBuilder({"x": [steps, 1, features]} | {f"h0_l{i}": [2, 1, hidden] for i in range(2)})
    y, width = "x", features
    for layer in range(2):
        p = f"l{layer}_"
        w = g.weight(f"{p}W", [2, 3 * hidden, width], fan_in=width)
        r = g.weight(f"{p}R", [2, 3 * hidden, hidden], fan_in=hidden)
        b = g.weight(f"{p}B", [2, 6 * hidden])
        ys = node_outputs(g, "GRU", [y, w, r, b, "", f"h0_l{layer}"], 2, f"{p}gru", hidden_size=hidden,
                          direction="bidirectional", linear_before_reset=1)
        y = g.node("Transpose", [ys[0]], f"{p}transpose", perm=[0, 2, 1, 3])
        y = g.node("Reshape", [y, constant(g, f"{p}shape", [steps, 1, 2 * hidden])], f"{p}reshape")
        width = 2 * hidden
    return g.model(y, "gru_layers")


def densenet_block(size: int = 56, cin: int = 64, layers: int = 3, growth: int = 32, bn_size: int = 4) -> ModelProto:
    """DenseNet-121's first dense block and transition (torchvision) at 56x56 from the 64-channel stem output, 3 of
    its 6 layers (the rest repeat the 3x3 conv's shape; each 1x1 conv's input width differs): per layer norm1 (a
    BatchNormalization node: it follows a Concat, no conv to fold it into) and Relu, 1x1 conv to 4 x growth (norm2
    folded into it: a bias), Relu, 3x3 conv to growth, Concat with the layer's input over channels; the transition
    norm and Relu, 1x1 conv halving the width, AveragePool 2x2 stride 2."""
    g = GraphBuilder({"x": [1, cin, size, size]})

    def norm_relu(y: str, channels: int, name: str) -> str:
        params = [g.weight(f"{name}_scale", [channels], mean=1.0), g.weight(f"{name}_bias", [channels]),
                  g.weight(f"{name}_mean", [channels]),
                  constant(g, f"{name}_var", [1.0] * channels, dtype=np.float32)]
        y = g.node("BatchNormalization", [y, *params], name, epsilon=1e-5, momentum=0.9)
        return g.node("Relu", [y], f"{name}_relu")

    y, width = "x", cin
    for layer in range(layers):
        p = f"l{layer}_"
        h = g.conv(norm_relu(y, width, f"{p}norm1"), width, bn_size * growth, 1, bias=True, name=f"{p}conv1")
        h = g.conv(g.node("Relu", [h], f"{p}relu2"), bn_size * growth, growth, 3, name=f"{p}conv2")
        y, width = g.node("Concat", [y, h], f"{p}concat", axis=1), width + growth
    y = g.conv(norm_relu(y, width, "transition_norm"), width, width // 2, 1, name="transition_conv")
    y = g.node("AveragePool", [y], "transition_pool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0],
               ceil_mode=0)
    return g.model(y, "densenet_block")


def se_block(cin: int = 256, width: int = 128, size: int = 56, blocks: int = 2, reduction: int = 16) -> ModelProto:
    """SE-ResNet-50's second stage (Hu et al., 2018; BN folded), its first two blocks from the 256-channel output of
    the first stage at 56x56: a bottleneck (the stride on the 3x3, a strided 1x1 conv shortcut in the first block)
    whose output is scaled by its squeeze-excitation (GlobalAveragePool, 1x1 conv to 1/16 the width with its bias,
    Relu, 1x1 conv back with its bias, Sigmoid, Mul broadcasting the [1, C, 1, 1] weights over the map), then +
    shortcut, Relu."""
    g = GraphBuilder({"x": [1, cin, size, size]})
    y = "x"
    for block in range(blocks):
        p, stride, cout = f"b{block}_", 2 if block == 0 else 1, 4 * width
        h = g.node("Relu", [g.conv(y, cin, width, 1, name=f"{p}conv1")], f"{p}relu1")
        h = g.node("Relu", [g.conv(h, width, width, 3, stride=stride, name=f"{p}conv2")], f"{p}relu2")
        h = g.conv(h, width, cout, 1, name=f"{p}conv3")
        se = g.node("GlobalAveragePool", [h], f"{p}se_pool")
        se = g.node("Relu", [g.conv(se, cout, cout // reduction, 1, bias=True, name=f"{p}se_fc1")], f"{p}se_relu")
        se = g.node("Sigmoid", [g.conv(se, cout // reduction, cout, 1, bias=True, name=f"{p}se_fc2")], f"{p}se_gate")
        h = g.node("Mul", [h, se], f"{p}se_scale")
        shortcut = y if stride == 1 and cin == cout else g.conv(y, cin, cout, 1, stride=stride, name=f"{p}down")
        y, cin = g.node("Relu", [g.node("Add", [h, shortcut], f"{p}add")], f"{p}relu3"), cout
    return g.model(y, "se_block")


def attention_bmm(seq: int = 197, hidden: int = 384, heads: int = 6, mlp: int = 1536,
                  packed: bool = False) -> ModelProto:
    """A ViT-S/16 encoder block (torchvision's EncoderBlock: pre-norm, nn.MultiheadAttention with batch_first) as
    torch.onnx writes it from [1, 197, 384]: LayerNorm (eps 1e-6), the batch moved second (Transpose), the q, k, v
    in-projections (MatMul by [384, 384], bias Add: MultiheadAttention's separate projection weights), q scaled by
    1/sqrt(d), each Reshape to [seq, heads, d] and Transpose to [heads, seq, d]; the scores a batched MatMul of
    [heads, seq, d] by k transposed, [heads, d, seq], Softmax, the context a batched MatMul by v, heads merged back
    (Transpose, Reshape to [seq, 1, 384]), the out-projection (MatMul, Add), the batch moved back, + input; then
    LayerNorm, the MLP (dense to 1536, exact Gelu, dense back) + residual.

    packed: the packed in-projection instead (MatMul by [384, 1152], bias Add, then Split into q, k, v along axis -1:
    torch's `chunk(3, dim=-1)` when query, key and value are one tensor). NNFusion aborts on that Split (its importer
    ignores the split sizes input and reads the axis' length with the raw axis: std::out_of_range at -1), and kdb
    coverage does not say so: kept out of the zoo until kdb names it (see tests/test_zoo.py's note)."""
    head = hidden // heads
    g = GraphBuilder({"x": [1, seq, hidden]})
    y = g.node("Transpose", [_layer_norm(g, "x", hidden, "ln1", eps=1e-6)], "seq_first", perm=[1, 0, 2])
    if packed:
        qkv = node_outputs(g, "Split", [_dense(g, y, hidden, 3 * hidden, "in_proj"),
                                        constant(g, "chunk3", [hidden] * 3)], 3, "qkv", axis=-1)
    else:
        qkv = [_dense(g, y, hidden, hidden, f"{n}_proj") for n in ("q", "k", "v")]
    split = constant(g, "split_heads", [seq, heads, head])
    q = g.node("Mul", [qkv[0], scalar(g, "scaling", 1.0 / math.sqrt(head))], "q_scaled")
    q, k, v = (g.node("Transpose", [g.node("Reshape", [t, split], f"{n}_split")], f"{n}_heads", perm=[1, 0, 2])
               for n, t in (("q", q), ("k", qkv[1]), ("v", qkv[2])))
    scores = g.node("MatMul", [q, g.node("Transpose", [k], "k_t", perm=[0, 2, 1])], "scores")
    context = g.node("MatMul", [g.node("Softmax", [scores], "softmax", axis=-1), v], "context")
    context = g.node("Transpose", [context], "merge", perm=[1, 0, 2])
    context = g.node("Reshape", [context, constant(g, "merge_heads", [seq, 1, hidden])], "merge_reshape")
    attn = g.node("Transpose", [_dense(g, context, hidden, hidden, "out_proj")], "batch_first", perm=[1, 0, 2])
    y = g.node("Add", [attn, "x"], "attn_residual")
    inner = _gelu(g, _dense(g, _layer_norm(g, y, hidden, "ln2", eps=1e-6), hidden, mlp, "mlp_fc1"), "gelu")
    return g.model(g.node("Add", [_dense(g, inner, mlp, hidden, "mlp_fc2"), y], "mlp_residual"), "attention_bmm")


def gpt_decoder(seq: int = 64, hidden: int = 256, heads: int = 4, vocab: int = 1000) -> ModelProto:
    """A GPT-2-style decoder block and its head, as HuggingFace's older export writes them, from the embeddings'
    output [1, seq, hidden]: pre-norm LayerNorm (eps 1e-5), the packed QKV dense layer ([hidden, 3 hidden], then
    Slices), heads split by Reshape/Transpose, scores / sqrt(d) + the causal mask as a constant bias (-10000 above the
    diagonal), Softmax, the context, the out-projection + residual; LayerNorm, the MLP (4 hidden, tanh Gelu:
    gelu_new) + residual; the final LayerNorm, the tied LM head (MatMul by [hidden, vocab], no bias) and a Softmax
    over the vocabulary: next-token probabilities, a rank-3 softmax of 1000 per row."""
    head = hidden // heads
    g = GraphBuilder({"x": [1, seq, hidden]})
    causal = np.triu(np.full((seq, seq), -10000.0, dtype=np.float32), 1).reshape(1, 1, seq, seq)
    g.initializers.append(numpy_helper.from_array(causal, "causal_mask"))
    qkv = _dense(g, _layer_norm(g, "x", hidden, "ln1", eps=1e-5), hidden, 3 * hidden, "c_attn")
    split = constant(g, "split_heads", [1, seq, heads, head])
    parts = []
    for i, n in enumerate("qkv"):
        part = g.node("Slice", [qkv, constant(g, f"{n}_start", [i * hidden]), constant(g, f"{n}_end", [(i + 1) * hidden]),
                                constant(g, f"{n}_axis", [2])], f"{n}_slice")
        perm = [0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]
        parts.append(g.node("Transpose", [g.node("Reshape", [part, split], f"{n}_split")], f"{n}_heads", perm=perm))
    scores = g.node("Div", [g.node("MatMul", parts[:2], "scores"), scalar(g, "sqrt_d", math.sqrt(head))], "scale")
    probs = g.node("Softmax", [g.node("Add", [scores, "causal_mask"], "masked")], "attn_softmax", axis=-1)
    context = g.node("Transpose", [g.node("MatMul", [probs, parts[2]], "context")], "merge", perm=[0, 2, 1, 3])
    context = g.node("Reshape", [context, constant(g, "merge_heads", [1, seq, hidden])], "merge_reshape")
    y = g.node("Add", [_dense(g, context, hidden, hidden, "c_proj"), "x"], "attn_residual")
    inner = _dense(g, _layer_norm(g, y, hidden, "ln2", eps=1e-5), hidden, 4 * hidden, "c_fc")
    cube = g.node("Mul", [scalar(g, "gelu_c", 0.044715), g.node("Pow", [inner, scalar(g, "three", 3.0)], "cube")],
                  "cube_scaled")
    tanh = g.node("Tanh", [g.node("Mul", [g.node("Add", [inner, cube], "inner_sum"),
                                          scalar(g, "sqrt_2_pi", math.sqrt(2.0 / math.pi))], "tanh_in")], "tanh")
    gelu = g.node("Mul", [g.node("Mul", [inner, scalar(g, "half", 0.5)], "half_x"),
                          g.node("Add", [tanh, scalar(g, "one", 1.0)], "one_plus")], "gelu")
    y = g.node("Add", [_dense(g, gelu, 4 * hidden, hidden, "mlp_proj"), y], "mlp_residual")
    logits = g.node("MatMul", [_layer_norm(g, y, hidden, "ln_f", eps=1e-5), g.weight("wte_t", [hidden, vocab],
                                                                                      fan_in=hidden)], "lm_head")
    return g.model(g.node("Softmax", [logits], "next_token", axis=-1), "gpt_decoder")


def convnext_block(channels: int = 96, size: int = 56, blocks: int = 2) -> ModelProto:
    """ConvNeXt-T's first stage (timm's ConvNeXtBlock with conv_mlp: 1x1 convs for the MLP) at 56x56, 96 channels,
    2 of its 3 blocks: a 7x7 depthwise conv (pads 3, its bias), LayerNorm over channels (eps 1e-6; LayerNorm2d:
    Transpose to NHWC, the norm, Transpose back), 1x1 conv to 4 x 96 with its bias, exact Gelu, 1x1 conv back, the
    layer scale (Mul by [1, 96, 1, 1]), + input."""
    g = GraphBuilder({"x": [1, channels, size, size]})
    y = "x"
    for block in range(blocks):
        p = f"b{block}_"
        h = g.conv(y, channels, channels, 7, pad=3, group=channels, bias=True, name=f"{p}dwconv")
        h = _layer_norm(g, g.node("Transpose", [h], f"{p}nhwc", perm=[0, 2, 3, 1]), channels, f"{p}norm", eps=1e-6)
        h = g.node("Transpose", [h], f"{p}nchw", perm=[0, 3, 1, 2])
        h = _gelu(g, g.conv(h, channels, 4 * channels, 1, bias=True, name=f"{p}fc1"), f"{p}gelu")
        h = g.conv(h, 4 * channels, channels, 1, bias=True, name=f"{p}fc2")
        h = g.node("Mul", [h, g.weight(f"{p}gamma", [1, channels, 1, 1], mean=1.0)], f"{p}layer_scale")
        y = g.node("Add", [h, y], f"{p}residual")
    return g.model(y, "convnext_block")


def unet_decoder(cin: int = 256, skip: int = 128, size: int = 28, bilinear: bool = False) -> ModelProto:
    """A U-Net decoder stage (milesial's Pytorch-UNet `Up`; BN folded) from the bottom of the network, [1, 256, 28,
    28], and the encoder's skip, [1, 128, 56, 56]: ConvTranspose 2x2 stride 2 to 128 channels (its bias), Concat
    [skip, up] over channels, then DoubleConv: 3x3 conv, Relu, 3x3 conv, Relu. bilinear: `Up(bilinear=True)`
    instead: nn.Upsample(scale_factor=2, mode='bilinear', align_corners=True) as opset 17 writes it (Resize with an
    empty roi and scales [1, 1, 2, 2]), the 256 channels kept, DoubleConv through 192 (half its input) to 128.
    NNFusion imports both ConvTranspose and Resize but has no CUDA kernel for either: each decoder compiles with
    kdb's row of its upsampling only."""
    g = GraphBuilder({"x": [1, cin, size, size], "skip": [1, skip, 2 * size, 2 * size]})
    if bilinear:
        roi, scales = constant(g, "roi", [], dtype=np.float32), constant(g, "scales", [1.0, 1.0, 2.0, 2.0],
                                                                           dtype=np.float32)
        y = g.node("Resize", ["x", roi, scales], "up", coordinate_transformation_mode="align_corners",
                   cubic_coeff_a=-0.75, mode="linear", nearest_mode="floor")
        width, mid = cin, (skip + cin) // 2
    else:
        w = g.weight("up_w", [cin, cin // 2, 2, 2], fan_in=cin * 4)
        y = g.node("ConvTranspose", ["x", w, g.weight("up_b", [cin // 2])], "up", kernel_shape=[2, 2],
                   strides=[2, 2], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
        width, mid = cin // 2, skip
    y = g.node("Concat", ["skip", y], "concat", axis=1)
    y = g.node("Relu", [g.conv(y, skip + width, mid, 3, bias=True, name="conv1")], "relu1")
    y = g.node("Relu", [g.conv(y, mid, skip, 3, bias=True, name="conv2")], "relu2")
    return g.model(y, "unet_decoder_bilinear" if bilinear else "unet_decoder")

def two_towers(users: int = 4, items: int = 16, user_features: int = 64, item_features: int = 32, classes: int = 10,
               channels: int = 8, size: int = 16) -> ModelProto:
    """Concats NNFusion copies with a kernel (kdb serves them), not the batch-1 channel joins it lays out in place: a
    two-tower recommender's towers (a Dot and a Relu each) joined on the last axis of [4, 16, *], a Dot head and its
    Softmax; beside it, an image batch of 2 whose encoder conv output is joined with the input on channels (a U-Net
    skip at batch 2) before the decoder conv. Two outputs."""
    g = GraphBuilder({"user": [users, items, user_features], "item": [users, items, item_features],
                      "image": [2, channels, size, size]})
    user = g.node("Relu", [g.node("MatMul", ["user", g.weight("wu", [user_features, user_features])], "tu")], "ru")
    item = g.node("Relu", [g.node("MatMul", ["item", g.weight("wi", [item_features, item_features])], "ti")], "ri")
    joined = g.node("Concat", [user, item], "join", axis=-1)
    head = g.node("MatMul", [joined, g.weight("wo", [user_features + item_features, classes])], "head")
    probs = g.node("Softmax", [head], "probs", axis=-1)
    encoded = g.node("Relu", [g.conv("image", channels, channels, 3, name="enc")], "enc_relu")
    skip = g.node("Concat", [encoded, "image"], "skip", axis=1)
    decoded = g.node("Relu", [g.conv(skip, 2 * channels, channels, 3, name="dec")], "dec_relu")
    model = g.model(probs, "two_towers")
    model.graph.output.append(helper.make_tensor_value_info(decoded, TensorProto.FLOAT, None))
    return model


def _conv_bn(g: GraphBuilder, x: str, cin: int, cout: int, k: int, name: str, stride: int = 1) -> str:
    """A bias-free conv and its BatchNormalization, unfolded (scale near 1, running mean and variance of a trained
    network's order)."""
    y = g.conv(x, cin, cout, k, stride=stride, name=name)
    params = [g.weight(f"{name}_bn_scale", [cout], mean=1.0), g.weight(f"{name}_bn_bias", [cout]),
              g.weight(f"{name}_bn_mean", [cout]), g.weight(f"{name}_bn_var", [cout], mean=1.0)]
    return g.node("BatchNormalization", [y, *params], f"{name}_bn", epsilon=1e-5, momentum=0.9)


def resnet_unfolded_bn(size: int = 112) -> ModelProto:
    """ResNet-50's stem, first stage (2 of its 3 bottlenecks) and the second stage's downsampling block with every
    BatchNormalization left in the graph, as the ONNX Model Zoo's resnet50-v1 and torch.onnx's exports that keep the
    BNs write them: Conv (no bias) -> BatchNormalization -> Relu, the third conv's BN before the residual Add, the
    shortcut's conv -> BN. NNFusion folds each BN into its conv (a filter and a bias: Conv -> Add -> Relu), and kdb
    extracts what it then looks up."""
    g = GraphBuilder({"x": [1, 3, size, size]})
    y = g.node("Relu", [_conv_bn(g, "x", 3, 64, 7, "stem", stride=2)], "stem_relu")
    y = g.node("MaxPool", [y], "stem_pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for p, width, stride in (("s1b0_", 64, 1), ("s1b1_", 64, 1), ("s2b0_", 128, 2)):
        h = g.node("Relu", [_conv_bn(g, y, cin, width, 1, f"{p}conv1")], f"{p}relu1")
        h = g.node("Relu", [_conv_bn(g, h, width, width, 3, f"{p}conv2", stride)], f"{p}relu2")
        h = _conv_bn(g, h, width, 4 * width, 1, f"{p}conv3")
        shortcut = y if stride == 1 and cin == 4 * width else _conv_bn(g, y, cin, 4 * width, 1, f"{p}down", stride)
        y = g.node("Relu", [g.node("Add", [h, shortcut], f"{p}add")], f"{p}relu3")
        cin = 4 * width
    return g.model(_classifier(g, y, cin), "resnet_unfolded_bn")


ZOO: dict[str, Callable[[], ModelProto]] = {
    "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "alexnet": alexnet, "bert_encoder": bert_encoder,
    "lstm": lstm, "resnext_blocks": resnext_blocks, "nasnet_cell": nasnet_cell, "inception": inception,
    "tcn": tcn, "gru": gru, "densenet_block": densenet_block, "se_block": se_block, "attention_bmm": attention_bmm,
    "convnext_block": convnext_block, "unet_decoder": unet_decoder,
    "unet_decoder_bilinear": lambda: unet_decoder(bilinear=True),
    "attention_packed": lambda: attention_bmm(packed=True), "gpt_decoder": gpt_decoder, "two_towers": two_towers,
    "resnet_unfolded_bn": resnet_unfolded_bn, "gru_layers": gru_layers,
}

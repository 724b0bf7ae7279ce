"""ConvTranspose rows (issue 39: every op NNFusion asks the DB for): NNFusion imports an ONNX ConvTranspose (group 1, a
square kernel), fetches ConvTranspose<input>;<filter>;<output><types> and has no CUDA kernel of its own for it, so a
network with one compiles only with a row (the zoo's U-Net decoder: tests/test_zoo.py)."""

from __future__ import annotations

import numpy as np
import pytest

from core.codegen.reference import TOLERANCE, reference
from core.opconfigs.opconfig import format_line, parse_line

CASES = [  # (input, filter [Cin, Cout, k, k], stride, pad, output)
    ((1, 16, 7, 7), (16, 8, 2, 2), 2, 0, (1, 8, 14, 14)),  # U-Net's Up: 2x2, stride 2
    ((1, 8, 5, 5), (8, 4, 4, 4), 2, 1, (1, 4, 10, 10)),  # a DCGAN generator's 4x4, stride 2, pad 1
    ((2, 8, 5, 5), (8, 4, 3, 3), 1, 1, (2, 4, 5, 5)),
]


def line(data, filt, stride, pad, out, dtype="float") -> str:
    def dims(s):
        return "_".join(map(str, s))

    return (f"cudnn_conv_transpose_op_{dtype}|i+{dims(data)}|w+{dims(filt)}|o+{dims(out)}|ws+{stride}_{stride}|wd+1_1|"
            f"p+{pad}_{pad}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[1][2]}s{c[2]}p{c[3]}")
def test_the_reference_is_onnx_runtimes_conv_transpose(case):
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (the run extra) to compare with")
    from onnx_models import onnx_runtime_one_node

    data, filt, stride, pad, out = case
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(data).astype(np.float32), rng.standard_normal(filt).astype(np.float32)
    expected = onnx_runtime_one_node("ConvTranspose", x, {"w": w}, ["x", "w"], kernel_shape=list(filt[2:]),
                                     strides=[stride] * 2, pads=[pad] * 4)
    got = reference(parse_line(line(*case), "case"), [x, w])
    assert got.shape == expected.shape == out and np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"k{c[1][2]}s{c[2]}p{c[3]}")
def test_the_kernel_computes_the_reference_and_is_looked_up_as_nnfusion_fetches_it(case):
    from core.codegen.generate import generate

    config = parse_line(line(*case), "case")
    assert format_line(config) == line(*case)
    result = generate(config, "sm_90")
    assert result.item is not None, result.error
    assert result.max_rel_error is not None and result.max_rel_error <= TOLERANCE
    data, filt, _, _, out = case
    assert config.signature().identifier == (f"ConvTranspose{','.join(map(str, data))};{','.join(map(str, filt))};"
                                             f"{','.join(map(str, out))}floatfloatfloat")


@pytest.mark.parametrize(("text", "said"), [
    (line((1, 8, 5, 5), (8, 4, 4, 4), 2, 1, (1, 4, 11, 11)), r"expected \[1, 4, 10, 10\]"),
    (line((1, 8, 5, 5), (6, 4, 4, 4), 2, 1, (1, 4, 10, 10)), "takes 6 input channels"),
    ("cudnn_conv_transpose_op_float|i+1_8_5_5|w+8_4_3_1|o+1_4_7_5|ws+1_1|wd+1_1|p+0_0", "square kernels only"),
])
def test_a_conv_transpose_kdb_does_not_generate_is_refused_naming_the_field(text: str, said: str):
    from core.errors import InputError

    with pytest.raises(InputError, match=said):
        parse_line(text, "ops.txt:1")


def test_extraction_makes_the_conv_transpose_and_its_bias_add_and_blocks_what_it_cannot_serve(tmp_path):
    pytest.importorskip("onnx")
    from onnx_models import GraphBuilder, write

    from core.opconfigs.onnx_extract import extract

    g = GraphBuilder({"x": [1, 16, 7, 7]})
    up = g.node("ConvTranspose", ["x", g.weight("w", [16, 8, 2, 2]), g.weight("b", [8])], "up", kernel_shape=[2, 2],
                strides=[2, 2])
    g.node("ConvTranspose", ["x", g.weight("w2", [16, 8, 3, 3])], "padded_out", kernel_shape=[3, 3], strides=[2, 2],
           output_padding=[1, 1])
    ext = extract(write(g.model(g.node("Relu", [up], "relu"), "up"), tmp_path / "up.onnx"))
    assert [format_line(c) for c in ext.configs if c.op_type == "ConvTranspose"] == [
        "cudnn_conv_transpose_op_float|i+1_16_7_7|w+16_8_2_2|o+1_8_14_14|ws+2_2|wd+1_1|p+0_0"]
    assert [n for c in ext.configs if c.op_type == "Add" for n in ext.nodes[c.key]] == [("up/bias",)]
    (blocker,) = ext.blockers
    assert blocker.node == "padded_out" and "output_padding" in blocker.reason and "no CUDA kernel" in blocker.reason


def test_a_half_conv_transpose_is_judged_by_the_terms_each_output_sums():
    """U-Net's Up in half: 256 input channels, a 2x2 window at stride 2 (one tap an output): 256 terms a sum, so the
    half bound is about sqrt(256) times an element-wise op's, and the kernel lands within it."""
    from core.codegen.generate import generate
    from core.codegen.reference import reduction_length, tolerance_for

    config = parse_line(line((1, 256, 7, 7), (256, 8, 2, 2), 2, 0, (1, 8, 14, 14), "half"), "case")
    assert reduction_length(config) == 256
    result = generate(config, "sm_90")
    assert result.item is not None, result.error
    assert result.max_rel_error is not None and result.max_rel_error <= tolerance_for(config)


@pytest.mark.parametrize(("attrs", "sliced"), [
    ({"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, True),  # torch's exact 2x upsampling
    ({"strides": [2, 2], "pads": [0, 1, 1, 0]}, True),  # pads that differ
    ({"strides": [3, 3], "pads": [1, 1, 1, 1], "output_padding": [1, 0]}, True),
    ({"strides": [3, 3], "pads": [1, 1, 1, 1], "output_padding": [2, 0]}, False),  # a row past the whole output
])
def test_expand_writes_output_padding_as_a_slice_of_the_whole_output(tmp_path, attrs, sliced):
    """Found in session 33 (a GAN generator's ConvTranspose2d(stride=2, padding=1, output_padding=1)): kdb's rows take
    neither output_padding nor unequal pads, and NNFusion has no kernel of its own. Expand writes the ConvTranspose
    without padding, whose row kdb makes, and a Slice of the model's rows: ONNX Runtime's numbers, and nothing left
    to name. An output_padding past the whole output (rows of the bias alone) is left, and its blocker says no
    Slice."""
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (the run extra) to compare with")
    import onnx
    from onnx_models import GraphBuilder, write

    from core.opconfigs.expand_functions import expand_functions
    from core.opconfigs.nnfusion_import import import_faults

    g = GraphBuilder({"x": [1, 8, 6, 6]})
    up = g.node("ConvTranspose", ["x", g.weight("w", [8, 4, 3, 3]), g.weight("b", [4])], "up", kernel_shape=[3, 3],
                **attrs)
    source = write(g.model(g.node("Relu", [up], "relu"), "up"), tmp_path / "m.onnx")
    (blocker,) = import_faults(onnx.shape_inference.infer_shapes(onnx.load(source)))[0]
    assert ("Slice" in blocker.reason) == sliced
    expand_functions(source, tmp_path / "x.onnx", None)
    left = import_faults(onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "x.onnx")))
    assert left == (([], []) if sliced else ([blocker], []))
    x = np.random.default_rng(0).standard_normal([1, 8, 6, 6]).astype(np.float32)
    before, after = (ort.InferenceSession(str(p)).run(None, {"x": x})[0] for p in (source, tmp_path / "x.onnx"))
    assert before.shape == after.shape
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attrs", [
    {"strides": [8], "pads": [4, 4]},  # HiFi-GAN's upsampling by 8 (kernel 16)
    {"strides": [2], "pads": [3, 3], "output_padding": [1]},
    {"strides": [3], "pads": [0, 0]},
])
def test_expand_writes_a_1d_conv_transpose_as_a_conv_of_the_spread_input(tmp_path, attrs):
    """Held out in session 33 (a HiFi-GAN generator's ConvTranspose1d): the importer takes NCHW only. Expand writes
    zeros between the samples and a Conv1d of the flipped filter: ONNX Runtime's numbers, nothing left to name."""
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (the run extra) to compare with")
    import onnx
    from onnx_models import GraphBuilder, write

    from core.opconfigs.expand_functions import expand_functions
    from core.opconfigs.nnfusion_import import import_faults

    g = GraphBuilder({"x": [1, 8, 10]})
    up = g.node("ConvTranspose", ["x", g.weight("w", [8, 4, 16 if attrs["strides"] == [8] else 7]),
                                  g.weight("b", [4])], "up", **attrs)
    source = write(g.model(g.node("Relu", [up], "relu"), "up"), tmp_path / "m.onnx")
    (blocker,) = import_faults(onnx.shape_inference.infer_shapes(onnx.load(source)))[0]
    assert "1-D ConvTranspose" in blocker.reason and "kdb model expand" in blocker.reason
    expand_functions(source, tmp_path / "x.onnx", None)
    assert import_faults(onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "x.onnx"))) == ([], [])
    x = np.random.default_rng(0).standard_normal([1, 8, 10]).astype(np.float32)
    before, after = (ort.InferenceSession(str(p)).run(None, {"x": x})[0] for p in (source, tmp_path / "x.onnx"))
    assert before.shape == after.shape
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)

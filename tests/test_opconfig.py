"""Op-config lines: regressions the fuzz properties found."""

from __future__ import annotations

import json
import re

import pytest

from core.errors import InputError
from core.opconfigs.opconfig import format_line, format_structured, parse_line, parse_structured

CONV = "convolution_op_float|ws+1_1|w+10_1_1_1|g+{g}|i+1_2_1_1|wd+1_1|p+0_0|pa+0_0|o+1_10_1_1"


@pytest.mark.parametrize("groups", ["", "1_2"])
def test_a_group_field_that_is_not_one_number_is_refused_by_name(groups: str):
    with pytest.raises(InputError, match="one group count"):
        parse_line(CONV.format(g=groups), "ops.txt:3")


def test_one_group_count_reads():
    assert parse_line(CONV.format(g="2")).op_type == "Convolution"


@pytest.mark.parametrize(("ta", "tb"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_dot_flops_count_the_reduced_dimension_whatever_the_transposes(ta: int, tb: int):
    """m=4, k=256, n=512: A is m x k (k x m when transposed), B k x n (n x k)."""
    a, b = ("256_4" if ta else "4_256"), ("512_256" if tb else "256_512")
    config = parse_line(f"cublas_dot_op_float|a+{a}|b+{b}|o+4_512|ta+{ta}|tb+{tb}")
    assert config.flops == 2 * 4 * 512 * 256


def test_conv_and_pool_flops():
    conv = parse_line("cudnn_convolution_op_float|i+1_3_32_32|w+16_3_3_3|o+1_16_32_32|ws+1_1|wd+1_1|p+1_1")
    assert conv.flops == 2 * (16 * 32 * 32) * (3 * 3 * 3)
    pool = parse_line("cudnn_maxpool_op_float|i+1_16_32_32|o+1_16_16_16|win+2_2|ws+2_2|pb+0_0|pa+0_0")
    assert pool.flops == 16 * 16 * 16 * 4


BERT_DOT = "cublas_dot_op_float|a+1_128_768|b+768_768|o+1_128_768|ta+0|tb+0"


def test_a_bert_dense_dot_reads_from_lines_toml_and_json_alike():
    """NNFusion's Dot of a [1,128,768] activation by a [768,768] weight: one op config in all three formats, the
    identifier the compiler looks up, the FLOPs of its [128,768] x [768,768] product."""
    config = parse_line(BERT_DOT, "ops.txt:1")
    assert format_line(config) == BERT_DOT
    assert config.signature().identifier == "Dot1,128,768;768,768;1,128,768floatfloatfloat"
    assert config.matrix_dims() == (128, 768, 768)
    assert config.flops == 2 * 128 * 768 * 768
    assert config.bytes_moved == (128 * 768 * 2 + 768 * 768) * 4
    assert config.describe() == "Dot 1x128x768 x 768x768"
    by_hand = {"toml": '[[op]]\nop_type = "Dot"\narg0_shape = [1, 128, 768]\narg1_shape = [768, 768]\n'
                       'out_shape = [1, 128, 768]\n',
               "json": '[{"op_type": "Dot", "arg0_shape": [1, 128, 768], "arg1_shape": [768, 768], '
                       '"out_shape": [1, 128, 768], "transpose_A": false, "transpose_B": false}]'}
    for fmt, text in by_hand.items():
        for source in (text, format_structured([config], fmt)):
            read = parse_structured(source, fmt, f"ops.{fmt}")
            assert read.errors == [] and [format_line(c) for c in read.configs] == [BERT_DOT]
            assert read.configs[0].signature() == config.signature()


SOFTMAX = "cudnn_softmax_op_half|i+1_12_128_128|o+1_12_128_128"


def test_a_softmax_reads_from_lines_toml_and_json_alike_and_refuses_an_axis_or_another_shape():
    """NNFusion's Softmax is over the last axis (its identifier has none): shapes only, in all three formats."""
    config = parse_line(SOFTMAX, "ops.txt:1")
    assert format_line(config) == SOFTMAX and config.describe() == "Softmax 1x12x128x128 (last axis) half"
    assert config.signature().identifier == "Softmax1,12,128,128;1,12,128,128halfhalf"
    assert config.memory_bound and config.bytes_moved == 2 * 12 * 128 * 128 * 2
    for fmt in ("toml", "json"):
        read = parse_structured(format_structured([config], fmt), fmt, f"ops.{fmt}")
        assert read.errors == [] and [format_line(c) for c in read.configs] == [SOFTMAX]
    for line, said in (("cudnn_softmax_op_float|i+4_10|o+4_11", "differs from input_shape"),
                       ("cudnn_softmax_op_float|i+4_10|o+4_10|ax+0", "does not read back")):
        with pytest.raises(InputError, match=said):
            parse_line(line, "ops.txt:2")
    read = parse_structured('[{"op_type": "Softmax", "input_shape": [4, 10], "output_shape": [4, 10], "axis": 0}]',
                            "json", "ops.json")
    assert [e.reason for e in read.errors] == ["parameters.axis: a kdb Softmax is over the last axis, and NNFusion's "
                                               "identifier cannot say another: leave it out"]


@pytest.mark.parametrize(("line", "said"), [
    ("cudnn_reduce_sum_op_float|i+1_64_256|o+1_64", "Sum 1x64x256 over axis 2"),
    ("cudnn_reduce_sum_op_half|i+2_3_4|o+3", "Sum 2x3x4 over axis 0x2 half"),
    ("cudnn_reduce_sum_op_float|i+4_4|o+4", "reduces axes [0] or [1]: NNFusion's identifier (the shapes alone) cannot "
                                            "tell them apart"),
    ("cudnn_reduce_sum_op_float|i+4_5|o+3", "is not [4, 5] with some axes reduced"),
    ("cudnn_reduce_sum_op_float|i+4_5|o+4_5", "is not [4, 5] with some axes reduced"),
])
def test_a_sum_is_served_only_where_its_shapes_tell_its_axes(line: str, said: str):
    """NNFusion's Sum identifier is the two shapes (Sum1,64,256;1,64floatfloat): a row of [4, 4] -> [4] would serve a
    Sum over either axis, so such a config is refused where it is written."""
    if "over axis" in said:
        config = parse_line(line, "ops.txt:1")
        assert config.describe() == said and format_line(config) == line
        assert config.signature().identifier.startswith("Sum") and config.memory_bound
    else:
        with pytest.raises(InputError, match=re.escape(said)):
            parse_line(line, "ops.txt:1")


def test_a_rank_4_dot_counts_every_leading_axis_as_rows():
    config = parse_line("cublas_dot_op_float|a+2_3_16_32|b+32_8|o+2_3_16_8|ta+0|tb+0")
    assert config.matrix_dims() == (96, 32, 8) and config.flops == 2 * 96 * 32 * 8


@pytest.mark.parametrize(("a", "b", "out", "ta", "reason"), [
    ([768, 128, 1], [768, 768], [1, 128, 768], 1, "transpose_A.*must be false"),
    ([768], [768, 3072], [3072], 0, "arg0_shape.*BatchMatMul"),
    ([1, 128, 768], [1, 768, 768], [1, 128, 768], 0, "arg1_shape.*BatchMatMul"),
])
def test_a_dot_nnfusion_never_makes_is_refused_where_it_was_written(a, b, out, ta, reason):
    def dims(shape: list[int]) -> str:
        return "_".join(map(str, shape))

    line = f"cublas_dot_op_float|a+{dims(a)}|b+{dims(b)}|o+{dims(out)}|ta+{ta}|tb+0"
    with pytest.raises(InputError, match=reason) as caught:
        parse_line(line, "ops.txt:7")
    assert caught.value.where == "ops.txt:7"
    entry = {"op_type": "Dot", "arg0_shape": a, "arg1_shape": b, "out_shape": out, "transpose_A": bool(ta)}
    (error,) = parse_structured(json.dumps([entry]), "json", "ops.json").errors
    assert error.where == "ops.json#0" and re.search(reason, str(error))


@pytest.mark.parametrize(("line", "said"), [
    # ResNeXt's 3x3: group 32 of 128 channels, 4 a group
    ("cudnn_convolution_op_float|i+1_128_56_56|w+128_4_3_3|o+1_128_56_56|ws+1_1|wd+1_1|p+1_1|g+32",
     "grouped convolution (group=32, not depthwise): NNFusion's ONNX importer aborts"),
    ("cudnn_convolution_op_float|i+1_32_56_56|w+32_1_3_3|o+1_32_56_56|ws+1_1|wd+1_1|p+1_1|g+32",
     "depthwise convolution (group=32): NNFusion runs it as DepthwiseConv2dNative"),
    ("cudnn_convolution_op_float|i+1_32_56_56|w+64_1_3_3|o+1_64_56_56|ws+1_1|wd+1_1|p+1_1|g+32",
     "depthwise convolution with 64 filters for 32 channels"),
    ("cudnn_convolution_op_float|i+1_32_56_56|w+32_1_5_5|o+1_32_54_54|ws+1_1|wd+1_1|p+1_1|g+32",
     "padding is neither SAME nor VALID"),
])
def test_a_grouped_conv_has_no_signature_and_says_what_nnfusion_does_with_it(line: str, said: str):
    config = parse_line(line, "ops.txt:1")
    with pytest.raises(InputError, match=re.escape(said)) as raised:
        config.signature()
    assert raised.value.where == "ops.txt:1"


def test_a_dilated_convolution_says_its_dilation():
    """Four dilated convolutions read alike in `kdb failures` (issue 39): the description named no dilation."""
    plain = parse_line("cudnn_convolution_op_float|i+1_32_20_20|w+48_32_3_3|o+1_48_20_20|ws+1_1|wd+1_1|p+1_1")
    dilated = parse_line("cudnn_convolution_op_float|i+1_32_20_20|w+48_32_3_3|o+1_48_16_16|ws+1_1|wd+3_3|p+1_1")
    assert plain.describe() == "Convolution in 1x32x20x20 w 48x32x3x3 out 1x48x20x20 s1x1 p1x1"
    assert dilated.describe() == "Convolution in 1x32x20x20 w 48x32x3x3 out 1x48x16x16 s1x1 p1x1 d3x3"


@pytest.mark.parametrize(("line", "said"), [
    ("concat_op_float|i+1_8_16|i+1_8_8|o+1_8_24", "Concat 1x8x16 + 1x8x8 on axis 2"),
    ("concat_op_half|i+2_3_4|i+2_5_4|i+2_1_4|o+2_9_4", "Concat 2x3x4 + 2x5x4 + 2x1x4 on axis 1 half"),
    ("concat_op_float|i+2_2|i+2_2|o+4_2", "Concat 2x2 + 2x2 on axis 0"),
    ("concat_op_float|i+2_2|i+2_2|o+2_4", "Concat 2x2 + 2x2 on axis 1"),
    ("concat_op_float|i+1_8_16|i+1_8_8|o+1_8_25", "[1, 8, 25] is no concatenation of [[1, 8, 16], [1, 8, 8]]"),
    ("concat_op_float|i+1_8_16|i+1_7_8|o+1_15_24", "is no concatenation of"),
    ("concat_op_float|i+1_8|i+1_8_1|o+1_16", "is no concatenation of"),
    ("concat_op_float|o+1_16", "missing: a Concat's inputs"),
])
def test_a_concat_is_read_with_the_axis_its_shapes_tell(line: str, said: str):
    """NNFusion's Concat identifier is the inputs' shapes and the output's (Concat1,8,16;1,8,8;1,8,24floatfloatfloat),
    no axis: the one axis the inputs' sizes add up on tells it, and shapes that no axis joins are refused."""
    if " on axis " in said:
        config = parse_line(line, "ops.txt:1")
        assert config.describe() == said and format_line(config) == line and config.memory_bound
        shapes = [f.partition("+")[2].replace("_", ",") for f in line.split("|")[1:]]
        dtype = line.split("|")[0].rpartition("_op_")[2]
        assert config.signature().identifier == f"Concat{';'.join(shapes)}{dtype * len(shapes)}"
    else:
        with pytest.raises(InputError, match=re.escape(said)):
            parse_line(line, "ops.txt:1")

"""Kernel JSON items: what validate_item accepts, and what it refuses naming the field."""

from __future__ import annotations

import pytest

from core.demo import _conv
from core.errors import InputError
from core.kernels.kernel_json import validate_item


def strided_conv(out_hw: int, **params: object) -> dict:
    """A 3x3 stride-2 conv of a 56x56 input, padding 0 below: 27 outputs, or 28 with one more row above."""
    item = _conv("Convolution", 16, 56, 32, 3, 0)
    p = item["parameters"]
    p.update(window_movement_strides=[2, 2], output_shape=[1, 32, out_hw, out_hw], **params)
    return item


@pytest.mark.parametrize("out_hw", [27, 28])
def test_a_conv_padded_symmetrically_or_one_more_above_needs_no_pad_above(out_hw: int):
    """TensorFlow's SAME padding puts the odd row above: NNFusion's padding_below_diff alone allows both."""
    assert validate_item(strided_conv(out_hw)).op.outputs == ((1, 32, out_hw, out_hw),)


def test_an_output_that_follows_from_no_padding_is_refused_naming_the_field():
    with pytest.raises(InputError, match=r"output_shape\[2\].*29 does not follow from input 56.*expected 27"):
        validate_item(strided_conv(29))
    with pytest.raises(InputError, match=r"output_shape\[2\].*28 does not follow"):
        validate_item(strided_conv(28, padding_above_diff=[0, 0]))  # an explicit pad above rules out 28


def dot_item(a: list[int], b: list[int], out: list[int], *, ta: bool = False, tb: bool = False) -> dict:
    return {"tvm_func_name": "k", "op_type": "Dot", "code": "__global__ void k() {}", "gridDim": [1],
            "blockDim": [1], "parameters": {"arg0_shape": a, "arg1_shape": b, "out_shape": out,
                                            "transpose_A": ta, "transpose_B": tb}}


@pytest.mark.parametrize(("a", "b", "out", "identifier"), [
    ([1, 128, 768], [768, 768], [1, 128, 768], "Dot1,128,768;768,768;1,128,768floatfloatfloat"),
    ([2, 3, 16, 32], [32, 8], [2, 3, 16, 8], "Dot2,3,16,32;32,8;2,3,16,8floatfloatfloat"),
    ([1, 64], [64, 256], [1, 256], "Dot1,64;64,256;1,256floatfloatfloat"),
])
def test_a_dot_of_any_left_rank_from_two_is_the_identifier_nnfusion_looks_up(a, b, out, identifier):
    """The compiler's own lookups (seen with ../shared/nnfusion): a MatMul by a 2-D weight is a Dot whatever
    the activation's rank, its identifier the shapes as they are."""
    assert validate_item(dot_item(a, b, out)).op.identifier == identifier


@pytest.mark.parametrize(("a", "b", "out", "params", "field", "reason"), [
    ([768], [768, 3072], [3072], {}, "arg0_shape", "rank 2 or more, got 1.*BatchMatMul"),
    ([1, 128, 768], [768], [1, 128], {}, "arg1_shape", "must have rank 2, got 1.*BatchMatMul"),
    ([2, 128, 64], [2, 64, 128], [2, 128, 128], {}, "arg1_shape", "must have rank 2, got 3.*BatchMatMul"),
    ([1, 128, 768], [768, 64], [1, 128, 64], {"ta": True}, "transpose_A", "must be false.*rank 3.*MatMul"),
    ([1, 128, 768], [64, 768], [1, 128, 64], {"tb": True}, "transpose_B", "must be false.*rank 3.*MatMul"),
    ([1, 128, 768], [512, 64], [1, 128, 64], {}, "arg1_shape", "K=768"),
    ([1, 128, 768], [768, 64], [2, 128, 64], {}, "out_shape", r"expected \[1, 128, 64\]"),
    ([1, 128, 768], [768, 64], [128, 64], {}, "out_shape", "must have rank 3, got 2"),
])
def test_a_dot_nnfusion_does_not_make_is_refused_naming_the_field(a, b, out, params, field, reason):
    with pytest.raises(InputError, match=rf"parameters\.{field}.*{reason}"):
        validate_item(dot_item(a, b, out, **params))


def concat_item(inputs: list[list[int]], out: list[int]) -> dict:
    return {"tvm_func_name": "k", "op_type": "Concat", "parameters": {"input_shapes": inputs, "output_shape": out},
            "code": "__global__ void k() {}", "gridDim": [1], "blockDim": [1]}


def test_a_concat_nnfusion_writes_in_place_is_taken_with_a_warning():
    """Every axis before the joined one of size 1: NNFusion runs no kernel for it, and a row would make it copy."""
    in_place = validate_item(concat_item([[1, 2, 4], [1, 3, 4]], [1, 5, 4]))
    assert in_place.op.identifier == "Concat1,2,4;1,3,4;1,5,4floatfloatfloat"
    assert [w for w in in_place.warnings if "in place" in w and "axis 1" in w]
    copied = validate_item(concat_item([[2, 2, 4], [2, 3, 4]], [2, 5, 4]))
    assert copied.warnings == ()

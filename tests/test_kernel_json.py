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

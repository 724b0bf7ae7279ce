"""Op-config lines: regressions the fuzz properties found."""

from __future__ import annotations

import pytest

from core.errors import InputError
from core.opconfigs.opconfig import parse_line

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

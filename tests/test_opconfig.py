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

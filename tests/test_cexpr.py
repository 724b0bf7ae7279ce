"""C integer expressions as the barrier counter evaluates them: C's rules, not Python's."""

from __future__ import annotations

import pytest

from core.cuda import cexpr


@pytest.mark.parametrize(("text", "value"), [
    # / truncates toward zero and % takes the dividend's sign (Python floors both)
    ("-7 / 2", -3), ("7 / -2", -3), ("-7 % 3", -1), ("7 % -3", 1), ("-8 % 4", 0), ("-1 / 4", 0),
    # threadIdx.x is unsigned: arithmetic with it wraps at 2^32
    ("threadIdx.x - 1", 2**32 - 1), ("(int)threadIdx.x - 1", -1), ("threadIdx.x % 3 - 1", 2**32 - 1),
    ("0x80000000 > 0", 1), ("-1 < 0u", 0),
])
def test_integer_arithmetic_follows_c(text: str, value: int):
    assert cexpr.evaluate(cexpr.parse(text), {"threadIdx.x": 0}) == value


@pytest.mark.parametrize("text", ["x % 0", "x / (x - 5)", "1 << 64"])
def test_what_c_leaves_undefined_is_unknown(text: str):
    with pytest.raises(cexpr.Unknown):
        cexpr.evaluate(cexpr.parse(text), {"x": 5})

"""Static barrier counts: exact where provable, otherwise no number and the reason."""

from __future__ import annotations

import pytest

from core.cuda.barriers import count_barriers
from core.cuda.source import parse_kernel


def count(body: str, block=(64, 1, 1), grid=(4, 1, 1)):
    src = parse_kernel(f'extern "C" __global__ void k(float* input0, float* output0) {{\n{body}\n}}')
    return count_barriers(src, block, grid)


@pytest.mark.parametrize(("body", "expected"), [
    ("output0[0] = input0[0];", 0),
    ("__syncthreads();", 1),
    ("for (int i = 0; i < 16; ++i) { __syncthreads(); }", 16),
    ("for (int i = 0; i < 16; ++i) __syncthreads();", 16),
    ("for (int i = 0; i < 10; i += 3) { __syncthreads(); __syncthreads(); }", 8),
    ("for (int i = 8; i > 0; i--) { __syncthreads(); }", 8),
    ("for (int a = 0; a < 4; ++a) { for (int b = 0; b < a; ++b) { __syncthreads(); } }", 6),
    ("for (int a = 0; a < 3; ++a) { __syncthreads(); for (int b = 0; b < 2; ++b) { x[b] = 1; } __syncthreads(); }", 6),
    # counted loops (bound and step untouched by the body) are multiplied out, not walked: same counts
    ("for (int i = 0; i <= 10; i += 3) { __syncthreads(); }", 4),
    # `<=` reaches its bound: one more trip than `<` when the bound is hit exactly
    ("for (int i = 0; i <= 16; ++i) { __syncthreads(); }", 17),
    ("for (int i = 0; i <= 9; i += 3) { __syncthreads(); }", 4),
    ("int n = 4; for (int i = 1; i <= n; ++i) { __syncthreads(); }", 4),
    ("for (int i = 8; i >= 0; i--) { __syncthreads(); }", 9),
    ("for (int i = 0; i <= 16; ++i) { if (i <= 4) __syncthreads(); }", 5),  # walked: the body reads i
    ("for (int i = 5; i < 5; ++i) { __syncthreads(); }", 0),
    ("for (int i = 7; i < 3; ++i) { __syncthreads(); }", 0),
    ("for (int i = -6; i < 6; i += 4) { __syncthreads(); }", 3),
    ("int n = 3; for (int i = 0; i < n; ++i) { int t = 2; for (int j = 0; j < t; ++j) { __syncthreads(); } }", 6),
    ("for (int i = 0; i < 4; ++i) { if (threadIdx.x < 8) { __syncthreads(); } }", 4),
    ("int s = 2; for (int i = 0; i < 9; i += s) { __syncthreads(); }", 5),
    # conditions on thread and block indices are evaluated for thread 0 of block 0
    ("if (((int)threadIdx.x) < 46) { __syncthreads(); }", 1),
    ("if (threadIdx.x >= 32) { __syncthreads(); } else { __syncthreads(); __syncthreads(); }", 2),
    ("if (blockIdx.x == 0 && threadIdx.y == 0) __syncthreads();", 1),
    # single-assignment locals, blockDim from the launch config
    ("int warp = threadIdx.x >> 5; int col = blockIdx.x * blockDim.x / 4 + warp; if (col < 256) { __syncthreads(); }", 1),
    ("int n = blockDim.x / 16; for (int i = 0; i < n; ++i) { __syncthreads(); }", 4),
    # a barrier-free branch on data is fine; so are equal branches
    ("if (input0[0] > 0.f) { output0[0] = 1.f; } __syncthreads();", 1),
    ("if (input0[0] > 0.f) { __syncthreads(); } else { __syncthreads(); }", 1),
    # an early return before the barrier, taken or not by thread 0
    ("if (threadIdx.x > 100) return; __syncthreads();", 1),
    ("if (threadIdx.x == 0) return; __syncthreads();", 0),
    ("for (int i = 0; i < 4; ++i) { __syncthreads(); if (i == 2) return; }", 3),
    # comments, strings and directives hold no barriers
    ("// __syncthreads();\n/* __syncthreads(); */\n#pragma unroll\nfor (int i = 0; i < 2; ++i) { __syncthreads(); }", 2),
    # a return after the last top-level barrier cannot change the count
    ("__syncthreads(); if (input0[0] > 0.f) return; output0[0] = 1.f;", 1),
])
def test_exact_counts(body: str, expected: int):
    result = count(body)
    assert result.reason == ""
    assert result.count == expected


@pytest.mark.parametrize(("body", "why"), [
    ("while (input0[0] > 0) { __syncthreads(); }", "while"),
    ("do { __syncthreads(); } while (input0[0] > 0);", "do"),
    ("if (input0[0] > 0.f) { __syncthreads(); }", "input0"),
    ("for (int i = 0; i < (int)input0[0]; ++i) { __syncthreads(); }", "input0"),
    ("int n = 4; if (threadIdx.x == 0) { n = 8; } for (int i = 0; i < n; ++i) { __syncthreads(); }", "n"),
    ("for (int i = 0; i < 8; ++i) { __syncthreads(); i += 1; }", "changes inside the loop"),
    ("for (int i = 0; i < 8; ++i) { __syncthreads(); if (i == 3) break; }", "break"),
    # a body that changes the bound is walked, not multiplied out, and then the bound is unknown
    ("int n = 8; for (int i = 0; i < n; ++i) { __syncthreads(); n = (int)input0[0]; }", "n"),
    ("for (int i = 0; i < 100000000; ++i) { __syncthreads(); }", "loop steps"),
    ("int c = __syncthreads_count(1);", "__syncthreads_count"),
    ("for (int i = 0; i < 100000000; ++i) { for (int j = 0; j < 100; ++j) { if (j == i) __syncthreads(); } }", "loop steps"),
    ('asm volatile("bar.sync 0;");', "bar"),
    ("lbl: __syncthreads(); goto lbl;", "goto"),
])
def test_unprovable_counts_carry_a_reason_and_no_number(body: str, why: str):
    result = count(body)
    assert result.count is None
    assert "not provable statically" in result.reason and why in result.reason

"""Reading kernel sources: parameters, every kind of __shared__ declaration, what lies outside."""

from __future__ import annotations

import pytest

from core.cuda.source import mask, parse_kernel
from core.errors import InputError

HEAD = 'extern "C" __global__ void k(float* __restrict__ A, float* B, float* C) {\n'


def test_parameters_and_qualifiers():
    src = parse_kernel('extern "C" __global__ void __launch_bounds__(128) k(const float* __restrict__ a, '
                       "float* b) { b[0] = a[0]; }")
    assert [(p.name, p.base_type, p.pointer_depth, p.is_const) for p in src.params] == [
        ("a", "float", 1, True), ("b", "float", 1, False)]
    assert src.launch_bounds == 128


def test_launch_bounds_in_nnfusions_own_order_before_global():
    # How NNFusion's CudaEmitter (and our rows, and `kdb export`) write it; the name may follow `void`.
    src = parse_kernel('extern "C" __launch_bounds__(2 * 32) __global__ void k(float* input0, float* output0) '
                       "{ output0[threadIdx.x] = input0[threadIdx.x]; }")
    assert src.launch_bounds == 64 and [p.name for p in src.params] == ["input0", "output0"] and not src.notes
    with pytest.raises(InputError, match="code outside the kernel"):
        parse_kernel('extern "C" int x; __launch_bounds__(64) __global__ void k(float* a) { a[0] = 1; }')


def test_shared_declarations_are_hoisted_and_casts_stay():
    code = HEAD + (
        "  __shared__ float A_shared[1024];\n"
        "  __shared__ float tile[4][33], s;\n"
        "  ((__shared__ float4*)(A_shared + 4))[0] = ((float4*)A)[0];\n"
        "  for (int i = 0; i < 2; ++i) { __shared__ float inner[32 * 2]; inner[i] = 0; }\n"
        "}")
    src = parse_kernel(code)
    assert [(d.name, d.symbol, d.dtype, d.size) for d in src.shared] == [
        ("A_shared", "A_shared", "float", 1024),
        ("tile", "tile_kdb_flat", "float", 132),
        ("s", "s_kdb_flat", "float", 1),
        ("inner", "inner", "float", 64),
    ]
    body = src.body_without_shared()
    assert "__shared__ float A_shared" not in body and "__shared__ float inner" not in body
    assert "((__shared__ float4*)(A_shared + 4))[0]" in body
    assert src.shared[1].alias == "float (*tile)[33] = reinterpret_cast<float (*)[33]>(tile_kdb_flat);"
    assert src.shared[2].alias == "float& s = s_kdb_flat[0];"


@pytest.mark.parametrize(("code", "reason"), [
    (HEAD + "extern __shared__ float buf[]; }", "dynamic shared memory"),
    ("__device__ float two() { return 2.f; }\n" + HEAD + "C[0] = two(); }", "outside the kernel"),
    (HEAD + "C[0] = 1; }\n" + HEAD + "C[0] = 2; }", "2 __global__ kernels"),
    (HEAD + "C[0] = 1;", "unbalanced brace"),
    ("float f(float* a) { return a[0]; }", "no __global__"),
    (HEAD + "__shared__ float x[N]; }", "not a constant"),
    (HEAD + "__shared__ float x[4]; { __shared__ float x[4]; } }", "declared twice"),
    ("template <int N> __global__ void k(float* a) { a[0] = N; }", "templated"),
])
def test_unusable_sources_are_refused_with_a_reason(code: str, reason: str):
    with pytest.raises(InputError, match=reason):
        parse_kernel(code)


def test_preprocessor_lines_outside_are_noted_not_fatal():
    src = parse_kernel("#include <cuda_fp16.h>\n" + HEAD + "C[0] = 1; }\n")
    assert any("not stored" in n for n in src.notes)


def test_mask_keeps_length_and_blanks_comments_strings_and_directives():
    code = 'a = "x;}"; // c }\n/* { */ b;\n#define X {\nc;'
    masked = mask(code)
    assert len(masked) == len(code)
    assert "}" not in masked.replace('"', "") and "{" not in masked and "c;" in masked


def test_a_lone_surrogate_in_the_body_does_not_break_brace_matching():
    """Found by the fuzz run: text decoded with surrogateescape kept a lone surrogate; the vectorised
    brace matcher's UTF-32 encode raised UnicodeEncodeError instead of reading past it."""
    from core.cuda.source import brace_pairs

    assert brace_pairs("a{\ud800{}}", 1) == {1: 5, 3: 4}

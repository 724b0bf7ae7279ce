"""core/opconfigs/einsum.py: the plan that writes an Einsum as Transposes, Reshapes and a MatMul, held against numpy's
einsum on the equations torch code writes (attention, ellipsis, implicit outputs), and the ones it must refuse."""

from __future__ import annotations

import numpy as np
import pytest

from core.opconfigs.einsum import plan, steps

SIZES = dict(zip("abcdehijklmnpqrs", (2, 3, 4, 5, 3, 2, 3, 4, 2, 5, 3, 4, 2, 3, 6, 1), strict=True))


def operands(equation: str) -> list[np.ndarray]:
    """Random operands for the equation's named letters; an ellipsis is [2, 3] (or its right part where shorter)."""
    rng = np.random.default_rng(0)
    lhs = equation.split("->")[0].split(",")
    shapes = []
    for term in lhs:
        ellipsis = [2, 3][:term.count(".") // 3 * 2] if "..." in term else []
        shapes.append([*ellipsis, *(SIZES[c] for c in term.replace("...", ""))])
    return [rng.standard_normal(s).astype(np.float64) for s in shapes]


def computed(equation: str, xs: list[np.ndarray]) -> np.ndarray:
    """What the written nodes compute (ONNX's Transpose, Reshape and MatMul are numpy's)."""
    made = plan(equation, [list(x.shape) for x in xs])
    assert made is not None
    moved = [np.transpose(x, o.perm).reshape(o.shape) for x, o in zip(xs, made.operands, strict=True)]
    if len(moved) == 1:
        return moved[0]
    return np.transpose(np.matmul(*moved).reshape(made.product), made.out_perm)


@pytest.mark.parametrize("equation", [
    "bqhd,bkhd->bhqk",  # attention scores, heads in the third axis (einsum_attn)
    "bhqk,bkhd->bqhd",  # attention's weighted values
    "bhnd,bhmd->bhnm", "bij,bjk->bik", "ij,jk->ik", "ij,kj->ik", "ji,jk->ki",
    "i,j->ij",  # an outer product (nothing contracted)
    "i,i->",  # a dot product to a scalar
    "bnd,dk->bnk", "bn,nd->bd", "bhd,bhd->bh",
    "...ij,...jk->...ik", "...ij,jk->...ik",  # ellipsis, broadcast by alignment
    "ij,jk",  # implicit output: ik
    "bqd,bkd",  # implicit: bkq (alphabetical)
    "ij->ji", "bhqd->bqhd",  # one operand: a transpose
    "b i j , b j k -> b i k",  # spaces
])
def test_the_plan_computes_numpys_einsum(equation: str):
    xs = operands(equation.replace(" ", ""))
    np.testing.assert_allclose(computed(equation, xs), np.einsum(equation.replace(" ", ""), *xs), rtol=1e-12,
                               atol=1e-12)


def test_one_batch_is_a_plain_dot():
    """A batch of 1 is dropped: [m, k] x [k, n], the Dot rows kdb serves most (a BatchMatMul otherwise)."""
    made = plan("bij,bjk->bik", [[1, 3, 4], [1, 4, 5]])
    assert made is not None and [o.shape for o in made.operands] == [[3, 4], [4, 5]]


@pytest.mark.parametrize("equation, shapes", [
    ("ii->i", [[3, 3]]),  # a diagonal
    ("ij->i", [[3, 4]]),  # a sum over an axis of one operand
    ("ij,jk->k", [[3, 4], [4, 5]]),  # i summed inside the first operand
    ("ij,jk,kl->il", [[2, 3], [3, 4], [4, 5]]),  # three operands
    ("bij,bjk->bik", [[1, 3, 4], [2, 4, 5]]),  # a named letter broadcast from 1
    ("ij,jk->ik", [[3, 4], [5, 6]]),  # sizes that differ
    ("ijk,jk->ik", [[3, 4], [4, 5]]),  # a term longer than its operand's rank
    ("ij,jk->iz", [[3, 4], [4, 5]]),  # an output letter no operand has
])
def test_what_the_plan_refuses(equation: str, shapes: list[list[int]]):
    assert plan(equation, shapes) is None


@pytest.mark.parametrize("equation", [
    "bnd,bde,bn->bne",  # a Performer's normalised linear attention (held out in session 33)
    "ij,jk,kl->il", "i,i,i->", "bij,bjk,bk->bi", "...ij,jk,k->...i",
])
def test_three_operands_or_more_are_a_chain_of_pairs(equation: str):
    xs = operands(equation)
    chain = steps(equation, [list(x.shape) for x in xs])
    assert chain is not None and len(chain) == len(xs) - 1
    result = xs[0]
    for k, (step, _) in enumerate(chain):
        result = computed(step, [result, xs[k + 1]])
    np.testing.assert_allclose(result, np.einsum(equation, *xs), rtol=1e-12, atol=1e-12)

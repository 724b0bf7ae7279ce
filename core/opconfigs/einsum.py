"""An ONNX Einsum (torch.einsum's export; NNFusion's importer has no translator for it) as the ops it imports: each
operand transposed and reshaped to [batch, rows, contracted] and [batch, contracted, cols], one MatMul, and its product
reshaped and transposed to the equation's output; three operands or more as a chain of such steps, left to right
(`steps`). `kdb model expand` writes what `plan` gives (import_rewrites._einsum). Where a plan cannot be made (a letter
summed inside one operand, a repeated letter: a diagonal), None: the node stays, and coverage names it."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Operand:
    perm: list[int]  # the transpose that puts its axes in the MatMul's order
    shape: list[int]  # then the reshape to the MatMul's operand: [batch, rows, contracted] / [batch, contracted, cols]


@dataclass(frozen=True)
class EinsumPlan:
    operands: list[Operand]  # one: a transpose alone (`product` and `out_perm` then unused); two: a MatMul's
    product: list[int]  # the MatMul's [batch, rows, cols] reshaped to its letters' sizes: batch, rows, cols
    out_perm: list[int]  # then transposed to the equation's output


def _terms(equation: str, ranks: list[int]) -> tuple[list[str], str] | None:
    """The equation's input terms and output, each ellipsis written as letters of its own (the same ones in every
    term, right-aligned as broadcasting aligns them), the implicit output made explicit (ONNX: the ellipsis' axes,
    then the letters that appear once, in alphabetical order). None where a term's letters miss its operand's rank."""
    text = equation.replace(" ", "")
    lhs, arrow, out = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        return None
    widest = max((rank - len(t.replace("...", "")) for t, rank in zip(terms, ranks, strict=True) if "..." in t),
                 default=0)
    fresh = [chr(0x100 + i) for i in range(widest)]  # (ONNX's letters are ASCII: these cannot clash)
    written = []
    for term, rank in zip(terms, ranks, strict=True):
        span = rank - len(term.replace("...", ""))
        if "..." in term:
            term = term.replace("...", "".join(fresh[widest - span:]))
        if len(term) != rank or not all(c.isalpha() for c in term):
            return None
        written.append(term)
    if arrow:
        output = out.replace("...", "".join(fresh))
    else:
        counts = {c: sum(t.count(c) for t in written) for t in written for c in t}
        output = "".join(fresh) + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in fresh))
    return written, output


def plan(equation: str, shapes: list[list[int]]) -> EinsumPlan | None:
    """How one or two operands of these static shapes compute the equation by Transpose, Reshape and MatMul."""
    if not 1 <= len(shapes) <= 2:
        return None
    written = _terms(equation, [len(s) for s in shapes])
    if written is None:
        return None
    terms, output = written
    size: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        if len(set(term)) != len(term):  # (a repeated letter: a diagonal)
            return None
        for letter, n in zip(term, shape, strict=True):
            if size.setdefault(letter, n) != n:  # (a broadcast size 1 against n: not written here)
                return None
    if len(set(output)) != len(output) or any(c not in size for c in output):
        return None
    if len(terms) == 1:
        (term,) = terms
        if sorted(term) != sorted(output):  # (a sum over an axis)
            return None
        return EinsumPlan([Operand([term.index(c) for c in output], [size[c] for c in output])], [], [])
    a, b = terms
    if any(c not in output and c not in (b if c in a else a) for c in size):  # (summed inside one operand)
        return None
    batch = [c for c in output if c in a and c in b]
    rows, cols = [c for c in output if c in a and c not in b], [c for c in output if c in b and c not in a]
    contracted = [c for c in a if c in b and c not in output]
    dims = [math.prod(size[c] for c in group) for group in (batch, rows, contracted, cols)]
    lead = dims[:1] if dims[0] != 1 else []  # (one batch: a plain Dot, which kdb serves most)
    operands = [Operand([a.index(c) for c in (*batch, *rows, *contracted)], [*lead, dims[1], dims[2]]),
                Operand([b.index(c) for c in (*batch, *contracted, *cols)], [*lead, dims[2], dims[3]])]
    order = [*batch, *rows, *cols]
    return EinsumPlan(operands, [size[c] for c in order], [order.index(c) for c in output])


def steps(equation: str, shapes: list[list[int]]) -> list[tuple[str, list[list[int]]]] | None:
    """The equation as one- or two-operand equations, each with its operands' shapes: the first operand contracted
    with the second, that result with the third, ..., each keeping the letters a later operand or the output reads
    (a Performer's `bnd,bde,bn->bne`: `bnd,bde->bne`, then `bne,bn->bne`). None where a term misses its rank."""
    written = _terms(equation, [len(s) for s in shapes])
    if written is None:
        return None
    terms, output = written
    if len(terms) <= 2:
        return [(",".join(terms) + "->" + output, shapes)]
    size = {c: n for term, shape in zip(terms, shapes, strict=True) for c, n in zip(term, shape, strict=True)}
    chain, result, result_shape = [], terms[0], shapes[0]
    for k in range(1, len(terms)):
        later = set("".join(terms[k + 1:])) | set(output)
        out = output if k == len(terms) - 1 else "".join(dict.fromkeys(c for c in result + terms[k] if c in later))
        chain.append((f"{result},{terms[k]}->{out}", [result_shape, shapes[k]]))
        result, result_shape = out, [size[c] for c in out]
    return chain

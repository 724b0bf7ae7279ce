"""A tiny evaluator for C integer expressions, as TVM writes them in loop bounds and conditions.

Used to count barriers statically: expressions are parsed once into tuples and evaluated many times
with an environment (thread 0 of block 0, loop variables, single-assignment locals). Anything that
is not plain integer arithmetic on known names raises Unknown; nothing is ever executed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Expr = tuple[Any, ...]


class Unknown(Exception):
    """The expression's value cannot be known statically (unknown name, float, call, ...)."""


class ParseError(Exception):
    """The text is not an expression this evaluator understands."""


_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9a-fA-F]+|\d+)(?P<suffix>[uUlL]*)(?![\w.])"
    r"|(?P<float>\d*\.\d+(?:[eE][-+]?\d+)?[fF]?|\d+[eE][-+]?\d+[fF]?|\d+\.[fF]?)"
    r"|(?P<name>[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)?)"
    r"|(?P<op><<|>>|<=|>=|==|!=|&&|\|\||[-+*/%<>&|^!~?:(),]))"
)

_INT_TYPES = frozenset(
    ["int", "unsigned", "signed", "long", "short", "char", "size_t", "int32_t", "int64_t", "uint32_t",
     "uint64_t", "int16_t", "uint16_t", "int8_t", "uint8_t", "bool"]
)

# Binary operators: precedence (higher binds tighter) and C semantics.
_BINARY: dict[str, tuple[int, Callable[[int, int], int]]] = {
    "||": (1, lambda a, b: int(bool(a) or bool(b))),
    "&&": (2, lambda a, b: int(bool(a) and bool(b))),
    "|": (3, lambda a, b: a | b),
    "^": (4, lambda a, b: a ^ b),
    "&": (5, lambda a, b: a & b),
    "==": (6, lambda a, b: int(a == b)),
    "!=": (6, lambda a, b: int(a != b)),
    "<": (7, lambda a, b: int(a < b)),
    "<=": (7, lambda a, b: int(a <= b)),
    ">": (7, lambda a, b: int(a > b)),
    ">=": (7, lambda a, b: int(a >= b)),
    "<<": (8, lambda a, b: a << b if 0 <= b < 64 else _raise_unknown()),
    ">>": (8, lambda a, b: a >> b if 0 <= b < 64 else _raise_unknown()),
    "+": (9, lambda a, b: a + b),
    "-": (9, lambda a, b: a - b),
    "*": (10, lambda a, b: a * b),
    "/": (10, lambda a, b: _cdiv(a, b)),
    "%": (10, lambda a, b: a - _cdiv(a, b) * b),
}

_FUNCTIONS: dict[str, Callable[..., int]] = {"min": min, "max": max}


def _raise_unknown() -> int:
    raise Unknown("shift out of range")


def _cdiv(a: int, b: int) -> int:
    if b == 0:
        raise Unknown("division by zero")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos, end = 0, len(text.rstrip())
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ParseError(f"unexpected text {text[pos:pos + 20]!r}")
        kind = m.lastgroup
        if kind == "suffix":
            kind = "num"
        value = m.group(kind) if kind != "num" else m.group("num")
        if kind == "name":
            value = re.sub(r"\s+", "", value)
        out.append((kind or "", value))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.toks = tokens
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i] if self.i < len(self.toks) else ("end", "")

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise ParseError(f"expected {value!r}, got {tok[1]!r}")
        if tok[0] == "end":
            raise ParseError("unexpected end of expression")
        self.i += 1
        return tok

    def expression(self, min_prec: int = 0) -> Expr:
        left = self.unary()
        while True:
            kind, op = self.peek()
            if kind == "op" and op == "?" and min_prec == 0:
                self.take()
                then = self.expression()
                self.take(":")
                other = self.expression()
                left = ("?", left, then, other)
                continue
            if kind != "op" or op not in _BINARY:
                return left
            prec = _BINARY[op][0]
            if prec < min_prec or prec == 0:
                return left
            self.take()
            right = self.expression(prec + 1)
            left = ("bin", op, left, right)

    def unary(self) -> Expr:
        kind, tok = self.peek()
        if kind == "op" and tok in "-+!~" and tok:
            self.take()
            return ("un", tok, self.unary())
        if kind == "op" and tok == "(":
            # A cast to an integer type is the identity here; anything else is a parenthesis.
            j = self.i + 1
            names = []
            while j < len(self.toks) and self.toks[j][0] == "name":
                names.append(self.toks[j][1])
                j += 1
            if names and j < len(self.toks) and self.toks[j][1] == ")" and all(n in _INT_TYPES for n in names):
                self.i = j + 1
                return self.unary()
            self.take("(")
            inner = self.expression()
            self.take(")")
            return inner
        return self.primary()

    def primary(self) -> Expr:
        kind, tok = self.take()
        if kind == "num":
            octal = tok.startswith("0") and tok != "0" and not tok.lower().startswith("0x")
            return ("num", int(tok, 8) if octal else int(tok, 0))
        if kind == "float":
            return ("float", tok)
        if kind == "name":
            if self.peek()[1] == "(":
                self.take("(")
                args: list[Expr] = []
                if self.peek()[1] != ")":
                    args.append(self.expression())
                    while self.peek()[1] == ",":
                        self.take(",")
                        args.append(self.expression())
                self.take(")")
                return ("call", tok, tuple(args))
            if tok in ("true", "false"):
                return ("num", int(tok == "true"))
            return ("name", tok)
        raise ParseError(f"unexpected {tok!r}")


def parse(text: str) -> Expr:
    """Parse a C expression; ParseError if it is not one this evaluator understands."""
    parser = _Parser(_tokens(text))
    if parser.peek()[0] == "end":
        raise ParseError("empty expression")
    expr = parser.expression()
    if parser.peek()[0] != "end":
        raise ParseError(f"unexpected {parser.peek()[1]!r}")
    return expr


def evaluate(expr: Expr, env: Mapping[str, int | None]) -> int:
    """Value of `expr` in `env` (a name mapped to None is known to be unknown)."""
    tag = expr[0]
    if tag == "num":
        return expr[1]
    if tag == "name":
        value = env.get(expr[1])
        if value is None:
            raise Unknown(f"{expr[1]} is not known statically")
        return value
    if tag == "bin":
        op = expr[1]
        left = evaluate(expr[2], env)
        if op == "&&" and not left:
            return 0
        if op == "||" and left:
            return 1
        return _BINARY[op][1](left, evaluate(expr[3], env))
    if tag == "un":
        value = evaluate(expr[2], env)
        return {"-": -value, "+": value, "!": int(not value), "~": ~value}[expr[1]]
    if tag == "?":
        return evaluate(expr[2] if evaluate(expr[1], env) else expr[3], env)
    if tag == "call":
        fn = _FUNCTIONS.get(expr[1])
        if fn is None:
            raise Unknown(f"call to {expr[1]}() is not evaluated statically")
        return fn(*(evaluate(a, env) for a in expr[2]))
    if tag == "opaque":
        raise Unknown(f"`{expr[1]}` is not integer arithmetic on known values")
    raise Unknown(f"{expr[1]} is not an integer")


def names(expr: Expr) -> set[str]:
    """Every name an expression reads."""
    tag = expr[0]
    if tag == "name":
        return {expr[1]}
    if tag == "call":
        return set().union(*(names(a) for a in expr[2])) if expr[2] else set()
    if tag in ("bin",):
        return names(expr[2]) | names(expr[3])
    if tag == "un":
        return names(expr[2])
    if tag == "?":
        return names(expr[1]) | names(expr[2]) | names(expr[3])
    return set()

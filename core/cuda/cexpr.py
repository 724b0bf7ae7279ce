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
        value = m.group(kind) if kind != "num" else m.group("num") + m.group("suffix")
        if kind == "name":
            value = re.sub(r"\s+", "", value)
        out.append((kind or "", value))
        pos = m.end()
    return out


class U(int):
    """A value of C type `unsigned int` (threadIdx.x and friends are unsigned: `threadIdx.x - 1` wraps)."""


MASK32 = 1 << 32
UNSIGNED_BUILTINS = frozenset(f"{v}.{a}" for v in ("threadIdx", "blockIdx", "blockDim", "gridDim") for a in "xyz")
_SIGNED32_CASTS = frozenset(["int", "signed", "int32_t", "signed int"])
_UNSIGNED32_CASTS = frozenset(["unsigned", "unsigned int", "uint32_t", "uint"])
MAX_LITERAL_DIGITS = 40


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
        if kind == "op" and tok in ("-", "+", "!", "~"):
            self.take()
            return ("un", tok, self.unary())
        if kind == "op" and tok == "(":
            j = self.i + 1
            names = []
            while j < len(self.toks) and self.toks[j][0] == "name":
                names.append(self.toks[j][1])
                j += 1
            if names and j < len(self.toks) and self.toks[j][1] == ")" and all(n in _INT_TYPES for n in names):
                self.i = j + 1
                return ("cast", " ".join(names), self.unary())
            self.take("(")
            inner = self.expression()
            self.take(")")
            return inner
        return self.primary()

    def primary(self) -> Expr:
        kind, tok = self.take()
        if kind == "num":
            digits, suffix = re.fullmatch(r"(0[xX][0-9a-fA-F]+|\d+)([uUlL]*)", tok).groups()  # type: ignore[union-attr]
            if len(digits) > MAX_LITERAL_DIGITS:
                raise ParseError(f"integer literal of {len(digits)} digits")
            octal = digits.startswith("0") and digits != "0" and not digits.lower().startswith("0x")
            if octal and not re.fullmatch(r"0[0-7]+", digits):
                raise ParseError(f"{digits} is not an octal number")
            value = int(digits, 8) if octal else int(digits, 0)
            # C: a 'u' suffix is unsigned; so is a hex literal that does not fit in int but fits unsigned.
            hex_unsigned = digits.lower().startswith("0x") and MASK32 // 2 <= value < MASK32
            return ("num", value, "u" in suffix.lower() or hex_unsigned)
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
                return ("num", int(tok == "true"), False)
            return ("name", tok)
        raise ParseError(f"unexpected {tok!r}")


def parse(text: str) -> Expr:
    """Parse a C expression; ParseError if it is not one this evaluator understands."""
    try:
        parser = _Parser(_tokens(text))
        if parser.peek()[0] == "end":
            raise ParseError("empty expression")
        expr = parser.expression()
    except RecursionError:
        raise ParseError("expression nested too deeply") from None
    if parser.peek()[0] != "end":
        raise ParseError(f"unexpected {parser.peek()[1]!r}")
    return expr


def evaluate(expr: Expr, env: Mapping[str, int | None]) -> int:
    """Value of `expr` in `env` (a name mapped to None is known to be unknown; U(...) values are unsigned).

    C's rules for 32-bit unsigned arithmetic apply: an operation with an unsigned operand is done
    unsigned (wrapping), and so are comparisons.
    """
    try:
        return _eval(expr, env)[0]
    except RecursionError:
        raise Unknown("expression nested too deeply") from None


def evaluate_typed(expr: Expr, env: Mapping[str, int | None]) -> tuple[int, bool]:
    """Like evaluate, with whether C would treat the value as unsigned."""
    try:
        return _eval(expr, env)
    except RecursionError:
        raise Unknown("expression nested too deeply") from None


def _eval(expr: Expr, env: Mapping[str, int | None]) -> tuple[int, bool]:
    tag = expr[0]
    if tag == "num":
        return expr[1], bool(expr[2]) if len(expr) > 2 else False
    if tag == "name":
        value = env.get(expr[1])
        if value is None:
            raise Unknown(f"{expr[1]} is not known statically")
        unsigned = isinstance(value, U) or expr[1] in UNSIGNED_BUILTINS
        return (int(value) % MASK32, True) if unsigned else (int(value), False)
    if tag == "bin":
        op = expr[1]
        left, lu = _eval(expr[2], env)
        if op in ("&&", "||"):
            if (op == "&&" and not left) or (op == "||" and left):
                return int(op == "||"), False
            return int(bool(_eval(expr[3], env)[0])), False
        right, ru = _eval(expr[3], env)
        if op in ("<<", ">>"):
            unsigned = lu  # a shift has the type of its left operand
        else:
            unsigned = lu or ru
            if unsigned:
                left, right = left % MASK32, right % MASK32
        result = _BINARY[op][1](left, right)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return result, False
        return (result % MASK32, True) if unsigned else (result, False)
    if tag == "un":
        value, unsigned = _eval(expr[2], env)
        if expr[1] == "!":
            return int(not value), False
        result = {"-": -value, "+": value, "~": ~value}[expr[1]]
        return (result % MASK32, True) if unsigned else (result, False)
    if tag == "cast":
        value, _ = _eval(expr[2], env)
        if expr[1] in _UNSIGNED32_CASTS:
            return value % MASK32, True
        if expr[1] in _SIGNED32_CASTS:
            value %= MASK32
            return (value - MASK32 if value >= MASK32 // 2 else value), False
        if value < 0 and ("unsigned" in expr[1] or expr[1].startswith(("size_t", "uint"))):
            raise Unknown(f"({expr[1]}) of a negative value")
        return value, False
    if tag == "?":
        return _eval(expr[2] if _eval(expr[1], env)[0] else expr[3], env)
    if tag == "call":
        fn = _FUNCTIONS.get(expr[1])
        if fn is None:
            raise Unknown(f"call to {expr[1]}() is not evaluated statically")
        if len(expr[2]) != 2:
            raise Unknown(f"{expr[1]}() with {len(expr[2])} arguments")
        (a, au), (b, bu) = (_eval(x, env) for x in expr[2])
        unsigned = au or bu
        if unsigned:
            a, b = a % MASK32, b % MASK32
        return fn(a, b), unsigned
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
    if tag == "bin":
        return names(expr[2]) | names(expr[3])
    if tag in ("un", "cast"):
        return names(expr[2])
    if tag == "?":
        return names(expr[1]) | names(expr[2]) | names(expr[3])
    return set()

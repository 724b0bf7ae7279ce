"""Fuzzing every parser: whatever the input, only InputError escapes, and the round-trips hold.

Each property is two tests: test_fuzz_NAME, marked `fuzz`, runs FUZZ_EXAMPLES examples (10,000; `make test`
runs them with the rest, `pytest -m fuzz` alone, KDB_FUZZ_EXAMPLES=300 makes a quick local run), and test_NAME runs SMOKE_EXAMPLES in the
default run. A property that found a bug in core is xfail(strict=True) with the minimal failing input as an
explicit example, so it fails every time until core is fixed and then XPASSes: the cue to drop the mark.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, example, given, reject, settings
from hypothesis import strategies as st

from core.cuda import cexpr
from core.cuda.barriers import BarrierCount, count_barriers
from core.cuda.source import mask, parse_kernel
from core.errors import InputError
from core.kernels.kernel_json import GRID_LIMITS, KernelSpec, parse_items, validate_item
from core.kernels.lint import CRASH, UNREACHABLE, WARNING, Finding, lint_row, lint_rows, quick_problem
from core.kernels.ops import CONV_FAMILY, DTYPES, ELEMENTWISE_ARITY
from core.kernels.profile import format_profile, merge_profile, parse_profile
from core.opconfigs.autotvm_log import CONV_TASK, MATMUL_TASK, MAX_LINE_BYTES, MAX_REPORTED_BAD_LINES, read_log
from core.opconfigs.opconfig import OpConfig, format_line, format_structured, parse_line, parse_lines, parse_structured
from core.settings import Settings, parse_value

FUZZ_EXAMPLES = int(os.environ.get("KDB_FUZZ_EXAMPLES", "10000"))
SMOKE_EXAMPLES = 50

Property = Callable[..., None]


def fuzzed(*, xfail: str = "", **strategies: st.SearchStrategy[Any]) -> Callable[[Property], Property]:
    """Register a property as test_fuzz_NAME (marked fuzz, FUZZ_EXAMPLES) and test_NAME (SMOKE_EXAMPLES)."""

    def register(prop: Property) -> Property:
        for name, examples, fuzz in ((f"test_fuzz_{prop.__name__}", FUZZ_EXAMPLES, True),
                                     (f"test_{prop.__name__}", SMOKE_EXAMPLES, False)):
            test = settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])(
                given(**strategies)(prop))
            if fuzz:
                test = pytest.mark.fuzz(test)
            if xfail:
                test = pytest.mark.xfail(strict=True, reason=xfail)(test)
            globals()[name] = test
        return prop

    return register


# ---------------------------------------------------------------------------------------------
# Shared strategies: hostile text and JSON, and edits that turn valid input into near-valid input

SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])  # not Unicode: SQLite refuses them
CHARS = st.characters(exclude_categories=()) | SURROGATES
TEXT = st.text(CHARS, max_size=40)
SHORT_TEXT = st.text(CHARS, max_size=4)

# Past MAX_DIM, past int64, and 4,001 digits: still under Python's 4,300-digit int/str conversion limit.
HUGE_INTS = st.sampled_from([2**31 - 1, 2**31, 2**36 + 1, 2**63, 2**64, -(2**63) - 1, 10**100, -(10**300), 10**4000])
SCALARS = (st.none() | st.booleans() | st.integers() | HUGE_INTS | st.floats() | TEXT
           | st.sampled_from(["NaN", "Infinity", "1", "", "float", "Convolution"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
NASTY = JSON | HUGE_INTS | st.sampled_from(
    [0, -1, True, 1.5, math.nan, math.inf, "NaN", "\ud800", "", [], {}, [0], [1] * 9, [2**31] * 4, [[1]], ["1"]])
KEYS = TEXT | st.sampled_from(["op_type", "dtype", "groups", "grid_dim", "block_dim", "input_shapes", "input_shape",
                        "padding_above_diff", "padding_above", "transpose_A", "parameters", "code", "time"])


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# Hypothesis validates every new strategy object, which costs more than drawing from it: the generators
# below build their strategies once (module constants, pick(), functools.cache) and pass `draw` down.


@functools.cache
def pick(items: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(items)


@functools.cache
def _pieces(tokens: tuple[str, ...]) -> st.SearchStrategy[str]:
    return SHORT_TEXT | st.sampled_from(tokens) if tokens else SHORT_TEXT


def edit(draw: st.DrawFn, text: str, tokens: tuple[str, ...] = ()) -> str:
    """text with up to four edits, each a short span replaced by random text or a token that matters."""
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        text = text[:i] + draw(_pieces(tokens)) + text[j:]
    return text


@st.composite
def edited(draw: st.DrawFn, base: st.SearchStrategy[str], tokens: tuple[str, ...] = ()) -> str:
    return edit(draw, draw(base), tokens)


def mutate(draw: st.DrawFn, value: Any, nasty: st.SearchStrategy[Any] = NASTY) -> Any:
    """A copy of value with one to three places changed: replaced by a nasty value, deleted, renamed or duplicated."""
    for _ in range(draw(st.integers(1, 3))):
        value = _mutate_once(draw, value, nasty)
    return value


def _mutate_once(draw: st.DrawFn, value: Any, nasty: st.SearchStrategy[Any]) -> Any:
    if isinstance(value, dict) and value and draw(st.integers(0, 3)):
        key = sorted(value)[draw(st.integers(0, len(value) - 1))]
        out = dict(value)
        action = draw(pick(("descend", "descend", "delete", "rename")))
        if action == "delete":
            del out[key]
        elif action == "rename":
            out[draw(KEYS)] = out.pop(key)
        else:
            out[key] = _mutate_once(draw, value[key], nasty)
        return out
    if isinstance(value, list) and value and draw(st.integers(0, 3)):
        i = draw(st.integers(0, len(value) - 1))
        action = draw(pick(("descend", "descend", "delete", "duplicate")))
        if action == "delete":
            return value[:i] + value[i + 1:]
        if action == "duplicate":
            return [*value[:i + 1], value[i], *value[i + 1:]]
        return [*value[:i], _mutate_once(draw, value[i], nasty), *value[i + 1:]]
    return draw(nasty)


# ---------------------------------------------------------------------------------------------
# Valid op configs: consistent shape arithmetic, so every one passes validation


@st.composite
def conv_configs(draw: st.DrawFn, *, any_dtype: bool, grouped: bool) -> OpConfig:
    spatial = draw(st.integers(1, 3))
    groups = draw(pick((1, 1, 2, 3))) if grouped and spatial == 2 else 1
    n, cin, k = draw(st.integers(1, 4)), draw(st.integers(1, 8)), groups * draw(st.integers(1, 8))
    data, filt, out = [n, cin * groups], [k, cin], [n, k]
    strides, dilations, below, above = [], [], [], []
    explicit_above = draw(st.booleans())  # else the compiler's rule: symmetric, or one more above
    for _ in range(spatial):
        size, d, s, pb = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(0, 3))
        pa = draw(st.integers(0, 3)) if explicit_above else pb + draw(st.integers(0, 1))
        window = d * (size - 1) + 1
        h = draw(st.integers(max(1, window - pb - pa), window + 30))
        data.append(h)
        filt.append(size)
        out.append((h + pb + pa - window) // s + 1)
        strides.append(s)
        dilations.append(d)
        below.append(pb)
        above.append(pa)
    params: dict[str, Any] = {"input_shape": data, "filter_shape": filt, "output_shape": out,
                              "window_movement_strides": strides, "window_dilation_strides": dilations,
                              "padding_below_diff": below}
    if explicit_above:
        params["padding_above_diff"] = above
    dtype = draw(pick(DTYPES)) if any_dtype else "float"
    return OpConfig(draw(pick(CONV_FAMILY)), params, groups, dtype)


@st.composite
def dot_configs(draw: st.DrawFn, *, any_dtype: bool) -> OpConfig:
    m, k, n = (draw(st.integers(1, 4096)) for _ in range(3))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    # NNFusion's Dot of a MatMul by a 2-D weight: the left operand's leading axes (never transposed) are rows
    lead = [] if ta or tb else draw(st.lists(st.integers(1, 8), max_size=2))
    params = {"arg0_shape": [k, m] if ta else [*lead, m, k], "arg1_shape": [n, k] if tb else [k, n],
              "out_shape": [*lead, m, n], "transpose_A": ta, "transpose_B": tb}
    return OpConfig("Dot", params, 1, draw(pick(DTYPES)) if any_dtype else "float")


@st.composite
def pool_configs(draw: st.DrawFn, *, any_dtype: bool) -> OpConfig:
    data, out = [draw(st.integers(1, 4)), draw(st.integers(1, 64))], []
    window, strides, below, above = [], [], [], []
    for _ in range(draw(st.integers(1, 3))):
        w, s, pb, pa = draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
        h = draw(st.integers(max(1, w - pb - pa), w + 30))
        data.append(h)
        out.append((h + pb + pa - w) // s + 1)
        window.append(w)
        strides.append(s)
        below.append(pb)
        above.append(pa)
    params = {"input_shape": data, "output_shape": data[:2] + out, "window_shape": window, "window_stride": strides,
              "padding_below": below, "padding_above": above}
    return OpConfig(draw(pick(("MaxPool", "AvgPool"))), params, 1,
                    draw(pick(DTYPES)) if any_dtype else "float")


@st.composite
def elementwise_configs(draw: st.DrawFn, *, line_safe: bool) -> OpConfig:
    """line_safe: the forms the line format can hold (input_shapes, rank 1 or more, fp32)."""
    op = draw(pick(tuple(sorted(ELEMENTWISE_ARITY))))
    shape = draw(st.lists(st.integers(1, 64), min_size=1 if line_safe else 0, max_size=4))
    params: dict[str, Any] = {"input_shapes": [list(shape) for _ in range(ELEMENTWISE_ARITY[op])],
                              "output_shape": shape}
    if not line_safe and ELEMENTWISE_ARITY[op] == 1 and draw(st.booleans()):
        params = {"input_shape": list(shape), "output_shape": shape}
    return OpConfig(op, params, 1, "float" if line_safe else draw(pick(DTYPES)))


@functools.cache
def op_configs(*, line_safe: bool, grouped: bool = True) -> st.SearchStrategy[OpConfig]:
    any_dtype = not line_safe
    return st.one_of(conv_configs(any_dtype=any_dtype, grouped=grouped), dot_configs(any_dtype=any_dtype),
                     pool_configs(any_dtype=any_dtype), elementwise_configs(line_safe=line_safe))


CONVS = conv_configs(any_dtype=False, grouped=False)


# ---------------------------------------------------------------------------------------------
# Kernel JSON

KERNEL_CODE = 'extern "C" __global__ void k(float* input0, float* output0) { output0[0] = input0[0]; }'


def launch_dims(draw: st.DrawFn, *, block: bool) -> list[int]:
    if block:  # at most 1,024 threads, z at most 64
        x = draw(st.integers(1, 1024))
        y = draw(st.integers(1, 1024 // x))
        dims = [x, y, draw(st.integers(1, min(64, 1024 // (x * y))))]
    else:
        dims = [draw(st.integers(1, limit)) for limit in GRID_LIMITS]
    return dims[:draw(st.integers(1, 3))]


@st.composite
def kernel_items(draw: st.DrawFn) -> dict[str, Any]:
    config = draw(op_configs(line_safe=False, grouped=False))
    item = {"tvm_func_name": draw(st.text(max_size=20)), "op_type": config.op_type, "parameters": config.params,
            "code": KERNEL_CODE, "gridDim": launch_dims(draw, block=False), "blockDim": launch_dims(draw, block=True)}
    if config.dtype != "float" or draw(st.booleans()):
        item["dtype"] = config.dtype
    return item


KERNEL_ITEMS = kernel_items()


JSON_TOKENS = ("NaN", "Infinity", "-Infinity", "1e999", "-0", "\\ud800", "\\u0000", "\ufeff", '"', "[", "]", "{",
               "}", ",", ":", "null", "true", "[" * 3000, '{"op_type": ', '"parameters": {', "\n")
KERNEL_JSON_TEXT = st.one_of(st.builds(json.dumps, JSON, ensure_ascii=st.booleans()), KERNEL_ITEMS.map(dumps),
                             st.lists(KERNEL_ITEMS, max_size=3).map(dumps), TEXT)


def check_items(raw: bytes | str) -> None:
    """Parse then validate every item: a list of KernelSpecs and InputErrors, nothing else."""
    try:
        items = parse_items(raw)
    except InputError:
        return
    assert isinstance(items, list)
    for item in items:
        try:
            assert isinstance(validate_item(item), KernelSpec)
        except InputError:
            pass


@fuzzed(raw=st.binary() | KERNEL_JSON_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")))
def kernel_json_bytes(raw: bytes) -> None:
    check_items(raw)


@fuzzed(
    text=edited(KERNEL_JSON_TEXT, (*JSON_TOKENS, "9" * 4301)),
)
@example(text="1" * 4301)
def kernel_json_text(text: str) -> None:
    check_items(text)


@fuzzed(item=JSON)
def kernel_json_any_item(item: Any) -> None:
    try:
        validate_item(item)
    except InputError:
        pass


@fuzzed(item=KERNEL_ITEMS, data=st.data())
def kernel_json_near_valid_items(item: dict[str, Any], data: st.DataObject) -> None:
    broken = mutate(data.draw, item)
    spec = validate_item(item)
    grid, block = ((*d, *[1] * (3 - len(d))) for d in (item["gridDim"], item["blockDim"]))
    assert (spec.op.op_type, spec.code, spec.grid, spec.block) == (item["op_type"], item["code"], grid, block)
    assert spec.name == (item["tvm_func_name"] or "(unnamed)")
    out_key = "out_shape" if item["op_type"] == "Dot" else "output_shape"
    assert spec.op.outputs == (tuple(item["parameters"][out_key]),)
    try:
        validate_item(broken)
    except InputError:
        pass


# ---------------------------------------------------------------------------------------------
# C integer expressions: written from a tree, evaluated here with C's rules, compared with cexpr


@dataclass(frozen=True)
class E:
    """A C integer expression tree: rendered to text for the parsers, evaluated by c_eval."""

    kind: str  # lit | name | paren | un | cast | bin | ? | call
    op: str = ""  # a literal's text, a name, an operator, a cast's type or a function
    args: tuple[E, ...] = ()
    value: int = 0  # a literal's value


class Unknowable(Exception):
    """C gives the expression no value here: an unknown name, or a division by zero."""


class Overflow(Exception):
    """A value outside 32-bit int: undefined behaviour in C, so the case proves nothing."""


PREC = {"*": 11, "/": 11, "%": 11, "+": 10, "-": 10, "<<": 9, ">>": 9, "<": 8, "<=": 8, ">": 8, ">=": 8,
        "==": 7, "!=": 7, "&": 6, "^": 5, "|": 4, "&&": 3, "||": 2}
C_OPS: dict[str, Callable[[int, int], int]] = {
    "*": operator.mul, "+": operator.add, "-": operator.sub, "<<": operator.lshift, ">>": operator.rshift,
    "&": operator.and_, "^": operator.xor, "|": operator.or_,
    "<": lambda a, b: int(a < b), "<=": lambda a, b: int(a <= b), ">": lambda a, b: int(a > b),
    ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
}


def c_eval(e: E, env: dict[str, int | None]) -> int:
    """e's value in C (int arithmetic, truncating division, short-circuit && || ?:)."""
    a = e.args
    if e.kind == "lit":
        v = e.value
    elif e.kind == "name":
        found = env.get(e.op)
        if found is None:
            raise Unknowable(e.op)
        v = found
    elif e.kind in ("paren", "cast"):
        v = c_eval(a[0], env)
    elif e.kind == "un":
        x = c_eval(a[0], env)
        v = {"-": -x, "+": x, "!": int(x == 0), "~": ~x}[e.op]
    elif e.kind == "?":
        v = c_eval(a[1] if c_eval(a[0], env) else a[2], env)
    elif e.kind == "call":
        x, y = c_eval(a[0], env), c_eval(a[1], env)
        v = min(x, y) if e.op == "min" else max(x, y)
    elif e.op in ("&&", "||"):
        x = c_eval(a[0], env) != 0
        v = int(x) if x == (e.op == "||") else int(c_eval(a[1], env) != 0)
    else:
        x, y = c_eval(a[0], env), c_eval(a[1], env)
        if e.op in ("/", "%"):
            if y == 0:
                raise Unknowable("division by zero")
            q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            v = q if e.op == "/" else x - q * y
        else:
            v = C_OPS[e.op](x, y)
    if not -(2**31) <= v < 2**31:
        raise Overflow(v)
    return v


def c_text(e: E) -> str:
    return _c_text(e)[0]


def _c_text(e: E) -> tuple[str, int]:
    """C source for e with only the parentheses C needs, and its precedence (16: primary, 1: ?:)."""
    if e.kind in ("lit", "name"):
        return e.op, 16
    if e.kind == "paren":
        return f"({c_text(e.args[0])})", 16
    if e.kind == "call":
        return f"{e.op}({', '.join(c_text(x) for x in e.args)})", 16
    if e.kind in ("un", "cast"):
        text, prec = _c_text(e.args[0])
        if prec < 15 or text[0] in "-+":  # "- -x" must not become "--x"
            text = f"({text})"
        return (e.op if e.kind == "un" else f"({e.op})") + text, 15
    if e.kind == "?":
        (cond, cp), then, (other, _) = _c_text(e.args[0]), c_text(e.args[1]), _c_text(e.args[2])
        return f"{f'({cond})' if cp <= 1 else cond} ? {then} : {other}", 1
    p = PREC[e.op]
    (left, lp), (right, rp) = _c_text(e.args[0]), _c_text(e.args[1])
    return f"{f'({left})' if lp < p else left} {e.op} {f'({right})' if rp <= p else right}", p


def _literal_texts(n: int) -> list[str]:
    return [str(n), f"0x{n:x}", f"0X{n:X}", f"{n}L", *([f"0{n:o}"] if n else [])]


@functools.cache  # built once: validating a fresh strategy costs more than drawing from it
def literals(high: int) -> st.SearchStrategy[E]:
    def literal(n: int, form: int) -> E:
        texts = _literal_texts(n)
        return E("lit", texts[form % len(texts)], value=n)

    return st.builds(literal, st.integers(0, high), st.integers(0, 4))


def expressions(leaves: st.SearchStrategy[E], *, safe_division: bool, max_leaves: int = 8,
                bitand: bool = True) -> st.SearchStrategy[E]:
    """Trees of C's integer operators; shifts by 0-7 only (C leaves 32 and more undefined)."""
    divisors = literals(9).filter(lambda e: e.value > 0)
    plain_ops = st.sampled_from([op for op in PREC if op not in ("/", "%", "<<", ">>", *["&"] * (not bitand))])

    def grow(inner: st.SearchStrategy[E]) -> st.SearchStrategy[E]:
        return st.one_of(
            st.builds(lambda x: E("paren", args=(x,)), inner),
            st.builds(lambda op, x: E("un", op, (x,)), st.sampled_from("-+!~"), inner),
            st.builds(lambda t, x: E("cast", t, (x,)), st.sampled_from(["int", "long"]), inner),
            st.builds(lambda op, x, y: E("bin", op, (x, y)), plain_ops, inner, inner),
            st.builds(lambda op, x, y: E("bin", op, (x, y)), st.sampled_from(["/", "%"]), inner,
                      divisors if safe_division else inner),
            st.builds(lambda op, x, y: E("bin", op, (x, y)), st.sampled_from(["<<", ">>"]), inner, literals(7)),
            st.builds(lambda c, x, y: E("?", args=(c, x, y)), inner, inner, inner),
            st.builds(lambda f, x, y: E("call", f, (x, y)), st.sampled_from(["min", "max"]), inner, inner),
        )

    return st.recursive(leaves, grow, max_leaves=max_leaves)


# Signed names only: c_eval models C's int arithmetic, while threadIdx/blockDim are unsigned in CUDA (their
# wrap-around is checked by unsigned_indices_wrap_like_c and the generated kernels).
EXPR_NAMES = ("a", "b", "n0", "missing")
EXPR_ENVS = st.fixed_dictionaries({}, optional={n: st.none() | st.integers(-50, 50) for n in EXPR_NAMES[:-1]})
C_EXPRESSIONS = expressions(literals(300) | st.sampled_from(EXPR_NAMES).map(lambda n: E("name", n)),
                            safe_division=False)


@fuzzed(e=C_EXPRESSIONS, env=EXPR_ENVS)
def cexpr_agrees_with_c(e: E, env: dict[str, int | None]) -> None:
    try:
        expected: int | None = c_eval(e, env)
    except Overflow:
        reject()
    except Unknowable:
        expected = None
    parsed = cexpr.parse(c_text(e))
    if expected is None:
        with pytest.raises(cexpr.Unknown):
            cexpr.evaluate(parsed, env)
    else:
        assert cexpr.evaluate(parsed, env) == expected


CEXPR_TOKENS = ("(", ")", "?", ":", ",", "(int)", "(unsigned)", "min(", "max(", "1.5f", "0x", "08", "1e5", "-", "!",
                "<<", "&&", "x.y", "threadIdx.x", "\n")


# cexpr is internal: its ParseError and Unknown are the documented way it says "not an expression I read"
# and "no static value"; its callers turn both into InputError or an unprovable barrier count.
@fuzzed(
    text=TEXT | edited(C_EXPRESSIONS.map(c_text), CEXPR_TOKENS), env=EXPR_ENVS,
)
@example(text="09", env={})
@example(text="min()", env={})
@example(text="max(1)", env={})
@example(text="(" * 1000 + "1" + ")" * 1000, env={})
def cexpr_any_text(text: str, env: dict[str, int | None]) -> None:
    try:
        parsed = cexpr.parse(text)
    except cexpr.ParseError:
        return
    try:
        assert isinstance(cexpr.evaluate(parsed, env), int)
    except cexpr.Unknown:
        pass


# ---------------------------------------------------------------------------------------------
# CUDA source: mask() on token streams whose masked form is known


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


NO_NEWLINE = st.text(st.characters(exclude_categories=(), exclude_characters="\n") | SURROGATES, max_size=12)
CODE = st.text(st.characters(exclude_categories=(), exclude_characters="/\"'#") | st.sampled_from("\n*\\{};"),
               max_size=12)


ESCAPES = st.builds(lambda c: "\\" + c, st.characters(exclude_categories=()) | st.just("\n"))
LITERAL_CONTENT = {q: st.lists(st.characters(exclude_categories=(), exclude_characters=f"{q}\n\\") | ESCAPES,
                               max_size=6).map("".join) for q in "\"'"}


@st.composite
def literal_token(draw: st.DrawFn) -> tuple[str, str]:
    """A string or character literal: the quotes stay, the contents are blanked."""
    quote = draw(pick(('"', "'")))
    content = draw(LITERAL_CONTENT[quote])
    return quote + content + quote, quote + _blank(content) + quote


DIRECTIVE_LINES = st.lists(NO_NEWLINE.filter(lambda s: not s.endswith("\\")), min_size=1, max_size=3)


@st.composite
def directive_token(draw: st.DrawFn) -> tuple[str, str]:
    """A preprocessor line, continued over backslash-newlines; it starts a line and ends at one."""
    lines = draw(DIRECTIVE_LINES)
    indent = draw(pick(("", " ", "\t", "  ")))
    directive = "#" + "\\\n".join(lines)
    return f"\n{indent}{directive}\n", f"\n{indent}{_blank(directive)}\n"


MASK_TOKENS = st.one_of(
    CODE.map(lambda t: (t, t)),
    NO_NEWLINE.filter(lambda s: not s.endswith("\\")).map(lambda s: (f"//{s}\n", " " * (len(s) + 2) + "\n")),
    st.text(CHARS, max_size=12).filter(lambda s: "*/" not in s).map(lambda s: (f"/*{s}*/", _blank(f"/*{s}*/"))),
    literal_token(),
    directive_token(),
)


@fuzzed(tokens=st.lists(MASK_TOKENS, max_size=12), open_comment=st.none() | st.text(CHARS, max_size=8))
def mask_blanks_exactly_comments_strings_and_directives(tokens: list[tuple[str, str]], open_comment: str | None) -> None:
    code, expected = "".join(t for t, _ in tokens), "".join(m for _, m in tokens)
    if open_comment is not None and "*/" not in f"/*{open_comment}":  # unterminated: blank to the end
        code, expected = code + f"/*{open_comment}", expected + _blank(f"/*{open_comment}")
    assert mask(code) == expected


@fuzzed(
    comment=NO_NEWLINE, code=st.text(st.sampled_from("abc_ ();"), min_size=1, max_size=12),
)
@example(comment="", code="x")
def mask_line_comment_continues_after_backslash(comment: str, code: str) -> None:
    text = f"//{comment}\\\n{code}\n"
    assert mask(text) == _blank(text)


# ---------------------------------------------------------------------------------------------
# CUDA kernels from a small TVM-like grammar, counted by a thread-zero interpreter of our own
#
# Statements are tuples: ("sync", text) ("plain", text) ("return",) ("local", type, name, E)
# ("for", var, start E, cmp, end E, delta, step text, body, braced) ("if", cond E, then, else | None, braced)
# ("data_if", cond text, then, else | None): a condition on data, whose branches pass the same barriers.

SYNCS = ("__syncthreads();", "__syncthreads( );", "__syncthreads ();")
PLAIN = (  # no barrier, no return, no integer declaration, no write to a name a condition reads
    "output0[0] = input0[0];",
    "compute_local[0] = (compute_local[0] + (A_shared[((int)threadIdx.x)] * input0[0]));",
    "float acc = 0.000000e+00f;",
    "acc = __shfl_down_sync(0xffffffff, acc, 16, 32);",
    "__syncwarp();",
    "((float4*)(output0 + 4))[0] = ((float4*)(input0 + 4))[0];",
    'printf("__syncthreads(); return; } {\\n");',
    "output0[1] = (float)'}';",
    "while (output0[0] > 1.f) { output0[0] = (output0[0] * 5.000000e-01f); }",
    "{ float t = input0[3]; output0[3] = t; }",
    "for (int j = 0; j < 4; ++j) { output0[j] = input0[j]; }",
    ";",
)
DO_WHILE = "do { output0[2] = (output0[2] + 1.f); } while (output0[2] < 0.f);"
# A break anywhere inside a loop that holds barriers makes the count unprovable by design: top level only.
SWITCH = "switch (((int)threadIdx.x) & 3) { case 0: output0[0] = 1.f; break; default: break; }"
DECOR = ("/* __syncthreads(); return; } */", "// for (;;) { __syncthreads();", "\n#pragma unroll",
         "\n#define TILE { __syncthreads(); \\\n  return; }")
DATA_CONDITIONS = ("input0[0] > 0.000000e+00f", "output0[((int)threadIdx.x)] != input0[1]", "isnan(input0[2])")
LOCAL_TYPES = ("int", "const int", "long", "int64_t", "signed int")
INDICES = [f"{kind}.{axis}" for kind in ("threadIdx", "blockIdx", "blockDim", "gridDim") for axis in "xyz"]
SMALL = literals(70)


@dataclass(frozen=True)
class Allowed:
    """What a generated block may hold. `full` adds the constructs the static count is known to miss (int
    locals, `x & name`, do-while): see generated_full_kernels_count_like_thread_zero."""

    full: bool
    syncs: bool = True
    returns: bool = True
    decls: bool = True


@functools.cache
def conditions(scope: tuple[str, ...], full: bool) -> st.SearchStrategy[E]:
    """Thread-0-decidable: on thread/block indices (as TVM casts them), launch dims, loop vars, locals."""
    indices = st.sampled_from(INDICES).map(lambda n: E("paren", args=(E("cast", "int", (E("name", n),)),)))
    names = st.sampled_from(list(scope)).map(lambda n: E("name", n)) if scope else st.nothing()
    return expressions(SMALL | indices | names, safe_division=True, max_leaves=5, bitand=full)


def statements(draw: st.DrawFn, scope: tuple[str, ...], depth: int, counter: list[int],
               allow: Allowed) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    kinds = ("plain", "decor", *("sync", "sync") * allow.syncs, *("return",) * allow.returns,
             *("local",) * (allow.decls and allow.full), *("for", "if", "data_if") * (depth < 3))
    plain = PLAIN + (SWITCH,) * (depth == 0) + (DO_WHILE,) * allow.full
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(pick(kinds))
        if kind == "sync":
            out.append(("sync", draw(pick(SYNCS))))
        elif kind in ("plain", "decor"):
            out.append(("plain", draw(pick(plain if kind == "plain" else DECOR))))
        elif kind == "return":
            out.append(("return",))
        elif kind == "local":  # a fresh name: a local is trusted only when written once in the kernel
            counter[0] += 1
            name = f"n{counter[0]}"
            out.append(("local", draw(pick(LOCAL_TYPES)), name, draw(conditions(scope, allow.full))))
            scope = (*scope, name)
        elif kind == "for":
            out.append(for_loop(draw, scope, depth, counter, allow))
        elif kind == "if":
            then = statements(draw, scope, depth + 1, counter, allow)
            other = statements(draw, scope, depth + 1, counter, allow) if draw(st.booleans()) else None
            out.append(("if", draw(conditions(scope, allow.full)), then, other, draw(st.booleans())))
        else:
            cond = draw(pick(DATA_CONDITIONS))
            if allow.syncs and draw(st.booleans()):  # the same barriers either way: written twice, no locals
                same = statements(draw, scope, depth + 1, counter, replace(allow, returns=False, decls=False))
                out.append(("data_if", cond, same, same))
            else:
                free = replace(allow, syncs=False, returns=False)
                then = statements(draw, scope, depth + 1, counter, free)
                other = statements(draw, scope, depth + 1, counter, free) if draw(st.booleans()) else None
                out.append(("data_if", cond, then, other))
    return out


def for_loop(draw: st.DrawFn, scope: tuple[str, ...], depth: int, counter: list[int], allow: Allowed) -> tuple[Any, ...]:
    """A loop of at most 7 trips: from a literal up to min(x, 6), or down to a literal."""
    var = f"i{depth}"
    step = draw(st.integers(1, 3))
    near = draw(literals(3))
    far = draw(literals(6)) if draw(st.booleans()) else E("call", "min", (draw(conditions(scope, allow.full)),
                                                                          draw(literals(6))))
    up = draw(st.booleans())
    start, end = (near, far) if up else (far, near)
    cmp = draw(pick(("<", "<=") if up else (">", ">=")))
    sign = "+" if up else "-"
    texts = (f"{var} {sign}= {step}", f"{var} = ({var} {sign} {step})")
    if step == 1:
        texts += (f"{sign * 2}{var}", f"{var}{sign * 2}")
    body = statements(draw, (*scope, var), depth + 1, counter, allow)
    return ("for", var, start, cmp, end, step if up else -step, draw(pick(texts)), body, draw(st.booleans()))


def c_block(stmts: list[tuple[Any, ...]], indent: int) -> str:
    return "".join(c_statement(s, indent) for s in stmts)


def c_statement(s: tuple[Any, ...], indent: int) -> str:
    pad = "  " * indent
    kind = s[0]
    if kind in ("sync", "plain"):
        return f"{pad}{s[1]}\n"
    if kind == "return":
        return f"{pad}return;\n"
    if kind == "local":
        return f"{pad}{s[1]} {s[2]} = {c_text(s[3])};\n"
    if kind == "for":
        _, var, start, cmp, end, _, step, body, braced = s
        return f"{pad}for (int {var} = {c_text(start)}; {var} {cmp} {c_text(end)}; {step})" + c_body(body, braced, indent)
    cond, then, other = (c_text(s[1]) if kind == "if" else s[1]), s[2], s[3]
    braced = s[4] if kind == "if" else True
    text = f"{pad}if ({cond})" + c_body(then, braced, indent)
    if other is not None and len(other) == 1 and other[0][0] == "if" and not braced:
        return text + f"{pad}else " + c_statement(other[0], indent).lstrip()  # else if
    return text if other is None else text + f"{pad}else" + c_body(other, braced, indent)


def c_body(body: list[tuple[Any, ...]], braced: bool, indent: int) -> str:
    # Unbraced only for one simple statement: no declaration, and no dangling else.
    if not braced and len(body) == 1 and (body[0][0] in ("sync", "return") or body[0][1] in (*PLAIN, DO_WHILE)):
        return "\n" + c_statement(body[0], indent + 1)
    return " {\n" + c_block(body, indent + 1) + "  " * indent + "}\n"


class _Returned(Exception):
    """Thread 0 left the kernel."""


class ThreadZero:
    """Runs a generated kernel as thread 0 of block 0 would, counting the barriers it passes."""

    def __init__(self, block: tuple[int, int, int], grid: tuple[int, int, int]) -> None:
        self.env: dict[str, int | None] = {f"{kind}.{axis}": 0 for kind in ("threadIdx", "blockIdx") for axis in "xyz"}
        self.env |= {f"blockDim.{axis}": n for axis, n in zip("xyz", block, strict=True)}
        self.env |= {f"gridDim.{axis}": n for axis, n in zip("xyz", grid, strict=True)}
        self.barriers = 0

    def count(self, stmts: list[tuple[Any, ...]]) -> int:
        try:
            self.run(stmts, dict(self.env))
        except _Returned:
            pass
        return self.barriers

    def run(self, stmts: list[tuple[Any, ...]], env: dict[str, int | None]) -> None:
        for s in stmts:
            kind = s[0]
            if kind == "sync":
                self.barriers += 1
            elif kind == "return":
                raise _Returned
            elif kind == "local":
                env[s[2]] = c_eval(s[3], env)
            elif kind == "if":
                self.run(s[2] if c_eval(s[1], env) else s[3] or [], dict(env))
            elif kind == "data_if":
                self.run(s[2], dict(env))  # either branch: the same barriers
            elif kind == "for":
                _, var, start, cmp, end, delta, _, body, _ = s
                inner = dict(env)
                inner[var] = c_eval(start, env)
                while C_OPS[cmp](inner[var], c_eval(end, inner)):
                    self.run(body, dict(inner))
                    inner[var] += delta  # type: ignore[operator]


@dataclass(frozen=True)
class Kernel:
    code: str
    name: str
    params: tuple[tuple[str, str, int, bool], ...]  # name, base type, pointer depth, const
    shared: tuple[tuple[str, str, tuple[int, ...]], ...]  # name, dtype, dims
    launch_bounds: int | None
    body: str
    statements: list[tuple[Any, ...]]
    block: tuple[int, int, int]
    grid: tuple[int, int, int]


PARAMS = (("float* __restrict__ input0", ("input0", "float", 1, False)),
          ("const float* __restrict__ input1", ("input1", "float", 1, True)),
          ("float4 *x", ("x", "float4", 1, False)), ("int n", ("n", "int", 0, False)),
          ("unsigned int m", ("m", "unsigned int", 0, False)), ("const half * h", ("h", "half", 1, True)),
          ("float** pp", ("pp", "float", 2, False)), ("float* __restrict__ output0", ("output0", "float", 1, False)))
SHARED_TYPES = ("float", "int", "float4", "half", "unsigned int")


POSITIVE_DIMS = literals(64).filter(lambda e: e.value > 0)
SHARED_PREFIXES = ("__shared__ {}", "volatile __shared__ {}", "__shared__ __align__(16) {}", "static __shared__ {}")


def shared_declaration(draw: st.DrawFn, index: int) -> tuple[str, list[tuple[str, str, tuple[int, ...]]]]:
    """One __shared__ statement (one or two declarators) and what parse_kernel must read from it."""
    dtype = draw(pick(SHARED_TYPES))
    declarators, expected = [], []
    for j in range(draw(st.integers(1, 2))):
        name = f"S{index}_{j}_shared"
        dims = draw(st.lists(POSITIVE_DIMS, max_size=3))
        declarators.append(name + "".join(f"[{d.op}]" for d in dims))
        expected.append((name, dtype, tuple(d.value for d in dims)))
    return f"{draw(pick(SHARED_PREFIXES)).format(dtype)} {', '.join(declarators)};", expected


LAUNCHES = (((64, 1, 1), (1, 1, 1)), ((128, 2, 1), (4, 2, 1)), ((32, 4, 2), (80, 1, 1)), ((256, 1, 1), (7, 3, 2)),
            ((1024, 1, 1), (1, 1, 1)))


def make_kernel(stmts: list[tuple[Any, ...]], *, name: str = "k", params: Sequence[tuple[str, Any]] = (),
                shared: Sequence[tuple[str, list[tuple[str, str, tuple[int, ...]]]]] = (), bounds: E | None = None,
                min_blocks: str = "", preamble: str = "", launch: tuple[Any, Any] = LAUNCHES[0]) -> Kernel:
    body = "\n" + "".join(f"  {text}\n" for text, _ in shared) + c_block(stmts, 1)
    signature = ", ".join(p[0] for p in params)
    bounds_text = f"__launch_bounds__({bounds.op}{min_blocks}) " if bounds else ""
    code = f'{preamble}extern "C" __global__ void {bounds_text}{name}({signature}) {{{body}}}\n'
    return Kernel(code, name, tuple(p[1] for p in params), tuple(d for _, found in shared for d in found),
                  bounds.value if bounds else None, body, stmts, *launch)


KERNEL_NAMES = ("default_function_kernel0", "Fused_Conv_kernel", "k")
PREAMBLES = ("", "// generated\n", "#include <cuda_fp16.h>\n", '/* "x" */ ')
SIGNATURES = st.lists(st.sampled_from(PARAMS), unique=True, max_size=4)
BOUNDS = st.none() | literals(1024).filter(lambda e: e.value > 0)


@st.composite
def kernels(draw: st.DrawFn, *, full: bool) -> Kernel:
    return make_kernel(
        statements(draw, (), 0, [0], Allowed(full)),
        name=draw(pick(KERNEL_NAMES)),
        params=draw(SIGNATURES),
        shared=[shared_declaration(draw, i) for i in range(draw(st.integers(0, 3)))],
        bounds=draw(BOUNDS),
        min_blocks=draw(pick(("", ", 2"))),
        preamble=draw(pick(PREAMBLES)),
        launch=draw(pick(LAUNCHES)),
    )


FULL_KERNELS = kernels(full=True)


def check_generated_kernel(kernel: Kernel) -> None:
    src = parse_kernel(kernel.code)
    assert (src.name, src.body, src.launch_bounds) == (kernel.name, kernel.body, kernel.launch_bounds)
    assert tuple((p.name, p.base_type, p.pointer_depth, p.is_const) for p in src.params) == kernel.params
    assert tuple((d.name, d.dtype, d.dims) for d in src.shared) == kernel.shared
    try:
        expected = ThreadZero(kernel.block, kernel.grid).count(kernel.statements)
    except (Unknowable, Overflow):
        reject()
    assert count_barriers(src, kernel.block, kernel.grid) == BarrierCount(expected)


@fuzzed(kernel=kernels(full=False))
def generated_kernels_parse_and_count_like_thread_zero(kernel: Kernel) -> None:
    check_generated_kernel(kernel)


SYNC = SYNCS[0]


@fuzzed(
    kernel=FULL_KERNELS,
)
@example(kernel=make_kernel([("local", "int", "n1", E("lit", "1", value=1)), ("sync", SYNC),
                             ("for", "i0", E("lit", "0"), "<", E("name", "n1"), 1, "++i0", [("sync", SYNC)], False)]))
@example(kernel=make_kernel([("for", "i0", E("lit", "0"), "<", E("lit", "2", value=2), 1, "++i0", [
    ("sync", SYNC), ("if", E("bin", "&", (E("lit", "1", value=1), E("name", "i0"))), [("plain", PLAIN[0])], None, False),
], True)]))
@example(kernel=make_kernel([("if", E("bin", ">", (E("name", "threadIdx.x"), E("lit", "0"))), [("plain", DO_WHILE)],
                              [("sync", SYNC)], False)]))
def generated_full_kernels_count_like_thread_zero(kernel: Kernel) -> None:
    check_generated_kernel(kernel)


@fuzzed(
    k=st.integers(1, 64), bound=st.integers(1, 64), index=st.sampled_from(INDICES[:6]),
)
@example(k=1, bound=1, index="threadIdx.x")
def unsigned_indices_wrap_like_c(k: int, bound: int, index: str) -> None:
    src = parse_kernel(f"__global__ void f() {{ if ({index} - {k} < {bound}) __syncthreads(); }}")
    assert count_barriers(src, (64, 1, 1), (1, 1, 1)).count in (0, None)  # unprovable is fine, 1 is wrong


CUDA_TOKENS = ("(", ")", "{", "}", ";", "09", "max(1)", "min()", "goto out;", "while (x) ", "do ", "break;",
               "continue;", "__syncthreads();", "return;", "for (", "if (", "else ", "#", "//", "/*", "*/", '"', "'",
               "\\", "\n", "__shared__ ", "__global__ ", 'asm("bar.sync 0;");', "__syncthreads_count(1)", "int n = ",
               "i0++", " = 1", "(int)", "[", "]", "extern ", "template <int N> ", "__launch_bounds__(", ",",
               "{" * 600 + "__syncthreads();" + "}" * 600)


def check_barrier_count(result: BarrierCount) -> None:
    assert (isinstance(result.count, int) and result.count >= 0 and result.reason == "") or (
        result.count is None and result.reason)


@fuzzed(
    code=TEXT | edited(FULL_KERNELS.map(lambda k: k.code), CUDA_TOKENS),
)
@example(code="__global__ void k() { __shared__ float a[09]; }")
@example(code="__global__ void k() { if ( __syncthreads(); }")
@example(code="__global__ void k() { for (int i = 0; i < 09; ++i) __syncthreads(); }")
@example(code="__global__ void k() { if (max(1)) __syncthreads(); }")
@example(code="__global__ void k() {" + "{" * 600 + "__syncthreads();" + "}" * 600 + "}")
def cuda_any_text(code: str) -> None:
    masked = mask(code)
    assert len(masked) == len(code)
    assert all(m == c or (m == " " and c != "\n") for m, c in zip(masked, code, strict=True))
    try:
        src = parse_kernel(code)
    except InputError:
        return
    start, end = src.body_span
    assert src.masked == masked and code[start - 1] == "{" and code[end] == "}"
    assert all(start <= d.span[0] < d.span[1] <= end for d in src.shared)
    src.body_without_shared()
    for block, grid in LAUNCHES[:2]:
        check_barrier_count(count_barriers(src, block, grid))


@fuzzed(code=TEXT | edited(FULL_KERNELS.map(lambda k: k.code), tuple(t for t in CUDA_TOKENS if len(t) < 100)))
def mask_keeps_length_and_only_blanks(code: str) -> None:
    masked = mask(code)
    assert len(masked) == len(code)
    assert all(m == c or (m == " " and c != "\n") for m, c in zip(masked, code, strict=True))


# ---------------------------------------------------------------------------------------------
# Op configs: the line format and TOML/JSON


def line_stem(config: OpConfig) -> str:
    if config.op_type in CONV_FAMILY:
        return "convolution"
    return {"Dot": "dot", "MaxPool": "maxpool", "AvgPool": "avgpool"}[config.op_type]


@st.composite
def op_lines(draw: st.DrawFn) -> tuple[OpConfig, str]:
    """A valid config and one of the lines that hold it: any field order, any prefix the reader accepts."""
    config = draw(op_configs(line_safe=True))
    line = format_line(config)
    if config.op_type in ELEMENTWISE_ARITY:
        return config, line  # one fixed form
    prefix, *parts = line.split("|")
    prefix = draw(pick(("", "cudnn_", "cublas_", "tvm_", "my_"))) + line_stem(config) + "_op_float"
    return config, "|".join([prefix, *draw(st.permutations(parts))])


@fuzzed(case=op_lines())
def op_config_lines_round_trip(case: tuple[OpConfig, str]) -> None:
    config, line = case
    assert parse_line(format_line(config)) == config
    parsed = parse_line(line, "ops.txt:1")
    assert parsed == config
    assert format_line(parsed) == line


@fuzzed(
    config=op_configs(line_safe=False),
)
@example(config=OpConfig("Relu", {"input_shapes": [[]], "output_shape": []}))
@example(config=OpConfig("Relu", {"input_shapes": [[1]], "output_shape": [1]}, dtype="half"))
@example(config=OpConfig("Relu", {"input_shape": [1], "output_shape": [1]}))
def op_config_lines_hold_every_valid_config(config: OpConfig) -> None:
    try:
        line = format_line(config)
    except InputError:
        return  # refusing a config the line format cannot hold is fine
    assert parse_line(line) == config


LINE_TOKENS = ("|", "+", "_", "i+", "o+", "w+", "g+2", "g+1", "fuse+relu", "fuse+none", "pa+1_1", "ta+1", "tb+2",
               "-1", "0", "99999999999", "\u0661", " 1", "9" * 5000, "elementwise_", "_op_float", "_op_half", "\n")


@fuzzed(lines=st.lists(TEXT | edited(op_lines().map(lambda c: c[1]), LINE_TOKENS), max_size=4), where=TEXT)
def op_config_lines_any_text(lines: list[str], where: str) -> None:
    for line in lines:
        try:
            config = parse_line(line, where)
        except InputError:
            continue
        assert format_line(config) == line
        if config.groups == 1:
            config.signature()
    text = "\n".join(lines)
    read = parse_lines(text, where)
    assert len(read.configs) + len(read.errors) == sum(
        1 for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))


@fuzzed(configs=st.lists(op_configs(line_safe=False), max_size=4), fmt=st.sampled_from(["toml", "json"]))
def op_config_files_round_trip(configs: list[OpConfig], fmt: str) -> None:
    text = format_structured(configs, fmt)
    read = parse_structured(text, fmt, "ops")
    assert read.errors == []
    assert read.configs == configs
    assert format_structured(read.configs, fmt) == text


TOML_NASTY = (st.dates() | st.datetimes() | st.times() | st.floats() | st.booleans() | TEXT | HUGE_INTS.filter(
    lambda n: abs(n) < 2**63) | st.lists(st.integers() | TEXT, max_size=3) | st.sampled_from([[], {}, [[1]], ["1"]]))
STRUCTURED_TOKENS = ("[[op]]\n", "1979-05-27", "nan", "inf", "groups = 2\n", '"x"', "[" * 2000, "{", "}", "=", "\n",
                     "op_type", '"op": ', "\\u0000", "9" * 5000)


def toml_text(entries: Any) -> str:
    try:
        return tomli_w.dumps({"op": entries})
    except (TypeError, ValueError):
        return ""  # a value TOML cannot hold (JSON's null)


@st.composite
def op_config_files(draw: st.DrawFn) -> tuple[str, str]:
    entries = [c.to_dict() for c in draw(st.lists(op_configs(line_safe=False), min_size=1, max_size=3))]
    fmt = draw(pick(("toml", "json")))
    if fmt == "json":
        text = json.dumps(mutate(draw, entries))
    else:
        text = toml_text(mutate(draw, entries, TOML_NASTY))
    return edit(draw, text, STRUCTURED_TOKENS) if draw(st.booleans()) else text, fmt


@fuzzed(
    case=op_config_files() | st.tuples(TEXT, st.sampled_from(["toml", "json"])),
)
@example(case=('[[op]]\nop_type = "Relu"\noutput_shape = 1979-05-27\n', "toml"))
@example(case=('[{"op_type": "Convolution", "groups": 2, "input_shape": [1, "x", 1, 1], '
               '"filter_shape": [1, 1, 1, 1], "output_shape": [1, 1, 1, 1]}]', "json"))
@example(case=("[" * 100000, "json"))
def op_config_files_any_text(case: tuple[str, str]) -> None:
    text, fmt = case
    try:
        read = parse_structured(text, fmt, "ops")
    except InputError:
        return
    assert all(isinstance(e, InputError) for e in read.errors)
    for config in read.configs:
        if config.groups == 1:
            config.signature()


# ---------------------------------------------------------------------------------------------
# AutoTVM logs


TASKS = st.sampled_from([CONV_TASK, MATMUL_TASK]) | st.text(min_size=1, max_size=10)
KNOBS = st.lists(st.tuples(st.sampled_from(["tile_k", "tile_x", "tile_y", "auto_unroll_max_step"]),
                           st.sampled_from(["sp", "ot"]), st.integers(-1, 1500)).map(list), max_size=4)
SECONDS = st.floats(0, 1e6, allow_nan=False)


@st.composite
def autotvm_records(draw: st.DrawFn) -> dict[str, Any]:
    """One well-formed record; its task may or may not map to an op."""
    task = draw(TASKS)
    if task == CONV_TASK:
        p = draw(CONVS).params
        args = [p["input_shape"], p["filter_shape"], p["output_shape"], p["window_movement_strides"],
                p["padding_below_diff"], p["window_dilation_strides"]]
    elif task == MATMUL_TASK:
        args = [draw(st.integers(1, 4096)) for _ in range(3)]
    else:
        args = draw(st.lists(JSON, max_size=3))
    error_no = draw(st.integers(0, 8))
    costs = [1e9] if error_no else draw(st.lists(SECONDS, min_size=1, max_size=3))
    config = {"i": draw(st.integers(0, 10**6)), "t": "", "c": None, "e": draw(KNOBS)}
    return {"i": ["cuda", task, args, {}, [task, *args], config],
            "r": [costs, error_no, draw(SECONDS), draw(st.floats(0, 2e9))], "v": 0.1}


AUTOTVM_TOKENS = ("NaN", "-1", "1e999", "1" * 400, "9" * 4301, "null", "[]", "{}", '"', "]", "}", ",", "#", "\r")


def _line(kind: str, text: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[str, bytes]]:
    return text.map(lambda t: (kind, t.encode("utf-8", "surrogatepass").replace(b"\n", b" ")))


RECORD_LINES = autotvm_records().map(json.dumps)  # ASCII: lone surrogates escaped, so a good line stays UTF-8
GOOD_LINES = _line("good", RECORD_LINES)
EDITED_LINES = _line("edited", edited(RECORD_LINES, AUTOTVM_TOKENS))
LOG_LINES = st.one_of(
    GOOD_LINES, GOOD_LINES, EDITED_LINES, EDITED_LINES,
    _line("bad", TEXT.map(lambda t: "{" + t)),
    _line("blank", st.text(" \t\r\x0b\x0c", max_size=3)),
    _line("comment", st.text(max_size=20).map(lambda t: " # " + t)),
    st.binary(max_size=40).map(lambda b: ("raw", b.replace(b"\n", b" "))),
    st.just(("oversized", b" " * (MAX_LINE_BYTES + 1))),
)


def counted_lines(data: bytes) -> int:
    """Lines a reader must account for: all but blank and '#' ones (over the cap or not UTF-8 always count)."""
    count = 0
    for line in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
        try:
            text = "x" if len(line) > MAX_LINE_BYTES else line.decode("utf-8").strip()
        except UnicodeDecodeError:
            text = "x"
        count += not (text == "" or text.startswith("#"))
    return count


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("autotvm") / "fuzz.log"


@fuzzed(
    lines=st.lists(LOG_LINES, max_size=8), final_newline=st.booleans(),
)
@example(lines=[("edited", b'{"i": ["", "t", [], {}, [], {"e": []}], "r": [[1' + b"0" * 309 + b'], 0, 0, 0]}')],
         final_newline=True)
@example(lines=[("edited", b"1" * 4301)], final_newline=True)
def autotvm_log_accounts_for_every_line(log_file: Path, lines: list[tuple[str, bytes]], final_newline: bool) -> None:
    data = b"\n".join(b for _, b in lines) + (b"\n" if final_newline and lines else b"")
    log_file.write_bytes(data)
    summary = read_log(log_file)
    assert summary.records + summary.bad_line_count == counted_lines(data)
    assert summary.records >= sum(kind == "good" for kind, _ in lines)
    assert summary.bad_line_count >= sum(kind in ("bad", "oversized") for kind, _ in lines)
    assert len(summary.bad_lines) == min(summary.bad_line_count, MAX_REPORTED_BAD_LINES)
    assert all(isinstance(e, InputError) and e.where.startswith(f"{log_file}:") for e in summary.bad_lines)
    assert sum(w.trials for w in summary.workloads) == summary.records
    for w in summary.workloads:
        assert w.successes + sum(w.errors_by_kind.values()) == w.trials == len(w.best_so_far)


# ---------------------------------------------------------------------------------------------
# Profile strings

TIMES = st.floats(min_value=0, exclude_min=True, allow_infinity=False)  # positive and finite, subnormals too
DEVICES = st.text(st.characters(exclude_categories=(), exclude_characters=":;") | SURROGATES, min_size=1, max_size=20)
TIME_TEXTS = st.one_of(
    st.floats().map(repr), TIMES.map(lambda t: f"{t:.6g}"), st.integers().map(str), st.text(max_size=6),
    st.sampled_from(["", " 1 ", ".5", "5.", "1e3", "1E+3", "-1", "0", "nan", "inf", "1e999", "1e-999", "0x10", "1_000",
                     "\u0661", "+1", " ", "1e", "\u20281"]))


PROFILE_ENTRIES = st.lists(st.tuples(DEVICES | TEXT, TIME_TEXTS), max_size=4)


@st.composite
def profile_texts(draw: st.DrawFn) -> str:
    entries = draw(PROFILE_ENTRIES)
    text = ";".join(f"{d}:{t}" for d, t in entries)
    return text + draw(pick((";", ";", ""))) if entries else text


PROFILES = profile_texts() | TEXT | st.dictionaries(DEVICES, TIMES, max_size=3).map(format_profile)


def same_6_digits(a: dict[str, float], b: dict[str, float]) -> bool:
    """Equal at format_profile's precision (6 significant digits)."""
    return {k: f"{v:.6g}" for k, v in a.items()} == {k: f"{v:.6g}" for k, v in b.items()}


@fuzzed(text=PROFILES | JSON)
def profile_any_text(text: Any) -> None:
    try:
        times = parse_profile(text)
    except InputError:
        return
    assert all(d and ":" not in d and ";" not in d and math.isfinite(t) and t > 0 for d, t in times.items())
    assert same_6_digits(parse_profile(format_profile(times)), times)


@fuzzed(times=st.dictionaries(DEVICES, TIMES, max_size=4))
def profile_round_trip(times: dict[str, float]) -> None:
    assert same_6_digits(parse_profile(format_profile(times)), times)


@fuzzed(times=st.dictionaries(TEXT, st.floats(), max_size=4))
def profile_format_any_times(times: dict[str, float]) -> None:
    try:
        assert isinstance(format_profile(times), str)
    except InputError:
        pass


@fuzzed(existing=PROFILES, device=DEVICES | TEXT, us=st.floats())
def profile_merge(existing: str, device: str, us: float) -> None:
    try:
        merged = merge_profile(existing, device, us)
    except InputError:
        return
    before, after = parse_profile(existing), parse_profile(merged)
    assert same_6_digits(after, {**before, device: us})


# ---------------------------------------------------------------------------------------------
# Lint: any column values, as a hostile DB may hold them

COLUMN = st.none() | st.binary(max_size=16) | st.integers() | HUGE_INTS | st.floats() | TEXT | st.builds(dumps, JSON)
CLEAN_FUNCTION = {"function_signature": 'extern "C" __global__ void k(float* input0, float* output0)',
                  "function_body": "", "grid_dim": [1, 1, 1], "block_dim": [64, 1, 1], "block_function_body": "",
                  "shared_memory": {"symbol": ["A_shared"], "dtype": ["float"], "size": [64]}, "num_syncthreads": 1}
TAGS = "KernelEmitter,CudaEmitter,BlockCudaEmitter"
ROW_TOKENS = (",", " ", "BlockCudaEmitter", "Relu")


@st.composite
def kernel_rows(draw: st.DrawFn) -> tuple[tuple[Any, ...], bool]:
    """A DB row as stored (rowid, Key, Identifier, OpType, Attributes, Source, DeviceType, Function, Tags,
    Miscs), and whether it is untouched (then lint must find nothing)."""
    sig = draw(op_configs(line_safe=False, grouped=False)).signature()
    profile = format_profile(draw(st.dictionaries(DEVICES, TIMES, max_size=2)))
    function = {**CLEAN_FUNCTION, "function_signature": CLEAN_FUNCTION["function_signature"].replace("float", sig.dtype)}
    columns: list[Any] = [draw(st.integers()), "key", sig.identifier, sig.op_type, sig.attributes(), "External",
                          "CUDA_GPU", function, TAGS, {"external_profile": {"time": profile, "resource": 64}}]
    clean = draw(st.booleans())
    if not clean:
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, 9))
            value = columns[i]
            if isinstance(value, dict):
                columns[i] = mutate(draw, value) if draw(st.booleans()) else draw(COLUMN)
            elif isinstance(value, str):
                columns[i] = edit(draw, value, ROW_TOKENS) if draw(st.booleans()) else draw(COLUMN)
            else:
                columns[i] = draw(COLUMN)
    return tuple(dumps(c) if isinstance(c, dict | list) else c for c in columns), clean


# CI's hypothesis once drew a shared_memory dtype that was a list: lint raised "unhashable type" instead of a finding
LIST_DTYPE_ROW = (1, "key", "Relu2;2floatfloat", "Relu", dumps({"input_shape": [[2]], "output_shape": [[2]]}),
                  "External", "CUDA_GPU",
                  dumps({**CLEAN_FUNCTION, "shared_memory": {"symbol": ["A"], "dtype": [["float"]], "size": [64]}}),
                  TAGS, "{}")


@fuzzed(rows=st.lists(kernel_rows(), min_size=1, max_size=2))
@example(rows=[(LIST_DTYPE_ROW, False)])
def lint_any_row(rows: list[tuple[tuple[Any, ...], bool]]) -> None:
    for row, clean in rows:
        findings = lint_row(row)
        assert all(isinstance(f, Finding) and f.severity in (CRASH, UNREACHABLE, WARNING) and f.rowid is row[0]
                   for f in findings)
        if clean:
            assert findings == []
    assert len(list(lint_rows([row for row, _ in rows]))) >= sum(len(lint_row(row)) for row, _ in rows)


SQL_VALUES = st.none() | st.integers() | st.floats() | TEXT | st.binary(max_size=16)


@fuzzed(
    row=kernel_rows(), values=st.lists(SQL_VALUES, min_size=10, max_size=10), pick=st.lists(st.booleans(), min_size=10,
                                                                                            max_size=10),
)
@example(row=((1, "k", "x", "Relu", "{}", "y", "CUDA_GPU", "{}", "", "{}"), False), values=[5] * 10,
         pick=[False, True, *[False] * 8])
def lint_quick_problem_any_values(row: tuple[tuple[Any, ...], bool], values: list[Any], pick: list[bool]) -> None:
    _, _, ident, op_type, attrs, source, device, _, tags, _ = row[0]
    args = [op_type, attrs, ident, source, device, tags, 1, 1, None, None]
    args = [v if p else a for a, v, p in zip(args, values, pick, strict=True)]
    assert isinstance(quick_problem(*args), str)


# ---------------------------------------------------------------------------------------------
# Settings

SETTING_KEYS = [f.name for f in fields(Settings)]
ARCH_TOKENS = st.text(st.characters(exclude_categories=("Z", "Cc", "Cs"), exclude_characters=","), min_size=1)


@fuzzed(key=st.sampled_from(SETTING_KEYS) | TEXT, text=TEXT | st.sampled_from(["'", '"', "a 'b c", "1e999", "0x10"]))
def settings_any_value(key: str, text: str) -> None:
    try:
        value = parse_value(key, text)
    except InputError:
        return
    default = getattr(Settings(), key)
    assert type(value) is type(default)
    if isinstance(value, list):
        assert all(isinstance(v, str) for v in value)
    if key == "archs":
        assert all(v and not re.search(r"[,\s]", v) for v in value)


@fuzzed(flags=st.lists(st.text(CHARS, max_size=8), max_size=4), archs=st.lists(ARCH_TOKENS, max_size=4),
        n=st.integers(), x=st.floats(allow_nan=False))
def settings_values_round_trip(flags: list[str], archs: list[str], n: int, x: float) -> None:
    assert parse_value("nvcc_flags", shlex.join(flags)) == flags
    assert parse_value("archs", ", ".join(archs)) == archs
    assert parse_value("workers", str(n)) == n
    assert parse_value("gpu_timeout_s", repr(x)) == x

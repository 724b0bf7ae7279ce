"""Read a CUDA kernel's source the way the injection pipeline needs it.

Finds the one `__global__` kernel, its parameters, every `__shared__` declaration, and what lies
outside the kernel. Work happens on a *masked* copy of the code (comments, string contents and
preprocessor lines blanked to spaces, same length) so that positions map back to the original
text and nothing inside a comment or string is mistaken for code. Regexes find the few places
that matter; nothing scans the code character by character in Python, so a 30 KB TVM kernel
parses in well under a millisecond.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.cuda import cexpr
from core.cuda.shared_types import SHARED_BITS_OF
from core.errors import InputError

_BRACE = re.compile(r"[{}]")
_PAREN = re.compile(r"[()]")
_STMT_BOUNDARY = re.compile(r"[;{}]")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_QUALIFIERS = frozenset(["const", "__restrict__", "__restrict", "restrict", "volatile"])
_DECL_SPECIFIERS = frozenset(["static", "volatile", "extern", "__shared__"])


_MASK_TOKENS = ("//", "/*", '"', "'", "#")


def mask(code: str) -> str:
    """Same-length copy with comments, string/char contents and preprocessor lines blanked."""
    pieces: list[str] = []
    pos = 0
    nxt = {t: code.find(t) for t in _MASK_TOKENS}
    while True:
        live = [(i, t) for t, i in nxt.items() if i >= 0]
        if not live:
            break
        start, token = min(live)
        if start < pos:
            nxt[token] = code.find(token, pos)
            continue
        skip_from = start + 1
        if token == "//":
            end = code.find("\n", start)
            while end > 0 and code[end - 1] == "\\":  # a backslash-newline splices the next line in
                end = code.find("\n", end + 1)
        elif token == "/*":
            end = code.find("*/", start + 2)
            end = end + 2 if end >= 0 else -1
        elif token == "#":
            line_start = code.rfind("\n", 0, start) + 1
            if code[line_start:start].strip():
                nxt[token] = code.find(token, skip_from)
                continue  # not at the start of a line: not a directive
            end = start
            while True:  # a directive continues over backslash-newlines
                end = code.find("\n", end)
                if end < 0 or code[end - 1] != "\\":
                    break
                end += 1
        else:  # a string or character literal: keep the quotes, blank the contents
            end = start + 1
            while end < len(code) and code[end] != token and code[end] != "\n":
                end += 2 if code[end] == "\\" else 1
            if end >= len(code) or code[end] != token:
                nxt[token] = code.find(token, skip_from)
                continue  # unterminated: leave it, the compiler will complain
            pieces.append(code[pos:start + 1])
            pieces.append(_blank(code[start + 1:end]))
            pos = end
            nxt = {t: (code.find(t, pos + 1) if 0 <= i < pos + 1 else i) for t, i in nxt.items()}
            continue
        if end < 0:
            end = len(code)
        pieces.append(code[pos:start])
        pieces.append(_blank(code[start:end]))
        pos = end
        nxt = {t: (code.find(t, pos) if 0 <= i < pos else i) for t, i in nxt.items()}
    if not pieces:
        return code
    pieces.append(code[pos:])
    return "".join(pieces)


def _blank(text: str) -> str:
    return " " * len(text) if "\n" not in text else re.sub(r"[^\n]", " ", text)


def find_words(text: str, word: str, start: int = 0, end: int | None = None) -> list[int]:
    """Positions of `word` as a whole identifier (str.find is far faster than a \\b regex)."""
    end = len(text) if end is None else end
    out = []
    i = text.find(word, start, end)
    while i >= 0:
        before = text[i - 1] if i > 0 else " "
        after = text[i + len(word)] if i + len(word) < len(text) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            out.append(i)
        i = text.find(word, i + len(word), end)
    return out


def line_of(code: str, pos: int) -> int:
    return code.count("\n", 0, pos) + 1


def match_close(masked: str, open_pos: int, pattern: re.Pattern[str] = _BRACE) -> int:
    """Position of the bracket closing the one at open_pos; InputError when unbalanced."""
    opener = masked[open_pos]
    if opener == "(":
        # Check each candidate by counting (in C): short spans, few candidates.
        q = masked.find(")", open_pos)
        while q >= 0:
            if masked.count("(", open_pos, q) == masked.count(")", open_pos, q) + 1:
                return q
            q = masked.find(")", q + 1)
    else:
        depth = 0
        for m in pattern.finditer(masked, open_pos):
            depth += 1 if m.group(0) == opener else -1
            if depth == 0:
                return m.start()
    kind = "brace" if opener == "{" else "parenthesis"
    raise InputError(f"unbalanced {kind} opened at line {line_of(masked, open_pos)}", where="code")


def brace_pairs(masked: str, start: int) -> dict[int, int]:
    """'{' position -> matching '}' for the braces from `start` until the one at `start` closes.

    Vectorised: a TVM kernel has hundreds of braces, too many for a Python loop on the hot path.
    Braces sorted by nesting level alternate open/close within a level, so pairs are neighbours.
    """
    import numpy as np

    # surrogatepass: one uint32 per code point even for lone surrogates (text read with errors kept)
    chars = np.frombuffer(masked[start:].encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    where = np.flatnonzero((chars == 123) | (chars == 125))  # '{' and '}'
    if where.size == 0:
        return {}
    step = np.where(chars[where] == 123, 1, -1)
    depth = np.cumsum(step)
    closed = np.flatnonzero(depth == 0)
    end = int(closed[0]) + 1 if closed.size else where.size  # up to the brace closing the first one
    where, step, depth = where[:end], step[:end], depth[:end]
    level = np.where(step == 1, depth, depth + 1)
    order = np.argsort(level, kind="stable")
    ordered, kinds = where[order], step[order]
    opens = np.flatnonzero(kinds[:-1] == 1)
    opens = opens[kinds[opens + 1] == -1]  # an unclosed '{' has no partner: leave it out
    return dict(zip((ordered[opens] + start).tolist(), (ordered[opens + 1] + start).tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    base_type: str  # e.g. "float", "float4", "unsigned int"
    pointer_depth: int
    is_const: bool
    text: str  # as written


@dataclass(frozen=True, slots=True)
class SharedDecl:
    """One `__shared__` array, as NNFusion's shared_memory table stores it.

    NNFusion re-declares each entry as `__shared__ <dtype> <symbol>[<size>];` (one-dimensional).
    Multi-dimensional arrays and scalars are hoisted under a flat `symbol` and reached again
    through `alias`, a statement put at the top of the block body.
    """

    name: str  # the name the kernel uses
    symbol: str  # the name stored in shared_memory
    dtype: str
    dims: tuple[int, ...]  # () for a scalar
    alias: str | None
    span: tuple[int, int]  # of the whole declaration statement in the code
    align: int = 0  # bytes asked by alignas / __align__ (0: the type's own); kept by padding (kernel_row.py)

    @property
    def stored_dtype(self) -> str:
        """The dtype shared_memory declares the array with: its own, or a type of BlockFusion's table of its size."""
        return SHARED_BITS_OF.get(self.dtype, self.dtype)

    @property
    def size(self) -> int:
        return math.prod(self.dims) if self.dims else 1


@dataclass(frozen=True, slots=True)
class KernelSource:
    """The parts of one kernel's source the pipeline turns into a DB row."""

    code: str
    masked: str
    name: str
    params: tuple[Param, ...]
    body_span: tuple[int, int]  # inner text of the body braces
    shared: tuple[SharedDecl, ...]
    launch_bounds: int | None
    notes: tuple[str, ...]  # harmless things worth telling (dropped preamble, lost qualifiers)
    braces: dict[int, int]  # each '{' of the body (and its own) -> its matching '}'; computed once

    @property
    def body(self) -> str:
        return self.code[self.body_span[0]:self.body_span[1]]

    def body_without_shared(self) -> str:
        """The body with every `__shared__` declaration statement cut out."""
        start, end = self.body_span
        pieces, pos = [], start
        for decl in sorted(self.shared, key=lambda d: d.span):
            if decl.span[0] < pos:
                continue
            pieces.append(self.code[pos:decl.span[0]])
            pos = decl.span[1]
        pieces.append(self.code[pos:end])
        return "".join(pieces)


def parse_kernel(code: str) -> KernelSource:
    """Parse CUDA source holding exactly one `__global__` kernel; InputError says what is wrong."""
    masked = mask(code)
    starts = find_words(masked, "__global__")
    if not starts:
        raise InputError("no __global__ kernel found", where="code")
    if len(starts) > 1:
        raise InputError(
            f"{len(starts)} __global__ kernels (lines {', '.join(str(line_of(code, s)) for s in starts)}); "
            "NNFusion stores exactly one kernel per row",
            where="code",
        )
    glob = starts[0]
    name_m = re.compile(r"\b([A-Za-z_]\w*)\s*\(").search(masked, glob)
    # Skip __launch_bounds__(...) and void, which also precede a parenthesis or a name.
    launch_bounds = None
    while name_m and name_m.group(1) in ("__launch_bounds__", "__attribute__"):
        close = match_close(masked, name_m.end() - 1, _PAREN)
        if name_m.group(1) == "__launch_bounds__":
            launch_bounds = _bound_value(masked[name_m.end():close])
        name_m = re.compile(r"\b([A-Za-z_]\w*)\s*\(").search(masked, close + 1)
    if name_m is None:
        raise InputError("cannot find the kernel's name and parameter list", where="code")
    header = masked[glob:name_m.start()]
    if "template" in masked[:glob][-200:] or "<" in header:
        raise InputError("templated kernels are not supported: NNFusion stores plain kernels", where="code")
    if not re.search(r"\bvoid\b", header):
        raise InputError("a __global__ kernel must return void", where="code")
    name = name_m.group(1)
    params_open = name_m.end() - 1
    params_close = match_close(masked, params_open, _PAREN)
    body_open_m = re.compile(r"\s*(\{|;)").match(masked, params_close + 1)
    if body_open_m is None or body_open_m.group(1) != "{":
        raise InputError(f"kernel {name} has no body", where="code")
    body_open = body_open_m.start(1)
    braces = brace_pairs(masked, body_open)
    body_close = braces.get(body_open)
    if body_close is None:
        raise InputError(f"unbalanced brace opened at line {line_of(masked, body_open)}", where="code")
    params = _parse_params(masked[params_open + 1:params_close], code[params_open + 1:params_close])

    decl_start = _declaration_start(masked, glob)
    # NNFusion's own emitter writes the bounds before __global__: extern "C" __launch_bounds__(N) __global__
    before = _LAUNCH_BOUNDS.search(masked, decl_start, glob)
    if before and launch_bounds is None:
        launch_bounds = _bound_value(before.group(1))
    notes = _outside_kernel(code, masked, decl_start, body_close + 1)
    shared, shared_notes = _shared_decls(code, masked, body_open + 1, body_close)
    return KernelSource(
        code=code,
        masked=masked,
        name=name,
        params=params,
        body_span=(body_open + 1, body_close),
        braces=braces,
        shared=shared,
        launch_bounds=launch_bounds,
        notes=tuple(notes + shared_notes),
    )


_LAUNCH_BOUNDS = re.compile(r"\b__launch_bounds__\s*\(([^()]*)\)")
_SPECIFIERS = re.compile(
    r'(?:\b(?:extern\s+"\s*"|extern|static|inline|__forceinline__)\s+|\b__launch_bounds__\s*\([^()]*\)\s*)+$')


def _bound_value(args: str) -> int | None:
    """The max-threads argument of __launch_bounds__(...), when it is a constant."""
    try:
        return cexpr.evaluate(cexpr.parse(args.split(",")[0]), {})
    except (cexpr.ParseError, cexpr.Unknown):
        return None


def _declaration_start(masked: str, glob: int) -> int:
    """Where the kernel's declaration starts: include `extern "C"`/`static`/`__launch_bounds__(N)` before
    __global__."""
    m = _SPECIFIERS.search(masked[:glob])
    return m.start() if m else glob


def _outside_kernel(code: str, masked: str, start: int, end: int) -> list[str]:
    """Text outside the kernel is not stored by NNFusion: fail on code, note dropped directives."""
    notes = []
    for part, offset in ((masked[:start], 0), (masked[end:], end)):
        stripped = part.strip()
        if stripped:
            pos = offset + len(part) - len(part.lstrip())
            raise InputError(
                f"code outside the kernel at line {line_of(code, pos)} ({stripped[:40]!r}): NNFusion stores "
                "only the kernel body, so helpers, globals and typedefs would be lost",
                where="code",
            )
    directives = [ln.strip() for ln in code[:start].splitlines() + code[end:].splitlines()
                  if ln.strip().startswith("#")]
    if directives:
        notes.append(f"preprocessor lines outside the kernel are not stored: {'; '.join(directives)[:200]}")
    return notes


def _parse_params(masked_list: str, original: str) -> tuple[Param, ...]:
    text = masked_list.strip()
    if not text or text == "void":
        return ()
    params = []
    depth, start = 0, 0
    pieces = []
    for i, ch in enumerate(masked_list):
        if ch in "([<":
            depth += 1
        elif ch in ")]>":
            depth -= 1
        elif ch == "," and depth == 0:
            pieces.append((start, i))
            start = i + 1
    pieces.append((start, len(masked_list)))
    for a, b in pieces:
        raw = original[a:b].strip()
        words = _IDENT.findall(masked_list[a:b])
        if not words:
            raise InputError(f"cannot read parameter {raw!r}", where="code")
        if "[" in masked_list[a:b] or "&" in masked_list[a:b]:
            raise InputError(f"parameter {raw!r}: arrays and references are not supported", where="code")
        name = words[-1]
        type_words = [w for w in words[:-1] if w not in _QUALIFIERS]
        if not type_words:
            raise InputError(f"parameter {raw!r} has no type", where="code")
        params.append(Param(
            name=name,
            base_type=" ".join(type_words),
            pointer_depth=masked_list[a:b].count("*"),
            is_const="const" in words,
            text=raw,
        ))
    return tuple(params)


def _statement_start(masked: str, pos: int, floor: int) -> int:
    """Start of the statement holding pos: just after the last ; { } before it (not before floor)."""
    i = max(masked.rfind(";", floor, pos), masked.rfind("{", floor, pos), masked.rfind("}", floor, pos))
    return max(i + 1, floor)


def _shared_decls(code: str, masked: str, start: int, end: int) -> tuple[tuple[SharedDecl, ...], list[str]]:
    decls: list[SharedDecl] = []
    notes: list[str] = []
    seen: dict[str, int] = {}
    last_end = start
    for at in find_words(masked, "__shared__", start, end):
        if at < last_end:
            continue  # a second __shared__ inside a statement already read
        stmt_start = _statement_start(masked, at, start)
        if masked.count("(", stmt_start, at) != masked.count(")", stmt_start, at):
            continue  # a cast such as ((__shared__ float4*)(A_shared + i)): stays in the body
        semi = masked.find(";", at, end)
        if semi < 0:
            raise InputError(f"unterminated __shared__ declaration at line {line_of(code, at)}",
                             where="code")
        stmt = masked[stmt_start:semi]
        line = line_of(code, at)
        for decl in _split_declaration(stmt, line, notes):
            name = decl[0]
            if name in seen:
                raise InputError(
                    f"__shared__ {name!r} is declared twice (lines {seen[name]} and {line}); hoisting them "
                    "into one function scope would merge them",
                    where="code",
                )
            seen[name] = line
            decls.append(_hoisted(name, decl[1], decl[2], (stmt_start, semi + 1), decl[3]))
        last_end = semi + 1
    flattened = [d for d in decls if d.symbol != d.name]
    if flattened:
        in_use = set(_IDENT.findall(masked, start, end))
        for d in flattened:
            if d.symbol in in_use:
                raise InputError(f"cannot hoist __shared__ {d.name!r}: the name {d.symbol!r} is in use",
                                 where="code")
    return tuple(decls), notes


def _split_declaration(stmt: str, line: int, notes: list[str]) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(name, dtype, dims, alignment in bytes or 0) for each declarator of one `__shared__` statement."""
    text = stmt.strip()
    if "=" in text:
        raise InputError(f"__shared__ variable with an initializer at line {line}: CUDA forbids it", where="code")
    alignment = 0
    for align in re.finditer(r"(?:__align__|alignas)\s*\(\s*(\d+)\s*\)", text):
        # NNFusion re-declares the array without it: the sizes are padded instead (see kernel_row.py)
        alignment = max(alignment, int(align.group(1)))
        text = text.replace(align.group(0), " ")
    first, *rest = split_top_commas(text)
    words = _IDENT.findall(first.split("[")[0])
    if "extern" in words:
        raise InputError(
            f"dynamic shared memory (extern __shared__) at line {line}: NNFusion needs every shared array's "
            "size in the source",
            where="code",
        )
    if "volatile" in words:
        notes.append(f"line {line}: volatile is dropped by hoisting the shared array")
    type_words = [w for w in words[:-1] if w not in _DECL_SPECIFIERS and w not in _QUALIFIERS]
    if not type_words or "*" in first.split("[")[0]:
        raise InputError(f"cannot read the __shared__ declaration at line {line}: {text[:60]!r}", where="code")
    dtype = " ".join(type_words)
    declarators = [first[first.rfind(words[-1]):] if words else first, *rest]
    out = []
    for d in declarators:
        m = re.fullmatch(r"\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", d)
        if m is None:
            raise InputError(f"cannot read the __shared__ declarator {d.strip()!r} at line {line}", where="code")
        dims = []
        for dim_text in re.findall(r"\[([^\]]*)\]", m.group(2)):
            if not dim_text.strip():
                raise InputError(f"__shared__ {m.group(1)!r} at line {line} has no size", where="code")
            try:
                value = cexpr.evaluate(cexpr.parse(dim_text), {})
            except (cexpr.ParseError, cexpr.Unknown):
                raise InputError(
                    f"__shared__ {m.group(1)!r} at line {line}: size {dim_text.strip()!r} is not a constant",
                    where="code",
                ) from None
            if value <= 0:
                raise InputError(f"__shared__ {m.group(1)!r} at line {line}: size {value}", where="code")
            dims.append(value)
        out.append((m.group(1), dtype, tuple(dims), alignment))
    return out


def split_top_commas(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _hoisted(name: str, dtype: str, dims: tuple[int, ...], span: tuple[int, int], align: int = 0) -> SharedDecl:
    storage = SHARED_BITS_OF.get(dtype)
    if storage is not None:  # declared as the table's type, the kernel's name a typed view of it
        symbol = f"{name}_kdb_bits"
        if not dims:
            alias = f"{dtype}& {name} = *reinterpret_cast<{dtype}*>({symbol});"
        elif len(dims) == 1:
            alias = f"{dtype}* {name} = reinterpret_cast<{dtype}*>({symbol});"
        else:
            inner = "".join(f"[{d}]" for d in dims[1:])
            alias = f"{dtype} (*{name}){inner} = reinterpret_cast<{dtype} (*){inner}>({symbol});"
        return SharedDecl(name, symbol, dtype, dims, alias, span, align)
    if len(dims) == 1:
        return SharedDecl(name, name, dtype, dims, None, span, align)
    symbol = f"{name}_kdb_flat"
    if not dims:  # a scalar: NNFusion only declares arrays
        return SharedDecl(name, symbol, dtype, (), f"{dtype}& {name} = {symbol}[0];", span, align)
    inner = "".join(f"[{d}]" for d in dims[1:])
    alias = f"{dtype} (*{name}){inner} = reinterpret_cast<{dtype} (*){inner}>({symbol});"
    return SharedDecl(name, symbol, dtype, dims, alias, span, align)

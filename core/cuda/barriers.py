"""Count the `__syncthreads()` that thread 0 of block 0 executes, without running the kernel.

BlockFusion needs this number exact (NNFusion's `num_syncthreads`). TVM-style kernels put barriers
in constant-bound `for` loops and under conditions on thread/block indices, so the count follows
from the source: the body is reduced to a small program of the statements that matter (barriers,
loops and ifs around them, returns, integer locals), which is then interpreted with threadIdx and
blockIdx at 0 and blockDim/gridDim from the launch config.

Whenever the count cannot be proven (a barrier in a while loop, a condition on data, a variable
changed behind our back, a loop too long to walk) the result says why and carries no number: the
GPU stage counts it by running an instrumented copy. Nothing is ever guessed.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from dataclasses import dataclass

from core.cuda import cexpr
from core.cuda.source import _PAREN, KernelSource, find_words, line_of, match_close
from core.errors import InputError

MAX_STEPS = 2_000_000  # interpretation budget per kernel (loop iterations x program nodes)

_PLAIN_BARRIER = re.compile(r"__syncthreads\s*\(\s*\)\s*;")
_KEYWORD = re.compile(r"(for|if|while|do|switch|return|break|continue|goto|else|case|default)\b")
_WS = re.compile(r"\s*")
_SIMPLE_END = re.compile(r"[;{}()]")
_INT_DECL = re.compile(
    r"\s*(?:const\s+)?(?:(?:unsigned|signed)\s+)?(?:int|long\s+long|long|short|size_t|u?int(?:8|16|32|64)_t|unsigned)"
    r"\s+([A-Za-z_]\w*)\s*=\s*(.+?)\s*",
    re.S,
)
_FOR_STEP = re.compile(
    r"\s*(?:(?:\+\+|--)\s*(?P<pre>[A-Za-z_]\w*)|(?P<post>[A-Za-z_]\w*)\s*(?P<postop>\+\+|--)"
    r"|(?P<acc>[A-Za-z_]\w*)\s*(?P<accop>[-+])=\s*(?P<accexpr>.+)"
    r"|(?P<asg>[A-Za-z_]\w*)\s*=\s*(?P<asgexpr>.+))\s*",
    re.S,
)
_FOR_INIT = re.compile(
    r"\s*(?:(?:const\s+)?(?:unsigned\s+)?(?:int|long|size_t|short)\s+)?([A-Za-z_]\w*)\s*=\s*(.+?)\s*", re.S)
_DECL_NEEDLES = ("int ", "long ", "_t ", "short ", "unsigned ")
_ELSE = re.compile(r"\s*else\b")
_OPERAND_END = re.compile(r"[\w)\]]\s*$")  # what precedes a binary '&' (so it is not an address-of)
_RARE_WORDS = ("break", "continue", "case", "default")  # when present, read statement by statement
_WRITE_AFTER = re.compile(r"\s*(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)")
_ASSIGNMENT = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)")
_OTHER_SYNC = re.compile(r"\b__syncthreads_(?:count|and|or)\b|\bthis_thread_block\b|\bgrid_group\b|\.sync\s*\(")
_ASM_BARRIER = re.compile(r"\basm\b[^;]*\b(?:bar|barrier)\.", re.S)


@dataclass(frozen=True, slots=True)
class BarrierCount:
    """Either an exact count, or None with the reason it could not be proven."""

    count: int | None
    reason: str = ""

    @property
    def known(self) -> bool:
        return self.count is not None


class _Unresolvable(Exception):
    pass


class _Returned(Exception):
    def __init__(self, count: int) -> None:
        self.count = count


# Program nodes: ("barrier",), ("return",), ("decl", name, expr|None, unsigned), ("taint", name),
# ("if", cond_expr, cond_text, then_nodes, else_nodes, line),
# ("for", var, init_expr, cond_expr, step, body_nodes, line)   step = (op, expr)


def count_barriers(src: KernelSource, block: tuple[int, int, int], grid: tuple[int, int, int]) -> BarrierCount:
    """Barriers executed by thread 0 of block 0, or the reason that cannot be proven statically."""
    start, end = src.body_span
    masked = src.masked
    if masked.find("__syncthreads", start, end) < 0 and src.code.find("asm", start, end) < 0 \
            and masked.find("sync", start, end) < 0:
        return BarrierCount(0)
    barrier_positions = find_words(masked, "__syncthreads", start, end)
    try:
        other = None
        if any(masked.find(w, start, end) >= 0 for w in ("__syncthreads_", "this_thread_block", "grid_group",
                                                           ".sync")):
            other = _OTHER_SYNC.search(masked, start, end)
        if other is None and masked.find("asm", start, end) >= 0:
            other = _ASM_BARRIER.search(src.code, start, end)
        if other:
            raise _Unresolvable(f"line {line_of(src.code, other.start())}: {other.group(0).strip()!r} "
                                "is a barrier the static count does not model")
        if not barrier_positions:
            return BarrierCount(0)  # "sync" only in other names (__shfl_down_sync, __syncwarp...)
        if find_words(masked, "goto", start, end):
            raise _Unresolvable("the kernel uses goto")
        builder = _Builder(src, barrier_positions)
        program = builder.block(start, end, top=True)
        env: dict[str, int | None] = {
            "threadIdx.x": 0, "threadIdx.y": 0, "threadIdx.z": 0,
            "blockIdx.x": 0, "blockIdx.y": 0, "blockIdx.z": 0,
            "blockDim.x": block[0], "blockDim.y": block[1], "blockDim.z": block[2],
            "gridDim.x": grid[0], "gridDim.y": grid[1], "gridDim.z": grid[2],
            "warpSize": 32,
        }
        runner = _Runner()
        try:
            return BarrierCount(runner.run(program, env))
        except _Returned as ret:
            return BarrierCount(ret.count)
    except _Unresolvable as exc:
        return BarrierCount(None, f"barrier count not provable statically: {exc}")
    except InputError as exc:  # unbalanced brackets and the like: the code is broken, not countable
        return BarrierCount(None, f"barrier count not provable statically: {exc.reason}")
    except RecursionError:
        return BarrierCount(None, "barrier count not provable statically: the code is nested too deeply")


class _Builder:
    """Reduces the masked body to the program nodes that can change the barrier count."""

    def __init__(self, src: KernelSource, barrier_positions: list[int]) -> None:
        self.src = src
        self.m = src.masked
        start, end = src.body_span
        self.body_span = (start, end)
        returns = find_words(self.m, "return", start, end)
        self.marks = sorted(barrier_positions + returns)
        self.last_barrier = barrier_positions[-1]
        # Where to stop and look: barriers, returns and braces. Between two of them lie only simple
        # statements, whose integer declarations are all that matters (found once, up front).
        self.fast = not any(find_words(self.m, w, start, end) for w in _RARE_WORDS if self.m.find(w, start, end) >= 0)
        points = set(barrier_positions) | set(returns)
        self.closing = src.braces
        for opening, closing in src.braces.items():
            if start <= opening < end:
                points.update((opening, closing))
        self.points = sorted(points)
        self.decls = self._find_decls(start, end)
        self.decl_starts = [d[0] for d in self.decls]

    def _find_decls(self, start: int, end: int) -> list[tuple[int, str]]:
        """(statement start, statement text) of every integer declaration statement of the body."""
        m = self.m
        found: dict[int, str] = {}
        for needle in _DECL_NEEDLES:
            i = m.find(needle, start, end)
            while i >= 0:
                # From the statement's first non-blank character: block() reaches statements there.
                stmt_start = self.skip_ws(
                    max(m.rfind(";", start, i), m.rfind("{", start, i), m.rfind("}", start, i), start - 1) + 1)
                if stmt_start not in found:
                    semi = m.find(";", i, end)
                    text = m[stmt_start:semi] if semi >= 0 else ""
                    if semi >= 0 and _INT_DECL.fullmatch(text):
                        found[stmt_start] = text
                i = m.find(needle, i + len(needle), end)
        return sorted(found.items())

    def close_brace(self, pos: int) -> int:
        close = self.closing.get(pos)
        if close is None:
            raise _Unresolvable(f"line {self.line(pos)}: unbalanced brace")
        return close

    def relevant(self, a: int, b: int) -> bool:
        i = bisect.bisect_left(self.marks, a)
        return i < len(self.marks) and self.marks[i] < b

    def line(self, pos: int) -> int:
        return line_of(self.src.code, pos)

    def skip_ws(self, pos: int) -> int:
        return _WS.match(self.m, pos).end()  # type: ignore[union-attr]

    def block(self, a: int, b: int, *, top: bool = False) -> list[tuple]:
        nodes: list[tuple] = []
        pos = self.skip_ws(a)
        while pos < b:
            if top and pos > self.last_barrier:
                break  # what follows the last barrier at top level cannot change the count
            i = bisect.bisect_left(self.points, pos)
            nxt = min(self.points[i], b) if i < len(self.points) else b
            if self.fast and nxt > pos and self.m[pos:nxt].rstrip().endswith(";"):
                self.emit_decls(pos, nxt, nodes)  # a run of simple statements
                pos = nxt
            elif self.fast and nxt < b and self.m[nxt] == "{" and not self.relevant(pos, self.close_brace(nxt)) \
                    and not _ELSE.match(self.m, self.close_brace(nxt) + 1) and not find_words(self.m, "do", pos, nxt):
                # Simple statements, then a compound statement holding no barrier: skip it whole.
                self.emit_decls(pos, nxt, nodes)
                pos = self.close_brace(nxt) + 1
            else:
                pos = self.statement(pos, b, nodes)
            pos = self.skip_ws(pos)
        return nodes

    def emit_decls(self, a: int, b: int, nodes: list[tuple]) -> None:
        """The integer declarations among the simple statements in [a, b)."""
        i = bisect.bisect_left(self.decl_starts, a)
        while i < len(self.decls) and self.decls[i][0] < b:
            self.note_assignment(self.decls[i][1], nodes)
            i += 1

    def statement(self, pos: int, limit: int, nodes: list[tuple]) -> int:
        """Parse the statement at pos, append its nodes, return the position after it."""
        m = self.m
        ch = m[pos]
        if ch == "{":
            close = self.close_brace(pos)
            if self.relevant(pos, close):
                nodes.extend(self.block(pos + 1, close))
            return close + 1
        if ch == ";":
            return pos + 1
        kw = _KEYWORD.match(m, pos)
        if kw:
            word = kw.group(1)
            if word == "for":
                return self.for_loop(pos, kw.end(), nodes)
            if word == "if":
                return self.if_stmt(pos, kw.end(), nodes)
            if word in ("while", "do", "switch"):
                end = self.compound_end(pos, kw.end(), word)
                if self.relevant(pos, end):
                    raise _Unresolvable(f"line {self.line(pos)}: barrier or return inside a {word} statement")
                return end
            if word == "return":
                end = self.simple_end(pos)
                nodes.append(("return",))
                return end
            if word in ("break", "continue"):
                raise _Unresolvable(f"line {self.line(pos)}: {word} in a loop that holds barriers")
            raise _Unresolvable(f"line {self.line(pos)}: unexpected {word!r}")
        if _PLAIN_BARRIER.match(m, pos):
            nodes.append(("barrier",))
            return _PLAIN_BARRIER.match(m, pos).end()  # type: ignore[union-attr]
        end = self.simple_end(pos)
        if self.relevant(pos, end):
            raise _Unresolvable(f"line {self.line(pos)}: a barrier or return inside an expression")
        self.note_assignment(m[pos:end - 1], nodes)
        return end

    def simple_end(self, pos: int) -> int:
        """Position after the `;` ending the simple statement at pos (skipping nested () and {})."""
        m = self.m
        semi = m.find(";", pos)
        if (semi >= 0 and m.count("(", pos, semi) == m.count(")", pos, semi)
                and m.find("{", pos, semi) < 0 and m.find("}", pos, semi) < 0):
            return semi + 1  # the common case, decided in C
        depth = 0
        for tok in _SIMPLE_END.finditer(m, pos):
            c = tok.group(0)
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "{" and depth == 0:
                close = self.close_brace(tok.start())
                return self.simple_end(close + 1) if m.find(";", close) >= 0 else close + 1
            elif c == "}" and depth == 0:
                raise _Unresolvable(f"line {self.line(pos)}: statement without ';'")
            elif c == ";" and depth == 0:
                return tok.end()
        raise _Unresolvable(f"line {self.line(pos)}: statement without ';'")

    def paren_span(self, pos: int) -> tuple[int, int]:
        pos = self.skip_ws(pos)
        if self.m[pos] != "(":
            raise _Unresolvable(f"line {self.line(pos)}: expected '('")
        return pos, match_close(self.m, pos, _PAREN)

    def substatement_end(self, pos: int) -> int:
        """End of the statement starting at pos, without building nodes (a barrier-free region)."""
        pos = self.skip_ws(pos)
        if self.m[pos] == "{":
            return self.close_brace(pos) + 1
        kw = _KEYWORD.match(self.m, pos)
        word = kw.group(1) if kw else ""
        if word in ("for", "while", "switch"):
            _, close = self.paren_span(kw.end())  # type: ignore[union-attr]
            return self.substatement_end(close + 1)
        if word == "if":
            return self.if_extent(pos, kw.end())[-1]  # type: ignore[union-attr]
        if word == "do":
            return self.compound_end(pos, kw.end(), "do")  # type: ignore[union-attr]
        return self.simple_end(pos)

    def compound_end(self, pos: int, after_kw: int, word: str) -> int:
        if word == "do":
            body_end = self.substatement_end(after_kw)
            w = re.compile(r"\s*while\b").match(self.m, body_end)
            if w is None:
                raise _Unresolvable(f"line {self.line(pos)}: do without while")
            _, close = self.paren_span(w.end())
            return self.simple_end(close + 1)
        _, close = self.paren_span(after_kw)
        return self.substatement_end(close + 1)

    def if_extent(self, pos: int, after_kw: int) -> tuple[int, int, int, int, int]:
        """(cond_open, cond_close, then_end, else_start, end); else_start == -1 without else."""
        c_open, c_close = self.paren_span(after_kw)
        then_end = self.substatement_end(c_close + 1)
        e = re.compile(r"\s*else\b").match(self.m, then_end)
        if e is None:
            return c_open, c_close, then_end, -1, then_end
        return c_open, c_close, then_end, e.end(), self.substatement_end(e.end())

    def if_stmt(self, pos: int, after_kw: int, nodes: list[tuple]) -> int:
        c_open, c_close, then_end, else_start, end = self.if_extent(pos, after_kw)
        if not self.relevant(pos, end):
            return end
        cond_text = self.m[c_open + 1:c_close]
        then_nodes: list[tuple] = []
        self.statement(self.skip_ws(c_close + 1), then_end, then_nodes)
        else_nodes: list[tuple] = []
        if else_start >= 0:
            self.statement(self.skip_ws(else_start), end, else_nodes)
        nodes.append(("if", self.expr(cond_text, pos), " ".join(cond_text.split()), then_nodes, else_nodes,
                      self.line(pos)))
        return end

    def for_loop(self, pos: int, after_kw: int, nodes: list[tuple]) -> int:
        h_open, h_close = self.paren_span(after_kw)
        end = self.substatement_end(h_close + 1)
        if not self.relevant(pos, end):
            return end
        parts = self.m[h_open + 1:h_close].split(";")
        if len(parts) != 3:
            raise _Unresolvable(f"line {self.line(pos)}: unusual for-loop header")
        init = _FOR_INIT.fullmatch(parts[0])
        step = _FOR_STEP.fullmatch(parts[2])
        if init is None or step is None or not parts[1].strip():
            raise _Unresolvable(f"line {self.line(pos)}: for-loop header not of the form "
                                "'int i = a; i < b; ++i'")
        var = init.group(1)
        step_var = step.group("pre") or step.group("post") or step.group("acc") or step.group("asg")
        if step_var != var:
            raise _Unresolvable(f"line {self.line(pos)}: the loop steps {step_var}, not {var}")
        if step.group("pre") or step.group("post"):
            op = "+" if "++" in (parts[2] if step.group("pre") else step.group("postop")) else "-"
            step_node = (op, ("num", 1))
        elif step.group("acc"):
            step_node = (step.group("accop"), self.expr(step.group("accexpr"), pos))
        else:
            step_node = ("=", self.expr(step.group("asgexpr"), pos))
        if self.writes(var, h_close + 1, end):
            raise _Unresolvable(f"line {self.line(pos)}: loop variable {var} changes inside the loop")
        if find_words(self.m, "break", h_close + 1, end) or find_words(self.m, "continue", h_close + 1, end):
            raise _Unresolvable(f"line {self.line(pos)}: break/continue in a loop that holds barriers")
        body_nodes: list[tuple] = []
        self.statement(self.skip_ws(h_close + 1), end, body_nodes)
        unsigned = bool(re.match(r"\s*(?:const\s+)?(?:unsigned|size_t|uint)", parts[0]))
        nodes.append(("for", var, self.expr(init.group(2), pos), self.expr(parts[1], pos), step_node,
                      body_nodes, self.line(pos), unsigned))
        return end

    def expr(self, text: str, pos: int) -> cexpr.Expr:
        try:
            return cexpr.parse(text)
        except cexpr.ParseError:
            # Not integer arithmetic we can read (array reads, floats...): its value is unknown.
            return ("opaque", " ".join(text.split())[:60])

    def writes(self, name: str, a: int, b: int) -> int:
        """How many times `name` is assigned, incremented or has its address taken in [a, b)."""
        m = self.m
        count = 0
        for i in find_words(m, name, a, b):
            before = m[max(a, i - 40):i].rstrip()
            address_of = before.endswith("&") and not before.endswith("&&") and not _OPERAND_END.search(before[:-1])
            if _WRITE_AFTER.match(m, i + len(name)) or before.endswith(("++", "--")) or address_of:
                count += 1
        return count

    def note_assignment(self, stmt: str, nodes: list[tuple]) -> None:
        d = _INT_DECL.fullmatch(stmt)
        if d:
            name = d.group(1)
            expr = None
            # Trust a local only if its declaration is the one write to it in the whole kernel.
            if self.writes(name, *self.body_span) == 1:
                try:
                    expr = cexpr.parse(d.group(2))
                except cexpr.ParseError:
                    expr = None
            unsigned = bool(re.match(r"\s*(?:const\s+)?(?:unsigned|size_t|uint)", stmt))
            nodes.append(("decl", name, expr, unsigned))
            return
        a = _ASSIGNMENT.match(stmt)
        if a:
            nodes.append(("taint", a.group(1)))


class _Runner:
    def __init__(self) -> None:
        self.steps = 0

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_STEPS:
            raise _Unresolvable(f"more than {MAX_STEPS:,} loop steps to walk")

    def value(self, expr: cexpr.Expr, env: Mapping[str, int | None], what: str, line: int) -> int:
        try:
            return cexpr.evaluate(expr, env)
        except cexpr.Unknown as exc:
            raise _Unresolvable(f"line {line}: {what} is not known statically ({exc})") from None

    def run(self, nodes: list[tuple], env: dict[str, int | None]) -> int:
        count = 0
        for node in nodes:
            self.tick()
            kind = node[0]
            if kind == "barrier":
                count += 1
            elif kind == "return":
                raise _Returned(count)
            elif kind == "decl":
                value = self._try(node[2], env)
                env[node[1]] = cexpr.U(value % cexpr.MASK32) if value is not None and node[3] else value
            elif kind == "taint":
                env[node[1]] = None
            else:
                try:
                    count += self.run_if(node, env) if kind == "if" else self.run_for(node, env)
                except _Returned as ret:
                    raise _Returned(count + ret.count) from None
        return count

    @staticmethod
    def _try(expr: cexpr.Expr | None, env: Mapping[str, int | None]) -> int | None:
        if expr is None:
            return None
        try:
            return cexpr.evaluate(expr, env)
        except cexpr.Unknown:
            return None

    def run_if(self, node: tuple, env: dict[str, int | None]) -> int:
        _, cond, cond_text, then_nodes, else_nodes, line = node
        try:
            taken = cexpr.evaluate(cond, env)
        except cexpr.Unknown:
            # Unknown condition: fine only if both branches execute the same barriers.
            counts = []
            for branch in (then_nodes, else_nodes):
                try:
                    counts.append(self.run(branch, dict(env)))
                except _Returned:
                    counts.append(None)
            if counts[0] is None or counts[0] != counts[1]:
                raise _Unresolvable(
                    f"line {line}: the barriers depend on `{cond_text[:60]}`, not known statically"
                ) from None
            return counts[0]
        return self.run(then_nodes if taken else else_nodes, env)

    def run_for(self, node: tuple, env: dict[str, int | None]) -> int:
        _, var, init, cond, (op, step), body, line = node[:7]
        outer = env.get(var) if var in env else _MISSING
        unsigned = bool(node[7]) if len(node) > 7 else False
        wrap = (lambda v: cexpr.U(v % cexpr.MASK32)) if unsigned else (lambda v: v)
        env[var] = wrap(self.value(init, env, f"the start of loop {var}", line))
        total = 0
        independent = var not in _names(body) and not _has_return(body)
        trips = self._trip_count(node, env) if independent and not unsigned else None
        if trips is not None:  # a counted loop whose body never varies: one pass, times the trips
            total = self.run(body, env) * trips if trips else 0
            self.tick(max(trips - 1, 0))
            self._restore(env, var, outer)
            return total
        body_count: int | None = None
        while self.value(cond, env, f"the bound of loop {var}", line):
            if independent and body_count is not None:
                self.tick()
            else:
                try:
                    body_count = self.run(body, env)
                except _Returned as ret:
                    raise _Returned(total + ret.count) from None
            total += body_count
            delta = self.value(step, env, f"the step of loop {var}", line)
            env[var] = wrap(delta if op == "=" else env[var] + (delta if op == "+" else -delta))  # type: ignore[operator]
        self._restore(env, var, outer)
        return total

    @staticmethod
    def _restore(env: dict[str, int | None], var: str, outer: object) -> None:
        if outer is _MISSING:
            env.pop(var, None)
        else:
            env[var] = outer  # type: ignore[assignment]

    @staticmethod
    def _trip_count(node: tuple, env: dict[str, int | None]) -> int | None:
        """Iterations of `for (var = start; var < bound; var += step)` with a body that changes neither
        bound nor step, or None for any other shape (then the loop is walked)."""
        _, var, _, cond, (op, step), body = node[:6]
        if op != "+" or cond[0] != "bin" or cond[1] not in ("<", "<=") or cond[2] != ("name", var):
            return None
        bound = cond[3]
        read = cexpr.names(bound) | cexpr.names(step)
        if var in read or read & _assigned(body):
            return None
        try:
            limit, limit_unsigned = cexpr.evaluate_typed(bound, env)
            delta, delta_unsigned = cexpr.evaluate_typed(step, env)
        except cexpr.Unknown:
            return None
        if limit_unsigned or delta_unsigned or delta <= 0:
            return None
        start = env[var]
        assert start is not None
        span = limit - start + (1 if cond[1] == "<=" else 0)
        return max(0, -(-span // delta))


_MISSING = object()


def _names(nodes: list[tuple]) -> set[str]:
    out: set[str] = set()
    for node in nodes:
        kind = node[0]
        if kind == "decl" and node[2] is not None:
            out |= cexpr.names(node[2])
        elif kind == "if":
            out |= cexpr.names(node[1]) | _names(node[3]) | _names(node[4])
        elif kind == "for":
            out |= cexpr.names(node[2]) | cexpr.names(node[3]) | cexpr.names(node[4][1]) | _names(node[5])
    return out


def _assigned(nodes: list[tuple]) -> set[str]:
    """Every name the nodes declare, taint or use as a loop variable."""
    out: set[str] = set()
    for node in nodes:
        kind = node[0]
        if kind in ("decl", "taint"):
            out.add(node[1])
        elif kind == "if":
            out |= _assigned(node[3]) | _assigned(node[4])
        elif kind == "for":
            out |= {node[1]} | _assigned(node[5])
    return out


def _has_return(nodes: list[tuple]) -> bool:
    for node in nodes:
        if node[0] == "return":
            return True
        if node[0] == "if" and (_has_return(node[3]) or _has_return(node[4])):
            return True
        if node[0] == "for" and _has_return(node[5]):
            return True
    return False

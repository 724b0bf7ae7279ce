"""Kernels browser at scale: launch -> first rows painted, filter keystroke -> repaint, paging, memory.

    .venv/bin/python bench/bench_browse.py                                   # 100,000 and 1,000,000 rows
    .venv/bin/python bench/bench_browse.py --sizes 100000                    # one size
    .venv/bin/python bench/bench_browse.py --sizes 100000 1000000 --dir /tmp/kdb-bench-browse \\
        --json bench/results/browse.json --reps 3

Targets (issue): first rows painted under 1 s at 1M rows, filter keystroke to repaint under 100 ms at 1M,
memory flat in DB size (here: peak RSS at 1M under 1.5x that at 100k).

The DBs (DIR/kernels-N.db) are generated once, deterministically (seeded), with NNFusion's DDL and rows shaped
like the ones core/kernels/kernel_row.py builds (bodies of about 1.5 KB: the size of real element-wise kernels; about
1% of rows carry a lint problem), and reused on later runs when their row count matches.

Every measurement goes through the real app: the Kernels screen in a Textual `run_test` pilot, in a fresh
process per size and launch (so peak RSS is that run's own). "first" launch: a fresh, empty KDB_STATE_DIR;
"second" launch: the same state dir again (the console may keep an index there). Times:
  first paint   from constructing the app to `#kernel-table` holding rows (plus process spawn -> first paint,
                and the imports, reported apart);
  keystroke     the query typed key by key into `#filter-text`; from the last key press until the screen's
                `rows` list has been replaced by a result matching the query and the table shows it;
  clear         the input emptied -> the unfiltered page shown again;
  page          `n` / `p` on the focused table -> the next / previous page shown.
Each wait is a task polling every 2 ms while the pilot presses the key (Pilot.press itself returns only when
the screen has gone idle, page loaded and counted, so timing around it would overstate every figure). After
measuring, each run waits (--settle) for the app's workers to go idle, so the first launch leaves a finished
index (if the app builds one) for the second.
  index ready   from constructing the app until the Kernels screen's browse-index sync is over (a first launch
                builds it; a second finds it in step). Keystrokes are measured after it: before it, filters on
                a DB this big wait for the index (the screen says so) rather than read every body.
"""

from __future__ import annotations

import time

T_TOP_WALL = time.time()  # before any heavy import: the child's "interpreter started" mark
T_TOP = time.perf_counter()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_DIR = Path("/tmp/kdb-bench-browse")
DEFAULT_JSON = REPO / "bench" / "results" / "browse.json"
SEED = 20240611
BATCH_ROWS = 20_000

# The filter queries: a rare dimension planted in about 10 rows at every size (no other shape holds 4093; the
# letters keep it out of the hex Keys, which a filter may search too), the conv family's identifier prefix (a
# large share of rows), and a string no row holds ("Add" matches many rows, so the prefixes typed before the
# last key are not empty: a stale page is told apart).
SELECTIVE, BROAD, NOTHING = "Dot4093", "Convolution", "Addx"
PLANTED_ROWS = 10
QUERIES = {"selective": SELECTIVE, "broad": BROAD, "none": NOTHING}

TARGET_FIRST_PAINT_MS = 1000.0
TARGET_KEYSTROKE_MS = 100.0
TARGET_MEMORY_RATIO = 1.5


# ---------------------------------------------------------------------------------------------------------------
# Generating a realistic kernel DB

BATCH = [1, 1, 1, 2, 4, 8, 16, 32, 64, 128]
CHANNELS = [3, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 576, 768, 960, 1024, 2048]
SPATIAL = [7, 8, 13, 14, 17, 27, 28, 35, 55, 56, 112, 224, 227]
MATRIX = [1, 16, 32, 64, 128, 256, 384, 512, 768, 1000, 1024, 2048, 3072, 4096]
UNARY = {"Relu": "max({x}, 0.000000e+00f)", "Sigmoid": "1.000000e+00f / (1.000000e+00f + __expf(-{x}))",
         "Tanh": "tanhf({x})", "Exp": "__expf({x})", "Sqrt": "sqrtf({x})", "Negative": "-{x}",
         "Gelu": "0.5f * {x} * (1.0f + erff({x} * 7.071068e-01f))"}
BINARY = {"Add": "{a} + {b}", "Multiply": "{a} * {b}", "Subtract": "{a} - {b}", "Divide": "{a} / {b}",
          "Maximum": "max({a}, {b})"}
OP_WEIGHTS = [("Convolution", 14), ("Fused_Convolution_Relu", 14), ("Fused_Convolution_Add_Relu", 5),
              ("Dot", 15), ("MaxPool", 5), ("AvgPool", 4), ("Relu", 10), ("Add", 10), ("unary", 11),
              ("binary", 12)]
DEVICES = ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"]
TAGS = "KernelEmitter,CudaEmitter,BlockCudaEmitter"


def _conv_out(size: int, window: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (window - 1) - 1) // stride + 1


def _elementwise_body(expr: str, n: int, dtype: str, inputs: int, unroll: int, copy: int) -> str:
    lines = [f"  // kdb-bench copy {copy}: element-wise, {inputs} input(s), unrolled x{unroll}",
             "  int tid = ((int)blockIdx.x) * ((int)blockDim.x) + ((int)threadIdx.x);",
             "  int stride = ((int)gridDim.x) * ((int)blockDim.x);",
             f"  for (int base = tid * {unroll}; base < {n}; base += stride * {unroll}) {{"]
    for u in range(unroll):
        args = {"x": f"input0[base + {u}]", "a": f"input0[base + {u}]", "b": f"input1[base + {u}]"}
        lines.append(f"    if (base + {u} < {n}) {{")
        if dtype == "half":
            lines.append(f"      output0[base + {u}] = __float2half({expr.format(**{k: f'__half2float({v})' for k, v in args.items()})});")  # noqa: E501
        else:
            lines.append(f"      output0[base + {u}] = {expr.format(**args)};")
        lines.append("    }")
    lines.append("  }")
    return "\n".join(lines) + "\n"


def _tiled_body(kind: str, tile: int, k_iters: int, copy: int, dims: tuple[int, ...]) -> tuple[str, str, list]:
    """A shared-memory kernel body (~1.5 KB), its block body (shared arrays passed in), and the shared list."""
    a, b = ("pad_temp_shared", "kernel_shared") if kind == "conv" else ("A_shared", "B_shared")
    shared = [[a, "float", tile * tile], [b, "float", tile * tile]]
    decls = f"  __shared__ float {a}[{tile * tile}];\n  __shared__ float {b}[{tile * tile}];\n"
    d = ", ".join(map(str, dims))
    core = (f"  // kdb-bench copy {copy}: {kind} tile {tile}x{tile}, {k_iters} reduction steps over ({d})\n"
            f"  float compute_local[4];\n"
            f"  for (int i = 0; i < 4; ++i) {{ compute_local[i] = 0.000000e+00f; }}\n"
            f"  for (int rc_outer = 0; rc_outer < {k_iters}; ++rc_outer) {{\n"
            f"    __syncthreads();\n"
            f"    {a}[((int)threadIdx.y) * {tile} + ((int)threadIdx.x)] = input0[((((int)blockIdx.y) * {tile} + "
            f"((int)threadIdx.y)) * {k_iters * tile}) + rc_outer * {tile} + ((int)threadIdx.x)];\n"
            f"    {b}[((int)threadIdx.y) * {tile} + ((int)threadIdx.x)] = input1[(((rc_outer * {tile}) + "
            f"((int)threadIdx.y)) * {tile}) + ((int)blockIdx.x) * {tile} + ((int)threadIdx.x)];\n"
            f"    __syncthreads();\n"
            f"    for (int rc_inner = 0; rc_inner < {tile}; ++rc_inner) {{\n"
            + "".join(f"      compute_local[{i}] = compute_local[{i}] + {a}[((int)threadIdx.y) * {tile} + rc_inner] * "
                      f"{b}[rc_inner * {tile} + ((int)threadIdx.x) + {i}];\n" for i in range(4))
            + "    }\n  }\n"
            + "".join(f"  output0[((((int)blockIdx.y) * {tile} + ((int)threadIdx.y)) * {tile * 4}) + "
                      f"((int)blockIdx.x) * {tile} + ((int)threadIdx.x) + {i}] = "
                      f"{'max(compute_local[' + str(i) + '], 0.000000e+00f)' if 'relu' in kind else 'compute_local[' + str(i) + ']'};\n"  # noqa: E501
                      for i in range(4)))
    block_prefix = f"  float* {a} = (float*)(shared_buffer + 0);\n  float* {b} = (float*)(shared_buffer + {tile * tile * 4});\n"  # noqa: E501
    return decls + core, block_prefix + core, shared


class RowMaker:
    """Row i of the benchmark DB of N rows; deterministic for a given (seed, N)."""

    def __init__(self, n: int, seed: int = SEED) -> None:
        from core.kernels.ops import tags_for
        from core.kernels.opsig import ConvParams, DotParams, OpSignature, PoolParams

        self.n, self.rng = n, random.Random(seed)
        self.tags_for, self.Sig = tags_for, OpSignature
        self.Conv, self.Dot, self.Pool = ConvParams, DotParams, PoolParams
        self.step = max(1, n // PLANTED_ROWS)
        self.ops = [op for op, _ in OP_WEIGHTS]
        self.weights = [w for _, w in OP_WEIGHTS]

    def row(self, i: int) -> tuple[tuple[str, ...], str, bool]:
        """(the nine column values, the lint problem planted ('' if none), whether the selective query matches)."""
        rng = self.rng
        planted = i % self.step == self.step // 2 and i // self.step < PLANTED_ROWS
        kind = "Dot" if planted else rng.choices(self.ops, self.weights)[0]
        dtype = "half" if rng.random() < 0.03 else "float"
        copy = i
        shared_mem: list = []
        barriers = 0
        if kind in ("Convolution", "Fused_Convolution_Relu", "Fused_Convolution_Add_Relu"):
            while True:
                nb, c, k = rng.choice(BATCH), rng.choice(CHANNELS), rng.choice(CHANNELS[1:])
                h = rng.choice(SPATIAL)
                r = rng.choice([1, 3, 3, 3, 5, 7, 11] if h >= 11 else [1, 3])
                s, p = rng.choice([1, 1, 2, 4] if r >= 7 else [1, 1, 2]), r // 2
                oh = _conv_out(h, r, s, p)
                if oh >= 1:
                    break
            data, filt, out = (nb, c, h, h), (k, c, r, r), (nb, k, oh, oh)
            ins = (data, filt, out) if kind == "Fused_Convolution_Add_Relu" else (data, filt)
            sig = self.Sig(kind, ins, (out,), self.Conv((s, s), (1, 1), (p, p)), dtype)
            tile = rng.choice([8, 16])  # whole warps: a 4x4 block with barriers is a lint finding (partial warp)
            body, block_body, shared_mem = _tiled_body("conv_relu" if "Relu" in kind else "conv", tile,
                                                       max(1, c * r * r // tile), copy, out)
            barriers = 2
            grid, block = [max(1, oh // tile), max(1, oh // tile), max(1, k // 16)], [tile, tile, 1]
            name = (f"tuned_{kind.lower()}_op_{dtype}_i{'_'.join(map(str, data))}_w{'_'.join(map(str, filt))}"
                    f"_o{'_'.join(map(str, out))}_ws{s}_{s}_wd1_1_p{p}_{p}_kernel0")
        elif kind == "Dot":
            m = 4093 if planted else rng.choice(MATRIX)
            kk, nn = rng.choice(MATRIX[1:]), rng.choice(MATRIX[1:])
            ta, tb = rng.random() < 0.1, rng.random() < 0.2
            sig = self.Sig("Dot", ((m, kk), (kk, nn)), ((m, nn),), self.Dot(ta, tb), dtype)
            tile = rng.choice([8, 16, 32])
            body, block_body, shared_mem = _tiled_body("dot", tile, max(1, kk // tile), copy, (m, kk, nn))
            barriers = 2
            grid, block = [max(1, nn // tile), max(1, math.ceil(m / tile)), 1], [tile, tile, 1]
            name = f"tuned_dot_op_{dtype}_m{m}_k{kk}_n{nn}_kernel0"
        elif kind in ("MaxPool", "AvgPool"):
            nb, c, h = rng.choice(BATCH), rng.choice(CHANNELS), rng.choice(SPATIAL[2:])
            w, s = rng.choice([(2, 2), (3, 2), (3, 1)])
            p = 1 if w == 3 and rng.random() < 0.5 else 0
            oh = _conv_out(h, w, s, p)
            sig = self.Sig(kind, ((nb, c, h, h),), ((nb, c, oh, oh),),
                           self.Pool((w, w), (s, s), (p, p), (p, p)), dtype)
            expr = "max({a}, {b})" if kind == "MaxPool" else "({a} + {b}) * 5.000000e-01f"
            total = nb * c * oh * oh
            body = _elementwise_body(expr, total, dtype, 2, rng.choice([4, 6, 8]), copy).replace(
                "input1[", "input0[" + str(h) + " + ")
            block_body = body
            grid, block = [max(1, math.ceil(total / 256)), 1, 1], [256, 1, 1]
            name = f"tuned_{kind.lower()}_op_{dtype}_i{nb}_{c}_{h}_{h}_w{w}_s{s}_p{p}_kernel0"
        else:
            if kind == "unary":
                kind = rng.choice(list(UNARY))
            elif kind == "binary":
                kind = rng.choice(list(BINARY))
            unary = kind in UNARY
            if rng.random() < 0.6:
                shape: tuple[int, ...] = (rng.choice(BATCH), rng.choice(CHANNELS), *([rng.choice(SPATIAL)] * 2))
            else:
                shape = (rng.choice(MATRIX), rng.choice(MATRIX[1:]))
            total = math.prod(shape)
            sig = self.Sig(kind, (shape,) if unary else (shape, shape), (shape,), None, dtype)
            expr = UNARY[kind] if unary else BINARY[kind]
            body = _elementwise_body(expr, total, dtype, 1 if unary else 2, rng.choice([4, 6, 8]), copy)
            block_body = body
            threads = rng.choice([128, 256, 512])
            grid, block = [max(1, min(65535, math.ceil(total / threads))), 1, 1], [threads, 1, 1]
            name = f"tuned_{kind.lower()}_op_{dtype}_{'_'.join(map(str, shape))}_kernel0"

        identifier = sig.identifier
        attributes = sig.attributes()
        n_in = len(sig.inputs)
        signature = ('extern "C" __global__  void (' + ", ".join(
            [f"{dtype}* input{j}" for j in range(n_in)] + [f"{dtype}* output0"]) + ")")
        function = {
            "function_signature": signature, "function_body": body, "grid_dim": grid, "block_dim": block,
            "block_function_body": block_body,
            "shared_memory": {"symbol": [s[0] for s in shared_mem], "dtype": [s[1] for s in shared_mem],
                              "size": [s[2] for s in shared_mem]},
            "num_syncthreads": barriers,
        }
        p = sig.params
        tags = self.tags_for(sig.op_type, *((p.transpose_a, p.transpose_b) if isinstance(p, self.Dot) else ()))
        resource_ = block[0] * block[1] * block[2]
        roll = rng.random()
        if roll < 0.5:
            times = {dev: round(rng.uniform(2.0, 900.0), 3) for dev in DEVICES[: rng.choice([1, 1, 1, 2, 3])]}
            miscs: dict[str, Any] = {"external_profile": {"time": "".join(f"{d}:{t:.6g};" for d, t in times.items()),
                                                          "resource": resource_},
                                     "kdb": {"name": name}}
        elif roll < 0.8:
            miscs = {"external_profile": {"time": "", "resource": resource_}, "kdb": {"name": name}}
        elif roll < 0.9:
            miscs = {"kdb": {"name": name}}
        else:
            miscs = {}

        problem = ""
        if rng.random() < 0.01:
            problem = rng.choices(["identifier", "profile", "tags"], [70, 20, 10])[0]
            if problem == "identifier":  # the Identifier of another shape: Attributes disagree with it
                identifier = identifier.replace("float", "double", 1) if "float" in identifier \
                    else identifier.replace("half", "float", 1)
            elif problem == "profile":  # no ';' at the end: the compiler skips the entry
                miscs["external_profile"] = {"time": f"{DEVICES[0]}:{rng.uniform(2, 900):.4g}", "resource": resource_}
            else:
                tags = "KernelEmitter,CudaEmitter"

        values = (_key(identifier, grid, block, body), identifier, sig.op_type, _dumps(attributes), "External",
                  "CUDA_GPU", _dumps(function), tags, _dumps(miscs))
        return values, problem, planted


def _key(identifier: str, grid: list[int], block: list[int], body: str) -> str:
    h = hashlib.sha256()  # what core.kernel_row.kernel_key computes (inlined: called a million times)
    for part in (identifier, repr(tuple(grid)), repr(tuple(block)), body):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return "kdb:" + h.hexdigest()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def write_db(path: Path, n: int, *, progress: bool = True) -> dict:
    """Fill a new DB of n rows at path (built beside it, renamed when complete)."""
    from core.db.kernel_db import KernelDB

    partial = path.with_name(path.name + ".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    KernelDB.open(partial, create=True).close()
    conn = sqlite3.connect(partial)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    maker = RowMaker(n)
    start, problems, planted, batch = time.perf_counter(), 0, 0, []
    every = max(BATCH_ROWS, n // 10)
    for i in range(n):
        values, problem, selective = maker.row(i)
        problems += bool(problem)
        planted += selective
        batch.append(values)
        if len(batch) == BATCH_ROWS or i == n - 1:
            with conn:
                conn.executemany("INSERT INTO KernelCache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
            batch = []
        if progress and (i + 1) % every == 0:
            el = time.perf_counter() - start
            print(f"  {path.name}: {i + 1:,}/{n:,} rows, {el:.0f} s, ~{el / (i + 1) * (n - i - 1):.0f} s left",
                  file=sys.stderr, flush=True)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    partial.rename(path)
    seconds = time.perf_counter() - start
    return {"rows": n, "seconds": round(seconds, 1), "lint_problems_planted": problems, "selective_rows": planted}


def count_rows(path: Path) -> int | None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT count(*) FROM KernelCache").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return None


def ensure_db(directory: Path, n: int) -> dict:
    path = directory / f"kernels-{n}.db"
    info: dict[str, Any] = {"path": str(path), "rows": n}
    if path.exists() and count_rows(path) == n:
        info["generated"] = False
        print(f"reusing {path} ({n:,} rows)", file=sys.stderr)
    else:
        need = n * 3600  # bytes a row, with room to spare
        free = shutil.disk_usage(directory).free
        if free < need * 1.3:
            raise SystemExit(f"not enough disk in {directory} for {n:,} rows: {free / 1e9:.1f} GB free, "
                             f"~{need / 1e9:.1f} GB needed")
        print(f"generating {path} ({n:,} rows)…", file=sys.stderr, flush=True)
        info.update(write_db(path, n), generated=True)
        print(f"  done in {info['seconds']:.0f} s", file=sys.stderr)
    info["db_mb"] = round(path.stat().st_size / 1e6, 1)
    return info


def sample_check(n: int = 3000) -> str:
    """A small DB from the same generator must go through lint and the browser's queries without surprises."""
    from core.db.browse import KernelFilter, count_kernels, list_kernels
    from core.db.kernel_db import KernelDB
    from core.kernels.lint import lint_rows
    from core.kernels.ops import FUSED_OP_TYPES

    with tempfile.TemporaryDirectory(prefix="kdb-bench-sample-") as tmp:
        path = Path(tmp) / "sample.db"
        KernelDB.open(path, create=True).close()
        maker = RowMaker(n)
        made = [maker.row(i) for i in range(n)]
        conn = sqlite3.connect(path)
        with conn:
            conn.executemany("INSERT INTO KernelCache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [m[0] for m in made])
        raw = list(conn.execute("SELECT rowid, * FROM KernelCache ORDER BY rowid"))
        conn.close()
        expected = {i + 1: m[1] for i, m in enumerate(made) if m[1]}
        check_of = {"identifier": "identifier", "profile": "profile", "tags": "tags"}
        # The rows are as kdb wrote them before a fused kernel got its CUDA twin: lint finds each fused one unused.
        untwinned = {i + 1 for i, m in enumerate(made) if m[0][2] in FUSED_OP_TYPES}
        found: dict[int, set[str]] = {}
        for f in lint_rows(raw):
            found.setdefault(f.rowid, set()).add(f.check)
        surprises = {r: c for r, c in found.items() if r not in expected.keys() | untwinned
                     or (r in expected and check_of[expected[r]] not in c)
                     or (r in untwinned and "pattern-twin" not in c)}
        missing = (expected.keys() | untwinned) - set(found)
        if surprises or missing:
            raise SystemExit(f"sample check: lint disagrees with the generator: unexpected "
                             f"{dict(list(surprises.items())[:5])}, missed {sorted(missing)[:5]} (first 5 shown)")
        with KernelDB.open(path) as db:
            flagged = count_kernels(db, KernelFilter(lint="problems"))
            selective = count_kernels(db, KernelFilter(text=SELECTIVE))
            none = count_kernels(db, KernelFilter(text=NOTHING))
            page = list_kernels(db, limit=200)
        if flagged != len(expected):
            raise SystemExit(f"sample check: the browser flags {flagged} rows, the generator planted {len(expected)}")
        if selective != sum(m[2] for m in made) or none != 0:
            raise SystemExit(f"sample check: '{SELECTIVE}' matches {selective} rows, '{NOTHING}' {none}")
        bad = [s for s in page if s.profile_error or s.grid is None or s.block is None or s.barriers is None]
        if len(page) != 200 or bad:
            raise SystemExit(f"sample check: a page of summaries came back odd: {bad[:2]}")
        sizes = [len(m[0][6]) for m in made]
    return (f"sample check ok: {n} rows, {len(expected)} lint problems found as planted, '{SELECTIVE}' matches "
            f"{selective}, Function {statistics.median(sizes) / 1e3:.1f} KB median")


# ---------------------------------------------------------------------------------------------------------------
# The measured child: the real app on one DB


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def matches(row: Any, query: str) -> bool | None:
    """Whether a summary row may be one the filter shows (None when the summary cannot say).

    Lenient on purpose: the text anywhere in the identifier, kernel name or Key, any case.
    """
    ident, name, key = (getattr(row, a, None) for a in ("identifier", "name", "key"))
    if not isinstance(ident, str):
        return None
    q = query.lower()
    return any(isinstance(v, str) and q in v.lower() for v in (ident, name, key))


async def child(db_path: Path, spawn_wall: float, reps: int, timeout: float, pages: int, settle: float) -> dict:
    out: dict[str, Any] = {"interp_start_ms": (T_TOP_WALL - spawn_wall) * 1000}
    t = time.perf_counter()
    from textual.app import ScreenStackError
    from textual.css.query import NoMatches
    from textual.widgets import Input
    from textual.worker import WorkerState

    from console.app import KdbApp
    from console.context import ConsoleContext
    from core.settings import load_settings

    out["imports_ms"] = (time.perf_counter() - t) * 1000

    class FixedDeviceApp(KdbApp):  # as tests/console_helpers.py: no GPU detection
        def detect_device(self) -> None:  # type: ignore[override]
            self.sub_title = f"{self.context.db_path} · {self.context.device_summary}"

    def table_rows(app: Any) -> int:
        try:
            return app.screen.query_one("#kernel-table").row_count
        except (NoMatches, ScreenStackError):  # not mounted yet
            return 0

    def shown(app: Any, before: Any, query: str | None) -> bool:
        """The screen's rows were replaced by a page of this query's result, and the table holds it."""
        rows = getattr(app.screen, "rows", None)
        if rows is None or rows is before or table_rows(app) != len(rows) or getattr(app.screen, "waiting", False):
            return False
        if query is None:
            return len(rows) > 0
        if query == NOTHING:
            return len(rows) == 0
        return len(rows) > 0 and all(matches(r, query) is not False for r in rows)

    async def watch(ready: Any, start: float, then: Any = None) -> tuple[float | None, float | None]:
        """ms from start until ready() (and, after it, until then()): polled every 2 ms by a task of its own.

        A task, not a loop around pilot calls: Pilot.press returns only once the screen has gone idle (the
        page loaded and counted), so timing around it would add that wait to every figure.
        """
        first = second = None
        while True:
            now = time.perf_counter()
            if first is None and ready():
                first = (now - start) * 1000
            if first is not None and (then is None or then()):
                second = (now - start) * 1000 if then is not None else None
                return first, second
            if now - start > timeout:
                return first, second
            await asyncio.sleep(0.002)

    ctx = ConsoleContext(db_path=db_path, settings=load_settings(), device_summary="no CUDA device (bench)")
    t0 = time.perf_counter()
    app = FixedDeviceApp(ctx)
    painted = asyncio.create_task(watch(lambda: table_rows(app) > 0, t0))
    async with app.run_test(size=(160, 45)) as pilot:
        out["run_test_entered_ms"] = (time.perf_counter() - t0) * 1000
        first, _ = await painted
        if first is None:
            out.update(failed=f"no rows painted within {timeout:.0f} s", rss_mb_end=rss_mb(),
                       peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            print("BENCH_RESULT " + json.dumps(out), flush=True)
            return out
        out["first_paint_ms"] = first
        out["spawn_to_first_paint_ms"] = (T_TOP_WALL - spawn_wall) * 1000 + (t0 - T_TOP) * 1000 + first
        out["rss_mb_first_paint"] = rss_mb()
        screen = app.screen
        # The browse index is built in the background on a first launch (filters wait for it on a big DB):
        # report when it was ready, then measure keystrokes against it.
        t_index = time.perf_counter()
        while getattr(screen, "syncing", False) and time.perf_counter() - t_index < settle:
            await asyncio.sleep(0.05)
        out["index_ready_ms"] = (time.perf_counter() - t0) * 1000
        out["rss_mb_index_ready"] = rss_mb()
        # the first page may be followed by a refresh (counts, the page again from the index): let it settle
        await pilot.pause(0.5)

        def counted() -> bool:  # the match count is shown (a screen may show the page first, count after)
            return isinstance(getattr(screen, "total", None), int)

        await pilot.press("slash")
        filt = screen.query_one("#filter-text", Input)
        if app.focused is not filt:
            filt.focus()
            await pilot.pause()
        queries: dict[str, Any] = {}
        for label, query in QUERIES.items():
            times: list[float | None] = []
            clears, count_ms, total = [], [], None
            for _ in range(reps):
                for ch in query[:-1]:
                    await pilot.press(ch)
                before, t_key = screen.rows, time.perf_counter()
                task = asyncio.create_task(watch(lambda q=query, b=before: shown(app, b, q), t_key, counted))
                await pilot.press(query[-1])
                got, count = await task
                times.append(got)
                if got is None:
                    break
                if count is not None:
                    count_ms.append(count)
                    total = screen.total
                before, t_clear = screen.rows, time.perf_counter()
                task = asyncio.create_task(watch(lambda b=before: shown(app, b, None), t_clear))
                filt.value = ""
                got, _ = await task
                clears.append(got)
                if got is None:
                    break
                await pilot.pause(0.05)
            ok = [x for x in times if x is not None]
            ok_clears = [c for c in clears if c is not None]
            queries[label] = {"query": query, "ms": times, "median_ms": statistics.median(ok) if ok else None,
                              "max_ms": max(ok) if ok else None, "failed": len(ok) < len(times),
                              "matches_shown": total,
                              "count_median_ms": statistics.median(count_ms) if count_ms else None,
                              "clear_median_ms": statistics.median(ok_clears) if ok_clears else None}
        out["queries"] = queries

        table = screen.query_one("#kernel-table")
        table.focus()
        await pilot.pause()
        page_ms: list[float | None] = []
        for key in ["n"] * pages + ["p"] * max(1, pages // 2):
            before, t_key = screen.rows, time.perf_counter()
            task = asyncio.create_task(watch(lambda b=before: shown(app, b, None), t_key))
            await pilot.press(key)
            got, _ = await task
            page_ms.append(got)
            if got is None:
                break
        ok = [x for x in page_ms if x is not None]
        out["page"] = {"ms": page_ms, "median_ms": statistics.median(ok) if ok else None,
                       "max_ms": max(ok) if ok else None, "failed": len(ok) < len(page_ms)}
        # Background work (an index built on first launch): wait until no worker has run for a while, so that
        # the second launch finds whatever the first one leaves behind; report when that was, from t0.
        idle_since, start = None, time.perf_counter()
        busy_after_measuring = False
        while time.perf_counter() - start < settle:
            busy = any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in app.workers)
            now = time.perf_counter()
            if busy:
                idle_since = None
                busy_after_measuring = busy_after_measuring or now - start > 0.1
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= 1.0:
                break
            await pilot.pause(0.05)
        out["workers_idle_s"] = (idle_since - t0) if idle_since is not None else None
        out["busy_after_measuring"] = busy_after_measuring
        out["rss_mb_end"] = rss_mb()
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # Reported before the app exits: a worker thread still inside a long query can hold the exit up.
        print("BENCH_RESULT " + json.dumps(out), flush=True)
    return out


def run_child(db: Path, state: Path, config: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "KDB_STATE_DIR": str(state), "KDB_CONFIG": str(config), "KDB_DB": str(db)}
    cmd = [sys.executable, __file__, "--child", str(db), "--reps", str(args.reps), "--timeout", str(args.timeout),
           "--pages", str(args.pages), "--settle", str(args.settle), "--spawn-wall", repr(time.time())]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout * 30 + args.settle + 300)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    for line in stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return json.loads(line[len("BENCH_RESULT "):])
    last = (stderr.strip().splitlines() or [""])[-1]
    return {"failed": f"child exited {proc.returncode} with no result: {last}", "stderr": stderr[-4000:]}


# ---------------------------------------------------------------------------------------------------------------
# The report


def fmt(v: Any, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(runs: list[dict]) -> None:
    head = ["rows", "launch", "paint ms", "spawn->paint", "index ready s", *(f"{q} ms (med/max)" for q in QUERIES),
            "clear ms", "page ms (med/max)", "RSS paint", "RSS end", "peak RSS MB"]
    lines = [head]
    for r in runs:
        m = r["measure"]
        if "first_paint_ms" not in m:
            lines.append([f"{r['rows']:,}", r["launch"], "FAILED", m.get("failed", "")[:60]])
            continue
        qs = m.get("queries", {})
        cells = [f"{r['rows']:,}", r["launch"], fmt(m["first_paint_ms"]), fmt(m["spawn_to_first_paint_ms"]),
                 fmt(m.get("index_ready_ms", 0) / 1000, ".1f")]
        for label in QUERIES:
            q = qs.get(label, {})
            cells.append(f"{fmt(q.get('median_ms'))}/{fmt(q.get('max_ms'))}" + ("!" if q.get("failed") else ""))
        clears = [q.get("clear_median_ms") for q in qs.values() if q.get("clear_median_ms") is not None]
        cells.append(fmt(statistics.median(clears)) if clears else "-")
        pg = m.get("page", {})
        cells += [f"{fmt(pg.get('median_ms'))}/{fmt(pg.get('max_ms'))}" + ("!" if pg.get("failed") else ""),
                  fmt(m.get("rss_mb_first_paint")), fmt(m.get("rss_mb_end")), fmt(m.get("peak_rss_mb"))]
        lines.append(cells)
    _print_rows(lines)
    print("\nmatch counts (ms from the last key until the screen shows the count / matches) and when the app's "
          "background work (workers) ended, s from launch ('<=': already idle when the measuring ended)")
    head = ["rows", "launch", *(f"{q} count ms / matches" for q in QUERIES), "bg work done s"]
    lines = [head]
    for r in runs:
        m = r["measure"]
        qs = m.get("queries", {})
        cells = [f"{r['rows']:,}", r["launch"]]
        for label in QUERIES:
            q = qs.get(label, {})
            shown = q.get("matches_shown")
            cells.append(f"{fmt(q.get('count_median_ms'))} / {'-' if shown is None else f'{shown:,}'}")
        idle = m.get("workers_idle_s")  # "<=": idle already when the measuring ended (the work ended earlier)
        cells.append(("" if m.get("busy_after_measuring") or idle is None else "<=") + fmt(idle, ".1f"))
        lines.append(cells)
    _print_rows(lines)


def _print_rows(lines: list[list[str]]) -> None:
    widths = [max(len(str(line[i])) for line in lines if i < len(line)) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(str(c).rjust(widths[i]) for i, c in enumerate(line)))


def verdict(runs: list[dict], sizes: list[int]) -> dict:
    def get(n: int, launch: str) -> dict:
        return next((r["measure"] for r in runs if r["rows"] == n and r["launch"] == launch), {})

    def worst_keystroke(m: dict) -> float | None:
        meds = [q.get("median_ms") for q in m.get("queries", {}).values()]
        if not meds or any(v is None for v in meds):
            return None
        return max(meds)

    out: dict[str, Any] = {}
    big, small = max(sizes), min(sizes)
    for launch in ("first", "second"):
        mb, ms = get(big, launch), get(small, launch)
        paint, key = mb.get("first_paint_ms"), worst_keystroke(mb)
        v: dict[str, Any] = {
            "at_rows": big,
            "first_paint_ms": paint, "first_paint_pass": paint is not None and paint < TARGET_FIRST_PAINT_MS,
            "keystroke_worst_median_ms": key, "keystroke_pass": key is not None and key < TARGET_KEYSTROKE_MS,
        }
        if big != small:
            def ratio(a: float | None, b: float | None) -> float | None:
                return a / b if a is not None and b else None

            v["ratio_first_paint"] = ratio(paint, ms.get("first_paint_ms"))
            v["ratio_keystroke"] = ratio(key, worst_keystroke(ms))
            v["ratio_peak_rss"] = ratio(mb.get("peak_rss_mb"), ms.get("peak_rss_mb"))
            v["memory_pass"] = v["ratio_peak_rss"] is not None and v["ratio_peak_rss"] < TARGET_MEMORY_RATIO
        out[launch] = v
    return out


def print_verdict(v: dict, sizes: list[int]) -> None:
    big, small = max(sizes), min(sizes)
    note = "" if big >= 1_000_000 else f" (targets are for 1,000,000 rows; largest here {big:,})"
    for launch, x in v.items():
        parts = [f"first paint {fmt(x['first_paint_ms'])} ms "
                 f"{'PASS' if x['first_paint_pass'] else 'FAIL'} (< {TARGET_FIRST_PAINT_MS:.0f})",
                 f"keystroke {fmt(x['keystroke_worst_median_ms'])} ms (worst query median) "
                 f"{'PASS' if x['keystroke_pass'] else 'FAIL'} (< {TARGET_KEYSTROKE_MS:.0f})"]
        if "memory_pass" in x:
            parts.append(f"peak RSS x{fmt(x['ratio_peak_rss'], '.2f')} {'PASS' if x['memory_pass'] else 'FAIL'} "
                         f"(< x{TARGET_MEMORY_RATIO})")
            print(f"  {launch} launch, {big:,}/{small:,}: first paint x{fmt(x['ratio_first_paint'], '.2f')}, "
                  f"keystroke x{fmt(x['ratio_keystroke'], '.2f')}, peak RSS x{fmt(x['ratio_peak_rss'], '.2f')}")
        print(f"  {launch} launch at {big:,} rows{note}: " + "; ".join(parts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the generated DBs are kept and reused")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results file")
    ap.add_argument("--reps", type=int, default=3, help="times each filter query is typed")
    ap.add_argument("--pages", type=int, default=4, help="`n` presses (then half as many `p`)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one wait may take before it fails")
    ap.add_argument("--settle", type=float, default=600.0,
                    help="seconds to wait, after measuring, for the app's background work (an index build) to end")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--spawn-wall", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(child(args.child, args.spawn_wall or T_TOP_WALL, args.reps, args.timeout, args.pages,
                          args.settle))
        return

    args.dir.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.sizes))
    print(sample_check(), file=sys.stderr)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "queries": QUERIES,
                               "dbs": [], "runs": []}
    for n in sizes:
        info = ensure_db(args.dir, n)
        results["dbs"].append(info)
        count_rows(Path(info["path"]))  # the same warm page cache for every size's first launch
        with tempfile.TemporaryDirectory(prefix=f"kdb-bench-state-{n}-") as tmp:
            state, config = Path(tmp) / "state", Path(tmp) / "settings.toml"
            for launch in ("first", "second"):
                print(f"measuring {n:,} rows, {launch} launch…", file=sys.stderr, flush=True)
                m = run_child(Path(info["path"]), state, config, args)
                results["runs"].append({"rows": n, "launch": launch, "measure": m})
                if "failed" in m:
                    print(f"  {m['failed']}", file=sys.stderr)
            state_mb = sum(f.stat().st_size for f in state.rglob("*") if f.is_file()) / 1e6 if state.exists() else 0
            results["dbs"][-1]["state_dir_mb"] = round(state_mb, 1)

    print("\nKernels browser through the real app (ms; med/max over the repetitions; '!' = a wait timed out)")
    print("queries: " + ", ".join(f"{k} = {v!r}" for k, v in QUERIES.items()))
    print_table(results["runs"])
    for info in results["dbs"]:
        gen = f"generated in {info['seconds']:.0f} s" if info.get("generated") else "reused"
        print(f"  {info['rows']:,} rows: DB {info['db_mb']:,.0f} MB ({gen}); state dir after two launches "
              f"{info.get('state_dir_mb', 0):,.1f} MB")
    results["verdict"] = verdict(results["runs"], sizes)
    print_verdict(results["verdict"], sizes)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"results: {args.json}")
    broken = [f"{r['rows']:,} {r['launch']}: {what}" for r in results["runs"] for what in _failures(r["measure"])]
    if broken:  # a missed target is a figure; a run that could not measure is an error
        sys.exit("measurement failed: " + "; ".join(broken))


def _failures(measure: dict) -> list[str]:
    if "failed" in measure:
        return [str(measure["failed"])]
    waits = {f"query {label}": q for label, q in measure.get("queries", {}).items()}
    waits["paging"] = measure.get("page", {})
    return [f"{name} timed out" for name, got in waits.items() if got.get("failed")]


if __name__ == "__main__":
    main()

"""Argument parsing for the `kdb` CLI. Each command lives in its own module, imported on use.

The CLI only parses and reports: all work is done by `core`.
Exit status: 0 success, 1 the command ran but found failures (failed kernels, lint findings),
2 the command could not run (bad arguments, unusable DB, missing tool), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "console": ("console.cli.cmd_console", "open the console (the default with no arguments)"),
    "inject": ("console.cli.cmd_inject", "inject kernel JSON files or directories into the kernel DB"),
    "ls": ("console.cli.cmd_ls", "list kernels in the DB"),
    "show": ("console.cli.cmd_show", "show one kernel (by Key, Key prefix or Identifier)"),
    "lint": ("console.cli.cmd_lint", "report rows the compiler could never fetch or would crash on"),
    "failures": ("console.cli.cmd_failures", "list, retry or dismiss failed conversions"),
    "db": ("console.cli.cmd_db", "init | check | repair | fastest | standalone | leave-to-library | undo | convert | "
                                 "backup the kernel DB"),
    "settings": ("console.cli.cmd_settings", "show or change the GPU/SM settings"),
    "opconfig": ("console.cli.cmd_opconfig", "extract op configs from an ONNX model, or check op-config files"),
    "model": ("console.cli.cmd_model", "convert an ONNX model: fp16 IN OUT (onnxconverter-common's converter), "
              "expand IN OUT (ops NNFusion cannot import, as ONNX defines them)"),
    "coverage": ("console.cli.cmd_coverage", "what NNFusion will run for each op of an ONNX model with this DB"),
    "nnfusion": ("console.cli.cmd_nnfusion", "compile a model with NNFusion and the DB; what its code really runs"),
    "autotvm": ("console.cli.cmd_autotvm", "summarise AutoTVM tuning logs"),
    "codegen": ("console.cli.cmd_codegen", "generate CUDA kernels (kernel JSON) for op configs with TVM; --inject: "
                                           "into the kernel DB too"),
    "gpu": ("console.cli.cmd_gpu", "CUDA devices; verify or time kernels already in the DB"),
    "tune": ("console.cli.cmd_tune", "tune op configs with MetaSchedule; verify and inject the best kernels"),
}


# The columns `kdb ls --sort` takes (core.db.browse.SORTABLE's keys; not imported here: --help stays fast).
SORT_KEYS = ("op", "identifier", "source", "device", "tags", "barriers", "threads", "blocks", "key")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {text}")
    return value


def _math_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--math", choices=["fp32", "tf32"],
                   help="how fp32 Dots and convolutions compute: fp32 (CUDA cores) or tf32 (tensor cores, as PyTorch's "
                        "cuDNN convolutions by default; a looser error bound); default: the settings' math (fp32)")


def _flag_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flag", action="append", default=[], metavar="-fNAME=VALUE",
                   help="an NNFusion flag (repeatable, after the settings' nnfusion_flags), e.g. "
                   "--flag=-fkernel_fusion_level=0")


def _compiler_options(p: argparse.ArgumentParser) -> None:
    _flag_option(p)
    p.add_argument("--product-name", metavar="NAME",
                   help="-fproduct_name: the device name profiles are read for (default: the settings')")


def _dim(text: str) -> tuple[str, int]:
    name, _, size = text.partition("=")
    if not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=SIZE, a size of 1 or more (batch=1)")
    return name, int(size)


def _db_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="PATH",
                   help="kernel DB file (default: $KDB_DB or ~/.cache/nnfusion/kernel_cache.db)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdb",
        description="Fill and inspect NNFusion's kernel DB. With no command, opens the console.",
        epilog="Exit status: 0 ok, 1 failures found, 2 could not run, 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version="kdb 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("console", help=COMMANDS["console"][1])
    _db_option(p)
    p.add_argument("--demo", action="store_true",
                   help="open a demo DB the console builds itself on first use (no GPU needed)")

    p = sub.add_parser("inject", help=COMMANDS["inject"][1])
    _db_option(p)
    p.add_argument("paths", nargs="+", metavar="PATH", help="kernel JSON files or directories of them")
    p.add_argument("--arch", action="append", metavar="sm_XX", help="SM arch for the compile check (repeatable; "
                   "default: the settings' archs)")
    p.add_argument("--no-compile", action="store_true", help="skip the nvcc compile check")
    p.add_argument("--replace", action="store_true",
                   help="rewrite rows with the same Key and drop other rows of the same identifier")
    p.add_argument("--workers", type=int, metavar="N", help="parallel workers (default: settings, or one per core)")
    p.add_argument("--verify", action="store_true", help="GPU: run each kernel and compare with a float64 reference")
    p.add_argument("--profile", action="store_true",
                   help="GPU: time each kernel with CUDA events and write the profile NNFusion reads")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print one JSON object with the counts and failures")
    fmt.add_argument("--jsonl", action="store_true",
                     help="JSON lines as it goes: one per kernel right after its commit, one per failure, "
                     "then a summary (a killed run's log says exactly what was committed)")

    p = sub.add_parser("ls", help=COMMANDS["ls"][1],
                       description="A page of kernels, in Key order unless --sort says otherwise: a table on a "
                       "terminal, tab-separated lines (streamed) elsewhere.")
    _db_option(p)
    p.add_argument("text", nargs="?", metavar="TEXT", help="only kernels whose identifier, name or Key holds TEXT "
                   "(any case)")
    p.add_argument("--op", metavar="OPTYPE", help="only this OpType")
    p.add_argument("--source", metavar="SOURCE", help="only this Source (e.g. External)")
    p.add_argument("--tag", metavar="TAG", help="only kernels with this tag")
    p.add_argument("--device", metavar="DEVICE", help="only this DeviceType (e.g. CUDA_GPU)")
    p.add_argument("--lint", choices=["ok", "problems"], help="only rows lint passes, or only those it flags")
    p.add_argument("--precision", choices=["fp16", "tf32", "fp32", "fp64"], help="only rows computing in this "
                   "precision (tf32: float rows on the tensor cores in TF32)")
    p.add_argument("--units", choices=["tensor", "cuda"], help="only rows on the tensor cores (mma.sync), or only "
                   "those on the CUDA cores")
    p.add_argument("--sort", choices=sorted(SORT_KEYS), default="key", help="sort by this column (default: key)")
    p.add_argument("--desc", action="store_true", help="sort descending")
    page = p.add_mutually_exclusive_group()
    page.add_argument("--limit", type=_positive, default=0, metavar="N", help="at most N rows (default: 50)")
    page.add_argument("--all", action="store_true", help="every row that matches")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object: {db, filter, sort, kernels, more}")
    fmt.add_argument("--jsonl", action="store_true", help="JSON lines, one object per kernel")

    p = sub.add_parser("show", help=COMMANDS["show"][1])
    _db_option(p)
    p.add_argument("key", metavar="KEY_OR_IDENTIFIER")
    p.add_argument("--json", action="store_true", help="one JSON object: {query, kernels} (columns parsed)")
    p.add_argument("--export", type=Path, metavar="FILE",
                   help="write the matching kernels as kernel JSON (re-inject with `kdb inject --replace FILE`)")

    p = sub.add_parser("lint", help=COMMANDS["lint"][1])
    _db_option(p)
    p.add_argument("--json", action="store_true", help="findings as a JSON object")

    p = sub.add_parser("failures", help=COMMANDS["failures"][1])
    _db_option(p)
    p.add_argument("action", nargs="?", choices=["list", "retry", "dismiss"], default="list")
    p.add_argument("ids", nargs="*", type=int, metavar="ID")
    p.add_argument("--all", action="store_true", help="retry/dismiss every open failure of this DB")
    p.add_argument("--json", action="store_true", help="JSON output")

    p = sub.add_parser("db", help=COMMANDS["db"][1])
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    q = dbsub.add_parser("init", help="create the DB file with NNFusion's exact table")
    _db_option(q)
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("check", help="integrity, schema and lint summary")
    _db_option(q)
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("repair", help="add the CUDA twin rows fused kernels need, bring older rows to the form "
                         "injection writes (shared arrays' alignment, __restrict__ pointers), put each op's rows "
                         "fastest-first (a preview unless --apply)")
    _db_option(q)
    q.add_argument("--apply", action="store_true", help="write them (one transaction, its undo file first); else "
                   "only show them")
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("fastest", help="per op, delete every row but the one timed fastest on one GPU (kdb keeps "
                                         "that one first already): BlockFusion can no longer swap in a slower row "
                                         "of smaller time x resource (a preview unless --apply)")
    _db_option(q)
    q.add_argument("--product", metavar="NAME",
                   help="the GPU whose times rank the rows, as in -fproduct_name (default: the settings', or the "
                        "one GPU this DB's profiles name)")
    q.add_argument("--apply", action="store_true", help="remove the slower rows (one transaction, its undo file "
                   "first)")
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("standalone", help="keep ops out of BlockFusion: their rows run on their own launch "
                         "(NNFusion's Antares row form; for a fused kernel that cannot launch; a preview unless "
                         "--apply)")
    _db_option(q)
    q.add_argument("keys", nargs="+", metavar="KEY", help="a row's Key (or prefix) or Identifier: every CUDA_GPU row "
                   "of its op changes")
    q.add_argument("--product", metavar="NAME", help="the -fproduct_name the network is compiled with (default: the "
                   "settings', else NNFusion's 'default'); kernel selection takes these rows for it only")
    q.add_argument("--undo", action="store_true", help="give the ops' rows back to BlockFusion (External rows)")
    q.add_argument("--apply", action="store_true", help="write the change (one transaction); else only show it")
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("leave-to-library", help="ops whose row ran slower than the library (cuDNN, cuBLAS, "
                         "NNFusion's own kernel) on a GPU: their rows set aside, the op left to the library (a preview "
                         "unless --apply; --undo FILE puts them back)")
    _db_option(q)
    q.add_argument("times", nargs="?", metavar="TIMES.json", help='{"device": GPU, "ops": [{"identifier", '
                   '"library_us", "row_us" (default: the row\'s profile)}]}: times measured on that GPU')
    q.add_argument("--margin", type=float, default=0.0, metavar="PCT",
                   help="act only where the row is more than PCT %% slower (default 0)")
    q.add_argument("--undo", metavar="FILE", help="put back the rows an earlier --apply set aside into FILE (as "
                   "`kdb db undo FILE`)")
    q.add_argument("--apply", action="store_true", help="write it (one transaction; the rows set aside in its undo "
                   "file first)")
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("undo", help="put back exactly what a maintenance --apply changed (repair, fastest, "
                         "standalone, leave-to-library, the console's F K S d), from the undo file it wrote (a "
                         "preview unless --apply)")
    _db_option(q)
    q.add_argument("file", metavar="FILE", help="the undo file the --apply named (the state dir's undo/)")
    q.add_argument("--apply", action="store_true", help="write it (one transaction)")
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("convert", help="rewrite an osdi20-schema DB into the current schema")
    q.add_argument("old", metavar="OLD")
    q.add_argument("new", metavar="NEW")
    q.add_argument("--json", action="store_true")
    q = dbsub.add_parser("backup", help="consistent copy via SQLite's online backup API")
    _db_option(q)
    q.add_argument("dest", nargs="?", metavar="DEST", help="default: the state dir's backups/ folder")
    q.add_argument("--json", action="store_true")

    p = sub.add_parser("opconfig", help=COMMANDS["opconfig"][1])
    osub = p.add_subparsers(dest="opconfig_command", metavar="ACTION", required=True)
    q = osub.add_parser("extract",
                        help="op configs of an ONNX model (shape inference; fused Conv+Relu, Conv+Add+Relu)")
    q.add_argument("model", metavar="MODEL.onnx")
    q.add_argument("-o", "--output", metavar="FILE", help="write the ones the compiler looks up at the flags to FILE "
                   "(.toml, .json, else the line format)")
    _flag_option(q)
    q.add_argument("--json", action="store_true")
    q = osub.add_parser("check", help="validate op-config files (any form) and print them de-duplicated")
    q.add_argument("files", nargs="+", metavar="FILE")
    q.add_argument("--json", action="store_true")

    p = sub.add_parser("model", help=COMMANDS["model"][1])
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    q = msub.add_parser("fp16", help="an fp32 model made fp16 (onnxconverter-common's float16 converter), for NNFusion "
                        "to compile in half and kdb to tune half kernels for")
    q.add_argument("source", metavar="IN.onnx")
    q.add_argument("output", metavar="OUT.onnx")
    q.add_argument("--keep-io-types", action="store_true", help="keep the graph's inputs and outputs float (Casts "
                   "at the edges); default: half, as NNFusion compiles them")
    q.add_argument("--json", action="store_true")
    q = msub.add_parser("expand", help="ops NNFusion cannot import (HardSwish, HardSigmoid, Mish, ...) written out as "
                        "ONNX's own definition of them, which it imports; and what its importer would take wrong "
                        "(shape computations, negative axes and indices, DepthToSpace, ...) rewritten as it takes it")
    q.add_argument("source", metavar="IN.onnx")
    q.add_argument("output", metavar="OUT.onnx")
    q.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", type=_dim,
                   help="the size of a named dynamic dimension (a torch export's dynamic_axes: batch=1); repeatable")
    q.add_argument("--json", action="store_true")

    p = sub.add_parser("coverage", help=COMMANDS["coverage"][1])
    _db_option(p)
    p.add_argument("model", metavar="MODEL.onnx")
    _compiler_options(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("nnfusion", help=COMMANDS["nnfusion"][1])
    _db_option(p)
    p.add_argument("model", metavar="MODEL.onnx")
    _compiler_options(p)
    p.add_argument("--out", metavar="DIR", help="where the compiler writes its project (default: a new folder "
                   "under the state dir's nnfusion/)")
    p.add_argument("--nnfusion", metavar="PATH", help="the compiler binary (default: the nnfusion_path setting, "
                   "else nnfusion on PATH)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="stop the compiler after S seconds")
    p.add_argument("--arch", metavar="sm_XX", help="the launch check's SM arch (default: the first of the settings' "
                   "archs)")
    p.add_argument("--fit-launches", action=argparse.BooleanOptionalAction, default=None,
                   help="when a BlockFusion kernel cannot launch, run the DB rows fused into it on their own launch "
                   "(writes them to the DB as `kdb db standalone` does) and compile again (default: on with --run, "
                   "off without)")
    p.add_argument("--no-launch-check", action="store_true", help="do not check that every launch fits its "
                   "kernel: its launch bounds, or for a kernel without them (BlockFusion's) the registers nvcc gives "
                   "it (needs nvcc, no GPU)")
    run = p.add_argument_group("running on the GPU (--run, --op-times)")
    run.add_argument("--run", action="store_true", help="also build the generated project with nvcc (cuDNN/cuBLAS "
                     "from their Python wheels), run it on the GPU on a seeded input against ONNX Runtime's output "
                     "(CPU), and time it against the same model compiled with an empty DB. Exit 1 when its output "
                     "is wrong or it is slower; 2 without a GPU (the networks are built, not run). --out DIR gets "
                     "with-db/ and empty-db/")
    run.add_argument("--never-slower", metavar="TIMES.json", help="with --run: leave rows to the library where the "
                     "whole network gets faster. The ops TIMES.json (from --op-times) found slower alone are set aside "
                     "one candidate at a time (ops BlockFusion runs in one kernel together), the network run in "
                     "rounds, each change kept only when the network is faster in every round, else put back; writes "
                     "the DB, an undo file per kept change. Exit 1 when the network stays slower than the empty DB")
    run.add_argument("--op-times", metavar="TIMES.json", help="instead of the network, each op the DB serves for it "
                     "alone: a one-op model compiled with a DB of only that op's rows and with an empty DB, both built "
                     "(nvcc), run and timed on the GPU as --run times; the times go to TIMES.json for `kdb db "
                     "leave-to-library`. Exit 1 when a row is slower than the library or an op could not be timed; 2 "
                     "without a GPU (everything built, nothing run, no file written). --out DIR gets ops/")
    run.add_argument("--workers", type=_positive, metavar="N", help="with --op-times: ops compiled and built at once "
                     "(default: one per CPU)")
    run.add_argument("--max-error", type=float, metavar="E", help="with --run: the largest relative error "
                     "allowed: max|out - ref| / max|ref| per output (default 1e-4)")
    run.add_argument("--seed", type=int, metavar="N", help="the input's random seed (default 0)")
    run.add_argument("--warmup", type=int, metavar="N", help="kernel_entry calls before timing "
                     "(default 100)")
    run.add_argument("--iterations", type=_positive, metavar="N", help="timed kernel_entry calls, "
                     "each between its own CUDA events; the median counts (default 1000)")
    run.add_argument("--rounds", type=_positive, metavar="N", help="with --run: runs of each network, by turns; "
                     "slower or faster is said only when every round says so, else 'within noise' (default 5)")
    run.add_argument("--cuda-graph", action="store_true", default=None, help="with --run: also time kernel_entry "
                     "captured once in a CUDA graph and replayed, as PyTorch's CUDA-graph baseline runs (the CPU's "
                     "cost of each launch gone); its output is checked too. Both projects are then compiled with "
                     "--default-stream per-thread")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("autotvm", help=COMMANDS["autotvm"][1])
    asub = p.add_subparsers(dest="autotvm_command", metavar="ACTION", required=True)
    q = asub.add_parser("summary", help="workloads, trials, errors by kind, best time, matching op configs")
    q.add_argument("log", metavar="LOG")
    q.add_argument("--opconfigs", nargs="*", default=[], metavar="FILE", help="op-config files to match against")
    q.add_argument("--json", action="store_true")

    p = sub.add_parser("codegen", help=COMMANDS["codegen"][1])
    p.add_argument("--db", metavar="PATH", help="kernel DB that failures are kept for, and a retry injects into "
                   "(default: $KDB_DB or ~/.cache/nnfusion/kernel_cache.db)")
    p.add_argument("inputs", nargs="+", metavar="OPCONFIGS",
                   help="op-config files (lines, .toml, .json), .onnx models, or directories of them")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="kernel JSON output (default: stdout; with --inject, written only when given)")
    p.add_argument("--arch", metavar="sm_XX", help="target SM arch (default: the first of the settings' archs)")
    p.add_argument("--no-check", action="store_true", help="skip the CPU numerics check against numpy")
    p.add_argument("--inject", action="store_true",
                   help="inject the kernels into the DB as they are generated (the Op configs view's g): nvcc-checked "
                   "for the settings' archs (--arch: that one), a note when nvcc is missing")
    p.add_argument("--no-compile", action="store_true", help="with --inject: skip the nvcc compile check")
    _math_option(p)
    _flag_option(p)  # which ops of a model the compiler looks up
    p.add_argument("--json", action="store_true", help="a JSON report on stdout (kernels go to -o)")

    p = sub.add_parser("tune", help=COMMANDS["tune"][1])
    _db_option(p)
    p.add_argument("inputs", nargs="+", metavar="OPCONFIGS", help="op-config files, .onnx models or directories")
    p.add_argument("--trials", type=int, metavar="N",
                   help="trial budget per op; for a model, per op on average (default: the settings')")
    p.add_argument("--budget", type=int, metavar="N",
                   help="trials in all, spread over the ops by their share of the network's time "
                        "(default for a model: --trials x its ops)")
    p.add_argument("--target", choices=["cuda", "llvm"], default="cuda",
                   help="cuda (kernels for the DB) or llvm (measures on the CPU; the same code path)")
    p.add_argument("--arch", metavar="sm_XX", help="SM arch (default: the first of the settings' archs)")
    _math_option(p)
    p.add_argument("--rpc", metavar="HOST:PORT:KEY", help="measure on TVM's RPC tracker (default: the settings')")
    p.add_argument("--rpc-workers", type=int, metavar="N",
                   help="measurements in flight over RPC (default: the tracker's free servers when the run starts)")
    p.add_argument("--gpus", type=int, default=0, metavar="N",
                   help="measure on N GPUs of this host: a local tracker and one rpc_server per GPU (-1: all)")
    p.add_argument("--no-inject", action="store_true", help="tune only; do not inject the kernels")
    p.add_argument("--efficient", action="store_true",
                   help="also inject each op's most efficient kernel (time x resource) for BlockFusion to swap in; "
                        "on the H200 that made ResNet-18 1.46x slower")
    p.add_argument("--runner-ups", type=int, metavar="N",
                   help="when an op's best row runs 1.2x its record's time or more (timed on the GPU as NNFusion "
                        "compiles it), inject the next N records' kernels as rows too (default 2; 0: never)")
    p.add_argument("--no-transfer", action="store_true",
                   help="give each op MetaSchedule's own fresh cost model instead of one model for the run, "
                        "taught by every trial recorded in the state dir")
    # Tune's defaults are core's (core.tuning.request.tune_request): an option left out is None. The help
    # repeats the numbers, not imported: the parser stays light for every command.
    p.add_argument("--batch", type=int, metavar="N",
                   help="candidates per search round (default 32); the search costs about the same per round, "
                        "so larger rounds search less per trial and learn less often")
    p.add_argument("--minutes", type=float, metavar="M",
                   help="a time budget: after M minutes the op in flight stops and its best kernels so far are "
                        "injected; ops not yet started are left (run again to go on); the trials stay a ceiling")
    p.add_argument("--max-per-op", type=int, metavar="N",
                   help="a model: no op gets more than N trials of the spread budget (the rest goes to the others)")
    p.add_argument("--join", metavar="RUN",
                   help="a model: tune it together with every other `kdb tune --join RUN` process of this host and "
                        "state dir; each op goes to the first process that claims it, so several processes keep a "
                        "many-core host busy (split the builds with --workers); a new name for each run")
    p.add_argument("--workers", type=int, metavar="N", help="parallel builds (default: this host's CPUs)")
    p.add_argument("--population", type=int, metavar="N",
                   help="the evolutionary search's population, at least --batch (default 256, or --batch when larger; "
                        "MetaSchedule's own is 512)")
    p.add_argument("--json", action="store_true", help="JSON lines of progress events on stdout")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show TVM's own log here too (it always goes to a file in the state dir)")

    p = sub.add_parser("gpu", help=COMMANDS["gpu"][1])
    gsub = p.add_subparsers(dest="gpu_command", metavar="ACTION", required=True)
    q = gsub.add_parser("devices", help="the CUDA devices here (pycuda)")
    q.add_argument("--json", action="store_true")
    for action, text in (("verify", "run kernels on random inputs and compare with a float64 reference"),
                         ("profile", "time kernels with CUDA events; write the profile into the DB")):
        q = gsub.add_parser(action, help=text)
        _db_option(q)
        q.add_argument("keys", nargs="*", metavar="KEY_OR_IDENTIFIER")
        q.add_argument("--all", action="store_true", help="every kernel in the DB")
        q.add_argument("--op", metavar="OPTYPE", help="only this OpType (with --all)")
        q.add_argument("--json", action="store_true")

    p = sub.add_parser("settings", help=COMMANDS["settings"][1])
    p.add_argument("assignments", nargs="*", metavar="KEY=VALUE",
                   help="change settings, e.g. archs=sm_80,sm_90 product_name='NVIDIA H200'")
    p.add_argument("--json", action="store_true")
    return parser


def run(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        return _failed(args, "interrupted", 130)
    except BrokenPipeError:
        # The reader has gone (`kdb ls --all | head`): it wanted no more, which is no failure of ours. stdout now
        # points at /dev/null, so the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # one place turns engine errors into a message and exit status 2
        from core.errors import KdbError

        if isinstance(exc, KdbError):
            return _failed(args, str(exc), 2)
        sqlite_error = _sqlite_error(exc)
        if sqlite_error:  # a file damaged past the header check surfaces mid-read: say so, no traceback
            where = getattr(args, "db", None) or "the kernel DB"
            return _failed(args, f"{where} cannot be read: {sqlite_error} (`kdb db check` tells more)", 2)
        raise


def _failed(args: argparse.Namespace, message: str, status: int) -> int:
    """Say why on stderr; with --json/--jsonl, stdout still gets its one JSON object: {"error": ...}."""
    print(f"kdb {args.command}: {message}", file=sys.stderr)
    if getattr(args, "json", False) or getattr(args, "jsonl", False):
        from console.cli.output import print_json

        print_json({"error": message})
    return status


# SQLite result codes about the file itself (not the query): READONLY, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB.
_FILE_ERRORS = {8, 10, 11, 13, 14, 26}


def _sqlite_error(exc: BaseException) -> str:
    """SQLite's own message when exc is an error about the DB file; "" otherwise."""
    import sqlite3

    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    return str(exc) if isinstance(exc, sqlite3.DatabaseError) and code in _FILE_ERRORS else ""

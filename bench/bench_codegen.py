"""Code generation time per kernel for the shared op configs (TVM 0.27, default schedule, no GPU).

    .venv/bin/python bench/bench_codegen.py            # prints a table and a ratio, writes bench/results/codegen.json
    .venv/bin/python bench/bench_codegen.py --dtype half   # the same ops in fp16 (tensor cores), codegen-half.json

Each op config of ../shared/nnfusion-artifact/op_configs (convolutions) is generated in each of its three
kernel-DB forms (Convolution, Fused_Convolution_Relu, Fused_Convolution_Add_Relu), with and without the CPU
numerics check; where ../shared is absent, the demo network's op configs (core/demo.py) as they are. TVM's
import is timed apart. The figures in docs/BENCHMARKS-HISTORY.md are the artifact's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from shared_data import ARTIFACT_OPCONFIGS, shared_path  # noqa: E402

if TYPE_CHECKING:
    from core.opconfigs.opconfig import OpConfig

CONV_FORMS = ("Convolution", "Fused_Convolution_Relu", "Fused_Convolution_Add_Relu")


def configs_to_time() -> tuple[str, list[tuple[str, OpConfig]]]:
    """(where they come from, [(model, op config)]): the artifact's convolutions in their three forms where
    ../shared has them, else the demo network's op configs as they are."""
    from core.demo import TINY_NETWORK
    from core.opconfigs.opconfig import parse_lines, read_opconfigs

    files = sorted(shared_path(ARTIFACT_OPCONFIGS).glob("*.txt"))
    if not files:
        return "the demo network (core/demo.py)", [("tiny", c) for c in parse_lines(TINY_NETWORK, "tiny").configs]
    return str(shared_path(ARTIFACT_OPCONFIGS)), [
        (path.stem.split("_")[0], replace(config, op_type=op, line_format=None))
        for path in files for config in read_opconfigs(path).configs for op in CONV_FORMS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None, help="results file (default: codegen[-half].json)")
    ap.add_argument("--dtype", choices=("float", "half"), default="float", help="the op configs' element type")
    args = ap.parse_args()
    out = args.json or RESULTS / ("codegen.json" if args.dtype == "float" else "codegen-half.json")
    start = time.perf_counter()
    import tvm  # noqa: F401

    import_s = time.perf_counter() - start
    from core.codegen.generate import generate

    source, configs = configs_to_time()
    configs = [(model, replace(c, dtype=args.dtype, line_format=None)) for model, c in configs]
    print(f"op configs: {len(configs)} of {source}, in {args.dtype}")
    rows = []
    for model, c in configs:
        gen = generate(c, "sm_90", check=False)
        checked = generate(c, "sm_90", check=True)
        rows.append({"model": model, "op": c.op_type, "config": c.describe(),
                     "codegen_s": gen.seconds, "with_check_s": checked.seconds,
                     "ok": gen.item is not None and checked.item is not None,
                     "max_rel_error": checked.max_rel_error})
    out.parent.mkdir(parents=True, exist_ok=True)
    gen_ms = [r["codegen_s"] * 1000 for r in rows]
    chk_ms = [r["with_check_s"] * 1000 for r in rows]
    print(f"{'model':10} {'op type':28} {'codegen ms':>10} {'+check ms':>10} {'max rel err':>12}")
    for r in rows:
        err = "-" if r["max_rel_error"] is None else f"{r['max_rel_error']:.1e}"
        print(f"{r['model']:10} {r['op']:28} {r['codegen_s'] * 1000:10.1f} {r['with_check_s'] * 1000:10.1f} {err:>12}")
    summary = {"source": source, "dtype": args.dtype, "kernels": len(rows), "all_ok": all(r["ok"] for r in rows),
               "tvm_import_s": import_s,
               "codegen_ms_median": statistics.median(gen_ms), "codegen_ms_max": max(gen_ms),
               "with_check_ms_median": statistics.median(chk_ms), "with_check_ms_max": max(chk_ms)}
    print(f"\n{len(rows)} kernels, all ok: {summary['all_ok']}; TVM import {import_s:.2f} s (once per process)")
    print(f"ratio: {summary['codegen_ms_median']:.0f} ms per kernel median (max {summary['codegen_ms_max']:.0f}); "
          f"with the CPU numerics check {summary['with_check_ms_median']:.0f} ms median "
          f"(max {summary['with_check_ms_max']:.0f})")
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if not summary["all_ok"]:
        sys.exit("some kernels failed to generate or to match numpy: see the table")


if __name__ == "__main__":
    main()

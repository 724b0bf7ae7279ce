"""Does padding in the schedule apply to every tuned record that needs it? (core/codegen/whole_warps.py)

    python3 bench/bench_whole_warps.py --state bench/results/h200/session12/7-state.tgz [--top 16]

For each op of a tuning state, its `--top` fastest records: how many have a partial-warp block with shared memory
(padding due), how many were padded, and for those whether TVM inserted the same number of barriers in the
padded kernel as in the unpadded one, all of them outside the guards. CPU only (TVM's CUDA codegen, no nvcc).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, required=True, help="a tuning state dir, or its state.tgz")
    ap.add_argument("--top", type=int, default=16)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()

    import tvm
    from bench_row_gap import tuning_dirs
    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target, prim_func_module
    from core.codegen.schedule import launch_dims
    from core.codegen.whole_warps import partial_warp_threads, whole_warp_module
    from core.opconfigs.opconfig import OpConfig

    target = cuda_target(args.arch)
    totals = {"records": 0, "due": 0, "padded": 0, "same_barriers": 0}
    started = time.perf_counter()
    print(f"{'op':44s} {'records':>7s} {'due':>4s} {'padded':>6s} {'same barriers':>13s}  blocks")
    with tempfile.TemporaryDirectory(prefix="kdb-whole-warps-") as work:
        for op_dir in tuning_dirs(args.state, Path(work)):
            item = json.loads(sorted(op_dir.glob("kernels-*.json"))[-1].read_text())[0]
            mod, _ = prim_func_module(OpConfig(item["op_type"], item["parameters"]))
            db = ms.database.JSONDatabase(path_workload=str(op_dir / "database_workload.json"),
                                          path_tuning_record=str(op_dir / "database_tuning_record.json"))
            counts = {"records": 0, "due": 0, "padded": 0, "same_barriers": 0}
            blocks: set[str] = set()
            for record in db.get_top_k(db.commit_workload(mod), args.top):
                sch = tvm.s_tir.Schedule(mod)
                record.trace.apply_to_schedule(sch, remove_postproc=False)
                plain = sch.mod
                counts["records"] += 1
                if partial_warp_threads(plain) is None:
                    continue
                counts["due"] += 1
                padded = whole_warp_module(plain)
                if padded is plain:
                    continue
                counts["padded"] += 1
                blocks.add(f"{launch_dims(plain)[1][0]}->{launch_dims(padded)[1][0]}")
                before, after = (tvm.compile(m, target=target).mod.imports[0].inspect_source().count("__syncthreads()")
                                 for m in (plain, padded))
                counts["same_barriers"] += before == after
            for k in totals:
                totals[k] += counts[k]
            print(f"{op_dir.name:44s} {counts['records']:7d} {counts['due']:4d} {counts['padded']:6d} "
                  f"{counts['same_barriers']:13d}  {' '.join(sorted(blocks))}", flush=True)
    print(f"all: {totals['records']} records, padding due for {totals['due']}, padded {totals['padded']} "
          f"({totals['padded'] / max(totals['due'], 1):.0%}), the same barrier count in {totals['same_barriers']}; "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()

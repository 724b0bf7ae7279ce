"""What one tuning candidate's NVRTC compile costs, with TVM's program and without libcu++ (core/tuning/nvrtc.py).

    python3 bench/bench_nvrtc.py [--per-op 4] [--state bench/results/h200/session10/3-state.tgz]

The candidates are H200 tuning records of ResNet-18's ops (session 10), `--per-op` drawn at random per op, each
rebuilt by TVM on this CPU to its CUDA source. Each source is compiled by NVRTC to a cubin both ways, in this
process (CPU seconds), and to PTX both ways to check that the kernel's code is the same. Prints a table and the
ratio. Needs NVRTC (cuda-bindings and nvidia-cuda-nvrtc, in the tvm extra) and the CUDA headers (CUDA_PATH,
default /usr/local/cuda); no GPU.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
STATE = REPO / "bench" / "results" / "h200" / "session10" / "3-state.tgz"


def candidate_sources(state: Path, work: Path, per_op: int) -> dict[str, str]:
    """CUDA sources of tuning candidates from MetaSchedule records (a state.tgz of h200_network.sh), `per_op`
    per op, each drawn at random (seeded by the op's work dir) and built by TVM here."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from core.tuning.pipeline import build_candidate

    with tarfile.open(state) as tar:
        tar.extractall(work, filter="data")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": "llvm"})
    sources: dict[str, str] = {}
    for folder in sorted((work / "state" / "tuning").iterdir()):
        db = ms.database.JSONDatabase(path_workload=str(folder / "database_workload.json"),
                                      path_tuning_record=str(folder / "database_tuning_record.json"))
        records = [r for r in db.get_all_tuning_records() if r.run_secs and float(r.run_secs[0]) < 1]
        for i, record in enumerate(random.Random(folder.name).sample(records, min(per_op, len(records)))):
            schedule = tvm.s_tir.Schedule(record.workload.mod)
            record.trace.apply_to_schedule(schedule, remove_postproc=False)
            module = build_candidate(schedule.mod, target, None)
            sources[f"{folder.name}#{i}"] = module.imports[0].inspect_source("cuda")
    return sources


def kernel_ptx(ptx: bytes | bytearray) -> str:
    text = bytes(ptx).decode()
    return text[text.index(".entry "):]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-op", type=int, default=4)
    ap.add_argument("--state", type=Path, default=STATE)
    args = ap.parse_args()
    os.environ.setdefault("CUDA_PATH", "/usr/local/cuda")
    from tvm.support import nvcc

    from core.tuning import nvrtc

    with tempfile.TemporaryDirectory() as work:
        sources = candidate_sources(args.state, Path(work), args.per_op)

    def cpu_s(code: str, light: bool) -> float:
        start = time.process_time()
        if light:
            with nvrtc.lighter_programs():
                nvcc.compile_cuda(code, target_format="cubin", arch="sm_90", compiler="nvrtc")
        else:
            nvcc.compile_cuda(code, target_format="cubin", arch="sm_90", compiler="nvrtc")
        return time.process_time() - start

    def same_kernel(code: str) -> bool:
        full = nvcc.compile_cuda(code, target_format="ptx", arch="sm_90", compiler="nvrtc")
        with nvrtc.lighter_programs():
            light = nvcc.compile_cuda(code, target_format="ptx", arch="sm_90", compiler="nvrtc")
        return kernel_ptx(full) == kernel_ptx(light)

    by_op: dict[str, list[tuple[float, float, bool]]] = {}
    for name, code in sources.items():
        cpu_s(code, False)  # NVRTC's own first-call start, out of the figures
        by_op.setdefault(name.rsplit("-", 1)[0], []).append((cpu_s(code, False), cpu_s(code, True), same_kernel(code)))
    print(f"{'op':28s} {'candidates':>10s} {'TVM program s':>14s} {'no libcu++ s':>13s} {'ratio':>6s} {'same PTX':>9s}")
    full_all, light_all = [], []
    for op, rows in by_op.items():
        full, light = [r[0] for r in rows], [r[1] for r in rows]
        full_all += full
        light_all += light
        print(f"{op:28s} {len(rows):10d} {statistics.mean(full):14.2f} {statistics.mean(light):13.2f} "
              f"{statistics.mean(light) / statistics.mean(full):6.2f} {sum(r[2] for r in rows):>5d}/{len(rows)}")
    print(f"ratio: NVRTC CPU s per candidate without libcu++ / with = {statistics.mean(light_all):.2f} / "
          f"{statistics.mean(full_all):.2f} = {statistics.mean(light_all) / statistics.mean(full_all):.2f}x over "
          f"{len(full_all)} candidates (mean); fallbacks to TVM's program: {nvrtc.fallbacks}")


if __name__ == "__main__":
    main()

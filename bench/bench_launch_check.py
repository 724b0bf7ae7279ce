"""What the launch check costs on a real generated project (no GPU; nvcc on this CPU).

    python3 bench/bench_launch_check.py [--reps 3] [ARCHIVE.tgz:PATH | nnfusion_rt.cu ...]

Default: the ResNet-18 projects NNFusion generated on the H200 with session 9's tuned rows (one BlockFusion
kernel could not launch) and session 10's (all fit). Prints, per project, the launches, how many kernels nvcc
compiled, and the check's wall and nvcc seconds (median of --reps). Run it at two commits to compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PROJECT = "net/nnfusion-tuned-best/nnfusion_rt/cuda_codegen/nnfusion_rt.cu"
DEFAULT = [f"bench/results/h200/session9/7-network-results.tgz:{PROJECT}",
           f"bench/results/h200/session10/4-network-results.tgz:{PROJECT}"]


def read(spec: str) -> str:
    archive, _, member = spec.partition(":")
    if not member:
        return Path(spec).read_text()
    with tarfile.open(REPO / archive) as tar:
        f = tar.extractfile(member)
        if f is None:
            raise SystemExit(f"{spec}: no such file in the archive")
        return f.read().decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("projects", nargs="*", default=DEFAULT)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    from core.cuda.nvcc import find_nvcc
    from core.nnfusion.generated import parse_generated
    from core.nnfusion.launch_check import check_launches

    nvcc = find_nvcc("")
    print(f"{'project':60s} {'launches':>8s} {'kernels':>8s} {'compiled':>8s} {'failing':>7s} {'wall s':>7s} "
          f"{'nvcc s':>7s}")
    for spec in args.projects:
        source = read(spec)
        generated = parse_generated(source)
        walls, nvccs = [], []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory() as work:
                start = time.perf_counter()
                report = check_launches(source, generated, args.arch, nvcc=nvcc, workdir=Path(work))
                walls.append(time.perf_counter() - start)
                nvccs.append(report.seconds)
        if report.error:
            print(f"{spec}: {report.error}")
            continue
        label = spec.partition(":")[0].removeprefix("bench/results/h200/")
        print(f"{label[-60:]:60s} {report.launch_count:8d} {len(report.kernels):8d} {report.compiled:8d} "
              f"{len(report.failing()):7d} "
              f"{statistics.median(walls):7.2f} {statistics.median(nvccs):7.2f}")


if __name__ == "__main__":
    main()

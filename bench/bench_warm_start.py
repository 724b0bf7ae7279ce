"""What a warm start of the shared cost model costs with and without each record's stored features (issue 31,
change C: core/tuning/features.py). No GPU needed.

    python3 bench/bench_warm_start.py --records STATE.tgz|TUNING_DIR [--ops 4] [--threads 2]

The work dirs (a `h200_network.sh` state archive, or a tuning root) are copied; the first `ops` of them (by
name) are learnt twice, each by a fresh model of its own:
- extracted: each dir as its tuning process learns its own trials (`warm_start(own=dir, budget=0)`): every
  record rebuilt from its trace and featurised, as every warm start did before; its features are stored;
- stored: the same dirs again, in the same order, by a fresh model (another process's warm start), now
  reading the stored features.
Both pass the same features to the same XGBoost updates: the models' data are compared and must be equal.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_search import tuning_root  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=Path, required=True)
    ap.add_argument("--ops", type=int, default=4, help="how many work dirs (first by name)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()

    from core.codegen.generate import cuda_target
    from core.tuning.costmodel import SharedCostModel
    from core.tuning.features import FEATURES
    from core.tuning.records import RECORDS

    with tempfile.TemporaryDirectory(prefix="kdb-bench-warm-") as tmp:
        found = tuning_root(args.records, Path(tmp) / "unpacked")
        root = Path(tmp) / "root"
        root.mkdir()
        for work_dir in sorted(p for p in found.iterdir() if (p / RECORDS).is_file())[:args.ops]:
            shutil.copytree(work_dir, root / work_dir.name)
            (root / work_dir.name / FEATURES).unlink(missing_ok=True)
        target = cuda_target(args.arch)

        extracted = SharedCostModel(target, args.threads)
        wall, cpu, trials = time.perf_counter(), time.process_time(), 0
        for work_dir in sorted(root.iterdir()):
            trials += extracted.warm_start(root, own=work_dir, budget=0).trials
        first = (time.perf_counter() - wall, time.process_time() - cpu)

        stored_model = SharedCostModel(target, args.threads)
        wall, cpu = time.perf_counter(), time.process_time()
        read = sum(stored_model.warm_start(root, own=work_dir, budget=0).stored for work_dir in sorted(root.iterdir()))
        second = (time.perf_counter() - wall, time.process_time() - cpu)

        same = all(
            extracted.model.data[h].costs.tolist() == g.costs.tolist()
            and all((a == b).all() for a, b in zip(extracted.model.data[h].features, g.features, strict=True))
            for h, g in stored_model.model.data.items()) and set(extracted.model.data) == set(stored_model.model.data)
    print(f"{trials} trials of {args.ops} ops, {args.threads} threads")
    print(f"{'warm start':<34} {'wall s':>8} {'CPU s':>8} {'ms/trial (wall)':>16}")
    for name, (w, c) in (("extracted (rebuild + featurise)", first), (f"stored ({read} read)", second)):
        print(f"{name:<34} {w:>8.1f} {c:>8.1f} {w / max(trials, 1) * 1e3:>16.1f}")
    print(f"saving: {first[0] - second[0]:.1f} s wall ({(first[0] - second[0]) / max(trials, 1) * 1e3:.1f} ms per "
          f"trial); the models' data identical: {same}")


if __name__ == "__main__":
    main()

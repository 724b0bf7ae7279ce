"""What one evolutionary-search round costs a CUDA tuning process, by population: no GPU needed.

    python3 bench/bench_search.py --records STATE.tgz|TUNING_DIR [--op TEXT] [--populations 512,256,128]
                                  [--threads 4] [--batch 128] [--rounds 2]

On the H200 (session 9) the tuning processes spent 3.8 CPU s per measured trial, more than the builds: every op
now evolves with the shared cost model, and MetaSchedule's search (a population of 512, four rounds of mutation,
each candidate's features extracted and scored) runs on the same 16 cores as the builds. This measures that
search alone on this machine: the cost model warm-started from real tuning records (a `h200_network.sh` state
archive, or a tuning root of work dirs), then, for each population, `rounds` calls of MetaSchedule's
generate_measure_candidates for a batch of `batch` candidates of one op, with their wall and CPU seconds and the
model's mean predicted score of the batch (relative to the first population's: does a smaller population find
candidates the model rates as well?). Whether those candidates also run as fast only the GPU can say.
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


def tuning_root(records: Path, scratch: Path) -> Path:
    """The folder of work dirs: `records` itself, or where its state archive unpacks."""
    if records.is_dir():
        return records
    with tarfile.open(records) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json") and ".." not in m.name]
        tar.extractall(scratch, members=members, filter="data")
    found = sorted({p.parent.parent for p in scratch.rglob("database_tuning_record.json")})
    if not found:
        raise SystemExit(f"{records}: no MetaSchedule work dirs inside")
    return found[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=Path, required=True)
    ap.add_argument("--op", default="", help="a work dir whose name contains TEXT (default: the one with most trials)")
    ap.add_argument("--populations", default="512,256,128")
    ap.add_argument("--threads", type=int, default=4, help="the search's threads (a tuning process's share)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()

    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target
    from core.tuning.costmodel import SharedCostModel
    from core.tuning.job import RECORDS, WORKLOADS
    from core.tuning.space import self_contained_cuda_space

    with tempfile.TemporaryDirectory(prefix="kdb-bench-search-") as tmp:
        root = tuning_root(args.records, Path(tmp))
        dirs = [p for p in root.iterdir() if (p / RECORDS).is_file() and args.op in p.name]
        if not dirs:
            raise SystemExit(f"{root}: no work dir matches {args.op!r}")
        work = max(dirs, key=lambda p: len((p / RECORDS).read_text().splitlines()))
        target = cuda_target(args.arch)
        model = SharedCostModel(target, args.threads)
        t0 = time.perf_counter()
        warm = model.warm_start(root, own=work)
        print(f"cost model: {warm.trials} trials of {warm.ops} ops in {time.perf_counter() - t0:.1f} s "
              f"(trained: {model.trained}); op: {work.name}")
        database = ms.database.JSONDatabase(path_workload=str(work / WORKLOADS), path_tuning_record=str(work / RECORDS))
        mod = database.get_all_tuning_records()[0].workload.mod
        rows = []
        for population in (int(p) for p in args.populations.split(",")):
            context = ms.TuneContext(mod=mod, target=target, space_generator=self_contained_cuda_space(),
                                     search_strategy=ms.search_strategy.EvolutionarySearch(population_size=population),
                                     num_threads=args.threads, rand_state=1)
            spaces = context.generate_design_space()
            context.pre_tuning(max_trials=args.batch * args.rounds, num_trials_per_iter=args.batch,
                               design_spaces=spaces, database=database, cost_model=model.model)
            walls, cpus, scores = [], [], []
            for _ in range(args.rounds):
                wall, cpu = time.perf_counter(), time.process_time()
                candidates = context.generate_measure_candidates() or []
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
                scores.append(statistics.fmean(float(s) for s in model.model.predict(context, candidates))
                              if candidates else float("nan"))
            context.post_tuning()
            rows.append((population, statistics.fmean(walls), statistics.fmean(cpus), statistics.fmean(scores)))
            print(f"  population {population}: {rows[-1][1]:.1f} s wall, {rows[-1][2]:.1f} CPU s per round",
                  flush=True)
    base = rows[0]
    print(f"\n{'population':>10} {'wall s/round':>13} {'CPU s/round':>12} {'CPU s/trial':>12} {'mean score':>11} "
          f"{'CPU ratio':>10} {'score ratio':>12}")
    for population, wall, cpu, score in rows:
        print(f"{population:>10} {wall:>13.1f} {cpu:>12.1f} {cpu / args.batch:>12.3f} {score:>11.3f} "
              f"{cpu / base[2]:>10.2f} {score / base[3]:>12.2f}")
    print(f"ratio: population {rows[-1][0]} costs {rows[-1][2] / base[2]:.2f}x the CPU of {base[0]} per round "
          f"({args.threads} threads, batch {args.batch}, {args.rounds} rounds, cost model of {model.samples} trials)")


if __name__ == "__main__":
    main()

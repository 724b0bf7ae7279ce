"""What one evolutionary-search round costs a CUDA tuning process, by population: no GPU needed.

    python3 bench/bench_search.py --records STATE.tgz|TUNING_DIR [--op TEXT] [--populations 512,256,128]
                                  [--iters 4] [--threads 4] [--batch 128] [--rounds 2]

On the H200 (session 9) the tuning processes spent 3.8 CPU s per measured trial, more than the builds: every op
now evolves with the shared cost model, and MetaSchedule's search (a population of 512, four rounds of mutation,
each candidate's features extracted and scored) runs on the same 16 cores as the builds. This measures that
search alone on this machine: the cost model warm-started from real tuning records (a `h200_network.sh` state
archive, or a tuning root of work dirs), then, for each population, `rounds` calls of MetaSchedule's
generate_measure_candidates for a batch of `batch` candidates of one op, with their wall and CPU seconds and the
model's mean predicted score of the batch (relative to the first setting's: does a smaller search find
candidates the model rates as well?). Whether those candidates also run as fast only the GPU can say. `--iters`
varies MetaSchedule's rounds of mutation (genetic_num_iters) the same way. Last, what one cost-model update
costs at this model's size: the op's last `batch` records fed again, as a measured batch is after each round.
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
    ap.add_argument("--iters", default="4", help="genetic_num_iters values, each tried with every population")
    ap.add_argument("--threads", type=int, default=4, help="the search's threads (a tuning process's share)")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()

    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target
    from core.tuning.costmodel import SharedCostModel
    from core.tuning.records import RECORDS, WORKLOADS
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
        settings = [(int(p), int(i)) for i in args.iters.split(",") for p in args.populations.split(",")]
        for population, iters in settings:
            strategy = ms.search_strategy.EvolutionarySearch(population_size=population, genetic_num_iters=iters)
            context = ms.TuneContext(mod=mod, target=target, space_generator=self_contained_cuda_space(),
                                     search_strategy=strategy, num_threads=args.threads, rand_state=1)
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
            rows.append((population, iters, statistics.fmean(walls), statistics.fmean(cpus), statistics.fmean(scores)))
            print(f"  population {population}, {iters} mutation rounds: {rows[-1][2]:.1f} s wall, "
                  f"{rows[-1][3]:.1f} CPU s per round", flush=True)
        update_wall, update_cpu, size = cost_model_update(model, database, target, args.batch, args.threads)
    base = rows[0]
    print(f"\n{'population':>10} {'mutation rounds':>15} {'wall s/round':>13} {'CPU s/round':>12} {'CPU s/trial':>12} "
          f"{'mean score':>11} {'CPU ratio':>10} {'score ratio':>12}")
    for population, iters, wall, cpu, score in rows:
        print(f"{population:>10} {iters:>15} {wall:>13.1f} {cpu:>12.1f} {cpu / args.batch:>12.3f} {score:>11.3f} "
              f"{cpu / base[3]:>10.2f} {score / base[4]:>12.2f}")
    print(f"cost-model update of {args.batch} trials at {size} trials: {update_wall:.1f} s wall, "
          f"{update_cpu:.1f} CPU s ({update_cpu / args.batch:.3f} CPU s per trial)")
    last = rows[-1]
    print(f"ratio: population {last[0]} with {last[1]} mutation rounds costs {last[3] / base[3]:.2f}x the CPU of "
          f"population {base[0]} with {base[1]} per round ({args.threads} threads, batch {args.batch}, {args.rounds} "
          f"rounds, cost model of {size} trials)")


def cost_model_update(model: object, database: object, target: object, batch: int,
                      threads: int) -> tuple[float, float, int]:
    """Wall and CPU seconds of one XGBoost update with the op's last `batch` records (features extracted, the
    model retrained on everything it holds), and the model's size before it."""
    from tvm.s_tir import meta_schedule as ms

    from core.tuning.costmodel import runner_result

    records = database.get_all_tuning_records()[-batch:]  # type: ignore[attr-defined]
    candidates = [r.as_measure_candidate() for r in records]
    results = [runner_result(r) for r in records]
    context = ms.TuneContext(mod=records[0].workload.mod, target=target, num_threads=threads)
    size = int(model.model.data_size)  # type: ignore[attr-defined]
    wall, cpu = time.perf_counter(), time.process_time()
    model.model.update(context, candidates, results)  # type: ignore[attr-defined]
    return time.perf_counter() - wall, time.process_time() - cpu, size


if __name__ == "__main__":
    main()

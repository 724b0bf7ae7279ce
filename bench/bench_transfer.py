"""How well a cost model trained on some ops' measured trials ranks another op's candidates (transfer).

    python3 bench/bench_transfer.py --state bench/results/h200/session14/3-state.tgz \
        --state bench/results/h200/session12/7-state.tgz --test dot --out bench/results/transfer-dot.txt

Every state is a tarball of MetaSchedule work dirs (`state/tuning/<family>-<hash>/`, what h200_network.sh carries
back); the trials in them were timed on the GPU, so this runs on any CPU: only the models' features are computed
here. The test family's trials (all states) are ranked by XGBoost models taught from:
  - the other families' trials (what a shared model holds when the first job of a new family starts),
  - the first --early trials of each op of the other families (a shared model early in a run: session 14's
    Dot started from 235 such trials),
  - the same family's trials in the other states (the same ops, another run),
  - everything but the test trials themselves.
For each model the table says how its ranking agrees with the measured times (Spearman), what the 16 and the
64 candidates it ranks first would give (the best measured time among them, what a search batch picks), and
the same for a ranking at random (the mean over 200 shuffles).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else 0.0


def expected_best(times: list[float], k: int, rng: random.Random) -> float:
    """The best of k trials picked at random, on average over 200 draws."""
    picks = [min(rng.sample(times, min(k, len(times)))) for _ in range(200)]
    return sum(picks) / len(picks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", action="append", required=True, type=Path, help="a state tarball (repeat)")
    ap.add_argument("--test", default="dot",
                    help="the kind of op ranked (core.tuning.costmodel.op_family): convolution, dot or pool")
    ap.add_argument("--early", type=int, default=16, metavar="N",
                    help="a teacher of the first N trials of each other op (a shared model early in a run)")
    ap.add_argument("--teach-ops", type=int, metavar="N",
                    help="at most N work dirs of the other families per state (a quick run: the smoke test)")
    ap.add_argument("--out", type=Path, help="also write the table here")
    args = ap.parse_args()

    from tvm.s_tir import meta_schedule as ms

    from core.codegen.generate import cuda_target
    from core.tuning.costmodel import TrialGroup, family_of_dir, ms_tune_context, recorded_trials

    target = cuda_target("sm_90")
    tmp = Path(tempfile.mkdtemp(prefix="kdb-transfer-"))
    groups: list[tuple[str, str, object]] = []  # (state, family, TrialGroup)
    for n, state in enumerate(args.state):
        root = tmp / str(n)
        with tarfile.open(state) as tar:
            tar.extractall(root, filter="data")
        other_dirs = 0
        for work_dir in sorted((root / "state" / "tuning").iterdir()):
            if family_of_dir(work_dir) != args.test:
                other_dirs += 1
                if args.teach_ops is not None and other_dirs > args.teach_ops:
                    continue
            for group in recorded_trials(work_dir, target).groups:
                groups.append((state.name, family_of_dir(work_dir), group))
    tests = [(s, g) for s, f, g in groups if f == args.test]
    if not tests:
        print(f"no {args.test} work dir in the states", file=sys.stderr)
        return 1
    if len(tests) > 1:  # all states' trials of the op in one ranking: regions one run's search never visited
        first = tests[0][1]
        tests.append(("all states", TrialGroup(first.workload, [c for _, g in tests for c in g.candidates],
                                               [r for _, g in tests for r in g.results])))

    def measured(group: object) -> list[float]:  # us; failed trials as +inf
        return [min(float(s) for s in r.run_secs) * 1e6 if r.run_secs else math.inf for r in group.results]  # type: ignore[attr-defined]

    models: dict[tuple[int, ...], object] = {}

    def model_from(teach: list[object]) -> object:  # one model per set of teaching groups (features cost)
        key = tuple(sorted(id(g) for g in teach))
        if key not in models:
            models[key] = ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=2)
            for group in teach:
                models[key].update(ms_tune_context(group.workload.mod, target, 2), group.candidates,
                                   group.results)
        return models[key]

    others = [g for _, f, g in groups if f != args.test]
    # built once: model_from knows a set of groups by their ids
    early = [TrialGroup(g.workload, g.candidates[:args.early], g.results[:args.early]) for g in others]
    teachers = {
        f"other families ({', '.join(sorted({f for _, f, _ in groups if f != args.test}))})": lambda state: others,
        f"the first {args.early} trials of each other op": lambda state: early,
        f"{args.test} of the other states": lambda state: [g for s, f, g in groups if f == args.test and s != state],
        "all but the test trials": lambda state: [g for s, f, g in groups if not (f == args.test and s == state)],
    }
    lines = [f"test: the {args.test} trials of each state, ranked by a model taught from the rest",
             f"{'state':<14} {'teacher':<48} {'trials':>6} {'taught':>6} {'spearman':>8} "
             f"{'top16 best':>10} {'top64 best':>10} {'random16':>9} {'random64':>9} {'best us':>8}"]
    rng = random.Random(0)
    for state, group in tests:
        times = measured(group)
        finite = [t for t in times if math.isfinite(t)]
        best = min(finite)

        for label, teach_for in teachers.items():
            teach = teach_for(state)
            if not teach or (state == "all states" and not label.startswith(("other families", "the first"))):
                continue  # the union's own trials would teach the model what it is asked
            model = model_from(teach)
            scores = list(model.predict(ms_tune_context(group.workload.mod, target, 2), group.candidates))
            order = sorted(range(len(times)), key=lambda i: -scores[i])
            pairs = [(scores[i], 1 / times[i]) for i in range(len(times)) if math.isfinite(times[i])]
            rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
            top16, top64 = min(times[i] for i in order[:16]), min(times[i] for i in order[:64])
            taught = sum(len(g.candidates) for g in teach)
            lines.append(f"{state:<14} {label[:48]:<48} {len(times):>6} {taught:>6} {rho:>8.2f} {top16:>10.1f} "
                         f"{top64:>10.1f} {expected_best(times, 16, rng):>9.1f} "
                         f"{expected_best(times, 64, rng):>9.1f} {best:>8.1f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a tuning host's CPU goes, across every process: the question the phase clock cannot answer.

The phase clock of bench_tune times each process's own phases in wall time, but MetaSchedule's search and
XGBoost run on threads, builds in a pool of worker processes, the nvcc check in subprocesses, and four
tuning processes share one host. This samples /proc every few seconds (Linux only):

    python3 bench/host_load.py sample --out LOAD.jsonl [--every 5]     # until killed
    python3 bench/host_load.py summary LOAD.jsonl [--trials N]         # a table, and CPU s per trial

Each sample: the host's busy share since the last one, and each live process's own CPU seconds (user +
system) with its kind: tuning processes (search, cost model, set-up, code generation), TVM's build workers,
GPU children, the rest. Kinds are told apart by command line. The summary charges each process what it used
while sampled, up to its last sample, so one that ends takes nothing back; what no sample saw (processes
shorter than the interval, such as the nvcc checks, and the last seconds of those that ended) is the
"unattributed" line, from the host's own busy count.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

KINDS = (("build workers", "tvm.exec.popen_worker"), ("GPU children", "core.gpu.worker"),
         ("tuning processes", "bench_tune.py"))
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def host_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def kind_of(cmdline: str) -> str:
    return next((kind for kind, needle in KINDS if needle in cmdline), "other")


def process_seconds() -> dict[str, list]:
    """Each live process's kind and own CPU seconds (user + system), by pid. Reaped children's seconds are left
    out: they are their own processes' (a build worker's, an nvcc check's), and counting them again in the
    parent, as a process's total does once it has waited for them, charged them twice."""
    procs: dict[str, list] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended between listing and reading
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        procs[entry.name] = [kind_of(cmdline), round(sum(int(x) for x in fields[11:13]) / TICK, 2)]  # utime stime
    return procs


def sample(out: Path, every: float) -> None:
    last = host_ticks()
    with out.open("a") as f:
        while True:
            time.sleep(every)
            now = host_ticks()
            busy = (now[0] - last[0]) / max(1, now[1] - last[1])
            last = now
            f.write(json.dumps({"t": time.time(), "busy": round(busy, 4), "cpus": os.cpu_count(),
                                "procs": process_seconds()}) + "\n")
            f.flush()


def by_kind(samples: list[dict]) -> dict[str, float]:
    """CPU seconds each kind used between the first and the last sample: for each process, its last sampled
    seconds less those at the first sample (none if it started later)."""
    first = samples[0]["procs"]
    last_seen: dict[str, list] = {}
    for s in samples[1:]:
        for pid, (kind, seconds) in s["procs"].items():  # a pid reused by a later process: the later one's figures
            seen = last_seen.get(pid)
            if kind == "other" and seen is not None and seen[0] != "other" and seen[1] <= seconds:
                kind = seen[0]  # the same process ended and not yet reaped: a zombie has no command line
            last_seen[pid] = [kind, seconds]
    totals: dict[str, float] = {}
    for pid, (kind, seconds) in last_seen.items():
        before = first[pid][1] if pid in first and first[pid][0] == kind and first[pid][1] <= seconds else 0.0
        totals[kind] = totals.get(kind, 0.0) + seconds - before
    return totals


def summary(path: Path, trials: int | None) -> None:
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if len(samples) < 2:
        print(f"{path}: fewer than two samples")
        return
    if any("procs" not in s for s in samples):
        print(f"{path}: written by an older host_load (totals by kind, which lost the seconds of processes that "
              "ended): not summarised")
        return
    span = samples[-1]["t"] - samples[0]["t"]
    cpus = samples[0].get("cpus") or os.cpu_count() or 1  # the sampled host's (older files: this one's)
    busy = sum(s["busy"] for s in samples[1:]) / (len(samples) - 1)
    print(f"{len(samples)} samples over {span:.0f} s; host busy {busy:.0%} of {cpus} CPUs on average")
    print(f"{'kind':<18} {'CPU s':>9} {'cores':>6}" + (f" {'CPU s/trial':>12}" if trials else ""))
    totals = by_kind(samples)
    busy_s = sum(b["busy"] * (b["t"] - a["t"]) * cpus for a, b in itertools.pairwise(samples))
    totals["unattributed"] = max(0.0, busy_s - sum(totals.values()))
    for kind in sorted(totals, key=lambda k: (k == "unattributed", k)):
        seconds = totals[kind]
        line = f"{kind:<18} {seconds:>9.1f} {seconds / span:>6.1f}"
        print(line + (f" {seconds / trials:>12.2f}" if trials else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--every", type=float, default=5.0)
    m = sub.add_parser("summary")
    m.add_argument("path", type=Path)
    m.add_argument("--trials", type=int)
    args = ap.parse_args()
    if not Path("/proc/stat").exists():
        sys.exit("host_load needs Linux's /proc")
    if args.action == "sample":
        sample(args.out, args.every)
    else:
        summary(args.path, args.trials)


if __name__ == "__main__":
    main()

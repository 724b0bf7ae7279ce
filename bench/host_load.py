"""Where a tuning host's CPU goes, across every process: the question the phase clock cannot answer.

The phase clock of bench_tune times each process's own phases in wall time, but MetaSchedule's search and
XGBoost run on threads, builds in a pool of worker processes, the nvcc check in subprocesses, and four
tuning processes share one host. This samples /proc every few seconds (Linux only):

    python3 bench/host_load.py sample --out LOAD.jsonl [--every 5]     # until killed
    python3 bench/host_load.py summary LOAD.jsonl [--trials N]         # a table, and CPU s per trial

Each sample: the host's busy share since the last one, and the CPU seconds of the live processes by kind:
tuning processes (search, cost model, set-up, code generation; with their reaped children, the nvcc
checks), TVM's build workers, GPU children, the rest. Kinds are told apart by command line.
"""

from __future__ import annotations

import argparse
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


def process_seconds() -> dict[str, float]:
    """CPU seconds (user + system, and reaped children's) of the live processes, summed by kind."""
    totals: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:  # the process ended between listing and reading
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        kind = kind_of(cmdline)
        totals[kind] = totals.get(kind, 0.0) + ticks / TICK
    return totals


def sample(out: Path, every: float) -> None:
    last = host_ticks()
    with out.open("a") as f:
        while True:
            time.sleep(every)
            now = host_ticks()
            busy = (now[0] - last[0]) / max(1, now[1] - last[1])
            last = now
            f.write(json.dumps({"t": time.time(), "busy": round(busy, 4), "cpu_s": process_seconds()}) + "\n")
            f.flush()


def summary(path: Path, trials: int | None) -> None:
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if len(samples) < 2:
        print(f"{path}: fewer than two samples")
        return
    first, last = samples[0], samples[-1]
    span = last["t"] - first["t"]
    busy = sum(s["busy"] for s in samples[1:]) / (len(samples) - 1)
    print(f"{len(samples)} samples over {span:.0f} s; host busy {busy:.0%} of {os.cpu_count()} CPUs on average")
    print(f"{'kind':<18} {'CPU s':>9} {'cores':>6}" + (f" {'CPU s/trial':>12}" if trials else ""))
    # A process that ended in between takes its seconds with it: the deltas undercount short-lived ones.
    for kind in sorted(set(first["cpu_s"]) | set(last["cpu_s"])):
        seconds = last["cpu_s"].get(kind, 0.0) - first["cpu_s"].get(kind, 0.0)
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

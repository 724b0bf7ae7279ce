"""Makes, on the CPU, what the device plan (docs/BENCHMARKS.md) takes from the earlier sessions' tuning results
(bench/results/h100/session{27,28,30}/1-tune.tgz). A checkout starts without .device/ and .netrun/ (git-excluded), so
each device session remakes them first (bench/device_ready.sh runs this).
- .device/seed/<part>/<op>-<hash>/ (h100_tune.sh's SEED): each op of bench/tune_parts.sh's lists, its work dir
  (MetaSchedule's records, kdb's features) out of the newest tgz that holds it: `kdb tune` goes on from those trials.
- with --tuned-dbs, .netrun/carry/{resnet50,bert2,bert12}-tuned.db (h100_tensorcore.sh graph's GRAPH_NETS): copies
  of the fp16 DBs `h100_tensorcore.sh prep` wrote, each op's newest tuned kernel injected in place of its row
  (convolutions into ResNet-50's, Dots into BERT's; BERT-12 runs BERT-2's ops).

    python3 bench/device_seed.py [--out .device/seed] [--tuned-dbs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.opconfigs.opconfig import read_opconfigs  # noqa: E402
from core.tuning.job import TuneJob  # noqa: E402

# newest first: an op tuned again in a later session has more records there
RESULTS = [ROOT / f"bench/results/h100/session{n}/1-tune.tgz" for n in (30, 28, 27)]
PARTS = ("bert", "conv1", "conv2")


def work_dir_names(lists: Path, part: str) -> list[str]:
    """The work dirs `kdb tune --arch sm_90` gives the part's ops (core/tuning/job.py names them)."""
    return [TuneJob(c, 1, "cuda", "sm_90").directory(Path(".")).name
            for c in read_opconfigs(lists / f"{part}.txt").configs]


def newest_kernels(tar: tarfile.TarFile, skip: set[str]) -> dict[str, tarfile.TarInfo]:
    """Each work dir's newest kernels-<time>.json in tune/<part>/state/tuning/<op>/, but the ops in `skip`."""
    newest: dict[str, tarfile.TarInfo] = {}
    for m in tar.getmembers():
        parts = Path(m.name).parts
        if not (m.isfile() and len(parts) == 6 and parts[2:4] == ("state", "tuning")
                and parts[5].startswith("kernels-") and parts[4] not in skip):
            continue
        if parts[4] not in newest or parts[5] > Path(newest[parts[4]].name).name:
            newest[parts[4]] = m
    return newest


def tuned_dbs(carry: Path) -> int:
    """The -tuned DBs: each op's newest best kernel JSON (the newest session's) injected with --replace."""
    for net in ("resnet50", "bert2"):
        if not (carry / f"{net}.db").is_file():
            print(f"{carry / net}.db: missing (bash bench/h100_tensorcore.sh prep writes it)", file=sys.stderr)
            return 1
        shutil.copyfile(carry / f"{net}.db", carry / f"{net}-tuned.db")
    seen: set[str] = set()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for tgz in RESULTS:
            with tarfile.open(tgz) as tar:
                for op, m in sorted(newest_kernels(tar, seen).items()):
                    seen.add(op)
                    kernels = Path(tmp) / f"{op}.json"
                    source = tar.extractfile(m)
                    assert source is not None
                    kernels.write_bytes(source.read())
                    db = carry / ("bert2-tuned.db" if op.startswith("dot-") else "resnet50-tuned.db")
                    done = subprocess.run([sys.executable, "-m", "console.entry", "inject", str(kernels), "--replace",
                                           "--db", str(db)], cwd=ROOT, capture_output=True, text=True,
                                          env={**os.environ, "KDB_STATE_DIR": str(Path(tmp) / "state")})
                    failed += done.returncode != 0
                    said = [line for line in done.stdout.splitlines() if line.startswith("done:")] or [done.stderr]
                    print(f"{db.name} <- {op} ({tgz.parent.name}): exit {done.returncode}, {said[0].strip()}")
    shutil.copyfile(carry / "bert2-tuned.db", carry / "bert12-tuned.db")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / ".device/seed")
    parser.add_argument("--tuned-dbs", action="store_true", help="also the -tuned DBs in .netrun/carry")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lists = Path(tmp)
        subprocess.run(["bash", str(ROOT / "bench/tune_parts.sh"), str(lists)], check=True)
        wanted = {name: part for part in PARTS for name in work_dir_names(lists, part)}
    missing = dict(wanted)
    for tgz in RESULTS:
        with tarfile.open(tgz) as tar:
            members = tar.getmembers()
            for name in [n for n in missing if any(f"/state/tuning/{n}/" in m.name for m in members)]:
                part = missing.pop(name)
                dest = args.out / part / name
                for m in members:
                    _, found, rest = m.name.partition(f"/state/tuning/{name}/")
                    if found and m.isfile() and ".." not in rest:
                        target = dest / rest
                        target.parent.mkdir(parents=True, exist_ok=True)
                        source = tar.extractfile(m)
                        assert source is not None
                        target.write_bytes(source.read())
                records = dest / "database_tuning_record.json"
                count = sum(1 for _ in records.open()) if records.exists() else 0
                print(f"{part}/{name}: {count} records, from {tgz.relative_to(ROOT)}")
    for name, part in missing.items():
        print(f"{part}/{name}: in none of {', '.join(str(t.relative_to(ROOT)) for t in RESULTS)}", file=sys.stderr)
    status = tuned_dbs(ROOT / ".netrun/carry") if args.tuned_dbs else 0
    return 1 if missing else status


if __name__ == "__main__":
    sys.exit(main())

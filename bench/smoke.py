"""Every benchmark script end to end at small sizes: `make bench-smoke`, and tests/test_bench_smoke.py.

    .venv/bin/python bench/smoke.py [--out DIR]      # results in DIR (default $TMPDIR/kdb-bench)

Injection and browsing run at small sizes; the figures in docs/BENCHMARKS.md come from full runs. Each
script's own output (and error) goes straight to this one's. About 2 minutes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def runs(out: Path) -> list[list[str]]:
    return [
        ["bench_inject.py", "--sizes", "100", "300", "--nvcc-kernels", "4", "--json", str(out / "inject.json")],
        ["bench_browse.py", "--sizes", "2000", "5000", "--reps", "1", "--dir", str(out / "browse"),
         "--json", str(out / "browse.json")],
        ["bench_codegen.py", "--json", str(out / "codegen.json")],
        ["bench_extract.py", "--json", str(out / "extract.json")],
        ["bench_default_schedules.py", "build", str(out / "default_schedules")],  # its `time` step needs a GPU
        ["bench_cli.py", "--rows", "2000", "--runs", "1", "--dir", str(out / "cli"), "--console-rows", "2000",
         "--console-runs", "1", "--console-dir", str(out / "browse"), "--json", str(out / "cli.json")],
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "kdb-bench", help="results folder")
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for script, *args in runs(out):
        print(f"== {script} {' '.join(args)}", flush=True)
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=BENCH.parent, check=False)
        if proc.returncode != 0:
            sys.exit(f"bench-smoke: {script} exited {proc.returncode} (its error is above)")
        print(f"== {script}: ok in {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()

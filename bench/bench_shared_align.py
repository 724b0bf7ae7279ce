"""Does the shared arrays' alignment explain the rows that run slower than their own tuning record?

    python3 bench/bench_shared_align.py --db bench/results/h200/session11/7-tuned.db.gz          # PTX only
    python3 bench/bench_shared_align.py --db bench/results/h200/session11/7-tuned.db.gz --gpu    # + H200 times

NNFusion declares a row's shared arrays from its `shared_memory` as `__shared__ float name[N];`, where TVM's
kernel said `__shared__ alignas(64) float name[N];`. Without the alignment nvcc cannot merge neighbouring
shared loads into 128-bit ones (docs/BENCHMARKS-HISTORY.md, eleventh session, section 3). For every distinct kernel of
the DB this compiles three forms of the same code and counts the vector loads in the PTX:

    nnfusion          the row exactly as NNFusion compiles it (core.cuda.nvcc.standalone_source)
    aligned           the row as `kdb db repair` leaves it (and injection writes it since 1f8bb1c): each shared
                      array declared with the alignment its code asked for, `__align__(64) name`
    aligned+restrict  and `__restrict__` on the pointer parameters, as TVM writes them (ld.global.nc)

With --gpu each form is compiled to a cubin here (nvcc, the device's arch), verified against float64 numpy and
timed by the GPU child (core/gpu/worker.py: the timing of every profile), one form after the other per row.
The table gives each form's microseconds and the ratio aligned / nnfusion; the row's injection profile is
there to compare. Without --gpu no time is printed ("not measured").
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FORMS = ("nnfusion", "aligned", "aligned+restrict")
KERNEL = "kdb_kernel"


def form_source(row: Any, form: str) -> str:
    """The row's kernel as NNFusion compiles it alone, changed as `form` says."""
    from core.cuda.nvcc import standalone_source
    from core.db.realign import realigned_function

    function = json.loads(row.function)
    if form in ("aligned", "aligned+restrict"):  # the row as `kdb db repair` (and injection, now) writes it
        function = realigned_function(row) or function
        # ...which since the twelfth session adds __restrict__ too: "aligned" is the alignment alone
        function = {**function, "function_signature": function["function_signature"].replace("__restrict__ ", "")}
    source = standalone_source(function, KERNEL)
    if form == "aligned+restrict":
        head, rest = source.split("\n{", 1)  # the signature, then the body
        source = re.sub(r"(\w+)\s*\*\s*(input|output)(\d+)", r"\1* __restrict__ \2\3", head) + "\n{" + rest
    return source


def ptx_text(source: str, arch: str, nvcc: str, work: Path) -> str:
    """The PTX nvcc -O3 makes of one translation unit (in `work`, which the caller owns)."""
    src = work / "k.cu"
    src.write_text(source, encoding="utf-8")
    subprocess.run([nvcc, f"-arch={arch}", "-ptx", "-O3", "-w", "-o", str(work / "k.ptx"), str(src)], check=True,
                   capture_output=True, timeout=300)
    return (work / "k.ptx").read_text()


def ptx_counts(source: str, arch: str, nvcc: str, work: Path) -> dict[str, int]:
    ptx = ptx_text(source, arch, nvcc, work)
    return {"v4": ptx.count("ld.shared.v4"), "v2": ptx.count("ld.shared.v2"),
            "scalar": len(re.findall(r"ld\.shared\.(?:f32|u32|b32)", ptx)), "nc": ptx.count("ld.global.nc")}


def open_db(path: Path, work: Path) -> Path:
    if path.suffix != ".gz":
        return path
    plain = work / path.stem
    with gzip.open(path) as src, plain.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return plain


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, required=True, help="a kernel DB (.db, or .db.gz)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--gpu", action="store_true", help="verify and time each form on the GPU")
    ap.add_argument("--out", type=Path, help="the results as JSON")
    args = ap.parse_args()

    from core.cuda.nvcc import compile_source, find_nvcc
    from core.db.kernel_db import KernelDB
    from core.gpu.jobs import GpuSession, job_for_row, require_gpu
    from core.kernels.kernel_row import distinct_kernels

    if args.gpu:
        print(f"GPU: {require_gpu()}")  # no GPU, or no pycuda on the path (`. /tmp/kdb-device/env.sh`): say so now
    nvcc = find_nvcc()
    work = Path(tempfile.mkdtemp(prefix="kdb-shared-align-"))
    results: list[dict[str, Any]] = []
    session = GpuSession(timeout_s=120) if args.gpu else None
    try:
        with KernelDB.open(open_db(args.db, work)) as db:
            rows = [r for r in distinct_kernels(db.iter_rows()) if r.device_type == "CUDA_GPU"]
            # nvcc is the slow part (two compiles per form, 3 forms per row): all of them at once in nvcc
            # processes, one per core; the GPU then verifies and times one form after the other
            def build(task: tuple[int, str]) -> tuple[dict[str, int], Any]:
                index, form = task
                source = form_source(rows[index], form)
                own = work / f"{index}-{FORMS.index(form)}"
                own.mkdir()
                built = compile_source(source, args.arch, nvcc=nvcc, workdir=own) if session is not None else None
                return ptx_counts(source, args.arch, nvcc, own), built

            tasks = [(i, form) for i in range(len(rows)) for form in FORMS]
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
                compiled = dict(zip(tasks, pool.map(build, tasks), strict=True))
            for index, row in enumerate(rows):
                miscs = json.loads(row.miscs or "{}")
                name = miscs.get("kdb", {}).get("name", row.key[:20])
                profile = next(iter(miscs.get("kdb", {}).get("profile", {}).values()), {}).get("us")
                entry: dict[str, Any] = {"name": name, "profile_us": profile, "forms": {}}
                for form in FORMS:
                    counts, built = compiled[(index, form)]
                    timed: dict[str, Any] = {"us": None, "error": "not measured"}
                    if session is not None:
                        if not built.ok:
                            timed = {"us": None, "error": built.error}
                        else:
                            job = {**job_for_row(row, "verify"), "source": built.source, "kernel": KERNEL,
                                   "cubins": {args.arch: base64.b64encode(built.cubin).decode("ascii")},
                                   "cubin_kernel": KERNEL}
                            verified = session.run(job)
                            timed = {"us": None, "error": verified.reason, "max_rel_error": verified.max_rel_error}
                            if verified.ok:
                                t = session.run({**job, "kind": "time"})
                                timed = {"us": t.microseconds if t.ok else None, "error": t.reason,
                                         "max_rel_error": verified.max_rel_error}
                    entry["forms"][form] = {**counts, **timed}
                results.append(entry)
                print_row(entry, flush=True)
    finally:
        if session is not None:
            session.close()
        shutil.rmtree(work, ignore_errors=True)
    summarize(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


def _us(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else "       -"


HEADER_PRINTED = False


def print_row(entry: dict[str, Any], *, flush: bool = False) -> None:
    global HEADER_PRINTED
    if not HEADER_PRINTED:
        print(f"{'kernel':52s} {'profile':>8s} " + " ".join(f"{f:>22s}" for f in FORMS) + "  aligned/nnfusion")
        print(f"{'':52s} {'us':>8s} " + " ".join(f"{'us  v4/v2/scalar/nc':>22s}" for _ in FORMS))
        HEADER_PRINTED = True
    cells = []
    for form in FORMS:
        f = entry["forms"][form]
        cells.append(f"{_us(f['us'])} {f['v4']:4d}/{f['v2']}/{f['scalar']}/{f['nc']}".rjust(22))
    a, n = entry["forms"]["aligned"]["us"], entry["forms"]["nnfusion"]["us"]
    ratio = f"{a / n:.2f}" if a and n else "not measured"
    print(f"{entry['name'][:52]:52s} {_us(entry['profile_us'])} " + " ".join(cells) + f"  {ratio}", flush=flush)
    for form in FORMS:
        error = entry["forms"][form].get("error")
        if error and error != "not measured":
            print(f"    {form}: {error}")


def summarize(results: list[dict[str, Any]]) -> None:
    import math

    pairs = [(e["forms"]["aligned"]["us"], e["forms"]["nnfusion"]["us"]) for e in results]
    pairs = [(a, n) for a, n in pairs if a and n]
    gained = sum(1 for e in results if e["forms"]["aligned"]["v4"] > e["forms"]["nnfusion"]["v4"])
    print(f"{len(results)} kernels; {gained} get 128-bit shared loads back with aligned arrays")
    if pairs:
        geo = math.exp(sum(math.log(a / n) for a, n in pairs) / len(pairs))
        print(f"aligned / nnfusion on the GPU: geometric mean {geo:.3f}x over {len(pairs)} kernels")
    else:
        print("GPU times: not measured (run with --gpu on a GPU host)")


if __name__ == "__main__":
    main()

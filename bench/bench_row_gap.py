"""Why does a row run slower than the tuning record it came from? Time the steps between them apart.

    python3 bench/bench_row_gap.py --state bench/results/h200/session12/7-state.tgz \
        --db bench/results/h200/session12/7-tuned.db.gz                  # compile and count only (any machine)
    python3 bench/bench_row_gap.py --state ... --db ... --gpu [--only 512x256]   # + H200 times

In session 12 three rows ran 1.3-3x the time MetaSchedule measured for their record (docs/BENCHMARKS-HISTORY.md,
twelfth session, section 2). Between the record and the row lie: the compiler (the tuner builds TVM's source
with NVRTC and TVM's options, `--use_fast_math` and ptxas `--register-usage-level=10`; NNFusion's project and our
GPU jobs use nvcc), the row's form (no `__restrict__`, `__launch_bounds__` of the row's block, shared arrays
re-declared from `shared_memory`, and for a partial-warp block the padding: idle threads that run the barriers
as non-aligned `barrier.sync`), and the timing method (MetaSchedule's runner against our GPU child).

For the newest kernel JSON of each op in a tuning state dir (what the last job generated from the op's best
record) and the DB row injected from it, four forms go through the same GPU child, one method:

    record-nvrtc    TVM's source, TVM's own NVRTC compile (what the tuner timed), TVM's block
    record-nvcc     TVM's source, nvcc -O3 (NNFusion's compiler), TVM's block
    row+restrict    the row as NNFusion compiles it alone, with `__restrict__` on its pointers
    row             the row as NNFusion compiles it alone (what the profile timed)
    row-whole-warps the row today's generation makes of the same record (core/codegen/whole_warps.py: a
                    partial last warp padded in the schedule, aligned barriers; `__restrict__`)

record-nvrtc against the record's own figure says whether the timing methods agree; record-nvcc against
record-nvrtc what the compiler costs; row against record-nvcc what the row's form costs; row-whole-warps
against row what padding in the schedule instead of the text wins back. Without --gpu nothing
is timed ("not measured"); registers (nvcc forms) and barrier/`.nc` counts (PTX) are printed either way.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import shutil
import sys
import tarfile
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

FORMS = ("record-nvrtc", "record-nvcc", "row+restrict", "row", "row-whole-warps")
KERNEL = "kdb_kernel"
TVM_LOCK = threading.Lock()  # TVM's operator definitions keep a global tag scope: one thread at a time


def tuning_dirs(state: Path, work: Path) -> list[Path]:
    """The op folders of a tuning state (a folder, or the state.tgz `h200_network.sh` writes)."""
    if state.is_file():
        with tarfile.open(state) as tar:
            tar.extractall(work / "state", filter="data")
        state = work / "state"
    root = next((p for p in (state / "state" / "tuning", state / "tuning", state) if p.is_dir()
                 and any(p.glob("*/database_tuning_record.json"))), None)
    if root is None:
        raise SystemExit(f"{state}: no tuning records (*/database_tuning_record.json) found")
    return sorted(p for p in root.iterdir() if (p / "database_tuning_record.json").is_file())


def best_record_us(op_dir: Path) -> float | None:
    """The fastest successful measurement among the op's records (MetaSchedule's runner), in microseconds."""
    from core.tuning.records import recorded_runs

    times = [t for t in recorded_runs(op_dir) if t is not None]
    return min(times) * 1e6 if times else None


def injected_best_kernel(op_dir: Path, rows: list[Any]) -> tuple[str, dict[str, Any], Any] | None:
    """(file#index, item, row) for the newest best-role kernel of the op that has a row in the DB. A job whose
    kernel was already there ("unchanged": the same code, the same Key) left the older file's row."""
    for path in sorted(op_dir.glob("kernels-*.json"), reverse=True):
        for index, item in enumerate(json.loads(path.read_text())):
            if "_best_" in item.get("tvm_func_name", ""):
                row = row_for(rows, f"{path.name}#{index}", item["tvm_func_name"])
                if row is not None:
                    return f"{path.name}#{index}", item, row
    return None


def row_for(rows: list[Any], origin: str, name: str) -> Any | None:
    for row in rows:
        kdb = json.loads(row.miscs or "{}").get("kdb", {})
        if kdb.get("from") == origin and kdb.get("name") == name:
            return row
    return None


def counts(source: str, arch: str, nvcc: str, work: Path) -> dict[str, int]:
    from bench_shared_align import ptx_text

    ptx = ptx_text(source, arch, nvcc, work)
    return {"bar_aligned": len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\.aligned\b", ptx)),
            "bar_nonaligned": len(re.findall(r"\bbarrier\.sync\s", ptx)),
            "nc": ptx.count("ld.global.nc")}


def nvrtc_cubin(code: str, arch: str) -> bytes:
    """TVM's source built the way the tuner's build workers built it: TVM's NVRTC compile and options, on the
    program without libcu++ (core.tuning.nvrtc; the same PTX as TVM's own program, tests/test_nvrtc.py)."""
    from tvm.support import nvcc as tvm_nvcc

    from core.tuning.nvrtc import lighter_programs

    with lighter_programs():
        return bytes(tvm_nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc"))


def tvm_kernel_name(code: str) -> str:
    match = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", code)
    if match is None:
        raise ValueError("no __global__ function in TVM's source")
    return match.group(1)


def tvm_params_in_row_order(code: str, name: str) -> bool:
    """Does TVM's kernel take its pointers in the row's order (inputs, then outputs)? The GPU child passes them
    that way; generate() renames them so, but a kernel JSON from elsewhere may not."""
    head = code[code.index(name):].split(")", 1)[0]
    names = re.findall(r"\b(input\d+|output\d+|compute\w*|T_\w+)\s*(?:,|$)", head + ",")
    canonical = sorted((n for n in names if n.startswith("input")), key=lambda n: int(n[5:])) + \
        sorted((n for n in names if n.startswith("output")), key=lambda n: int(n[6:]))
    return names == canonical


def regenerated_row(op_dir: Path, item: dict[str, Any], arch: str) -> Any:
    """The row today's generation and injection make of the op's best record (the kernel JSON `item` names
    the op): what the twelfth session's record would give now. InputError when it gives none."""
    from core.errors import InputError
    from core.inject.prepare import prepare
    from core.opconfigs.opconfig import OpConfig
    from core.tuning.harvest import best_kernels
    from core.tuning.job import TuneJob

    config = OpConfig(item["op_type"], item["parameters"])
    job = TuneJob(config, trials=1, target="cuda", arch=arch, work_dir=op_dir)
    kernel = best_kernels(job, op_dir, check=False).kernels["best"]
    prepared = prepare("regenerated", 0, kernel)
    if prepared.row is None:
        raise InputError(f"the regenerated kernel gives no row: {prepared.failure}")
    return prepared.row


def build_forms(op_dir: Path, row: Any, item: dict[str, Any], arch: str, nvcc: str, work: Path,
                gpu: bool) -> dict[str, dict[str, Any]]:
    """Each form's source, launch, cubin (for --gpu) and PTX counts. A form that cannot be built says why."""
    from bench_shared_align import form_source

    from core.cuda.nvcc import compile_source
    from core.errors import InputError

    code, name = item["code"], tvm_kernel_name(item["code"])
    try:
        with TVM_LOCK:
            whole = regenerated_row(op_dir, item, arch)
        launch = json.loads(whole.function)
        whole_form: tuple[str, str, Any, Any] | str = (form_source(whole, "nnfusion"), KERNEL, launch["grid_dim"],
                                                       launch["block_dim"])
    except InputError as exc:
        whole_form = f"not generated: {exc}"
    sources = {
        "record-nvrtc": (code, name, item["gridDim"], item["blockDim"]),
        "record-nvcc": (code, name, item["gridDim"], item["blockDim"]),
        "row+restrict": (form_source(row, "aligned+restrict"), KERNEL, None, None),
        "row": (form_source(row, "nnfusion"), KERNEL, None, None),
        "row-whole-warps": whole_form,
    }
    forms: dict[str, dict[str, Any]] = {}
    for form, built_from in sources.items():
        if isinstance(built_from, str):
            forms[form] = {"kernel": None, "grid": None, "block": None, "source": "", "us": None,
                           "error": built_from, "registers": None}
            continue
        source, kernel, grid, block = built_from
        own = work / f"{op_dir.name}-{FORMS.index(form)}"
        own.mkdir(parents=True)
        entry: dict[str, Any] = {"kernel": kernel, "grid": grid, "block": block, "source": source, "us": None,
                                 "error": "not measured", "registers": None}
        if form.startswith("record") and not tvm_params_in_row_order(code, name):
            forms[form] = {**entry, "error": "TVM's pointers are not in the row's order: not run"}
            continue
        entry.update(counts(source, arch, nvcc, own))
        if form == "record-nvrtc":
            if gpu:
                try:
                    entry["cubin"] = nvrtc_cubin(source, arch)
                except (RuntimeError, ImportError) as exc:  # what TVM's NVRTC compile raises (core.tuning.nvrtc)
                    entry["error"] = f"NVRTC: {str(exc).splitlines()[0][:200]}"
        else:
            built = compile_source(source, arch, nvcc=nvcc, workdir=own)
            entry["registers"] = max((k.registers or 0 for k in built.kernels.values()), default=None)
            if not built.ok:
                entry["error"] = f"nvcc: {built.error[:200]}"
            elif gpu:
                entry["cubin"] = built.cubin
        forms[form] = entry
    return forms


def time_forms(session: Any, row: Any, forms: dict[str, dict[str, Any]], arch: str) -> None:
    from core.gpu.jobs import job_for_row

    base = job_for_row(row, "verify")
    for entry in forms.values():
        if not entry.get("cubin"):
            continue
        job = {**base, "source": entry["source"], "kernel": entry["kernel"], "cubin_kernel": entry["kernel"],
               "cubins": {arch: base64.b64encode(entry["cubin"]).decode("ascii")}}
        if entry["grid"] is not None:
            job.update(grid=entry["grid"], block=entry["block"])
        verified = session.run(job)
        entry.update(error=verified.reason, max_rel_error=verified.max_rel_error)
        if verified.ok:
            timed = session.run({**job, "kind": "time"})
            entry.update(us=timed.microseconds if timed.ok else None, error=timed.reason)


def _us(value: float | None) -> str:
    return f"{value:7.1f}" if value is not None else "      -"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=Path, required=True, help="a tuning state dir, or its state.tgz")
    ap.add_argument("--db", type=Path, required=True, help="the kernel DB the rows went into (.db or .db.gz)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--only", default="", help="only ops whose kernel name or folder holds this text")
    ap.add_argument("--gpu", action="store_true", help="verify and time each form on the GPU")
    ap.add_argument("--out", type=Path, help="the results as JSON")
    args = ap.parse_args()

    from bench_shared_align import open_db

    from core.cuda.nvcc import find_nvcc
    from core.db.kernel_db import KernelDB
    from core.gpu.jobs import GpuSession, require_gpu

    if args.gpu:
        print(f"GPU: {require_gpu()}", flush=True)
    nvcc = find_nvcc()
    work = Path(tempfile.mkdtemp(prefix="kdb-row-gap-"))
    results: list[dict[str, Any]] = []
    try:
        with KernelDB.open(open_db(args.db, work)) as db:
            rows = [r for r in db.iter_rows() if r.device_type == "CUDA_GPU"]
            ops = []
            for op_dir in tuning_dirs(args.state, work):
                found = injected_best_kernel(op_dir, rows)
                if found is None:
                    print(f"{op_dir.name}: no row of the DB came from its kernel JSON")
                    continue
                origin, item, row = found
                if args.only and args.only not in item["tvm_func_name"] and args.only not in op_dir.name:
                    continue
                ops.append((op_dir, origin, item, row))

            def build(op: tuple[Path, str, dict[str, Any], Any]) -> dict[str, dict[str, Any]]:
                return build_forms(op[0], op[3], op[2], args.arch, nvcc, work, args.gpu)

            with ThreadPoolExecutor(max_workers=min(8, len(ops) or 1)) as pool:  # nvcc is the slow part
                built = list(pool.map(build, ops))
            session = GpuSession(timeout_s=120) if args.gpu else None
            try:
                print(f"{'op':44s} {'record':>7s} {'profile':>7s} " + " ".join(f"{f:>14s}" for f in FORMS)
                      + "   regs (nvcc / row / whole)  barriers al/non row, whole  .nc row+r/row")
                for (op_dir, origin, item, row), forms in zip(ops, built, strict=True):
                    if session is not None:
                        time_forms(session, row, forms, args.arch)
                    profile = next(iter(json.loads(row.miscs).get("kdb", {}).get("profile", {}).values()),
                                   {}).get("us")
                    entry = {"op": op_dir.name, "kernel": item["tvm_func_name"], "from": origin,
                             "record_us": best_record_us(op_dir), "profile_us": profile,
                             "block_tvm": item["blockDim"], "block_row": json.loads(row.function)["block_dim"],
                             "forms": {f: {k: v for k, v in e.items() if k not in ("cubin", "source")}
                                       for f, e in forms.items()}}
                    results.append(entry)
                    f = entry["forms"]
                    print(f"{item['tvm_func_name'][4:48]:44s} {_us(entry['record_us'])} {_us(profile)} "
                          + " ".join(f"{_us(f[form]['us']):>14s}" for form in FORMS)
                          + f"   {f['record-nvcc'].get('registers')} / {f['row'].get('registers')}"
                          + f" / {f['row-whole-warps'].get('registers')}"
                          + f"  {f['row'].get('bar_aligned')}/{f['row'].get('bar_nonaligned')}"
                          + f", {f['row-whole-warps'].get('bar_aligned')}/{f['row-whole-warps'].get('bar_nonaligned')}"
                          + f"  {f['row+restrict'].get('nc')}/{f['row'].get('nc')}"
                          + f"  block {entry['block_tvm'][0]}->{entry['block_row'][0]}", flush=True)
                    for form in FORMS:
                        error = f[form].get("error")
                        if error and error != "not measured":
                            print(f"    {form}: {error}")
            finally:
                if session is not None:
                    session.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summarize(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


def summarize(results: list[dict[str, Any]]) -> None:
    """Geometric means of each step, over the ops where both sides were timed."""
    steps = [("record-nvrtc", "record (MetaSchedule's runner)", None),
             ("record-nvcc", "record-nvrtc", "record-nvrtc"), ("row", "record-nvcc", "record-nvcc"),
             ("row+restrict", "row", "row"), ("row-whole-warps", "row", "row"),
             ("row-whole-warps", "record-nvrtc", "record-nvrtc")]
    print(f"{len(results)} ops")
    for form, label, against in steps:
        pairs = []
        for r in results:
            a = r["forms"][form]["us"]
            b = r["record_us"] if against is None else r["forms"][against]["us"]
            if a and b:
                pairs.append(a / b)
        if pairs:
            g = math.exp(sum(math.log(p) for p in pairs) / len(pairs))
            print(f"{form} / {label}: geometric mean {g:.3f}x over {len(pairs)} ops (max {max(pairs):.2f}x)")
        else:
            print(f"{form} / {label}: not measured")


if __name__ == "__main__":
    main()

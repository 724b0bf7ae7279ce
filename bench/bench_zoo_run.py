"""Issue 30's GPU target: every network of the zoo through the README's commands, then `kdb nnfusion --run`.

For each network (tests/zoo.py, built here with onnx.helper): `kdb opconfig extract`, `kdb codegen`, `kdb inject`,
then `kdb nnfusion model.onnx --run --json`, which compiles with the DB and with an empty DB, builds both with
nvcc, checks each output against ONNX Runtime and times both. Each network has its own folder, settings, state
and DB (the KDB_* variables), so several run side by side (--jobs). The rows are `kdb codegen`'s (TVM's default
schedules, not tuned): the run checks that the compiled networks are right on the GPU; their speed against the
empty DB is printed as measured, and untuned rows are not expected to win it. `--db NET=PATH` runs a network with
a DB of its own (a tuned one) instead of the codegen rows. `--leave-to-library` first times each op alone with its
row and with the library (`kdb nnfusion model.onnx --op-times times.json`), then lets the network decide which of
the rows that lost alone to set aside (`kdb nnfusion model.onnx --run --never-slower times.json`), as the README
tells a user to: the run then measures "never slower".

    python3 bench/bench_zoo_run.py --nnfusion PATH --out DIR [--jobs 3] [--nets resnet50 bert_encoder ...]
                                   [--leave-to-library]

Prints one table (network, status, max error, ms with the DB, ms empty, ratio) and writes DIR/zoo-run.json.
Exit 0 when every network ran right (status 0 or 1 for "slower" only), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

# The compiler cannot take these whatever the DB holds (tests/test_zoo.py's COMPILER_FAULTS): not run.
NOT_COMPILABLE = {"resnext_blocks", "nasnet_cell", "attention_packed"}


def kdb(work: Path, env: dict[str, str], log: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "console.entry", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)
    with log.open("a") as f:
        f.write(f"$ kdb {' '.join(args)}\n[exit {proc.returncode}]\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}\n")
    return proc


def said(proc: subprocess.CompletedProcess) -> str:
    """What a failed command said: its errors, else the end of its report (kdb prints "no CUDA GPU ..." there)."""
    return (proc.stderr.strip() or proc.stdout.strip())[-300:]


def one_network(name: str, work: Path, compiler: str, product: str, db: str | None, iterations: int,
                model: str | None = None, leave_to_library: bool = False, fp16: bool = False) -> dict:
    """NAME from the zoo (or the ONNX file MODEL) with codegen's rows (or a copy of the DB at DB); fp16: made half
    first (`kdb model fp16`, as the README tells a user)."""
    import zoo
    from onnx import save

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # one GPU lock for every network (each has its own state dir): their timed runs never overlap
    env = {**os.environ, "KDB_STATE_DIR": str(work / "state"), "KDB_CONFIG": str(work / "settings.toml"),
           "KDB_DB": str(work / "kernel_cache.db"), "KDB_GPU_LOCK": str(work.parent / "gpu0.lock"),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = work / "commands.log"
    started = time.monotonic()
    if model:
        shutil.copy(model, work / "model.onnx")
    else:
        network = zoo.ZOO[name]()
        network.ir_version = min(network.ir_version, 10)  # as exporters write; a newer onnx's 14 is past ORT 1.30's 13
        save(network, str(work / "model.onnx"))
    result: dict = {"network": name, "db": db or "codegen rows (untuned)"}
    # the README's way (the device bundle carries tomli-w when made with bench/device-wheels.txt)
    steps: list[tuple[str, ...]] = [("settings", "archs=sm_90", f"product_name={product}",
                                     f"nnfusion_path={compiler}")]
    if fp16:
        steps.append(("model", "fp16", "float.onnx", "model.onnx"))
        (work / "model.onnx").rename(work / "float.onnx")
    if db:
        shutil.copy(db, work / "kernel_cache.db")
    else:
        steps += [("opconfig", "extract", "model.onnx", "-o", "ops.txt"),
                  ("codegen", "ops.txt", "-o", "kernels.json", "--arch", "sm_90"),
                  ("inject", "kernels.json")]
    for step in steps:
        proc = kdb(work, env, log, *step)
        if proc.returncode != 0:
            result.update(status=None, problem=f"kdb {step[0]} exit {proc.returncode}: {said(proc)}")
            return result
    if leave_to_library:  # the network first with every row, then without the rows the library beats
        before = run_network(work, env, log, compiler, iterations)
        result["before_leaving"] = {k: before.get(k) for k in ("status", "median_ms", "ratio", "errors", "problem")}
        # exit 1: a row lost to the library (what the next step is for); 2: no GPU, or the ops could not be built
        proc = kdb(work, env, log, "nnfusion", "model.onnx", "--nnfusion", compiler, "--op-times", "times.json")
        if proc.returncode not in (0, 1) or not (work / "times.json").exists():
            result.update(status=None, problem=f"kdb nnfusion --op-times exit {proc.returncode}: "
                                               f"{said(proc)}")
            return result
        # the README's step: the network decides (an op slower alone is left to the library only when the network
        # runs faster without its row); `kdb db leave-to-library --apply` decided op by op and made fp16 BERT-12
        # 1.46x slower in session 28
        proc = kdb(work, env, log, "nnfusion", "model.onnx", "--nnfusion", compiler, "--run", "--never-slower",
                   "times.json", "--iterations", str(iterations), "--json")
        try:
            decided = json.loads(proc.stdout)
        except json.JSONDecodeError:
            decided = {}
        if proc.returncode not in (0, 1) or "trials" not in decided:
            result.update(status=None, problem=f"kdb nnfusion --never-slower exit {proc.returncode}: "
                                               f"{said(proc)}")
            return result
        result["left_to_library"] = [i for t in decided["trials"] if t["kept"] for i in t["identifiers"]]
        result["put_back"] = [i for t in decided["trials"] if not t["kept"] for i in t["identifiers"]]
    result.update(run_network(work, env, log, compiler, iterations))
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def run_network(work: Path, env: dict[str, str], log: Path, compiler: str, iterations: int) -> dict:
    """`kdb nnfusion model.onnx --run --json`: the network with the DB and with the empty DB, right and timed."""
    proc = kdb(work, env, log, "nnfusion", "model.onnx", "--nnfusion", compiler, "--run", "--iterations",
               str(iterations), "--json")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"status": None, "problem": f"kdb nnfusion --run exit {proc.returncode}, no JSON: {said(proc)}"}
    runs = sorted(work.glob("run*.json"))
    (work / f"run{len(runs) + 1}.json").write_text(json.dumps(report, indent=1))
    errors = {c["label"]: c["max_rel_error"] for c in report.get("contenders", [])}
    used = [c for c in report.get("contenders", []) if c["label"] == "with-db"]
    compile_report = (used[0].get("compile") or {}) if used else {}
    return dict(status=report.get("status"), findings=report.get("findings"), notes=report.get("notes"),
                device=report.get("device"), median_ms=report.get("median_ms"), ratio=report.get("ratio"),
                errors=errors, allowed=report.get("max_error_allowed"),
                rows_used=len((compile_report.get("usage") or {}).get("db_rows_used", [])),
                made_standalone=used[0]["made_standalone"] if used else [],
                problems={c["label"]: c["problem"] for c in report.get("contenders", []) if c["problem"]})


def table(results: list[dict]) -> str:
    def ms(r: dict, label: str) -> str:
        v = (r.get("median_ms") or {}).get(label)
        return f"{v:.4f}" if v else "-"

    def err(r: dict, label: str) -> str:
        v = (r.get("errors") or {}).get(label)
        return f"{v:.2e}" if v is not None else "-"

    lines = ["| network | status | rows used | error with DB | error empty DB | ms with DB | ms empty DB | ratio | s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else "-"
        lines.append(f"| {r['network']} | {r.get('status')} | {r.get('rows_used', '-')} | {err(r, 'with-db')} | "
                     f"{err(r, 'empty-db')} | {ms(r, 'with-db')} | {ms(r, 'empty-db')} | {ratio} | "
                     f"{r.get('seconds', '-')} |")
    for r in results:
        for what in ("problem", "findings", "notes", "problems", "made_standalone", "before_leaving",
                     "left_to_library", "put_back"):
            if r.get(what):
                lines.append(f"- {r['network']} {what}: {r[what]}")
    return "\n".join(lines)


def main() -> int:
    import zoo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nnfusion", required=True, help="the compiler (nnfusion binary)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--nets", nargs="*", default=[n for n in zoo.ZOO if n not in NOT_COMPILABLE])
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--product", default="NVIDIA H200")
    p.add_argument("--db", action="append", default=[], metavar="NET=PATH", help="a DB of its own for NET")
    p.add_argument("--model", action="append", default=[], nargs=3, metavar=("LABEL", "ONNX", "DB"),
                   help="also a network from an ONNX file, with a copy of the DB at DB")
    p.add_argument("--leave-to-library", action="store_true",
                   help="before the run: each op timed alone, then the README's never-slower step")
    p.add_argument("--fp16", action="store_true", help="each network made fp16 first (kdb model fp16)")
    args = p.parse_args()
    dbs = dict(item.split("=", 1) for item in args.db)
    unknown = [n for n in [*args.nets, *dbs] if n not in zoo.ZOO]
    if unknown:
        p.error(f"not in the zoo: {unknown}; the zoo: {list(zoo.ZOO)}")
    args.out.mkdir(parents=True, exist_ok=True)
    compiler = str(Path(args.nnfusion).resolve())
    runs = ([(n, n, None, None) for n in args.nets] + [(f"{n}-own-db", n, d, None) for n, d in dbs.items()]
            + [(label, label, d, m) for label, m, d in args.model])
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_network, name, args.out / folder, compiler, args.product,
                               d and str(Path(d).resolve()), args.iterations, m and str(Path(m).resolve()),
                               args.leave_to_library, args.fp16)
                   for folder, name, d, m in runs]
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except Exception as e:  # one network's crash must not hide the others' results
                results.append({"network": "?", "status": None, "problem": f"{type(e).__name__}: {e}"})
    (args.out / "zoo-run.json").write_text(json.dumps(results, indent=1))
    text = table(results)
    (args.out / "zoo-run.txt").write_text(text + "\n")
    print(text)
    # kdb nnfusion --run's own bound (it knows the DB's math: TF32 rows are judged by 1e-2, not fp32's 1e-4)
    default = 0.05 if args.fp16 else 1e-4
    return 0 if all(r.get("status") in (0, 1) and not r.get("problem") and all(
        e is not None and e <= (r.get("allowed") or default) for e in (r.get("errors") or {}).values())
        for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""From a job's records to kernels: the fastest record's kernel JSON (and, asked, the most efficient one's:
smallest time x resource, which NNFusion's BlockFusion swaps in when a group's blocks exceed its capacity; off
by default: on the H200, ResNet-18 compiled with both ran 1.46x slower than with the best kernels alone,
docs/BENCHMARKS-HISTORY.md, 2026-12-03 session 5), and the runner-ups timed as rows when the best one's row is slow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.tuning.job import TuneJob, TuneResult
from core.tuning.records import FAILED_SECONDS, open_database

ScoredRecord = tuple[float, int, Any, int]  # (mean seconds, resource, scheduled module, threads per block)


def scored_records(job: TuneJob, work_dir: Path, top_k: int = 16) -> list[ScoredRecord]:
    """(mean seconds, resource, scheduled module, threads per block) of the job's `top_k` fastest successful
    records: what best_kernels and runner_up_kernels choose from (reading them applies each record's trace)."""
    import tvm

    from core.codegen.generate import prim_func_module
    from core.codegen.schedule import launch_dims
    from core.codegen.whole_warps import whole_warp_module

    if job.target != "cuda":
        raise InputError("kernels for the kernel DB come from CUDA tuning (target cuda)")
    mod, _ = prim_func_module(job.config)
    database = open_database(work_dir)
    scored = []
    for record in database.get_top_k(database.commit_workload(mod), top_k):
        secs = [float(s) for s in record.run_secs or []]
        if not secs or min(secs) >= FAILED_SECONDS:
            continue
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        grid, block = launch_dims(whole_warp_module(sch.mod))  # the block the row launches, as it was timed
        resource = math.ceil(math.prod(block) / 32) * 32 * math.prod(grid)
        scored.append((sum(secs) / len(secs), resource, sch.mod, math.prod(block)))
    if not scored:
        raise InputError(f"{job.name}: no successful trial recorded in {work_dir}")
    return scored


def best_kernels(job: TuneJob, work_dir: Path, *, top_k: int = 16, check: bool = True,
                 scored: list[ScoredRecord] | None = None) -> TuneResult:
    """Kernel JSON for the fastest record, and for the most efficient one (time x resource) if the job asks.
    `scored`: the records as scored_records read them, when the caller has them already."""
    result = TuneResult(job, work_dir)
    scored = scored if scored is not None else scored_records(job, work_dir, top_k)
    result.best_seconds = min(s[0] for s in scored)
    skipped: list[str] = []
    checked = False
    roles: list[tuple[str, Callable[[Any], float]]] = [("best", lambda s: s[0])]
    if job.efficient:
        roles.append(("efficient", lambda s: s[0] * s[1]))
    for role, order in roles:
        # Walk the records from the best down: a schedule may lean on TVM helper functions (cp.async...)
        # that live outside the kernel, which NNFusion cannot store; the first self-contained one wins.
        for seconds, resource, scheduled, _threads in sorted(scored, key=order):
            # The CPU check runs the op's definition (the same for every record): once per job is enough;
            # each kernel's own code is verified on the GPU when it is injected.
            item, problem, generated = _kernel_item(job, scheduled, work_dir, check=check and not checked)
            checked = checked or generated
            if item is None:
                skipped.append(f"{seconds * 1e6:.2f} us: {problem[:200]}")
                continue
            item["tvm_func_name"] = item["tvm_func_name"].replace("_kernel0", f"_{role}_kernel0")
            if item["code"] not in [k["code"] for k in result.kernels.values()]:
                result.kernels[role] = item
            result.candidates.append({"role": role, "seconds": seconds, "resource": resource})
            break
    result.errors = {f"skipped schedule ({len(skipped)})": len(skipped)} if skipped else {}
    if not result.kernels:
        raise InputError(f"{job.name}: none of the {len(scored)} best schedules gives a self-contained kernel "
                         f"(first: {skipped[0] if skipped else '?'})")
    return result


def runner_up_kernels(job: TuneJob, work_dir: Path, scored: list[ScoredRecord], taken: Iterable[str], count: int,
                      *, after_seconds: float) -> list[tuple[str, float, dict[str, Any]]]:
    """(role, seconds, kernel JSON item) for `count` more of the `scored` records, slower than `after_seconds`
    (the best kernel's record: best_kernels generated every record up to it already), whose kernels differ from
    the `taken` codes and from each other (roles best2, best3...): the fastest record of another block size than
    the best's, then the next by time (_runner_up_order).

    The tuner ranks records by TVM's build of them; NNFusion runs the row's form, compiled by nvcc. Where the
    best record's row runs far slower than the record (a row of session 12 ran 3x), the next records are
    injected too and timed as rows, so the DB can hold the fastest row rather than the fastest record."""
    taken = set(taken)
    found: list[tuple[str, float, dict[str, Any]]] = []
    for seconds, _resource, scheduled, _threads in _runner_up_order(scored):
        if len(found) >= count:
            break
        if seconds <= after_seconds:
            continue
        item, _problem, _generated = _kernel_item(job, scheduled, work_dir, check=False)
        if item is None or item["code"] in taken:
            continue
        taken.add(item["code"])
        role = f"best{len(found) + 2}"
        item["tvm_func_name"] = item["tvm_func_name"].replace("_kernel0", f"_{role}_kernel0")
        found.append((role, seconds, item))
    return found


def _runner_up_order(scored: list[ScoredRecord]) -> list[ScoredRecord]:
    """The records after the fastest, by time, but the fastest of another block size first: the row's form
    differs most from TVM's where the block does (a partial warp is padded, with non-aligned barriers), so a
    record of another block size is the likeliest to escape what slowed the best one's row."""
    ordered = sorted(scored, key=lambda s: s[0])
    other = next((s for s in ordered if s[3] != ordered[0][3]), None)
    return ordered if other is None else [other] + [s for s in ordered if s is not other]


def _kernel_item(job: TuneJob, scheduled: Any, work_dir: Path, *,
                 check: bool) -> tuple[dict[str, Any] | None, str, bool]:
    """(kernel JSON item or None, why not, whether TVM generated it without error) for a scheduled record."""
    from core.codegen.generate import generate

    generated = generate(job.config, job.arch, scheduled=scheduled, check=check)
    problem = generated.error or _standalone_problem(generated.item, job.arch, work_dir)
    return (None if problem else generated.item), problem, generated.error == ""


def _standalone_problem(item: dict[str, Any] | None, arch: str, work_dir: Path) -> str:
    """Why the kernel's code does not compile on its own (the way NNFusion will hold it), or ''."""
    from core.cuda.nvcc import compile_source, find_nvcc, half_header

    if item is None:
        return "no kernel"
    # with what NNFusion's file gives the kernel (cuda_fp16.h): without it every half kernel read as not compiling
    code = half_header(item["code"]) + item["code"]
    result = compile_source(code, arch, nvcc=find_nvcc(), workdir=work_dir / "check")
    return "" if result.ok else result.error

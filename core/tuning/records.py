"""A job's work dir: MetaSchedule's JSON databases, one record per measured trial, appended.

A kill mid-write can tear the last record: repair_work_dir cuts it off, and the trials kept count against
the job's budget when it resumes (run.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RECORDS = "database_tuning_record.json"
WORKLOADS = "database_workload.json"
FAILED_SECONDS = 1e9  # what MetaSchedule stores for a failed run (seen: 1e10)


def open_database(work_dir: Path) -> Any:
    """The work dir's MetaSchedule JSONDatabase. Its records' traces tensorize with kdb's mma intrinsics, and TVM
    reads every trace as it opens the files: they are registered first, or a tensor-core op cannot resume."""
    from tvm.s_tir import meta_schedule as ms

    from core.codegen import mma

    mma.register()
    return ms.database.JSONDatabase(path_workload=str(work_dir / WORKLOADS), path_tuning_record=str(work_dir / RECORDS))


def repair_work_dir(work_dir: Path) -> int:
    """Cut a torn last record (a kill mid-write) from the JSON-lines databases; return records kept."""
    kept = 0
    for name in (WORKLOADS, RECORDS):
        path = work_dir / name
        if not path.exists():
            continue
        data = path.read_bytes()
        lines = data.split(b"\n")
        good: list[bytes] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                break  # only the last record can be torn: stop at the first bad one
            good.append(line)
        repaired = b"".join(g + b"\n" for g in good)
        if repaired != data:
            tmp = path.with_suffix(".json.repair")
            tmp.write_bytes(repaired)
            tmp.replace(path)
        if name == RECORDS:
            kept = len(good)
    return kept


def recorded_runs(work_dir: Path) -> list[float | None]:
    """Seconds of every recorded trial in order (None for failed ones)."""
    path = work_dir / RECORDS
    out: list[float | None] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            secs = record[1][1]
        except (ValueError, IndexError, TypeError):
            continue
        valid = [float(s) for s in secs or [] if isinstance(s, int | float) and 0 < s < FAILED_SECONDS]
        out.append(sum(valid) / len(valid) if valid else None)
    return out


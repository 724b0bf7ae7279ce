"""Verify and time kernels already in the DB (the console's "verify/profile selected kernels")."""

from __future__ import annotations

import json
import tempfile
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.cuda.nvcc import compile_archs, find_nvcc
from core.db.kernel_db import KernelDB, kernel_db_path
from core.errors import InputError
from core.gpu.jobs import GpuResult, GpuSession, GpuSessions, gpu_children, job_for_row, require_device
from core.kernels.kernel_row import KernelRow, distinct_kernels
from core.kernels.profile import merge_profile

if TYPE_CHECKING:
    from core.settings import Settings


@dataclass
class RowCheck:
    key: str
    name: str
    verified: GpuResult | None = None
    timed: GpuResult | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and all(r is None or r.ok for r in (self.verified, self.timed))


@dataclass(frozen=True)
class NvccBuild:
    """Compile each row here with nvcc, as `kdb inject` does, and give the GPU child the cubin.

    Without it the child compiles the row again through pycuda, which on the H200 ran past its 300 s for 7 of
    18 tuned rows that had each compiled in seconds in injection (docs/BENCHMARKS-HISTORY.md, eleventh session)."""

    archs: tuple[str, ...]
    nvcc: str
    flags: tuple[str, ...] = ()
    timeout_s: float = 120.0

    def cubins(self, row: KernelRow) -> dict[str, bytes]:
        """arch -> cubin of the row's translation unit; InputError naming nvcc's reason when one fails."""
        with tempfile.TemporaryDirectory(prefix="kdb-gpu-nvcc-") as work:
            results = compile_archs(json.loads(row.function), self.archs, nvcc=self.nvcc, flags=self.flags,
                                    timeout_s=self.timeout_s, workdir=Path(work))
        failed = next((r for r in results if not r.ok), None)
        if failed is not None:
            raise InputError(failed.error)
        return {arch: r.cubin for arch, r in zip(self.archs, results, strict=True)}


@dataclass
class RowsReport:
    checks: list[RowCheck] = field(default_factory=list)
    device: str = ""
    cancelled: bool = False

    def as_json(self) -> dict:
        return {"device": self.device, "cancelled": self.cancelled, "kernels": [{
            "key": c.key, "name": c.name, "ok": c.ok, "error": c.error,
            "max_rel_error": c.verified.max_rel_error if c.verified else None,
            "verify": None if c.verified is None else (c.verified.reason or "ok"),
            "us": c.timed.microseconds if c.timed else None} for c in self.checks]}


@dataclass(frozen=True)
class GpuCheckRequest:
    """Verify (and with `profile`, time) kernels of a DB on the GPU: `kdb gpu verify|profile` and the Kernels view's
    v and p. Both build it with from_settings and run it with check_db_rows."""

    db_path: Path
    keys: tuple[str, ...]  # Keys or Identifiers; with every_row, ignored
    profile: bool
    product_name: str  # the device name profiles are kept under ("": the device's own)
    timeout_s: float  # per GPU job
    workers: int  # GPU children at once
    nvcc: str
    nvcc_flags: tuple[str, ...]
    nvcc_timeout_s: float
    every_row: bool = False
    op: str = ""  # with every_row: only this OpType

    @classmethod
    def from_settings(cls, settings: Settings, db_path: Path | str | None, keys: Iterable[str] = (), *, profile: bool,
                      every_row: bool = False, op: str = "") -> GpuCheckRequest:
        """db_path None: $KDB_DB, else NNFusion's default."""
        return cls(kernel_db_path(db_path), tuple(keys), profile, settings.product_name, settings.gpu_timeout_s,
                   gpu_children(settings.effective_workers()), settings.nvcc_path,
                   tuple(settings.nvcc_flags), settings.nvcc_timeout_s, every_row, op)


    def build(self, device_arch: str) -> NvccBuild:
        """nvcc for the device's arch alone: the child loads that cubin, and a device whose arch the settings lack
        would otherwise compile each row again through pycuda."""
        return NvccBuild((device_arch,), find_nvcc(self.nvcc), self.nvcc_flags, self.nvcc_timeout_s)


def check_db_rows(request: GpuCheckRequest, *, on_result: Callable[[RowCheck], None] | None = None,
                  should_cancel: Callable[[], bool] | None = None) -> RowsReport:
    """Run the request on the first CUDA device (ToolError saying why there is none, before the DB is opened):
    its rows compiled with nvcc for that device's arch, verified, and timed with their profile written when asked."""
    if not request.every_row and not request.keys:
        raise InputError("name kernels (Key or Identifier), or ask for every row")
    build = request.build(require_device().arch)
    with KernelDB.open(request.db_path, write=request.profile) as db:
        if request.every_row:
            where, params = ("WHERE OpType = ?", [request.op]) if request.op else ("", [])
            rows = list(db.iter_rows(where, params))
        else:
            rows = [r for key in request.keys for r in db.find(key)]
        return check_rows(db, rows, verify=True, profile=request.profile, product_name=request.product_name,
                          timeout_s=request.timeout_s, on_result=on_result, should_cancel=should_cancel,
                          workers=request.workers, build=build)


def check_rows(db: KernelDB, rows: Iterable[KernelRow], *, verify: bool, profile: bool, product_name: str = "",
               timeout_s: float = 60.0, on_result: Callable[[RowCheck], None] | None = None,
               should_cancel: Callable[[], bool] | None = None, workers: int = 1,
               build: NvccBuild | None = None) -> RowsReport:
    """Run the asked GPU jobs for each row; timed rows get their profile merged into Miscs.

    `workers` GPU children run at once (each compiles and verifies its kernel; timed launches take turns on the
    GPU, core/gpu/exclusive.py); results come back, and profiles are written, in the rows' order, here.
    With `build`, each worker compiles its row with nvcc first and the child loads the cubin."""
    report = RowsReport()
    sessions = GpuSessions(timeout_s=timeout_s)

    def run(row: KernelRow) -> RowCheck:
        with sessions.borrow() as session:
            return _check(session, row, verify=verify, profile=profile, build=build)

    pending: deque[tuple[KernelRow, Future[RowCheck]]] = deque()

    def take() -> None:
        row, future = pending.popleft()
        check = future.result()
        timed = check.timed
        report.device = next((r.device for r in (timed, check.verified) if r is not None and r.device), report.device)
        if timed is not None and timed.ok and timed.microseconds is not None:
            _store_profile(db, row, product_name or timed.device, timed)
        report.checks.append(check)
        if on_result is not None:
            on_result(check)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        try:
            for row in distinct_kernels(rows):
                if should_cancel is not None and should_cancel():
                    report.cancelled = True
                    break
                pending.append((row, pool.submit(run, row)))
                while pending and (len(pending) > 2 * workers or pending[0][1].done()):
                    take()
            while pending:
                take()
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=True)
            sessions.close()
    return report


def _check(session: GpuSession, row: KernelRow, *, verify: bool, profile: bool,
           build: NvccBuild | None = None) -> RowCheck:
    """One row's GPU jobs in `session` (a worker thread: no DB, no report)."""
    check = RowCheck(row.key, _name(row))
    try:
        cubins = build.cubins(row) if build is not None else None
        if verify:
            check.verified = session.run(job_for_row(row, "verify", cubins=cubins))
        if profile and (check.verified is None or check.verified.ok):
            check.timed = session.run(job_for_row(row, "time", cubins=cubins))
    except InputError as exc:
        check.error = str(exc)
    except Exception as exc:  # this row fails with its cause; the others go on
        check.error = f"{type(exc).__name__}: {exc}"
    return check


def _name(row: KernelRow) -> str:
    try:
        return str(json.loads(row.miscs).get("kdb", {}).get("name", "")) or row.key[:20]
    except (ValueError, AttributeError):
        return row.key[:20]


def _store_profile(db: KernelDB, row: KernelRow, device: str, timed: GpuResult) -> None:
    try:
        miscs = json.loads(row.miscs) if row.miscs else {}
    except ValueError:
        miscs = {}
    if not isinstance(miscs, dict):
        miscs = {}
    profile = miscs.get("external_profile") if isinstance(miscs.get("external_profile"), dict) else {}
    if "resource" not in profile:
        fn = json.loads(row.function)
        from math import ceil, prod

        profile["resource"] = ceil(prod(fn["block_dim"]) / 32) * 32 * prod(fn["grid_dim"])
    try:
        profile["time"] = merge_profile(profile.get("time", "") if isinstance(profile.get("time"), str) else "",
                                        device, timed.microseconds or 0.0)
    except InputError:  # an unreadable old profile string: replace it rather than keep a broken one
        profile["time"] = merge_profile("", device, timed.microseconds or 0.0)
    miscs["external_profile"] = profile
    antares = miscs.get("antares")
    if isinstance(antares, dict) and antares.get("device_name") == device:
        antares["time"] = timed.microseconds  # a standalone row: kernel selection ranks the op's rows by this time
    kdb = miscs.setdefault("kdb", {}) if isinstance(miscs.get("kdb", {}), dict) else {}
    kdb.setdefault("profile", {})[device] = timed.profile_entry()
    miscs["kdb"] = kdb
    db.update_miscs(row.key, miscs)  # the op's rows are put fastest-first again in the same transaction

"""The injection pipeline: kernel JSON files -> rows in NNFusion's kernel DB, every failure kept.

    read -> validate -> parse -> barriers -> compile (nvcc, optional) -> gpu (not yet) -> insert

CPU stages run in worker processes when asked (workers > 1), nvcc checks in a thread pool (each is
its own process anyway); results come back in input order and are inserted one kernel per
transaction by this process, the single writer. A bad file or item fails alone: the batch goes on.
Cancellation is honoured between kernels, never inside a write. With replace, a non-empty DB is
backed up first (SQLite's online backup API) and the report says where.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from types import MappingProxyType
from typing import Any

from core.cuda.barriers import BarrierCount
from core.cuda.nvcc import SPILL_LIMIT_BYTES, CompileResult, compile_archs, find_nvcc
from core.db.engine import DbLocked
from core.db.fastest import shadowed
from core.db.kernel_db import InsertOutcome, KernelDB
from core.db.state import StateDB, state_dir
from core.errors import InputError, KdbError, printable
from core.gpu.jobs import GpuSession, GpuSessions, gpu_children, job_for_row
from core.inject.prepare import ItemFailure, Prepared, dump_input, item_origin, prepare_chunk
from core.kernels.kernel_json import iter_json_files, load_items
from core.kernels.kernel_row import KernelRow, build_row, one_block_signature
from core.kernels.profile import merge_profile
from core.processes import exit_with_parent, spawn_context
from core.settings import Settings

STAGES = ("read", "validate", "parse", "barriers", "compile", "gpu", "insert")
# Not a missing feature: the GPU stages run when asked for (the CLI's progress bar says the same).
GPU_NOT_RUN = "gpu stages (barrier count on the GPU, verification, timing): not run (--verify/--profile run them)"
CHUNK = 8  # items per worker task: the IPC of one task costs about as much as parsing a small kernel


@dataclass(frozen=True)
class InjectOptions:
    archs: tuple[str, ...] = ("sm_90",)
    compile: bool = True
    replace: bool = False
    nvcc: str = ""
    nvcc_flags: tuple[str, ...] = ()
    nvcc_timeout_s: float = 120.0
    workers: int = 1  # processes for the CPU stages; nvcc checks run this many at a time too
    workdir: Path | None = None  # scratch space for nvcc (default: the state dir)
    verify: bool = False  # GPU: run on random inputs, compare with a float64 reference
    profile: bool = False  # GPU: time with CUDA events, write the profile NNFusion reads
    product_name: str = ""  # device name in profile strings (empty: the CUDA device's own name)
    gpu_timeout_s: float = 60.0
    gpu_workers: int = 0  # GPU children verifying at once (0: from workers); timed launches take turns
    reuse_cubin: bool = True  # GPU children load the nvcc check's cubin (False: they compile again, as before)

    @property
    def gpu_children(self) -> int:
        """A verification's cost is the CPU's float64 reference: several children overlap them on one GPU."""
        return self.gpu_workers or gpu_children(self.workers)

    @property
    def gpu(self) -> bool:
        """Any GPU stage asked for; then barriers that static analysis cannot count are counted on the GPU."""
        return self.verify or self.profile

    @classmethod
    def from_settings(cls, settings: Settings, *, archs: tuple[str, ...] | None = None, compile: bool = True,
                      replace: bool = False, workers: int | None = None, verify: bool = False,
                      profile: bool = False) -> InjectOptions:
        """Options as the shared settings say, with what a command line or a form overrides."""
        return cls(archs=archs or tuple(settings.archs), compile=compile, replace=replace,
                   nvcc=settings.nvcc_path, nvcc_flags=tuple(settings.nvcc_flags),
                   nvcc_timeout_s=settings.nvcc_timeout_s, workers=workers or settings.effective_workers(),
                   verify=verify, profile=profile, product_name=settings.product_name,
                   gpu_timeout_s=settings.gpu_timeout_s)


@dataclass(frozen=True, slots=True)
class Committed:
    """One kernel whose insert transaction has committed: reported at once, so a killed run's log is exact."""

    key: str
    file: str
    index: int
    replaced: int = 0  # older rows this insert removed


@dataclass
class InjectProgress:
    files_total: int = 0
    files_done: int = 0
    items_seen: int = 0
    items_done: int = 0
    injected: int = 0
    unchanged: int = 0
    failed: int = 0
    passed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    failed_at: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    current: str = ""

    def snapshot(self) -> InjectSnapshot:
        return InjectSnapshot(self.files_total, self.files_done, self.items_seen, self.injected, self.unchanged,
                              self.failed, MappingProxyType(dict(self.passed)), MappingProxyType(dict(self.failed_at)),
                              self.current)


@dataclass(frozen=True)
class InjectSnapshot:
    """An immutable copy of InjectProgress, which keeps changing in the thread that runs the injection: what a
    progress event hands to another thread (a screen) or keeps."""

    files_total: int
    files_done: int
    items_seen: int
    injected: int
    unchanged: int
    failed: int
    passed: Mapping[str, int]
    failed_at: Mapping[str, int]
    current: str

    def stage(self, name: str) -> tuple[int, int]:
        """(done, total) for a stage's bar: kernels that left the stage of those that can still reach it."""
        if name == "read":
            return self.files_done, self.files_total
        reachable = self.items_seen - sum(self.failed_at.get(s, 0) for s in STAGES[1:STAGES.index(name)])
        if name in ("compile", "insert"):
            reachable -= self.unchanged  # kernels already in the DB skip both
        reachable = max(reachable, 0)
        return min(self.passed.get(name, 0) + self.failed_at.get(name, 0), reachable), reachable


@dataclass
class InjectReport:
    injected: int = 0
    unchanged: int = 0
    failed: int = 0
    failures: list[ItemFailure] = field(default_factory=list)
    cancelled: bool = False
    notes: list[str] = field(default_factory=list)
    shadowed: list[tuple[str, str]] = field(default_factory=list)  # (injected key, the earlier row NNFusion takes)
    standalone: dict[str, str] = field(default_factory=dict)  # injected key -> product: went in standalone, as its op
    run_id: int | None = None
    replaced_rows: int = 0
    backup: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"injected": self.injected, "unchanged": self.unchanged, "failed": self.failed,
                "failures": [f.as_report() for f in self.failures],
                "shadowed": [{"key": key, "used_instead": first} for key, first in self.shadowed],
                "standalone": [{"key": key, "product": product} for key, product in self.standalone.items()]}


def _batched(items: Iterator[tuple[str, int, Any]], size: int) -> Iterator[tuple[tuple[str, int, Any], ...]]:
    while batch := tuple(islice(items, size)):
        yield batch


class _InlineExecutor(Executor):
    """Runs each task at submit time: the single-process path, same interface as the pools."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


# ---------------------------------------------------------------------------------------------
# The driver


class Injector:
    """One injection run against one DB. Drive it with run(paths) or run_items(items)."""

    def __init__(
        self,
        db: KernelDB,
        options: InjectOptions,
        *,
        state: StateDB | None = None,
        on_progress: Callable[[InjectProgress], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        on_commit: Callable[[Committed], None] | None = None,
    ) -> None:
        self.db = db
        self.options = options
        self.state = state
        self.on_progress = on_progress
        self.on_commit = on_commit
        self.should_cancel = should_cancel or (lambda: False)
        self.progress = InjectProgress()
        self.report = InjectReport(notes=[] if options.gpu else [GPU_NOT_RUN])
        self._committed: list[str] = []
        self._gpu: GpuSession | None = None  # barrier counts, here in this thread
        self._gpu_pool: ThreadPoolExecutor | None = None  # verify and time, in parallel children
        self._sessions = GpuSessions(timeout_s=options.gpu_timeout_s)
        self._on_gpu: deque[tuple[Prepared, Future[GpuOutcome]]] = deque()
        self._gpu_counts = {"verified": 0, "timed": 0, "barriers counted": 0}
        self._device = ""
        self._cancel_event = threading.Event()
        self._nvcc = find_nvcc(options.nvcc) if options.compile else ""
        self._workdir = options.workdir or state_dir() / "tmp"

    # -- public ------------------------------------------------------------------------------

    def run(self, paths: list[Path], *, kind: str = "inject") -> InjectReport:
        files = list(iter_json_files(paths))
        self.progress.files_total = len(files)
        return self._run(self._items_from_files(files), kind=kind, args={"paths": [str(p) for p in paths]})

    def run_items(self, items: list[tuple[str, int, Any]], *, kind: str = "retry") -> InjectReport:
        """Process given (file, index, raw item) triples, e.g. failures being retried or kernels just generated:
        they are in hand, so read already."""
        self.progress.files_total = self.progress.files_done = len({f for f, _, _ in items})
        self.progress.items_seen += len(items)  # on top of any failed before (a retry's codegen)
        self.progress.passed["read"] += len(items)
        return self._run(iter(items), kind=kind, args={"items": len(items)})

    # -- internals ---------------------------------------------------------------------------

    def _items_from_files(self, files: list[Path]) -> Iterator[tuple[str, int, Any]]:
        for path in files:
            self.progress.current = str(path)
            try:
                items = load_items(path)
            except InputError as exc:
                self._fail(ItemFailure(printable(str(path)), None, "", "read", exc.reason))
                self.progress.files_done += 1
                continue
            self.progress.items_seen += len(items)
            self.progress.passed["read"] += len(items)
            self._emit()
            for index, raw in enumerate(items):
                yield str(path), index, raw
            self.progress.files_done += 1

    def _run(self, items: Iterator[tuple[str, int, Any]], *, kind: str, args: dict[str, Any]) -> InjectReport:
        if self.options.replace and self.report.backup is None:
            self.report.backup = self._backup_before_replace()
        if self.state is not None:
            self.report.run_id = self.state.start_run(kind, self.db.path, {**args, **_options_dict(self.options)})
        workers = max(1, self.options.workers)
        cpu: Executor = _InlineExecutor() if workers == 1 else ProcessPoolExecutor(
            max_workers=workers, mp_context=spawn_context(),
            initializer=exit_with_parent, initargs=(os.getpid(),))
        nvcc_pool = ThreadPoolExecutor(max_workers=workers) if self.options.compile else None
        if self.options.gpu:
            self._gpu_pool = ThreadPoolExecutor(max_workers=self.options.gpu_children)
        # Items go to the workers in chunks (per-task IPC costs as much as a small kernel's parse); the raw
        # items stay here for failure records.
        prepared: deque[tuple[Future[list[Prepared]], list[Any]]] = deque()
        compiling: deque[tuple[Prepared, Future[Compiled]]] = deque()
        chunk = 1 if workers == 1 else CHUNK

        def take_results() -> None:
            future, raws = prepared.popleft()
            for item, raw in zip(future.result(), raws, strict=True):
                item.raw = raw
                self._after_prepare(item, nvcc_pool, compiling)
                self._drain_compiles(compiling, block=len(compiling) >= 2 * workers)
                self._drain_gpu(block=len(self._on_gpu) >= 2 * self.options.gpu_children)

        try:
            for batch in _batched(items, chunk):
                if self._cancelled():
                    break
                self.progress.current = batch[-1][0]
                prepared.append((cpu.submit(prepare_chunk, batch, self.options.gpu), [raw for _, _, raw in batch]))
                while prepared and (len(prepared) >= 4 * workers or prepared[0][0].done()):
                    take_results()
                    if self._cancelled():
                        break
            while prepared and not self._cancelled():
                take_results()
            while compiling and not self._cancelled():
                self._drain_compiles(compiling, block=True)
            while self._on_gpu and not self._cancelled():
                self._drain_gpu(block=True)
        finally:
            if self._cancelled():
                self._cancel_event.set()
                self.report.cancelled = True
            for future, _ in prepared:
                future.cancel()
            cpu.shutdown(wait=True, cancel_futures=True)
            if nvcc_pool is not None:
                nvcc_pool.shutdown(wait=True, cancel_futures=True)
            if self._gpu_pool is not None:
                self._gpu_pool.shutdown(wait=True, cancel_futures=True)
            self._sessions.close()
            if self._gpu is not None:
                self._gpu.close()
            if self.options.gpu:
                done = ", ".join(f"{n} {what}" for what, n in self._gpu_counts.items())
                self.report.notes.append(f"gpu ({self._device or 'no answer'}): {done}")
            self._note_shadowed()
            self._note_standalone()
            if self.state is not None and self.report.run_id is not None:
                self.state.finish_run(self.report.run_id, injected=self.report.injected,
                                      unchanged=self.report.unchanged, failed=self.report.failed,
                                      cancelled=self.report.cancelled)
            self.progress.current = ""
            self._emit()
        return self.report

    def _note_shadowed(self) -> None:
        """Say which new rows NNFusion will not use: an earlier row of the same op comes first in the table."""
        if not self._committed or self.options.replace:  # replace leaves the new row the op's only one
            return
        try:
            self.report.shadowed = shadowed(self.db, self._committed)
        except (sqlite3.Error, KdbError) as exc:  # in a finally: never hide the error that ended the run
            self.report.notes.append(f"could not check which new rows come first for their op: {exc}")
            return
        if self.report.shadowed:
            key, first = self.report.shadowed[0]
            self.report.notes.append(
                f"{len(self.report.shadowed)} injected kernel(s) come after an earlier row of their op, and NNFusion "
                f"takes an op's first row (e.g. {first} before {key}): each op's rows are kept fastest-first, so the "
                "earlier row was timed faster, or neither was timed (`kdb gpu profile` times them, `kdb db fastest` "
                "then keeps the faster one alone); `kdb inject FILE --replace` keeps the new one alone. Where the "
                "two compute different ops of one identifier (a Resize's mode, a depthwise convolution's stride: "
                "their Attributes differ), no choice serves both nodes: `kdb coverage` names the one left with wrong "
                "numbers")

    def _note_standalone(self) -> None:
        """Say which new rows went in standalone: their op's rows run on their own launch (`kdb db standalone`)."""
        if not self.report.standalone:
            return
        key, product = next(iter(self.report.standalone.items()))
        self.report.notes.append(
            f"{len(self.report.standalone)} injected kernel(s) went in standalone for -fproduct_name={product!r}, as "
            f"the other rows of their op are (kept out of BlockFusion by `kdb db standalone` or a launch fit; e.g. "
            f"{key}): an External row would be taken first and fused again; `kdb db standalone --undo KEY --apply` "
            "gives the op back to BlockFusion")

    def _backup_before_replace(self) -> str | None:
        """Replace deletes rows: copy a non-empty DB first (or fail before any write)."""
        if self.db.count() == 0:
            return None
        return str(self.db.backup_to_new_file(state_dir() / "backups", "before-replace"))

    def _cancelled(self) -> bool:
        if not self._cancel_event.is_set() and self.should_cancel():
            self._cancel_event.set()
        return self._cancel_event.is_set()

    def _after_prepare(self, item: Prepared, nvcc_pool: ThreadPoolExecutor | None,
                       compiling: deque[tuple[Prepared, Future[Compiled]]]) -> None:
        passed = self.progress.passed
        if item.failure is not None:
            for stage in STAGES[1:STAGES.index(item.failure.stage)]:
                passed[stage] += 1
            self._fail(item.failure)
            return
        passed["validate"] += 1
        passed["parse"] += 1
        if item.needs_gpu_barriers is not None and not self._count_barriers_on_gpu(item):
            return
        passed["barriers"] += 1
        assert item.row is not None
        if nvcc_pool is None:
            self._insert(item, [])  # the insert itself finds an existing Key
            return
        if not self.options.replace and self.db.has_key(item.row.key):
            self._count_unchanged()  # already stored: spare nvcc the work
            return
        function = json.loads(item.row.function)
        fut = nvcc_pool.submit(self._compile_all, function)
        compiling.append((item, fut))

    # -- GPU stages (one device, so they run here, one kernel at a time, each in the child process) --

    def _gpu_session(self) -> GpuSession:
        if self._gpu is None:
            self._gpu = GpuSession(timeout_s=self.options.gpu_timeout_s)
        return self._gpu

    def _gpu_fail(self, item: Prepared, reason: str, stage: str = "gpu") -> None:
        self._fail(ItemFailure(item.file, item.index, item.name, stage, reason, {}, dump_input(item.raw)))

    def _count_barriers_on_gpu(self, item: Prepared) -> bool:
        """Static analysis could not count the barriers: count them with an instrumented run."""
        assert item.needs_gpu_barriers is not None
        spec, src = item.needs_gpu_barriers
        extra = {"from": item_origin(item.file, item.index)}
        try:
            probe = build_row(spec, src, BarrierCount(0), extra_miscs=extra)  # the count is not needed to run it
            result = self._gpu_session().run(job_for_row(probe, "barriers"))
        except InputError as exc:
            self._gpu_fail(item, str(exc), "parse")
            return False
        self._device = result.device or self._device
        if not result.ok or result.barriers is None:
            self._gpu_fail(item, f"barrier count on the GPU failed: {result.reason}", "barriers")
            return False
        self._gpu_counts["barriers counted"] += 1
        item.row = build_row(spec, src, BarrierCount(result.barriers),
                             extra_miscs={**extra, "barriers": "counted on the GPU (instrumented run)"})
        item.needs_gpu_barriers = None
        return True

    def _gpu_stages(self, row: KernelRow, cubins: dict[str, bytes]) -> GpuOutcome:
        """Verify and/or time one kernel in a GPU child of the pool (a worker thread: it touches no state)."""
        if self._cancel_event.is_set():
            return GpuOutcome(None, "cancelled")
        try:
            with self._sessions.borrow() as session:
                return gpu_stages(session, row, cubins, self.options)
        except Exception as exc:  # this kernel fails with its cause; the batch goes on
            return GpuOutcome(None, f"{type(exc).__name__}: {exc}")

    def _drain_gpu(self, *, block: bool) -> None:
        """Insert the kernels back from the GPU, in input order (this thread is the DB's single writer)."""
        while self._on_gpu and (block or self._on_gpu[0][1].done()):
            item, fut = self._on_gpu.popleft()
            outcome = fut.result()
            block = False
            self._device = outcome.device or self._device
            for what, n in outcome.counts.items():
                self._gpu_counts[what] += n
            if outcome.row is None:
                if outcome.reason != "cancelled":
                    self._gpu_fail(item, outcome.reason)
                continue
            self.progress.passed["gpu"] += 1
            self._store(item, outcome.row)

    def _compile_all(self, function: dict[str, Any]) -> Compiled:
        results = self._compile_archs(function)
        spilled = max((r.spill_bytes() for r in results), default=0)
        bounded = one_block_signature(function["function_signature"])
        if not all(r.ok for r in results) or spilled <= SPILL_LIMIT_BYTES or bounded is None:
            return Compiled(results)
        # ptxas spilled under the block-size bound alone: try one resident block, keep whichever spills less.
        other = {**function, "function_signature": bounded}
        retried = self._compile_archs(other)
        still = max((r.spill_bytes() for r in retried), default=0)
        if all(r.ok for r in retried) and still < spilled:
            note = (f"ptxas spilled {spilled} B per thread under the block-size bound; "
                    f"{still} B under __launch_bounds__(N, 1), which the row keeps")
            return Compiled(retried, other, note)
        return Compiled(results)

    def _compile_archs(self, function: dict[str, Any]) -> list[CompileResult]:
        return compile_archs(function, self.options.archs, nvcc=self._nvcc, flags=self.options.nvcc_flags,
                             timeout_s=self.options.nvcc_timeout_s, workdir=self._workdir, cancel=self._cancel_event)

    def _drain_compiles(self, compiling: deque[tuple[Prepared, Future[Compiled]]], *,
                        block: bool) -> None:
        while compiling and (block or compiling[0][1].done()):
            item, fut = compiling.popleft()
            compiled = fut.result()
            results = compiled.results
            block = False
            if self._cancel_event.is_set():
                return
            if compiled.function is not None and item.row is not None:
                miscs = json.loads(item.row.miscs)
                miscs["kdb"]["launch_bounds"] = compiled.note
                item.row = replace(item.row, function=json.dumps(compiled.function, ensure_ascii=False),
                                   miscs=json.dumps(miscs, ensure_ascii=False, allow_nan=False))
            bad = next((r for r in results if not r.ok), None)
            if bad is not None:
                self._fail(ItemFailure(item.file, item.index, item.name, "compile", bad.error,
                                       {"arch": bad.arch, "line": bad.error_line, "log": bad.log,
                                        "source": bad.source}, dump_input(item.raw)))
                continue
            self.progress.passed["compile"] += 1
            self._insert(item, results)

    def _insert(self, item: Prepared, compiled: list[CompileResult]) -> None:
        row = item.row
        assert row is not None
        if compiled:
            miscs = json.loads(row.miscs)
            miscs["kdb"]["compile"] = {r.arch: r.summary() for r in compiled}
            row = replace(row, miscs=json.dumps(miscs, ensure_ascii=False, allow_nan=False))
        if self._gpu_pool is not None:
            cubins = {r.arch: r.cubin for r in compiled if r.cubin} if self.options.reuse_cubin else {}
            self._on_gpu.append((item, self._gpu_pool.submit(self._gpu_stages, row, cubins)))
            return
        self._store(item, row)

    def _store(self, item: Prepared, row: KernelRow) -> None:
        try:
            result = self.db.insert(row, replace=self.options.replace)
        except DbLocked:
            raise  # every later kernel would wait out the same lock: end the run with its message
        except KdbError as exc:
            self._fail(ItemFailure(item.file, item.index, item.name, "insert", exc.reason, {},
                                   dump_input(item.raw)))
            return
        except Exception as exc:  # a DB error must not end the batch: record it with its cause
            self._fail(ItemFailure(item.file, item.index, item.name, "insert", f"{type(exc).__name__}: {exc}",
                                   {}, dump_input(item.raw)))
            return
        self.progress.passed["insert"] += 1
        if result.outcome is InsertOutcome.UNCHANGED:
            self._count_unchanged()
            return
        self._committed.append(row.key)
        if result.standalone_for:
            self.report.standalone[row.key] = result.standalone_for
        if self.on_commit is not None:
            self.on_commit(Committed(row.key, item.file, item.index, len(result.replaced)))
        self.report.injected += 1
        self.report.replaced_rows += len(result.replaced)
        self.progress.injected += 1
        self.progress.items_done += 1
        self._emit()

    def _count_unchanged(self) -> None:
        self.report.unchanged += 1
        self.progress.unchanged += 1
        self.progress.items_done += 1
        self._emit()

    def _fail(self, failure: ItemFailure) -> None:
        self.report.failures.append(failure)
        self.report.failed += 1
        self.progress.failed += 1
        # a retry's codegen failures count under their own stage, before the pipeline's
        self.progress.failed_at[failure.stage] = self.progress.failed_at.get(failure.stage, 0) + 1
        if failure.index is not None:
            self.progress.items_done += 1
        if self.state is not None:
            from core.db.state_records import Failure

            self.state.record_failures([Failure(
                run_id=self.report.run_id, db_path=str(self.db.path), file=failure.file,
                item_index=failure.index, name=failure.name, stage=failure.stage, reason=failure.reason,
                detail=json.dumps(failure.detail, ensure_ascii=False, default=str), input=failure.input,
            )])
        self._emit()

    def _emit(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)


@dataclass
class Compiled:
    """The nvcc checks of one kernel; `function` is set when the row should carry another signature."""

    results: list[CompileResult]
    function: dict[str, Any] | None = None
    note: str = ""


@dataclass
class GpuOutcome:
    """What one kernel's GPU stages gave: the row with its verification and profile, or why not."""

    row: KernelRow | None
    reason: str = ""
    device: str = ""
    counts: dict[str, int] = field(default_factory=dict)


def gpu_stages(session: GpuSession, row: KernelRow, cubins: dict[str, bytes], options: InjectOptions) -> GpuOutcome:
    """Verify and/or time one kernel in `session`'s child (the nvcc check's cubin, when it built one for the
    device's arch, is loaded instead of compiled again)."""
    device, counts = "", {"verified": 0, "timed": 0}
    if options.verify:
        result = session.run(job_for_row(row, "verify", cubins=cubins))
        device = result.device or device
        if not result.ok:
            return GpuOutcome(None, f"verification failed: {result.reason}", device, counts)
        counts["verified"] += 1
        miscs = json.loads(row.miscs)
        miscs["kdb"]["verified"] = {"device": result.device, "max_rel_error": result.max_rel_error, **result.extra}
        row = replace(row, miscs=json.dumps(miscs, ensure_ascii=False, allow_nan=False))
    if options.profile:
        result = session.run(job_for_row(row, "time", cubins=cubins))
        device = result.device or device
        if not result.ok or result.microseconds is None:
            return GpuOutcome(None, f"timing failed: {result.reason}", device, counts)
        name = options.product_name or result.device
        miscs = json.loads(row.miscs)
        profile = miscs.setdefault("external_profile", {})
        profile["time"] = merge_profile(profile.get("time", ""), name, result.microseconds)
        miscs["kdb"].setdefault("profile", {})[name] = result.profile_entry()
        row = replace(row, miscs=json.dumps(miscs, ensure_ascii=False, allow_nan=False))
        counts["timed"] += 1
    return GpuOutcome(row, "", device, counts)


def _options_dict(options: InjectOptions) -> dict[str, Any]:
    return {"archs": list(options.archs), "compile": options.compile, "replace": options.replace,
            "workers": options.workers}


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)

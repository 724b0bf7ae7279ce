"""Generate then inject: op configs -> CUDA kernels (TVM) -> rows in the kernel DB, as one run.

The one use case behind the Op configs view's `g` and `kdb codegen OPS --inject` (and `kdb codegen` alone, which
stops after generating). The kernels go from TVM to the injector in memory; the kernel JSON is written only where
the request names a file. Progress goes to `on_event` as immutable events; `should_cancel` is read between ops while
generating and between kernels while injecting (never inside a write). Each op config TVM fails on is kept in the
state DB as a codegen failure of the request's kernel DB, each kernel that fails injection as an inject failure:
both show in the Failures view and `kdb failures`, and retry there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.codegen.batch import CodegenReport, generate_all
from core.codegen.generate import Generated
from core.cuda.nvcc import find_nvcc
from core.db.state import StateDB
from core.errors import InputError, ToolError
from core.inject.pipeline import GPU_NOT_RUN, InjectOptions, InjectProgress, InjectReport, InjectSnapshot
from core.inject.session import open_injector
from core.opconfigs.opconfig import OpConfig, with_math
from core.settings import Settings


@dataclass(frozen=True)
class GenerateRequest:
    configs: tuple[OpConfig, ...]
    db_path: Path  # the kernel DB injected into, and that codegen failures are kept for
    options: InjectOptions  # archs[0] is the arch generated for; every arch is compile-checked
    check: bool = True  # each kernel's math against numpy on the CPU
    inject: bool = True  # False: generate only (`kdb codegen` without --inject)
    kernels_file: Path | None = None  # also keep the kernel JSON there (asked for: `-o`)

    @classmethod
    def from_settings(cls, configs: Iterable[OpConfig], db_path: Path, settings: Settings, *, arch: str | None = None,
                      compile: bool = True, check: bool = True, inject: bool = True,
                      kernels_file: Path | None = None, math: str | None = None) -> GenerateRequest:
        """The run as the shared settings say (their first arch, compile-checked for all of them; their math), with
        what a command line overrides: both faces build it here."""
        options = InjectOptions.from_settings(settings, archs=(arch,) if arch else None, compile=compile)
        math = math or settings.math
        return cls(tuple(with_math(c, math) for c in configs), db_path, options, check=check, inject=inject,
                   kernels_file=kernels_file)

    @property
    def arch(self) -> str:
        return self.options.archs[0]


@dataclass(frozen=True)
class CodegenProgress:
    done: int
    total: int
    failed: int
    current: str  # the op being generated now; "" once all are done


@dataclass(frozen=True)
class CompileCheckSkipped:
    """Injection goes on without the nvcc check, which cannot run here: a note of the run, not a failure."""

    reason: str


GenerateEvent = CodegenProgress | CompileCheckSkipped | InjectSnapshot


@dataclass
class GenerateReport:
    codegen: CodegenReport
    inject: InjectReport | None  # None: not asked for, or nothing was generated (or the run was cancelled first)
    kernels_file: Path | None  # where the kernel JSON was kept, when asked for
    notes: list[str] = field(default_factory=list)

    @property
    def cancelled(self) -> bool:
        return self.codegen.cancelled or bool(self.inject and self.inject.cancelled)

    @property
    def failed(self) -> int:
        """Op configs TVM failed on and kernels that failed injection: each is in the Failures view."""
        return len(self.codegen.failed) + (self.inject.failed if self.inject else 0)

    def as_json(self) -> dict[str, Any]:
        injected = {"inject": self.inject.as_json() if self.inject else None, "cancelled": self.cancelled,
                    "notes": self.notes}
        return {**self.codegen.as_json(), **injected}


def generated_origin(arch: str) -> str:
    """The name injected kernels carry for the file they came from (a row's Miscs "from", a failure's file): they
    came from TVM, in memory."""
    return f"generated for {arch}"


def generate_and_inject(request: GenerateRequest, *, on_event: Callable[[GenerateEvent], None] | None = None,
                        should_cancel: Callable[[], bool] | None = None) -> GenerateReport:
    """Generate a kernel for each op config with TVM, keep the kernel JSON where asked, and inject the kernels that
    generated (all of them, unless cancelled) into the request's kernel DB."""
    if request.kernels_file is not None and not request.kernels_file.parent.is_dir():  # said before TVM's minutes
        raise InputError("cannot keep the kernel JSON there: no such directory", where=str(request.kernels_file))
    emit = on_event or (lambda event: None)
    configs = list(request.configs)
    failed = 0

    def on_result(result: Generated, done: int, total: int) -> None:
        nonlocal failed
        failed += result.item is None
        emit(CodegenProgress(done, total, failed, configs[done].describe() if done < total else ""))

    options, notes = request.options, []
    if request.inject and options.compile:
        try:
            find_nvcc(options.nvcc)
        except ToolError as exc:  # not a failure of the run: the compile check is just unavailable here
            options = replace(options, compile=False)
            notes.append(f"compile check skipped: {exc.reason}")
            emit(CompileCheckSkipped(exc.reason))
    emit(CodegenProgress(0, len(configs), 0, configs[0].describe() if configs else ""))
    with closing(StateDB()) as state:
        codegen = generate_all(configs, request.arch, check=request.check, on_result=on_result,
                               should_cancel=should_cancel, state=state, db_path=request.db_path)
        if request.kernels_file is not None:
            _write_atomically(request.kernels_file, json.dumps(codegen.items, indent=1) + "\n")
        if not request.inject or codegen.cancelled or not codegen.items:
            return GenerateReport(codegen, None, request.kernels_file, notes)
        origin = generated_origin(request.arch)
        items = [(origin, position, g.item) for position, g in enumerate(codegen.generated) if g.item is not None]

        def on_progress(progress: InjectProgress) -> None:
            emit(progress.snapshot())

        with open_injector(request.db_path, options, state=state, on_progress=on_progress,
                           should_cancel=should_cancel) as injector:
            report = injector.run_items(items, kind="codegen")
    # The GPU stages are no part of this run: the pipeline's note names flags it does not have.
    notes += [note for note in report.notes if note != GPU_NOT_RUN]
    return GenerateReport(codegen, report, request.kernels_file, notes)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)

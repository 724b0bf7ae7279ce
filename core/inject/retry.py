"""Retry failed conversions with today's settings (a new SM arch, an edited item, a fixed file).

Each failure keeps its input item (or its file, when the whole file failed); a codegen failure keeps
its op config, which is generated again (for the settings' first arch) and injected when that succeeds.
A retried item that passes closes its failure as resolved; one that fails again gets a fresh failure
record and the old one is closed as superseded, so each item has at most one open failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from core.codegen.failures import CODEGEN_STAGE, codegen_detail, codegen_input, config_of
from core.codegen.generate import generate, require_tvm
from core.db.kernel_db import kernel_db_path
from core.db.state import StateDB, StoredFailure
from core.errors import InputError
from core.inject.pipeline import InjectOptions, Injector, InjectProgress, InjectReport, ItemFailure
from core.inject.session import open_injector
from core.kernels.kernel_json import load_items
from core.nnfusion.compile_job import STAGE as NNFUSION_STAGE


def retry_open_failures(
    db_path: Path | str | None,
    options: InjectOptions,
    ids: list[int] | None = None,
    *,
    edited: tuple[int, str] | None = None,
    on_progress: Callable[[InjectProgress], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> InjectReport:
    """The Failures view's r, R and e and `kdb failures retry IDS | --all`: the failures `ids` of the kernel DB at
    `db_path` (None: every open one) retried with `options`, in this state dir; `edited` (a failure's id, its new
    input) is saved first."""
    with closing(StateDB()) as state:
        if edited is not None:
            state.update_input(*edited)
        if ids is None:
            ids = [f.id for f in state.failures(kernel_db_path(db_path)) if f.id is not None]
        return retry_failures(ids, db_path, options, state=state, on_progress=on_progress, should_cancel=should_cancel)


def retry_failures(
    ids: list[int],
    db_path: Path | str | None,
    options: InjectOptions,
    *,
    state: StateDB | None = None,
    on_progress: Callable[[InjectProgress], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> InjectReport:
    """Retry the failures `ids` (of the state DB `state`, else this state dir's) into the kernel DB at `db_path`."""
    with open_injector(db_path, options, state=state, on_progress=on_progress,
                       should_cancel=should_cancel) as injector:
        return _retry(ids, injector, should_cancel)


def _retry(ids: list[int], injector: Injector, should_cancel: Callable[[], bool] | None) -> InjectReport:
    state = injector.state
    assert state is not None  # open_injector always gives the injector one
    options = injector.options
    failures = [f for f in (state.get_failure(i) for i in ids) if f is not None]
    # A failed compile is retried by compiling again, not by injecting: those stay as they are.
    compiles = [f for f in failures if f.stage == NNFUSION_STAGE]
    failures = [f for f in failures if f.stage != NNFUSION_STAGE]
    if compiles and not failures:
        raise InputError(f"{len(compiles)} NNFusion compile failure(s): retry them by compiling again "
                         f"(`kdb nnfusion {compiles[0].file}`, or n in the Op configs view)")
    items: list[tuple[str, int, Any]] = []
    failed_before_injection: list[ItemFailure] = []
    codegen = [f for f in failures if f.stage == CODEGEN_STAGE]
    for f in failures:
        if f.stage == CODEGEN_STAGE:
            continue
        if f.item_index is not None and f.input is not None:
            try:
                items.append((f.file, f.item_index, json.loads(f.input)))
            except ValueError as exc:
                failed_before_injection.append(ItemFailure(f.file, f.item_index, f.name, "read",
                                                           f"edited item is not valid JSON: {exc}", input=f.input))
            continue
        try:  # the whole file failed, or the item was too large to keep: read the file again
            raw_items = load_items(Path(f.file))
        except InputError as exc:
            failed_before_injection.append(ItemFailure(f.file, None, f.name, "read", exc.reason))
            continue
        indices = range(len(raw_items)) if f.item_index is None else [f.item_index]
        items.extend((f.file, i, raw_items[i]) for i in indices if i < len(raw_items))
    if codegen:
        require_tvm()
    for f in codegen:
        if should_cancel is not None and should_cancel():
            break
        generated, failure = _regenerate(f, options.archs[0])
        if generated is not None:
            items.append((f.file, f.item_index or 0, generated))
        elif failure is not None:
            failed_before_injection.append(failure)
    for failure in failed_before_injection:  # recorded like any other failure of this run
        injector.progress.items_seen += failure.index is not None  # each is an item done (failed)
        injector._fail(failure)
    report = injector.run_items(items, kind="retry")
    failed_again = {(r.file, r.index) for r in report.failures} | {(r.file, None) for r in report.failures}
    resolved = [f.id for f in failures if f.id is not None and (f.file, f.item_index) not in failed_again]
    superseded = [f.id for f in failures if f.id is not None and (f.file, f.item_index) in failed_again]
    if not report.cancelled:
        state.close_failures(resolved, resolved=True)
    state.close_failures(superseded, resolved=False)
    return report


def _regenerate(failure: StoredFailure, arch: str) -> tuple[dict[str, Any] | None, ItemFailure | None]:
    """(the kernel JSON item, None), or (None, the failure) for the op config a codegen failure keeps."""
    try:
        config = config_of(failure)
    except InputError as exc:  # an edit that no longer reads: keep it, to be edited again
        detail = {"source": failure.detail_dict().get("source", failure.file), "codegen_stage": "read", "arch": arch}
        return None, ItemFailure(failure.file, failure.item_index, failure.name, CODEGEN_STAGE, str(exc), detail,
                                 failure.input)
    result = generate(config, arch)
    if result.item is not None:
        return result.item, None
    return None, ItemFailure(failure.file, failure.item_index, config.describe(), CODEGEN_STAGE, result.error,
                             codegen_detail(result, arch), codegen_input(config))

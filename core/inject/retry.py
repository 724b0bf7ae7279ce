"""Retry failed conversions with today's settings (a new SM arch, an edited item, a fixed file).

Each failure keeps its input item (or its file, when the whole file failed). A retried item that
passes closes its failure as resolved; one that fails again gets a fresh failure record and the old
one is closed as superseded, so each item has at most one open failure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.errors import InputError
from core.inject.pipeline import InjectOptions, Injector, InjectProgress, InjectReport, ItemFailure
from core.kernels.kernel_json import load_items


def retry_failures(
    ids: list[int],
    db: KernelDB,
    options: InjectOptions,
    state: StateDB,
    *,
    on_progress: Callable[[InjectProgress], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
) -> InjectReport:
    failures = [f for f in (state.get_failure(i) for i in ids) if f is not None]
    items: list[tuple[str, int, Any]] = []
    unreadable: list[ItemFailure] = []
    for f in failures:
        if f.item_index is not None and f.input is not None:
            try:
                items.append((f.file, f.item_index, json.loads(f.input)))
            except ValueError as exc:
                unreadable.append(ItemFailure(f.file, f.item_index, f.name, "read",
                                              f"edited item is not valid JSON: {exc}", input=f.input))
            continue
        try:  # the whole file failed, or the item was too large to keep: read the file again
            raw_items = load_items(Path(f.file))
        except InputError as exc:
            unreadable.append(ItemFailure(f.file, None, f.name, "read", exc.reason))
            continue
        indices = range(len(raw_items)) if f.item_index is None else [f.item_index]
        items.extend((f.file, i, raw_items[i]) for i in indices if i < len(raw_items))
    injector = Injector(db, options, state=state, on_progress=on_progress, should_cancel=should_cancel)
    for u in unreadable:
        injector._fail(u)  # recorded like any other failure of this run
    report = injector.run_items(items, kind="retry")
    failed_again = {(r.file, r.index) for r in report.failures} | {(r.file, None) for r in report.failures}
    resolved = [f.id for f in failures if f.id is not None and (f.file, f.item_index) not in failed_again]
    superseded = [f.id for f in failures if f.id is not None and (f.file, f.item_index) in failed_again]
    if not report.cancelled:
        state.close_failures(resolved, resolved=True)
    state.close_failures(superseded, resolved=False)
    return report

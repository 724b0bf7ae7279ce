"""The one set-up of an injection run: the kernel DB (created with NNFusion's table when missing), the state DB that
keeps its runs and every failure, and an Injector over both. Every run that injects (inject, generate and inject,
retry, tune, the demo) opens them here, so each gets the same handles and closes them the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.db.kernel_db import KernelDB
from core.db.state import StateDB
from core.inject.pipeline import Committed, InjectOptions, Injector, InjectProgress


@dataclass(frozen=True)
class InjectTarget:
    """The kernel DB injections write, and the state DB that keeps their runs and failures."""

    db: KernelDB
    state: StateDB

    def injector(self, options: InjectOptions, *, on_progress: Callable[[InjectProgress], None] | None = None,
                 should_cancel: Callable[[], bool] | None = None,
                 on_commit: Callable[[Committed], None] | None = None) -> Injector:
        """One injection run into this target (a run's report is its own: several runs may share one target)."""
        return Injector(self.db, options, state=self.state, on_progress=on_progress,
                        should_cancel=should_cancel, on_commit=on_commit)


@contextmanager
def open_target(db_path: Path | str | None, *, state: StateDB | None = None) -> Iterator[InjectTarget]:
    """The kernel DB at `db_path` (None: $KDB_DB, else NNFusion's default), and `state`, or the state DB of this state
    dir when none is given; what was opened here is closed when the block ends."""
    with ExitStack() as stack:
        if state is None:
            state = stack.enter_context(closing(StateDB()))
        db = stack.enter_context(KernelDB.open(db_path, create=True))  # with replace, the engine backs it up first
        yield InjectTarget(db, state)


@contextmanager
def open_injector(
    db_path: Path | str | None,
    options: InjectOptions,
    *,
    state: StateDB | None = None,
    on_progress: Callable[[InjectProgress], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    on_commit: Callable[[Committed], None] | None = None,
) -> Iterator[Injector]:
    """An Injector on open_target(db_path, state=state), for a run that injects once."""
    with open_target(db_path, state=state) as target:
        yield target.injector(options, on_progress=on_progress, should_cancel=should_cancel, on_commit=on_commit)

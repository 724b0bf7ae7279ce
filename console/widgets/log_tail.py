"""MetaSchedule's log, tailed: a tap on TVM's loggers while a run is on, and the Log that shows the lines.

The tap runs in the tuning thread and hands out immutable LogTail snapshots (the newest one is all the screen
needs, so they coalesce); the widget appends only the lines it has not shown yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from textual.widgets import Log

TAIL_LINES = 200
METASCHEDULE = "tvm.s_tir.meta_schedule"


@dataclass(frozen=True)
class LogTail:
    total: int  # lines produced so far
    lines: tuple[str, ...]  # the last TAIL_LINES of them


class MetaScheduleTap(logging.Filter):
    """Keeps a copy of MetaSchedule's log records between __enter__ and __exit__; `on_tail` gets each new snapshot.

    A filter that lets every record through, not a handler: every tune_tir re-runs logging.config.dictConfig on
    "tvm.s_tir.meta_schedule", which replaces that logger's handlers and empties those of every logger below it,
    but leaves filters alone. A logger's filters see the records logged on it (not those propagated from below),
    so the tap sits on that logger and on each module logger under it, and sees every record once. Each task's
    own logger (IR dumps, propagating nowhere) is left out: it stays in the work dir's logs/.
    """

    def __init__(self, on_tail: Callable[[LogTail], None]) -> None:
        super().__init__()
        self.formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
        self.on_tail = on_tail
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.total = 0
        self.loggers: list[logging.Logger] = []
        self.lock = threading.Lock()  # records can come from TVM's threads too

    def __enter__(self) -> MetaScheduleTap:
        try:
            import tvm.s_tir.meta_schedule  # noqa: F401  (its modules create their loggers on import)
        except ImportError:
            return self  # nothing to tap: the run itself says TVM is missing
        self.loggers = [logging.getLogger(METASCHEDULE)] + [
            logger for name, logger in list(logging.Logger.manager.loggerDict.items())
            if name.startswith(METASCHEDULE + ".") and isinstance(logger, logging.Logger) and logger.propagate]
        for logger in self.loggers:
            logger.addFilter(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        for logger in self.loggers:
            logger.removeFilter(self)
        self.loggers = []

    def note(self, text: str) -> None:
        """A line of our own (a job's state) among TVM's."""
        self._add([f"{time.strftime('%H:%M:%S')} kdb {text}"])

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self._add(self.formatter.format(record).splitlines())
        except Exception:  # a record that cannot be formatted still goes on to TVM's own handlers
            pass
        return True

    def _add(self, lines: list[str]) -> None:
        lines = [line.rstrip() for line in lines if line.strip()]
        if not lines:
            return
        with self.lock:
            self.tail.extend(lines)
            self.total += len(lines)
            snapshot = LogTail(self.total, tuple(self.tail))
        self.on_tail(snapshot)


class LogTailView(Log):
    """The last TAIL_LINES lines of a run's log (attributes down: the screen calls show and reset)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(max_lines=TAIL_LINES, id=id)
        self.shown = 0

    def show(self, tail: LogTail) -> None:
        new = tail.total - self.shown
        if new > 0:
            self.write_lines(tail.lines[-new:])
            self.shown = tail.total

    def reset(self) -> None:
        self.clear()
        self.shown = 0

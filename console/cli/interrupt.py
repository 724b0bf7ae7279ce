"""Ctrl-C in a long run: the first asks the engine to stop at its next safe point, a second aborts at once."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from console.cli.output import log


@contextmanager
def first_ctrl_c_cancels(in_flight: str) -> Iterator[Callable[[], bool]]:
    """Yields the run's should_cancel: true once Ctrl-C was pressed. The engine then finishes `in_flight` (e.g. "the
    kernel in progress"); a second Ctrl-C raises KeyboardInterrupt (exit 130). The handler stays until the block
    ends, so a Ctrl-C while the report prints does not cut it short."""
    requested = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if requested:
            raise KeyboardInterrupt
        requested = True
        log(f"cancelling after {in_flight} (Ctrl-C again to abort)")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: requested
    finally:
        signal.signal(signal.SIGINT, previous)

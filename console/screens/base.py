"""The base of every view."""

from __future__ import annotations

from textual.screen import Screen
from textual.worker import Worker


class KdbScreen(Screen[None]):
    """A view whose worker failures reach the App's one handler (a screen's worker events do not bubble)."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        self.app.report_worker_failure(event)  # type: ignore[attr-defined]

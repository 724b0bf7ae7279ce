"""Placeholder while the screen is being written (not committed as a feature)."""

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static


class FailuresScreen(Screen[None]):
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("failures: being built")
        yield Footer()

"""Placeholder while the screen is being written (not committed as a feature)."""

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static


class InjectScreen(Screen[None]):
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("inject: being built")
        yield Footer()

"""Typed modal dialogs: each returns its answer through dismiss(), so callers get a typed result."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from core.errors import InputError
from core.settings import Settings, save_settings


class ConfirmDialog(ModalScreen[bool]):
    """Yes/no, with the consequences spelled out."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel"), Binding("y", "confirm", "Yes")]

    def __init__(self, question: str, detail: str = "", *, confirm_label: str = "Yes") -> None:
        super().__init__()
        self.question, self.detail, self.confirm_label = question, detail, confirm_label

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.question, classes="dialog-title")
            yield from self.details()
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.confirm_label, variant="error", id="confirm")
                yield Button("Cancel", id="cancel")

    def details(self) -> ComposeResult:
        """What is between the question and the buttons (a subclass may show more)."""
        if self.detail:
            yield Static(self.detail, classes="dialog-detail")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


def start_folder(settings: Settings) -> Path:
    """Where a file dialog starts: the folder of the last path one took (while it exists), else the working dir."""
    if settings.last_path:
        last = Path(settings.last_path).expanduser()
        for folder in (last, last.parent):
            if folder.is_dir():
                return folder
    return Path.cwd()


def dialog_default(settings: Settings, name: str = "") -> str:
    """A dialog's starting text: start_folder, then a file name if one is proposed."""
    return str(start_folder(settings) / name) if name else f"{start_folder(settings)}/"


class PathDialog(ModalScreen[str | None]):
    """Ask for a file path (export destinations and the like); the path taken is remembered in the settings
    (last_path), so the next dialog starts in its folder."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, default: str) -> None:
        super().__init__()
        self.title_text, self.default = title, default

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Input(self.default, id="path")
            with Horizontal(classes="dialog-buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        # focused here, not left to Textual's auto focus, which skips a screen opened while the terminal reports the
        # app blurred, and leaves the path without focus when it comes back
        self.query_one("#path", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.take(event.value)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.take(self.query_one("#path", Input).value)
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def take(self, text: str) -> None:
        path = text.strip()
        if path:
            self.remember(Path(path).expanduser().absolute())
        self.dismiss(path or None)

    def remember(self, path: Path) -> None:
        settings: Settings = self.app.context.settings  # type: ignore[attr-defined]
        settings.last_path = str(path)
        try:
            save_settings(settings)
        except (OSError, InputError) as exc:  # the choice still goes through: only the memory of it is lost
            self.app.notify(f"could not remember {path} in the settings: {exc}", severity="warning")


class EditTextDialog(ModalScreen[str | None]):
    """Edit a text (a kernel JSON item) in a TextArea; returns the new text, or None if cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel"),
                                             Binding("ctrl+s", "save", "Save")]

    def __init__(self, title: str, text: str, *, language: str | None = "json") -> None:
        super().__init__()
        self.title_text, self.text, self.language = title, text, language

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog dialog-wide"):
            yield Label(self.title_text, classes="dialog-title")
            yield TextArea(self.text, language=self.language, id="editor", show_line_numbers=True)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save and retry (ctrl+s)", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#editor", TextArea).focus()  # as PathDialog's path: typing goes to the text at once

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.dismiss(None)

    def action_save(self) -> None:
        self.dismiss(self.query_one("#editor", TextArea).text)

    def action_cancel(self) -> None:
        self.dismiss(None)

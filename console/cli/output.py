"""How the CLI talks: Rich for people (tables, progress on a terminal), plain JSON for scripts.

Results go to stdout, logs and progress to stderr; NO_COLOR is honoured by Rich itself. Rich is imported
on first use: a command that prints JSON or plain lines never pays for it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _width(stream: TextIO) -> int | None:
    """Rich's width for a stream: the terminal's on a terminal (None: Rich finds it, or COLUMNS says it).
    Off a terminal Rich would fold every table and message at 80 columns, splitting failure reasons
    across lines of a CI log; there a wide page keeps one line per row."""
    return None if is_terminal(stream) or os.environ.get("COLUMNS") else 200


class _LazyConsole:
    """A Rich Console for stdout or stderr, made on first use."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def _real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            # Messages on stderr are never folded: one reason, one line, whatever the page width.
            self._console = Console(stderr=self._stderr, soft_wrap=self._stderr, width=_width(stream))
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    # A Rich progress bar enters its console (`with console:`), and special methods bypass __getattr__.
    def __enter__(self) -> Console:
        return self._real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._real().__exit__(*exc)


out: Console = _LazyConsole(stderr=False)  # type: ignore[assignment]
err: Console = _LazyConsole(stderr=True)  # type: ignore[assignment]


def print_json(value: Any, stream: TextIO | None = None) -> None:
    write(json.dumps(value, ensure_ascii=False, indent=None, default=str) + "\n", stream)
    (stream or sys.stdout).flush()


def write(text: str, stream: TextIO | None = None) -> None:
    """Text as UTF-8, with no Rich in the way. Undecodable file names or lone surrogates leave as \\udcXX
    escapes (still valid JSON inside a JSON string), never a crash."""
    (stream or sys.stdout).buffer.write(text.encode("utf-8", "backslashreplace"))


def log(message: str) -> None:
    """One message, one line: never folded (a file path in it can make it longer than any page)."""
    err.print(message, markup=False, highlight=False, soft_wrap=True)


def console_for(stream: TextIO) -> Console:
    """A Rich console on another stream (tune's captured stderr) with the same width rule as out/err."""
    from rich.console import Console

    return Console(file=stream, soft_wrap=False, width=_width(stream))


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def shorten_path(path: str, width: int) -> str:
    """A file's path as a reader finds it: relative to the working folder when inside it, and cut from the left
    (its name is the part that tells two files apart: ops.txt of two models)."""
    import os

    try:
        relative = os.path.relpath(path)
    except ValueError:  # (another drive)
        relative = ".."
    shown = path if relative.startswith("..") else relative
    return shown if len(shown) <= width else "…" + shown[-(width - 1):]

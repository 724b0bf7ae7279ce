"""How the CLI talks: Rich for people (tables, progress on a terminal), plain JSON for scripts.

Results go to stdout, logs and progress to stderr; NO_COLOR is honoured by Rich itself.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rich.console import Console


def _width(stream: TextIO) -> int | None:
    """Rich's width for a stream: the terminal's on a terminal (None: Rich finds it, or COLUMNS says it).
    Off a terminal Rich would fold every table and message at 80 columns, splitting failure reasons
    across lines of a CI log; there a wide page keeps one line per row."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return None if tty or os.environ.get("COLUMNS") else 200


out = Console(soft_wrap=False, width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))


def print_json(value: Any, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    text = json.dumps(value, ensure_ascii=False, indent=None, default=str) + "\n"
    # Undecodable file names or lone surrogates leave as \\udcXX escapes: still valid JSON, never a crash.
    stream.buffer.write(text.encode("utf-8", "backslashreplace"))
    stream.flush()


def log(message: str) -> None:
    err.print(message, markup=False, highlight=False)


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"

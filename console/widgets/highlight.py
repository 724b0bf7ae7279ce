"""Source listings highlighted and numbered ahead of time, as plain `Text`.

Pygments takes a second or two on a 30 KB TVM body. A rich `Syntax` defers that work to rendering,
which happens on the UI thread; views build these listings in workers instead, so the UI thread only
lays them out.
"""

from __future__ import annotations

from collections.abc import Collection

from rich.style import Style
from rich.text import Text

MARK = Style(color="white", bgcolor="dark_red", bold=True)


def numbered_listing(code: str, language: str, marked: Collection[int] | None = None) -> Text:
    """`code` highlighted, each line numbered; with `marked`, a gutter flags those lines (❱) and they
    stand out in MARK."""
    from rich.syntax import Syntax  # Pygments: loaded when the first listing is built, not at start-up

    lines = Syntax(code, language, theme="ansi_dark").highlight(code).split("\n", allow_blank=True)
    width = len(str(len(lines)))
    out = Text(no_wrap=True, overflow="crop")
    for number, line in enumerate(lines, start=1):
        flagged = marked is not None and number in marked
        if marked is not None:
            out.append("❱ " if flagged else "  ", style="bold red" if flagged else "")
        out.append(f"{number:>{width}} ", style="dim")
        if flagged:
            line.stylize(MARK)
        out.append_text(line)
        out.append("\n")
    out.rstrip()
    return out

"""A time ratio against the library, with a bar: what the compile dialog's op times and the Network view show."""

from __future__ import annotations

from rich.text import Text

BAR = 16  # cells of the bar at 4x the library (longer ratios stop there)


def ratio_bar(ratio: float | None) -> Text:
    """The ratio and a bar of it: red where the row is slower than the library, green where it is faster."""
    if ratio is None:
        return Text("not measured", style="dim")
    cells = max(1, min(BAR, round(ratio * BAR / 4)))
    return Text(f"{ratio:5.2f}x ", style="bold") + Text("█" * cells, style="red" if ratio > 1.0 else "green")

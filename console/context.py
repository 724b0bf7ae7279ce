"""What every screen of the console needs to know, handed down from the App ("attributes down")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from core.db.kernel_db import KernelDB
from core.opconfigs.opconfig import OpConfig
from core.settings import Settings, load_settings


@dataclass
class ConsoleContext:
    db_path: Path
    settings: Settings = field(default_factory=load_settings)
    demo: bool = False
    device_summary: str = "detecting GPU…"
    # The Op configs view's list, edited in place there (the App hands this very list to that view) and read by
    # the Tuning view: one view never reaches into another.
    opconfigs: list[OpConfig] = field(default_factory=list)

    def open_db(self, *, write: bool = False) -> KernelDB:
        """A short-lived handle for one worker's job (each worker opens its own: no shared connection)."""
        db = KernelDB.open(self.db_path, write=write)
        db.order_product = self.settings.product_name  # the console's settings rank each op's rows on every write
        return db

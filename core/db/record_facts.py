"""What a state record offers whichever way it came (SQLModel's class, about to be written; or read back as a
light record): shared by core/db/state.py and core/db/state_records.py, which must not import each other at load."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any


def _json_object(text: str) -> dict[str, Any]:
    """A detail column's JSON object ({} when it holds anything else)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class WithDetail:
    """What every record with a JSON detail column offers, read back or about to be written (a mixin: its
    annotations are for type checkers only, so SQLModel takes no columns from it)."""

    if TYPE_CHECKING:
        detail: str

    def detail_dict(self) -> dict[str, Any]:
        return _json_object(self.detail)


class FailureFacts(WithDetail):
    if TYPE_CHECKING:
        file: str
        item_index: int | None
        name: str
        stage: str
        reason: str

    def as_report(self) -> dict[str, Any]:
        return {"file": self.file, "index": self.item_index, "name": self.name, "stage": self.stage,
                "reason": self.reason}

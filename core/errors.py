"""The one error type the engine lets escape: every parser and loader raises KdbError (or a subclass).

A KdbError always says what was wrong in words a user can act on; `where` names the place
(file, item, field) when there is one.
"""

from __future__ import annotations


class KdbError(Exception):
    """A user-facing failure: bad input, unusable DB, a tool that is missing or failed."""

    def __init__(self, reason: str, *, where: str = "") -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.reason = reason
        self.where = where


class InputError(KdbError):
    """Malformed or unsupported input (kernel JSON, CUDA source, op configs, logs, profiles)."""


class DbError(KdbError):
    """The kernel DB cannot be opened, read or written as asked."""


class ToolError(KdbError):
    """An external tool (nvcc, TVM, the GPU) is missing, hung or failed."""


def printable(text: str) -> str:
    """Text safe to keep in a failure record, SQLite and JSON: undecodable bytes (of file names, say) become
    backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")

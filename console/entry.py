"""The `kdb` command: the console with no arguments, the CLI otherwise.

Kept tiny so `kdb --help` starts fast: Textual, Rich, SQLAlchemy and TVM load only when a command
needs them.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        args = ["console"]
    from console.cli.parser import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())

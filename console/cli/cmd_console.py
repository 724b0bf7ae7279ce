"""kdb console: open the Textual console on a kernel DB."""

from __future__ import annotations

import argparse


def main(args: argparse.Namespace) -> int:
    from console.app import run_app

    return run_app(db_path=args.db, demo=args.demo)

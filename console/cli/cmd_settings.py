"""kdb settings: show the settings the console and the CLI share, or change them (KEY=VALUE ...)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from console.cli.output import out, print_json
from core.errors import InputError
from core.settings import Settings, load_settings, parse_value, save_settings, settings_dict, settings_path


def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.assignments:
        for assignment in args.assignments:
            key, sep, value = assignment.partition("=")
            if not sep:
                raise InputError(f"{assignment!r}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(f.name for f in fields(Settings))}")
            setattr(settings, key, parse_value(key, value))
        path = save_settings(settings)
        out.print(f"saved {path}")
    if args.json:
        print_json({"path": str(settings_path()), **settings_dict(settings)})
    else:
        out.print(f"[bold]{settings_path()}[/]")
        for key, value in settings_dict(settings).items():
            out.print(f"  {key} = {value!r}")
    return 0

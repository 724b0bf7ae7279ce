"""kdb settings: show the settings the console and the CLI share, or change them (KEY=VALUE ...)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from console.cli.output import out, print_json
from core.errors import InputError
from core.settings import Settings, load_settings, save_settings, settings_dict, settings_path


def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.assignments:
        kinds = {f.name: f for f in fields(Settings)}
        for assignment in args.assignments:
            key, sep, value = assignment.partition("=")
            if not sep or key not in kinds:
                raise InputError(f"{assignment!r}: expected KEY=VALUE with KEY one of {', '.join(kinds)}")
            current = getattr(settings, key)
            if isinstance(current, list):
                setattr(settings, key, [v for v in value.split(",") if v] if value else [])
            elif isinstance(current, int):
                setattr(settings, key, int(value))
            elif isinstance(current, float):
                setattr(settings, key, float(value))
            else:
                setattr(settings, key, value)
        path = save_settings(settings)
        out.print(f"saved {path}")
    if args.json:
        print_json({"path": str(settings_path()), **settings_dict(settings)})
    else:
        out.print(f"[bold]{settings_path()}[/]")
        for key, value in settings_dict(settings).items():
            out.print(f"  {key} = {value!r}")
    return 0

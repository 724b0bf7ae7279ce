"""kdb settings: show the settings the console and the CLI share, or change them (KEY=VALUE ...)."""

from __future__ import annotations

import argparse
from dataclasses import fields

from console.cli.output import out, print_json
from core.cuda.nvcc import probe_nvcc
from core.errors import InputError
from core.settings import Settings, load_settings, read_settings, save_settings, settings_dict, settings_path


def main(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.assignments:
        values: dict[str, str] = {}
        for assignment in args.assignments:
            key, sep, value = assignment.partition("=")
            if not sep:
                raise InputError(f"{assignment!r}: expected KEY=VALUE with KEY one of "
                                 f"{', '.join(f.name for f in fields(Settings))}")
            values[key] = value
        probe = None
        if {"archs", "nvcc_path"} & set(values):  # what nvcc decides: whether nvcc_path finds it, the archs it builds
            probe = probe_nvcc(values.get("nvcc_path", settings.nvcc_path))
            values.setdefault("archs", ", ".join(settings.archs))  # another nvcc: archs checked again, as in the form
        settings, errors = read_settings(values, probe, settings)
        if errors:
            raise InputError("; ".join(f"{key}: {why}" for key, why in errors.items()) + " (nothing saved)")
        path = save_settings(settings)
        out.print(f"saved {path}")
    if args.json:
        print_json({"path": str(settings_path()), **settings_dict(settings)})
    else:
        out.print(f"[bold]{settings_path()}[/]")
        for key, value in settings_dict(settings).items():
            out.print(f"  {key} = {value!r}")
    return 0

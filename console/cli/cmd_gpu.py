"""kdb gpu devices | verify | profile: the GPU side, for kernels already in the DB."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from console.cli.output import out, print_json, shorten
from core.errors import KdbError


def main(args: argparse.Namespace) -> int:
    if args.gpu_command == "devices":
        return _devices(args)
    from core.gpu.rows import GpuCheckRequest, check_db_rows
    from core.settings import load_settings

    if not args.all and not args.keys:
        raise KdbError("name kernels (Key or Identifier) or use --all")
    request = GpuCheckRequest.from_settings(load_settings(), args.db, args.keys, profile=args.gpu_command == "profile",
                                            every_row=args.all, op=args.op or "")
    report = check_db_rows(request, on_result=None if args.json else _print_one)
    if args.json:
        print_json(report.as_json())
    else:
        bad = sum(not c.ok for c in report.checks)
        out.print(f"{len(report.checks)} kernels on {report.device}: {len(report.checks) - bad} ok, {bad} failed")
    return 1 if any(not c.ok for c in report.checks) else 0


def _print_one(check) -> None:  # type: ignore[no-untyped-def]
    status = "[green]ok[/]" if check.ok else "[red]FAILED[/]"
    err = f"{check.verified.max_rel_error:.1e}" if check.verified and check.verified.max_rel_error is not None else "-"
    us = f"{check.timed.microseconds:.2f} us" if check.timed and check.timed.microseconds else ""
    why = check.error or (check.verified.reason if check.verified and not check.verified.ok else "") or (
        check.timed.reason if check.timed and not check.timed.ok else "")
    out.print(f"{status} {shorten(check.name, 60)}  rel.err {err}  {us} {why}")


def _devices(args: argparse.Namespace) -> int:
    from core.gpu.inventory import detect_devices

    devices, reason = detect_devices()
    if args.json:
        print_json({"devices": [asdict(d) for d in devices], "reason": reason})
    elif not devices:
        out.print(reason)
    for d in [] if args.json else devices:
        out.print(f"{d.index}: {d.name} ({d.arch}), {d.sm_count} SMs, {d.shared_per_block // 1024} KiB shared/block "
                  f"({d.shared_per_block_optin // 1024} KiB opt-in), {d.registers_per_block} registers/block, "
                  f"{d.clock_khz / 1e6:.2f} GHz, {d.memory_bytes / 2**30:.0f} GiB")
    return 0 if devices else 1

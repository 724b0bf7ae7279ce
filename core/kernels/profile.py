"""NNFusion's profile string (`Miscs.external_profile.time`): `<device>:<microseconds>;` per device.

The compiler splits on ';' and the first ':' and converts with std::stof, so a device name may hold
neither character, a time must be a finite decimal number, and every entry ends with ';' (an entry
without it is silently ignored by the compiler's loop).
"""

from __future__ import annotations

import math
import re

from core.errors import InputError

_C_SPACE = " \t\n\v\f\r"  # what std::stof skips; str.strip() would also take \x1c-\x1f, which float() refuses
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?")


def parse_profile(text: str) -> dict[str, float]:
    """Device -> microseconds. InputError names the entry the compiler would choke on or skip."""
    if not isinstance(text, str):
        raise InputError(f"profile time must be a string, got {type(text).__name__}")
    out: dict[str, float] = {}
    if text == "":
        return out
    if not text.endswith(";"):
        raise InputError(f"profile {text[:60]!r} does not end with ';' (the compiler skips its last entry)")
    for entry in text[:-1].split(";"):
        device, sep, value = entry.partition(":")
        if not sep:
            raise InputError(f"profile entry {entry[:60]!r} has no ':'")
        if not device:
            raise InputError(f"profile entry {entry[:60]!r} has no device name")
        number = value.strip(_C_SPACE)
        if not _NUMBER.fullmatch(number):
            raise InputError(f"profile entry {entry[:60]!r}: {value[:30]!r} is not a time in microseconds")
        time = float(number)
        if not math.isfinite(time) or time <= 0:
            raise InputError(f"profile entry {entry[:60]!r}: time must be positive and finite")
        if device in out:
            raise InputError(f"profile names device {device!r} twice")
        out[device] = time
    return out


def format_profile(times: dict[str, float]) -> str:
    parts = []
    for device, us in times.items():
        if not device or any(c in device for c in ":;"):
            raise InputError(f"device name {device!r} cannot go into a profile string (':' and ';' delimit it)")
        if not math.isfinite(us) or us <= 0:
            raise InputError(f"time {us!r} for {device!r} is not a positive finite number")
        parts.append(f"{device}:{us:.6g};")
    return "".join(parts)


def merge_profile(existing: str, device: str, us: float) -> str:
    """Set one device's time, keeping every other device's entry."""
    times = parse_profile(existing)
    times[device] = us
    return format_profile(times)

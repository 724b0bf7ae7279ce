"""TVM's errors cut to what decides them, and the IR they were raised on.

A ScheduleError's message is mostly the whole module printed with the offending statements underlined
(`^^^`), then "Error message: ...", sometimes followed by a numbered definition of which only the item
it names ("violates condition #2") matters. Other TVM errors end with their message after a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_EXCERPT_LINES = 12
MAX_REASON = 500
MAX_SCRIPT = 256 * 1024  # the IR kept with a failure record; bigger modules are cut at this size

# A ScheduleError prints the IR after the first; a pass's error (TVM 0.27: "Error in pass: ...") after the second
_IR_HEADERS = ("The IR with diagnostic is:", "Location (TVMScript):")
_PASS = "Error in pass:"
_UNDERLINE = re.compile(r"^\s*\^+\s*$")
_PRIMITIVE = re.compile(r"in the schedule primitive '([\w-]+)'")
_CONDITION = re.compile(r"condition #(\d+)")
_BLOCK_REF = re.compile(r"\bs_tir\.SBlock#\d+")
_FRAME = re.compile(r"^\s*(?:File \"|\d+: |Traceback \(most recent call last\))")


@dataclass
class TvmDiagnosis:
    reason: str  # one line: the error type, the primitive and the decisive message
    excerpt: str  # the decisive lines of TVM's message, the IR left out
    script: str = ""  # the IR TVM printed with the error, underlines removed
    marked: list[int] = field(default_factory=list)  # 1-based lines of `script` TVM underlined


def diagnose(exc: BaseException) -> TvmDiagnosis:
    kind = type(exc).__name__
    lines = str(exc).strip().splitlines()
    script, marked, rest = _split_ir(lines)
    message_at = next((i for i, line in enumerate(rest) if line.startswith("Error message:")), None)
    if message_at is None:  # no schedule diagnostic: the message is what follows the traceback frames
        excerpt = [line for line in rest if line.strip() and not _FRAME.match(line)][-MAX_EXCERPT_LINES:]
        head = next((line.strip() for line in reversed(excerpt) if not line.startswith(_PASS)), "")
        reason = head if head.startswith(f"{kind}:") else f"{kind}: {head}" if head else kind
        return TvmDiagnosis(reason[:MAX_REASON], "\n".join(excerpt), script, marked)
    message = rest[message_at].removeprefix("Error message:").strip()
    definition = rest[message_at + 1:]
    condition = _CONDITION.search(message)
    named = next((line for line in definition if condition and line.startswith(f"{condition.group(1)})")), "")
    message = _BLOCK_REF.sub(lambda m: _block_name(script, m.group(0)), message)
    primitive = _PRIMITIVE.search(rest[0]) if rest else None
    reason = f"{kind} in {primitive.group(1)}" if primitive else kind
    reason += f": {message.rstrip('.')}: {named.split(')', 1)[1].strip()}" if named else f": {message}"
    excerpt = [rest[0], f"Error message: {message}", *([named] if named else definition[:MAX_EXCERPT_LINES - 2])]
    return TvmDiagnosis(reason[:MAX_REASON], "\n".join(excerpt), script, marked)


def _split_ir(lines: list[str]) -> tuple[str, list[int], list[str]]:
    """(IR, its underlined lines, the message without the IR)."""
    header = next((h for h in _IR_HEADERS if h in lines), None)
    if header is None:
        return "", [], lines
    start = lines.index(header) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("Error message:")), len(lines))
    body = [line for line in lines[start:end] if not line.startswith(("Access path:", "Note: "))]
    while body and not body[0].strip():
        body.pop(0)
    script: list[str] = []
    marked: list[int] = []
    for line in body:
        if not _UNDERLINE.match(line):
            script.append(line)
        elif script and (not marked or marked[-1] != len(script)):
            marked.append(len(script))  # the line above is underlined
    text = "\n".join(script).rstrip()[:MAX_SCRIPT] + "\n"
    return text, [n for n in marked if n <= text.count("\n")], [*lines[:start - 1], *lines[end:]]


def _block_name(script: str, ref: str) -> str:
    """TVM names blocks in messages by a comment above them in the IR: their name is on the next line."""
    lines = script.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip() == f"# {ref}":
            found = re.search(r'T\.s?block\("([^"]+)"\)', lines[i + 1])
            if found:
                return f'"{found.group(1)}"'
    return ref

"""Run the user's NNFusion compiler on a model with a kernel DB, and read its log.

The compiler writes a CUDA project (`nnfusion_rt/cuda_codegen/`) into its working directory. At
`-min_log_level=0` it logs every kernel-DB lookup ("Trying to fetch kernel <identifier> on DeviceType: <d>")
and every pattern it substitutes, which is how kdb knows what it asked the DB for.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import KdbError
from core.opconfigs.extract_cache import extract_cached
from core.opconfigs.onnx_extract import Extraction
from core.opconfigs.ort_prepass import SCRIPT, PrePass

# Flags whose value changes what the compiler asks the DB for, with NNFusion's defaults.
FLAG_DEFAULTS: dict[str, int | bool] = {
    "kernel_fusion_level": 3,  # element-wise chains become NNFusion's own kernels above 0
    "blockfusion_level": 1,
    "blockfusion_interplay": True,  # big BlockFusion groups swap in the row with the smallest time x resource
    "pattern_substitution": True,  # Conv+Relu, Conv+Add+Relu -> Matched_Pattern (needs the CUDA row)
    "kernel_selection": False,  # profile-based selection instead of the first External row
}
_FLAG = re.compile(r"^--?f(\w+?)(?:=(.*))?$")
_LOOKUP = re.compile(r"Trying to fetch kernel (.*) on DeviceType: (\S+)\s*$")
_SUBSTITUTED = re.compile(r"Substitution applied: (.*?)\s*$")
# `what():` (the message of the exception that ended it) has no word boundary after its parenthesis: outside \b..\b.
# (CHECK and Check failed in their case: the ONNX Runtime pre-pass prints "ONNX model check passed!")
_DECISIVE = re.compile(r"(?i:\b(ERROR|FATAL|Failure at|terminate called|Aborted|exception)\b|\bwhat\(\))"
                       r"|\b(Check failed|CHECK)\b")
# Lines every run prints, failing or not: the optional onnxruntime pre-optimisation's traceback, and kernel
# selection finding no kernel for graph inputs and outputs.
_HARMLESS = re.compile(r"ort_run_frozen|onnxruntime|^Traceback \(most recent call last\)|Failed to optimize ONNX Graph "
                       r"with external tool|No valid kernel found:.*\(op type: (?:Parameter|Constant|Result),")
_PREFIX = re.compile(r"^\[(?:INFO|DEBUG|WARNING|ERROR|FATAL)\] \S+ \S+ \d+\s+|^\s*what\(\):\s*")
_LOG_LINE = re.compile(r"^\[(?:INFO|DEBUG|WARNING|ERROR|FATAL)\]")
_CONVERTING = re.compile(r"graph_convert\.cpp \d+\s+convert node: (.*?)\s*$")


@dataclass(frozen=True)
class CompilerFlags:
    """The compiler flags coverage models (NNFusion's defaults unless given)."""

    kernel_fusion_level: int = 3
    blockfusion_level: int = 1
    blockfusion_interplay: bool = True
    pattern_substitution: bool = True
    kernel_selection: bool = False

    @classmethod
    def parse(cls, flags: Iterable[str]) -> CompilerFlags:
        """From command-line flags as the compiler takes them (`-fkernel_fusion_level=0`, `-fblockfusion_level=0`,
        `-fpattern_substitution=false`); other flags are the compiler's business. KdbError on a bad value."""
        values: dict[str, int | bool] = {}
        for flag in flags:
            match = _FLAG.match(flag.strip())
            if not match or match.group(1) not in FLAG_DEFAULTS:
                continue
            name, text = match.group(1), match.group(2)
            default = FLAG_DEFAULTS[name]
            if isinstance(default, bool):
                if text is None or text.lower() in ("true", "1"):
                    values[name] = True
                elif text.lower() in ("false", "0"):
                    values[name] = False
                else:
                    raise KdbError(f"{flag}: -f{name} takes true or false")
            else:
                try:
                    values[name] = int(text or "")
                except ValueError:
                    raise KdbError(f"{flag}: -f{name} takes a whole number") from None
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Lookup:
    identifier: str
    device_type: str


@dataclass
class CompileResult:
    command: list[str]
    workdir: Path
    returncode: int | None  # None: cancelled or timed out before it ended
    seconds: float
    log_file: Path
    cancelled: bool = False
    timed_out: bool = False
    lookups: list[Lookup] = field(default_factory=list)
    substitutions: list[str] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)  # the log's last lines

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.project is not None

    @property
    def project(self) -> Path | None:
        folder = self.workdir / "nnfusion_rt" / "cuda_codegen"
        return folder if (folder / "nnfusion_rt.cu").is_file() else None

    def decisive_lines(self, limit: int = 12) -> list[str]:
        """What says why a run failed: the node the importer was converting when it stopped, then the log's error
        messages (a check's text joined with the line it continues on; each once), else the log's end (not when
        the importer stopped without a message: its last lines are only progress)."""
        raw = self._raw_log_lines()
        node = self._importing(raw)
        lines = _since_node_began(_kept(raw)) if node is not None else _kept(raw)
        messages = _messages(lines)
        head = [f"while importing ONNX node {node or '(unnamed)'}"] if node is not None else []
        return head + (messages[-limit:] if messages else [] if node is not None else lines[-limit:])

    def _raw_log_lines(self) -> list[str]:
        """The log's lines, read once for each question asked of it."""
        return self.log_file.read_text(encoding="utf-8", errors="replace").splitlines() if self.log_file.exists() \
            else []

    def importing_node(self) -> str | None:
        """The ONNX node the importer was converting when the run ended, when it ended there (None otherwise)."""
        return self._importing(self._raw_log_lines())

    def _importing(self, raw: list[str]) -> str | None:
        if self.returncode == 0 or not raw:
            return None
        node = None
        for line in raw:
            if (m := _CONVERTING.search(line)) is not None:
                node = m.group(1)
            elif "convert graph done" in line:
                node = None
        return node

    def reason(self) -> str:
        if self.cancelled:
            return "cancelled"
        if self.timed_out:
            return f"the compiler ran past its time limit ({self.seconds:.0f} s)"
        if self.returncode is not None and self.returncode != 0:
            how = (f"was killed by {_signal_name(-self.returncode)}" if self.returncode < 0
                   else f"exited with status {self.returncode}")
            # the first message (a kernel selection's "No valid kernel found" comes before the check it then fails),
            # where the importer stopped; not libstdc++'s "terminate called after throwing ..."
            raw = self._raw_log_lines()
            node = self._importing(raw)
            found = _messages(_since_node_began(_kept(raw)) if node is not None else _kept(raw))
            cause = next((line for line in found if not line.startswith("terminate called")), found[0] if found else "")
            where = f" while importing ONNX node {node or '(unnamed)'}" if node is not None else ""
            return f"nnfusion {how}{where}" + (f": {cause}" if cause else "")
        return "" if self.project else "nnfusion exited 0 but wrote no nnfusion_rt/cuda_codegen/nnfusion_rt.cu"


def _kept(raw: list[str]) -> list[str]:
    """The log's lines that can say why a run failed: not blank, not what every run prints (_HARMLESS)."""
    return [line.rstrip() for line in raw if line.strip() and not _HARMLESS.search(line)]


def _since_node_began(lines: list[str]) -> list[str]:
    """The lines after the importer began its last node: where it stopped (an [ERROR] it logged and went on from at
    an earlier node, a Split's unread attribute, is not the cause)."""
    began = max((i for i, line in enumerate(lines) if _CONVERTING.search(line)), default=-1)
    return lines[began + 1:]


def _messages(lines: list[str]) -> list[str]:
    """The log's error messages, in order: a check's text joined with the line it continues on; each once (a failed
    check is logged, then printed again by terminate)."""
    messages = []
    for i, line in enumerate(lines):
        if _DECISIVE.search(line):
            follows = lines[i + 1] if i + 1 < len(lines) else ""
            continued = bool(follows) and not _LOG_LINE.match(follows) and not _DECISIVE.search(follows)
            messages.append(_PREFIX.sub("", line).strip() + (f" {follows.strip()}" if continued else ""))
    return list(dict.fromkeys(messages))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name  # SIGABRT: a failed check; SIGSEGV: a crash
    except ValueError:
        return f"signal {number}"


def find_compiler(given: str = "", setting: str = "") -> Path:
    """The nnfusion binary, found the one way every command finds it: `given` (a command's --nnfusion), else the
    nnfusion_path setting, else `nnfusion` on PATH. Each may be a path or a name on PATH. KdbError says where it
    looked when none is there."""
    if given:
        name, where = given, f"--nnfusion ({given!r})"
    elif setting:
        name, where = setting, f"the nnfusion_path setting ({setting!r})"
    else:
        name, where = "nnfusion", "PATH (set nnfusion_path in the settings, or give --nnfusion PATH)"
    name = os.path.expanduser(name)
    found = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) and
                                                            os.path.isfile(name) else None)
    if not found:
        raise KdbError(f"no NNFusion compiler found in {where}: point it at the nnfusion binary "
                       "(built from github.com/microsoft/nnfusion; its assets stay beside it)")
    return Path(found).resolve()


def compiler_environment() -> dict[str, str]:
    """The environment kdb runs the compiler in (its own): the PATH here decides which python3 runs the pre-pass."""
    return dict(os.environ)


NO_PREPASS = "#!/bin/sh\necho 'kdb: NNFusion runs without its ONNX Runtime pre-pass on this model' >&2\nexit 1\n"


def without_prepass(env: dict[str, str], workdir: Path) -> dict[str, str]:
    """`env` with a python3 first on the PATH that fails at once: the compiler's pre-pass does not rewrite the model,
    and it imports the model as given (onnx_import/onnx.cpp: it falls back when the script fails)."""
    folder = workdir / "no-prepass"
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "python3"
    shim.write_text(NO_PREPASS, encoding="utf-8")
    shim.chmod(0o755)
    return {**env, "PATH": f"{folder}{os.pathsep}{env.get('PATH', os.defpath)}"}


def compiler_prepass(given: str = "", setting: str = "") -> PrePass:
    """NNFusion's ONNX Runtime pre-pass as the compiler find_compiler(given, setting) finds will run it: the script
    beside its binary, and the python3 its system() call finds on the PATH kdb gives it (/bin/sh's default path
    when there is none). When no compiler is found, a PrePass that says the pre-pass could not be checked."""
    try:
        binary = find_compiler(given, setting)
    except KdbError as exc:
        return PrePass.not_checked(str(exc))
    python3 = shutil.which("python3", path=compiler_environment().get("PATH", os.defpath))
    return PrePass(binary.parent / SCRIPT, Path(python3) if python3 else None)


def extract_for_compiler(model: Path, flags: Iterable[str], *, binary: str = "", nnfusion_path: str = "") -> Extraction:
    """A model's op configs as the compiler find_compiler(binary, nnfusion_path) imports it (its ONNX Runtime pre-pass
    run) and looks them up at `flags` (cached by content): the Op configs view's import, `kdb opconfig extract`,
    `kdb coverage` and a compile's own coverage all read a model here."""
    return extract_cached(model, CompilerFlags.parse(list(flags)), prepass=compiler_prepass(binary, nnfusion_path))


def compile_model(model: Path, db: Path, workdir: Path, *, binary: Path, product_name: str = "",
                  flags: Iterable[str] = (), timeout_s: float = 1800.0,
                  on_line: Callable[[str], None] | None = None,
                  should_cancel: Callable[[], bool] | None = None, prepass: bool = True) -> CompileResult:
    """Compile `model` (ONNX) against the kernel DB `db` in `workdir`; never raises for a failing compile.

    The command is a list (no shell); the log goes to workdir/nnfusion.log and, line by line, to on_line.
    prepass=False runs the compiler without its ONNX Runtime pre-pass (the extraction's outcome says when:
    ort_prepass.PrePassOutcome.bypassed).
    """
    if not model.is_file():
        raise KdbError(f"{model}: no such model file")
    workdir = workdir.resolve()  # the log's path and the project's are reported: never relative to our cwd
    workdir.mkdir(parents=True, exist_ok=True)
    command = [str(binary), str(model.resolve()), "-f", "onnx", f"-fkernel_cache_path={db.resolve()}",
               "-min_log_level=0", *flags]
    if product_name:
        command.append(f"-fproduct_name={product_name}")
    log_file = workdir / "nnfusion.log"
    result = CompileResult(command, workdir, None, 0.0, log_file)
    start = time.monotonic()
    with log_file.open("w", encoding="utf-8", errors="replace") as log:
        try:
            proc = subprocess.Popen(command, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
                                    env=compiler_environment() if prepass else without_prepass(
                                        compiler_environment(), workdir))
        except OSError as exc:
            raise KdbError(f"cannot run {binary}: {exc.strerror or exc}") from exc
        stop = threading.Event()

        def watchdog() -> None:  # cancel and the time limit are checked while the compiler is silent too
            while not stop.wait(0.2):
                if (should_cancel is not None and should_cancel()) or time.monotonic() - start > timeout_s:
                    result.cancelled = bool(should_cancel and should_cancel())
                    result.timed_out = not result.cancelled
                    proc.kill()
                    return

        guard = threading.Thread(target=watchdog, daemon=True)
        guard.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                _read_line(line, result)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            proc.wait()
        finally:
            stop.set()
            guard.join()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result.seconds = time.monotonic() - start
    result.returncode = None if (result.cancelled or result.timed_out) else proc.returncode
    return result


def _read_line(line: str, result: CompileResult) -> None:
    if (m := _LOOKUP.search(line)) is not None:
        result.lookups.append(Lookup(m.group(1), m.group(2)))
    elif (m := _SUBSTITUTED.search(line)) is not None:
        result.substitutions.append(m.group(1))
    result.tail = [*result.tail[-39:], line.rstrip("\n")]

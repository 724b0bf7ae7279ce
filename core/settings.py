"""Settings shared by the console and the CLI, stored as TOML in the user config dir.

`KDB_CONFIG` names another file (tests, CI). Unknown keys are ignored (a newer version's file still
loads); bad values are refused with the key and the reason, never silently replaced.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import InputError

if TYPE_CHECKING:
    from core.cuda.nvcc import NvccProbe

ARCH_RE = re.compile(r"sm_\d{2,3}[a-z]?")
MATH_MODES = ("fp32", "tf32")


@dataclass
class Settings:
    # Target SM architectures for compile checks (and codegen); the first is the primary one.
    archs: list[str] = field(default_factory=lambda: ["sm_90"])
    # Device name written into profile strings; must equal NNFusion's -fproduct_name.
    # Empty: the detected CUDA device's name.
    product_name: str = ""
    nvcc_path: str = ""  # empty: nvcc on PATH, else /usr/local/cuda/bin/nvcc
    nvcc_flags: list[str] = field(default_factory=list)
    nvcc_timeout_s: float = 120.0
    gpu_timeout_s: float = 60.0  # per GPU job (verify/time one kernel) in its child process
    workers: int = 0  # parallel workers for injection; 0 = one per core
    tune_trials: int = 64
    tune_builder_timeout_s: float = 120.0  # MetaSchedule's default 30 s kills big nvcc builds
    rpc_tracker: str = ""  # HOST:PORT for distributed measurement; empty = local
    rpc_key: str = "kdb"
    nnfusion_path: str = ""  # the NNFusion compiler (a path, or a name on PATH); empty = `nnfusion` on PATH
    # Extra flags for NNFusion (`-fkernel_fusion_level=0`, ...): passed to it, and read by coverage's model.
    nnfusion_flags: list[str] = field(default_factory=list)
    # The last path a console file dialog took; the next dialog starts in its folder (empty: the working dir).
    last_path: str = ""
    # How fp32 ops may compute: "fp32" on the CUDA cores, "tf32" on the tensor cores in TF32 (as PyTorch's cuDNN
    # convolutions do by default); codegen and tuning take it, `--math` overrides it for one command.
    math: str = "fp32"

    def validate(self) -> None:
        if not self.archs:
            raise InputError("at least one SM arch is needed", where="archs")
        for arch in self.archs:
            if not isinstance(arch, str) or not ARCH_RE.fullmatch(arch):
                raise InputError(f"{arch!r} is not an SM arch like sm_90", where="archs")
        if any(c in self.product_name for c in ":;"):
            raise InputError("must not contain ':' or ';' (they delimit NNFusion's profile string)",
                             where="product_name")
        for name in ("nvcc_timeout_s", "gpu_timeout_s", "tune_builder_timeout_s"):
            if not 0 < float(getattr(self, name)) <= 86400:
                raise InputError("must be between 0 and 86400 seconds", where=name)
        if not 0 <= self.workers <= 256:
            raise InputError("must be between 0 and 256", where="workers")
        if not 1 <= self.tune_trials <= 100000:
            raise InputError("must be between 1 and 100000", where="tune_trials")
        if self.rpc_tracker and not re.fullmatch(r"[\w.\-]+:\d{1,5}", self.rpc_tracker):
            raise InputError("must be HOST:PORT", where="rpc_tracker")
        if self.math not in MATH_MODES:
            raise InputError(f"{self.math!r}: one of {', '.join(MATH_MODES)}", where="math")
        for flag in self.nnfusion_flags:
            if not isinstance(flag, str) or not re.fullmatch(r"-{1,2}[A-Za-z_]\w*(=\S*)?", flag):
                raise InputError(f"{flag!r} is not a compiler flag like -fkernel_fusion_level=0",
                                 where="nnfusion_flags")

    def effective_workers(self) -> int:
        return self.workers or max(1, os.cpu_count() or 1)


def settings_path() -> Path:
    env = os.environ.get("KDB_CONFIG")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir("kdb", appauthor=False)) / "settings.toml"


def load_settings(path: Path | None = None) -> Settings:
    path = path or settings_path()
    settings = Settings()
    if not path.exists():
        return settings
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"cannot read settings: {exc}", where=str(path)) from exc
    known = {f.name: f for f in fields(Settings)}
    for key, value in data.items():
        if key not in known:
            continue
        default = getattr(settings, key)
        if isinstance(default, bool) or (not isinstance(value, type(default)) and not (
            isinstance(default, float) and isinstance(value, int)
        )):
            raise InputError(f"{key} must be a {type(default).__name__}", where=str(path))
        setattr(settings, key, float(value) if isinstance(default, float) else value)
    settings.validate()
    return settings


def save_settings(settings: Settings, path: Path | None = None) -> Path:
    import tomli_w

    settings.validate()
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(asdict(settings)), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a crash leaves the old file or the new one
    return path


def settings_dict(settings: Settings) -> dict[str, Any]:
    return asdict(settings)


def parse_value(key: str, text: str) -> Any:
    """A setting's value from text, as the CLI (KEY=VALUE) and the console's form both read it.

    Lists: archs split on commas or spaces; nvcc_flags split like a shell would (quotes kept together).
    """
    import shlex

    kinds = {f.name: f for f in fields(Settings)}
    if key not in kinds:
        raise InputError(f"unknown setting; known: {', '.join(kinds)}", where=key)
    current = getattr(Settings(), key)
    try:
        if key == "nvcc_flags":
            return shlex.split(text)
        if isinstance(current, list):
            return [v for v in re.split(r"[,\s]+", text) if v]
        if isinstance(current, int):
            return int(text)
        if isinstance(current, float):
            return float(text)
    except ValueError as exc:
        kind = {int: "a whole number", float: "a number"}.get(type(current), "")
        raise InputError(f"{text!r}: must be {kind}" if kind else f"{text!r}: {exc}", where=key) from None
    return text.strip()


def archs_problem(archs: list[str] | tuple[str, ...], probe: NvccProbe | None = None) -> str:
    """Why these SM archs cannot be used ("" when they can): none given, a name that is no SM arch, or one the probed
    nvcc does not build (with no probe, or no nvcc found, names are checked alone). Every face checks archs here:
    the inject form and `kdb inject --arch`, the settings form and `kdb settings archs=...`."""
    if not archs:
        return "at least one SM arch is needed, like sm_90"
    if bad := [a for a in archs if not ARCH_RE.fullmatch(a)]:
        return f"{', '.join(bad)}: not an SM arch like sm_90"
    if probe is not None and (unbuilt := probe.unbuilt(archs)):
        return f"{', '.join(unbuilt)}: not built by this nvcc, {probe.nvcc} (it builds {' '.join(probe.archs)})"
    return ""


def setting_problem(name: str, text: str, probe: NvccProbe | None) -> str:
    """Why this text cannot be setting `name` ("" when it can): it does not parse, the settings would be invalid, an
    SM arch the probed nvcc does not build, an nvcc_path that finds no nvcc. `probe` None: nvcc not asked (yet)."""
    try:
        value = parse_value(name, text)
        replace(Settings(), **{name: value}).validate()  # defaults are valid: any error is this field's
    except InputError as exc:
        return exc.reason
    if probe is None:
        return ""
    if name == "archs":
        return archs_problem(value, probe)
    if name == "nvcc_path" and text.strip() and probe.problem:
        return probe.problem
    return ""


def read_settings(values: dict[str, str], probe: NvccProbe | None,
                  base: Settings | None = None) -> tuple[Settings, dict[str, str]]:
    """`base` with the settings named in `values` (name -> text) changed, and why each one that cannot be is refused:
    the console's settings form and `kdb settings KEY=VALUE` both change settings here."""
    errors = {name: err for name, text in values.items() if (err := setting_problem(name, text, probe))}
    good = {name: parse_value(name, text) for name, text in values.items() if name not in errors}
    return replace(base or Settings(), **good), errors


def problems(settings: Settings) -> dict[str, str]:
    """Every invalid field with its reason (validate() stops at the first)."""
    found: dict[str, str] = {}
    defaults = Settings()
    for f in fields(Settings):
        trial = Settings(**{**asdict(defaults), f.name: getattr(settings, f.name)})
        try:
            trial.validate()
        except InputError as exc:
            found[f.name] = exc.reason
    return found

"""Code generation for many op configs: read them from files or ONNX models, generate, report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.codegen.failures import codegen_failure
from core.codegen.generate import Generated, generate, require_tvm
from core.db.state import StateDB
from core.errors import InputError
from core.opconfigs.opconfig import OpConfig, dedupe, read_opconfigs


@dataclass
class CodegenReport:
    generated: list[Generated] = field(default_factory=list)
    input_errors: list[InputError] = field(default_factory=list)  # unreadable files, bad op-config lines
    cancelled: bool = False
    run_id: int | None = None  # the state DB's run that recorded the failures

    @property
    def items(self) -> list[dict[str, Any]]:
        return [g.item for g in self.generated if g.item is not None]

    @property
    def failed(self) -> list[Generated]:
        return [g for g in self.generated if g.item is None]

    def as_json(self) -> dict[str, Any]:
        return {
            "generated": len(self.items),
            "failed": len(self.failed) + len(self.input_errors),
            "kernels": [{"name": g.item["tvm_func_name"], "op": g.config.describe(), "source": g.config.source,
                         "max_rel_error": g.max_rel_error, "seconds": round(g.seconds, 3)}
                        for g in self.generated if g.item is not None],
            "failures": [{"op": g.config.describe(), "source": g.config.source, "stage": g.stage,
                          "reason": g.error} for g in self.failed]
                        + [{"op": "", "source": e.where, "stage": "read", "reason": e.reason}
                           for e in self.input_errors],
        }


_INPUT_SUFFIXES = (".txt", ".toml", ".json", ".onnx")


def load_configs(paths: list[Path]) -> tuple[list[OpConfig], list[InputError]]:
    """Op configs from op-config files (lines, .toml, .json) and ONNX models, de-duplicated."""
    configs: list[OpConfig] = []
    errors: list[InputError] = []
    files: list[Path] = []
    for path in paths:  # directories: every op-config file and ONNX model in them
        files.extend(sorted(p for p in path.rglob("*") if p.suffix.lower() in _INPUT_SUFFIXES and p.is_file())
                     if path.is_dir() else [path])
    for path in files:
        try:
            if path.suffix.lower() == ".onnx":
                from core.opconfigs.onnx_extract import extract

                configs.extend(replace(c, source=f"{path}:{c.source}") for c in extract(path).configs)
            else:
                result = read_opconfigs(path)
                configs.extend(result.configs)
                errors.extend(result.errors)
        except InputError as exc:
            errors.append(exc if exc.where else InputError(exc.reason, where=str(path)))
    return dedupe(configs), errors


def generate_all(configs: list[OpConfig], arch: str, *, check: bool = True,
                 on_result: Callable[[Generated, int, int], None] | None = None,
                 should_cancel: Callable[[], bool] | None = None,
                 state: StateDB | None = None, db_path: Path | None = None) -> CodegenReport:
    """Generate each config. Given a state DB, every failure is recorded there (for the kernel DB
    `db_path`, which a retry injects into) as soon as it happens, in a run of kind codegen."""
    require_tvm()
    report = CodegenReport()
    recording = state is not None and db_path is not None
    if recording:
        report.run_id = state.start_run("codegen", db_path, {"arch": arch, "configs": len(configs), "check": check})
    try:
        for i, config in enumerate(configs):
            if should_cancel is not None and should_cancel():
                report.cancelled = True
                break
            result = generate(config, arch, check=check)
            report.generated.append(result)
            if recording and result.item is None:
                state.record_failures([codegen_failure(result, arch, db_path, report.run_id, i)])
            if on_result is not None:
                on_result(result, i + 1, len(configs))
    finally:
        if recording and report.run_id is not None:
            state.finish_run(report.run_id, injected=0, unchanged=0, failed=len(report.failed),
                             cancelled=report.cancelled)
    return report

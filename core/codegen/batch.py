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
from core.opconfigs.onnx_extract import LookupFlags
from core.opconfigs.opconfig import OpConfig, read_opconfigs, with_math
from core.opconfigs.ort_prepass import PrePass


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
                         "max_rel_error": g.max_rel_error, "cpu_check": g.cpu_check, "seconds": round(g.seconds, 3),
                         "math": g.math}
                        for g in self.generated if g.item is not None],
            "failures": [{"op": g.config.describe(), "source": g.config.source, "stage": g.stage,
                          "reason": g.error} for g in self.failed]
                        + [{"op": "", "source": e.where, "stage": "read", "reason": e.reason}
                           for e in self.input_errors],
        }


_INPUT_SUFFIXES = (".txt", ".toml", ".json", ".onnx")


@dataclass
class Inputs:
    """Op configs read from files and models: distinct, in order, with how often each occurs."""

    configs: list[OpConfig] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # OpConfig.key -> occurrences (1 per op-config line)
    models: list[str] = field(default_factory=list)  # names of the ONNX models read
    errors: list[InputError] = field(default_factory=list)

    def add(self, config: OpConfig, count: int) -> None:
        if config.key not in self.counts:
            self.configs.append(config)
        self.counts[config.key] = self.counts.get(config.key, 0) + count

    def count(self, config: OpConfig) -> int:
        return self.counts.get(config.key, 0)

    def with_math(self, math: str) -> Inputs:
        """The same inputs, each config computed as `math` asks (opconfig.with_math)."""
        out = Inputs(models=list(self.models), errors=list(self.errors))
        for config in self.configs:
            out.add(with_math(config, math), self.count(config))
        return out


def read_inputs(paths: list[Path], flags: LookupFlags | None = None, *, prepass: PrePass) -> Inputs:
    """Op configs from op-config files (lines, .toml, .json) and ONNX models, and directories of them. Of a model,
    the ops the compiler looks up at these flags (NNFusion's defaults unless given), each counted as often as it
    is looked up. Models are extracted as the compiler whose pre-pass `prepass` is imports them."""
    inputs = Inputs()
    files: list[Path] = []
    for path in paths:  # directories: every op-config file and ONNX model in them
        files.extend(sorted(p for p in path.rglob("*") if p.suffix.lower() in _INPUT_SUFFIXES and p.is_file())
                     if path.is_dir() else [path])
    for path in files:
        try:
            if path.suffix.lower() == ".onnx":
                from core.opconfigs.extract_cache import extract_cached

                extraction = extract_cached(path, flags, prepass=prepass)
                inputs.models.append(extraction.model_name)
                away = extraction.fused_away()
                for config in extraction.looked_up():
                    inputs.add(replace(config, source=f"{path}:{config.source}"),
                               extraction.count(config) - away.get(config.key, 0))
            else:
                result = read_opconfigs(path)
                for config in result.configs:
                    inputs.add(config, 1)
                inputs.errors.extend(result.errors)
        except InputError as exc:
            inputs.errors.append(exc if exc.where else InputError(exc.reason, where=str(path)))
    return inputs


def load_configs(paths: list[Path], flags: LookupFlags | None = None, *,
                 prepass: PrePass) -> tuple[list[OpConfig], list[InputError]]:
    """Op configs from op-config files (lines, .toml, .json) and ONNX models (read_inputs), de-duplicated."""
    inputs = read_inputs(paths, flags, prepass=prepass)
    return inputs.configs, inputs.errors


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

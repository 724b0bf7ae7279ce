"""Codegen failures as failure records of the state DB, and back to op configs for a retry.

A record keeps the op config (as a JSON object, the TOML/JSON op-config form, so it can be edited and
retried), where it came from (file, and line or entry where it has one), the stage TVM stopped at, TVM's
decisive lines and the TVMScript of the failing module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.codegen.generate import Generated
from core.errors import InputError
from core.opconfigs.opconfig import OpConfig, format_line, from_dict, source_location

if TYPE_CHECKING:
    from core.db.state import StoredFailure
    from core.db.state_records import Failure

CODEGEN_STAGE = "codegen"


def codegen_detail(result: Generated, arch: str) -> dict[str, Any]:
    try:
        line = format_line(result.config)
    except InputError:  # a dtype the line format cannot hold
        line = ""
    return {"source": result.config.source, "op_config": line, "codegen_stage": result.stage, "arch": arch,
            "tvm_error": result.tvm_error, "tvmscript": result.script, "marked": result.marked}


def codegen_input(config: OpConfig) -> str:
    return json.dumps(config.to_dict())


def codegen_failure(result: Generated, arch: str, db_path: Path, run_id: int | None, position: int) -> Failure:
    """The record of one failed op config; `position` (its place in the batch) keys it when its source
    names no line or entry."""
    file, number = source_location(result.config.source)
    from core.db.state_records import Failure

    return Failure(run_id=run_id, db_path=str(db_path), file=file or "(op configs)",
                   item_index=number if number is not None else position, name=result.config.describe(),
                   stage=CODEGEN_STAGE, reason=result.error,
                   detail=json.dumps(codegen_detail(result, arch), ensure_ascii=False),
                   input=codegen_input(result.config))


def config_of(failure: Failure | StoredFailure) -> OpConfig:
    """The op config a codegen failure keeps (perhaps edited since); InputError when it is not one."""
    where = str(failure.detail_dict().get("source") or failure.file)
    if failure.input is None:
        raise InputError("the failure kept no op config", where=where)
    try:
        entry = json.loads(failure.input)
    except ValueError as exc:
        raise InputError(f"the op config is not valid JSON: {exc}", where=where) from None
    return from_dict(entry, where)

"""AutoTVM tuning logs (TVM 0.7 JSON lines): per workload, its trials, errors, best time and best-so-far curve.

One record per measured config:

    {"i": [target, task_name, args, kwargs, workload,
           {"i": config_index, "t": template_key, "c": null, "e": [[knob, kind, value], ...]}],
     "r": [[cost_seconds, ...], error_no, all_cost_seconds, timestamp], "v": 0.1}

error_no is AutoTVM's MeasureErrorNo (ERROR_KINDS); failed measurements carry the placeholder cost 1e9.
A trial's time is the mean of its costs. A workload is (task_name, args); its trials are its records in
file order, which is the order AutoTVM measured them in (timestamps within a batch are not sorted).

The tasks of the NNFusion artifact's logs and what their args mean:

    tvm_conv2d_nchw_tune_op   [input NCHW, filter OIHW, output NCHW, strides [h, w], padding [h, w]
                              (the same below and above), dilation [h, w]]          -> Convolution
    tvm_matmul_tune_op        [M, K, N]: out[M, N] = A[M, K] x B, from two templates of the same name:
        the hand-written tiling one (all_tuned_tilling_dense_nn; knobs tile_k, tile_y, tile_x,
        auto_unroll_max_step) takes B as [K, N]                                     -> Dot
        TOPI's dense (all_tuned_topi_dense; knob tile_k alone, or tile_x, tile_y, tile_k for
        large batches) takes B as [N, K]                                            -> Dot, transpose_B
      Only the knobs tell them apart: auto_unroll_max_step belongs to the tiling template alone.

Their args carry no element type: the artifact tuned them from its `*_op_float` op configs, so they map to fp32
op configs (an fp16 op config never matches one). Other tasks are summarised without an op config. Bad lines
(over MAX_LINE_BYTES, not UTF-8, not JSON, the wrong structure, NaN or negative costs) are collected in
LogSummary.bad_lines and never stop the parse.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from core.errors import InputError
from core.opconfigs.opconfig import OpConfig, validate

MAX_LINE_BYTES = 1 << 20
MAX_REPORTED_BAD_LINES = 1000  # a garbage file of any size still gives a short report (all are counted)

# AutoTVM's MeasureErrorNo, by number.
ERROR_KINDS = ("NO_ERROR", "INSTANTIATION_ERROR", "COMPILE_HOST", "COMPILE_DEVICE", "RUNTIME_DEVICE",
               "WRONG_ANSWER", "BUILD_TIMEOUT", "RUN_TIMEOUT", "UNKNOWN_ERROR")

CONV_TASK = "tvm_conv2d_nchw_tune_op"
MATMUL_TASK = "tvm_matmul_tune_op"
_TILING_ONLY_KNOB = "auto_unroll_max_step"

Workload = tuple[str, str]  # (task name, args as canonical JSON): hashable, and prints as the log writes it


@dataclass
class WorkloadSummary:
    task: str
    args: list[Any]
    op_config: OpConfig | None
    op_config_note: str = ""  # why op_config is None
    trials: int = 0
    successes: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    best_seconds: float | None = None
    best_trial: int | None = None  # 1-based, among this workload's trials
    best_config: list[Any] = field(default_factory=list)  # the knobs [[name, kind, value], ...]
    best_so_far: list[float] = field(default_factory=list)  # seconds per trial; inf until the first success
    first_timestamp: float = math.inf
    last_timestamp: float = -math.inf

    @property
    def workload(self) -> Workload:
        return workload_key(self.task, self.args)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values (inf becomes null)."""
        return {"task": self.task, "args": self.args,
                "op_config": self.op_config.to_dict() if self.op_config else None,
                "op_config_description": self.op_config.describe() if self.op_config else None,
                "op_config_note": self.op_config_note, "trials": self.trials, "successes": self.successes,
                "errors_by_kind": self.errors_by_kind, "best_seconds": self.best_seconds,
                "best_trial": self.best_trial, "best_config": self.best_config,
                "best_so_far": [s if math.isfinite(s) else None for s in self.best_so_far],
                "first_timestamp": self.first_timestamp, "last_timestamp": self.last_timestamp}

    def _add(self, record: _Record) -> None:
        self.trials += 1
        if record.error_no == 0:
            self.successes += 1
            if self.best_seconds is None or record.seconds < self.best_seconds:  # strict: the first to reach it
                self.best_seconds, self.best_trial, self.best_config = record.seconds, self.trials, record.knobs
        else:
            kind = ERROR_KINDS[record.error_no]
            self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + 1
        self.best_so_far.append(math.inf if self.best_seconds is None else self.best_seconds)
        self.first_timestamp = min(self.first_timestamp, record.timestamp)
        self.last_timestamp = max(self.last_timestamp, record.timestamp)


@dataclass
class LogSummary:
    path: Path
    workloads: list[WorkloadSummary]  # in order of first appearance
    bad_lines: list[InputError]  # where = "PATH:LINE"; the first MAX_REPORTED_BAD_LINES
    bad_line_count: int = 0
    records: int = 0  # good records


def workload_key(task: str, args: Any) -> Workload:
    return task, json.dumps(args, sort_keys=True)


@dataclass(frozen=True, slots=True)
class _Record:
    task: str
    args: list[Any]
    knobs: list[Any]
    error_no: int
    seconds: float  # mean cost
    timestamp: float


def read_log(path: Path) -> LogSummary:
    """Summarise one log, streaming it line by line; InputError only if the file cannot be read."""
    summary = LogSummary(path, [], [])
    by_workload: dict[Workload, WorkloadSummary] = {}
    try:
        with path.open("rb") as f:
            for number, line in enumerate(_lines(f), start=1):
                where = f"{path}:{number}"
                try:
                    record = _record(line)
                except InputError as exc:
                    summary.bad_line_count += 1
                    if len(summary.bad_lines) < MAX_REPORTED_BAD_LINES:
                        summary.bad_lines.append(InputError(exc.reason, where=where))
                    continue
                if record is None:
                    continue
                summary.records += 1
                key = workload_key(record.task, record.args)
                if key not in by_workload:
                    by_workload[key] = _new_workload(record, where)
                    summary.workloads.append(by_workload[key])
                by_workload[key]._add(record)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", where=str(path)) from exc
    for w in summary.workloads:  # errors in AutoTVM's numbering order, whatever order they came in
        w.errors_by_kind = {k: w.errors_by_kind[k] for k in ERROR_KINDS if k in w.errors_by_kind}
    return summary


def match(summary: LogSummary, opconfigs: Iterable[OpConfig]) -> dict[Workload, OpConfig]:
    """Each workload whose op config equals (by OpConfig.key) one of opconfigs; the first such wins."""
    by_key: dict[str, OpConfig] = {}
    for config in opconfigs:
        by_key.setdefault(config.key, config)
    return {w.workload: by_key[w.op_config.key] for w in summary.workloads
            if w.op_config is not None and w.op_config.key in by_key}


def op_config_for(task: str, args: Any, knob_names: Iterable[str], source: str = "") -> OpConfig:
    """The op an AutoTVM task tunes, in kernel-JSON naming; InputError for tasks or args it cannot map."""
    if task == CONV_TASK:
        if not (isinstance(args, list) and len(args) == 6 and all(isinstance(a, list) for a in args)):
            raise InputError("expected args [input, filter, output, strides, padding, dilation]", where=source)
        data, filt, out, strides, padding, dilation = args
        config = OpConfig("Convolution", {
            "input_shape": data, "filter_shape": filt, "output_shape": out, "window_movement_strides": strides,
            "window_dilation_strides": dilation, "padding_below_diff": padding}, source=source)
    elif task == MATMUL_TASK:
        if not (isinstance(args, list) and len(args) == 3 and all(_is_int(v) for v in args)):
            raise InputError("expected args [M, K, N]", where=source)
        m, k, n = args
        transpose_b = _TILING_ONLY_KNOB not in set(knob_names)  # TOPI's dense: B is [N, K]
        config = OpConfig("Dot", {"arg0_shape": [m, k], "arg1_shape": [n, k] if transpose_b else [k, n],
                                  "out_shape": [m, n], "transpose_A": False, "transpose_B": transpose_b},
                          source=source)
    else:
        raise InputError(f"task {task!r} is not one kdb maps to an op", where=source)
    validate(config)
    return config


def _new_workload(record: _Record, where: str) -> WorkloadSummary:
    names = [k[0] for k in record.knobs if isinstance(k, list) and k and isinstance(k[0], str)]
    try:
        return WorkloadSummary(record.task, record.args, op_config_for(record.task, record.args, names, where))
    except InputError as exc:
        return WorkloadSummary(record.task, record.args, None, exc.reason)


def _lines(f: BinaryIO) -> Iterator[bytes | None]:
    """Each line, or None for one over MAX_LINE_BYTES (read past, never held in memory whole)."""
    while line := f.readline(MAX_LINE_BYTES + 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def _record(line: bytes | None) -> _Record | None:
    """One line's record; None for blank and '#' comment lines (AutoTVM skips them too)."""
    if line is None:
        raise InputError(f"line over the {MAX_LINE_BYTES:,}-byte cap, skipped")
    try:
        text = line.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if not text or text.startswith("#"):
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise InputError(f"truncated JSON: {exc.msg} at the end, column {exc.colno}") from None
        raise InputError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise InputError("JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise InputError(f"not JSON Python can read: {exc}") from None
    try:
        return _checked(obj)
    except OverflowError as exc:  # an integer past float range where a time belongs
        raise InputError(f"a number out of range: {exc}") from None


def _checked(obj: Any) -> _Record:
    inputs, result = (obj.get("i"), obj.get("r")) if isinstance(obj, dict) else (None, None)
    if not (isinstance(inputs, list) and len(inputs) == 6):
        raise InputError('"i" must be [target, task, args, kwargs, workload, config]')
    task, args, config = inputs[1], inputs[2], inputs[5]
    if not (isinstance(task, str) and task):
        raise InputError('"i"[1], the task name, must be a non-empty string')
    if not isinstance(args, list):
        raise InputError('"i"[2], the task args, must be a list')
    if not (isinstance(config, dict) and isinstance(config.get("e"), list)):
        raise InputError('"i"[5] must be a config object with an "e" list of knobs')
    if not (isinstance(result, list) and len(result) == 4):
        raise InputError('"r" must be [costs, error_no, all_cost, timestamp]')
    costs, error_no, all_cost, timestamp = result
    if not (_is_int(error_no) and 0 <= error_no < len(ERROR_KINDS)):
        raise InputError(f"error_no {error_no!r} is not an AutoTVM error number (0-{len(ERROR_KINDS) - 1})")
    if not (isinstance(costs, list) and costs and all(_is_number(c) for c in costs)):
        raise InputError('"r"[0] must be a non-empty list of costs in seconds')
    if (bad := next((c for c in costs if not math.isfinite(c) or c < 0), None)) is not None:
        raise InputError(f"cost {bad} is not a time in seconds")
    for name, value in (("all_cost", all_cost), ("timestamp", timestamp)):
        if not (_is_number(value) and math.isfinite(value)):
            raise InputError(f"{name} {value!r} is not a finite number")
    return _Record(task, args, config["e"], error_no, sum(costs) / len(costs), timestamp)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

"""AutoTVM tuning logs the tests write themselves, in TVM 0.7's JSON-lines format (as the artifact's logs are).

demo_network_log() tunes the demo network's op configs (core/demo.py): its convolutions with the conv2d
template, its dot with one of the matmul templates (the tiling one takes B as [K, N], TOPI's dense as [N, K]).
Trial times follow a seeded random walk down to a floor; AutoTVM's error kinds are mixed in at rates like the
artifact's. The writer keeps its own tally (LogPlan) so tests compare the parser against what was written.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.demo import TINY_NETWORK
from core.opconfigs.autotvm_log import CONV_TASK, ERROR_KINDS, MATMUL_TASK
from core.opconfigs.opconfig import OpConfig, dedupe, parse_lines

CONV_KNOBS = [["tile_f", "sp", [-1, 2, 8, 1]], ["tile_y", "sp", [-1, 1, 8, 1]], ["tile_x", "sp", [-1, 2, 4, 1]],
              ["tile_rc", "sp", [-1, 4]], ["tile_ry", "sp", [-1, 1]], ["tile_rx", "sp", [-1, 3]],
              ["auto_unroll_max_step", "ot", 512], ["unroll_explicit", "ot", 1]]
TILING_KNOBS = [["tile_k", "sp", [-1, 2, 8]], ["tile_y", "sp", [-1, 1, 2, 8]], ["tile_x", "sp", [-1, 2, 8, 16]],
                ["auto_unroll_max_step", "ot", 1500]]
TOPI_KNOBS = [["tile_k", "sp", [-1, 8]]]
# error_no -> chance per trial (INSTANTIATION_ERROR, COMPILE_HOST, RUNTIME_DEVICE, BUILD_TIMEOUT)
ERROR_RATES = {1: 0.08, 2: 0.04, 4: 0.02, 6: 0.01}


@dataclass
class Workload:
    task: str
    args: list[Any]
    knobs: list[Any]
    trials: int = 0
    successes: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class LogPlan:
    """What the writer put in the log, counted as it wrote it."""

    path: Path
    workloads: list[Workload]

    @property
    def records(self) -> int:
        return sum(w.trials for w in self.workloads)

    def errors(self) -> Counter[str]:
        return sum((w.errors for w in self.workloads), Counter())


def demo_network_convolutions() -> list[OpConfig]:
    """The demo network's convolutions as plain Convolution op configs (what the conv2d template tunes)."""
    convs = [c for c in parse_lines(TINY_NETWORK, "tiny_network.txt").configs if "Convolution" in c.op_type]
    return dedupe([replace(c, op_type="Convolution", line_format=None) for c in convs])


def demo_network_dots() -> list[OpConfig]:
    return [c for c in parse_lines(TINY_NETWORK, "tiny_network.txt").configs if c.op_type == "Dot"]


def conv_args(config: OpConfig) -> list[Any]:
    p = config.params
    return [p["input_shape"], p["filter_shape"], p["output_shape"], p["window_movement_strides"],
            p["padding_below_diff"], p["window_dilation_strides"]]


def record(task: str, args: list[Any], knobs: list[Any], index: int, seconds: float, error_no: int,
           timestamp: float) -> str:
    """One measured config; a failed one carries AutoTVM's placeholder cost 1e9."""
    workload = [task, *args]
    costs = [seconds] if error_no == 0 else [1e9]
    return json.dumps({"i": ["cuda", task, args, {}, workload, {"i": index, "t": "", "c": None, "e": knobs}],
                       "r": [costs, error_no, 0.5 + index % 7 / 10, timestamp], "v": 0.1})


def write_log(path: Path, workloads: list[Workload], trials: int, seed: int = 7) -> LogPlan:
    rng = random.Random(seed)
    lines = []
    start = 1589313668.0
    for n, w in enumerate(workloads):
        floor = 1e-5 * (n + 1)
        current = floor * 40
        for trial in range(trials):
            roll, error_no = rng.random(), 0
            for number, rate in ERROR_RATES.items():
                if roll < rate:
                    error_no = number
                    break
                roll -= rate
            current = max(floor, current * rng.uniform(0.9, 1.08))
            # AutoTVM measures in batches of 8: timestamps within a batch are not sorted
            stamp = start + n * 10000 + (trial // 8) * 8 + rng.uniform(0, 8)
            lines.append(record(w.task, w.args, w.knobs, trial, current, error_no, stamp))
            w.trials += 1
            if error_no:
                w.errors[ERROR_KINDS[error_no]] += 1
            else:
                w.successes += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return LogPlan(path, workloads)


def demo_network_log(path: Path, dense: str = "tiling", trials: int = 300) -> LogPlan:
    """The demo network tuned: each convolution, then its dot with one dense template ("tiling" or "topi";
    a workload is (task, args), so the two templates' trials of one dot go to two logs, as in the artifact)."""
    workloads = [Workload(CONV_TASK, conv_args(c), CONV_KNOBS) for c in demo_network_convolutions()]
    for dot in demo_network_dots():
        m, k = dot.params["arg0_shape"]
        n = dot.params["out_shape"][1]
        workloads.append(Workload(MATMUL_TASK, [m, k, n], {"tiling": TILING_KNOBS, "topi": TOPI_KNOBS}[dense]))
    return write_log(path, workloads, trials)

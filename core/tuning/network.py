"""A whole network as one tuning job: its distinct ops, a trial budget spread by where the time goes, and the
network time predicted from the best kernels so far.

Which ops: of a model, those NNFusion looks up in its kernel DB at the compiler flags given (core/codegen/batch.py's
read_inputs keeps Extraction.looked_up(): its kernel fusion replayed, so a lone bias Add is tuned and an Add fused
into NNFusion's own kernel is not). Of op-config files, every op a kernel-DB row can serve; an op with no kernel-DB
op type (a grouped convolution) is skipped with the reason.

The budget: every op gets a floor, the rest follows each op's share of the network's estimated time (its
best time so far x its count; FLOPs x count while nothing of it is measured, scaled by the speed the measured
ops reached). Trials an earlier run recorded count against an op's share, so a second run resumes where the
first stopped and re-spreads by what was measured; an op that already holds more than its share keeps it and
measures nothing. Ops run largest share first: a session cut short has tuned what pays most.

FLOPs misjudge memory-bound ops and every op whose first kernels come out slow: on the H200 (session 8) the
Dot got 16 trials by its FLOPs and ended at 7.3x cuBLAS. So before the budget is spread, each op with
nothing measured is probed with the floor's trials (`probe_trials`), and the spread weighs what the probes
measured: an op whose kernel is still slow gets the trials to fix it, as MetaSchedule's gradient scheduler
does after its first round. The probes count against the budget like any recorded trial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import InputError
from core.opconfigs.onnx_extract import LookupFlags
from core.opconfigs.opconfig import OpConfig
from core.opconfigs.ort_prepass import PrePass

FLOOR_TRIALS = 16  # no op below this (nor below a quarter of the average share): MetaSchedule's first
# batches are mostly its random initial population


def has_row_type(config: OpConfig) -> tuple[bool, str]:
    """Whether a kernel-DB row can serve this op (it has an identifier); else why not."""
    try:
        config.signature()
    except InputError as exc:
        return False, exc.reason
    return True, ""


@dataclass(frozen=True)
class NetworkOp:
    config: OpConfig
    count: int  # occurrences in the network
    library_seconds: float | None = None  # cuDNN/cuBLAS for this op, where someone measured it


@dataclass
class Network:
    name: str
    ops: list[NetworkOp]
    skipped: list[tuple[OpConfig, int, str]] = field(default_factory=list)  # (config, count, why not tuned)

    @property
    def library_seconds(self) -> float | None:
        """The library's time for the tuned ops, only when it is known for every one of them."""
        if not self.ops or any(op.library_seconds is None for op in self.ops):
            return None
        return sum(op.library_seconds * op.count for op in self.ops if op.library_seconds is not None)


def network_of(name: str, configs: list[OpConfig], count: Callable[[OpConfig], int],
               library: Mapping[str, float] | None = None) -> Network:
    """The ops of `configs` (a model's: those NNFusion looks up) a kernel-DB row can serve, with their counts (and
    library times by OpConfig.key)."""
    network = Network(name, [])
    for config in configs:
        wanted, why = has_row_type(config)
        if wanted:
            network.ops.append(NetworkOp(config, count(config), (library or {}).get(config.key)))
        else:
            network.skipped.append((config, count(config), why))
    return network


def network_from_model(path: Path, flags: LookupFlags | None = None, *, prepass: PrePass) -> Network:
    """The network of an ONNX model: the ops NNFusion looks up at these flags (its defaults unless given), in the
    graph the compiler imports (after `prepass`)."""
    from core.codegen.batch import read_inputs

    inputs = read_inputs([path], flags, prepass=prepass)
    if inputs.errors:
        raise inputs.errors[0]
    return network_of("+".join(inputs.models), inputs.configs, inputs.count)


# ---------------------------------------------------------------------------------------------
# The budget


def estimated_seconds(ops: list[NetworkOp], best: Mapping[str, float]) -> dict[str, float]:
    """Each op's time in the network (x count): measured best where there is one, else its FLOPs at the speed
    the measured ops reached (at 1 FLOP/s while none is measured: only the ratios matter)."""
    measured = [op for op in ops if op.config.key in best]
    rate = (sum(op.config.flops for op in measured) / sum(best[op.config.key] for op in measured)
            if measured else 1.0)
    return {op.config.key: (best[op.config.key] if op.config.key in best else max(op.config.flops, 1) / rate)
            * op.count for op in ops}


def spread_budget(ops: list[NetworkOp], total: int, *, recorded: Mapping[str, int] | None = None,
                  best: Mapping[str, float] | None = None, cap: int | None = None) -> dict[str, int]:
    """Trials per op (recorded ones included) summing to `total`, or to what is recorded when that is more, or
    to less when every op is at `cap`.

    Each op gets a floor, then the rest in proportion to its estimated time. An op that already recorded more
    than that keeps its trials, and an op whose share passes `cap` (trials per op at most) gets the cap; the
    others share what is left (repeated until no op is over).
    """
    recorded = recorded or {}
    weights = estimated_seconds(ops, best or {})
    keys = [op.config.key for op in ops]
    floor = floor_trials(ops, total)
    kept: dict[str, int] = {}
    while True:
        free = [k for k in keys if k not in kept]
        shares = _proportional(free, weights, total - sum(kept.values()), floor)
        over = {k: recorded[k] for k in free if recorded.get(k, 0) > shares[k]}
        if cap is not None and not over:
            over = {k: max(cap, recorded.get(k, 0)) for k in free if shares[k] > cap}
        if not over:
            return {k: kept[k] if k in kept else shares[k] for k in keys}
        kept.update(over)


def floor_trials(ops: list[NetworkOp], total: int) -> int:
    return max(1, min(FLOOR_TRIALS, total // (4 * max(len(ops), 1))))


def probe_trials(ops: list[NetworkOp], total: int, *, recorded: Mapping[str, int] | None = None,
                 best: Mapping[str, float] | None = None) -> dict[str, int]:
    """Trials for each op with nothing measured and fewer than the floor's trials recorded, before the budget
    is spread: empty when fewer than two ops could be weighed against each other."""
    recorded, best = recorded or {}, best or {}
    floor = floor_trials(ops, total)
    probes = {op.config.key: floor for op in ops
              if op.config.key not in best and recorded.get(op.config.key, 0) < floor}
    return probes if len(ops) > 1 and probes else {}


def _proportional(keys: list[str], weights: Mapping[str, float], budget: int, floor: int) -> dict[str, int]:
    """A floor each (as much of it as the budget allows, never under 1), the rest by weight (largest remainder)."""
    if not keys:
        return {}
    base = max(1, min(floor, budget // len(keys)))
    rest = max(0, budget - base * len(keys))
    weight = sum(weights[k] for k in keys) or 1.0
    exact = {k: rest * weights[k] / weight for k in keys}
    shares = {k: base + int(exact[k]) for k in keys}
    left = rest - sum(int(exact[k]) for k in keys)
    for k in sorted(keys, key=lambda k: exact[k] - int(exact[k]), reverse=True)[:left]:
        shares[k] += 1
    return shares


def tuning_order(ops: list[NetworkOp], best: Mapping[str, float]) -> list[NetworkOp]:
    """Largest estimated share first."""
    weights = estimated_seconds(ops, best)
    return sorted(ops, key=lambda op: weights[op.config.key], reverse=True)


# ---------------------------------------------------------------------------------------------
# The prediction


@dataclass
class NetworkEvent:
    """The network as the best kernels so far make it: sum over ops of best time x count."""

    network: str
    ops: int  # distinct ops tuned
    measured_ops: int  # of them, those with a successful trial
    predicted_seconds: float | None  # over the measured ops; None until one is measured
    library_seconds: float | None  # cuDNN/cuBLAS for all the ops, when measured; None: not measured
    trials: int  # recorded so far, over all ops
    budget: int

    @property
    def complete(self) -> bool:
        return self.measured_ops == self.ops

    def text(self) -> str:
        if self.predicted_seconds is None:
            return f"{self.network}: no op measured yet"
        scope = "" if self.complete else f" (measured ops only: {self.measured_ops} of {self.ops})"
        if not self.library_seconds:
            library = "library (cuDNN) time not measured"
        elif self.complete:
            library = (f"library {self.library_seconds * 1e6:,.1f} us, ratio "
                       f"{self.predicted_seconds / self.library_seconds:.2f}x")
        else:  # the library's time covers every op: a ratio over part of them would flatter
            library = f"library {self.library_seconds * 1e6:,.1f} us (ratio once every op has a result)"
        return f"{self.network}: predicted {self.predicted_seconds * 1e6:,.1f} us{scope} · {library}"


def predict(network: Network, best: Mapping[str, float], trials: int, budget: int) -> NetworkEvent:
    measured = [op for op in network.ops if op.config.key in best]
    predicted = sum(best[op.config.key] * op.count for op in measured) if measured else None
    return NetworkEvent(network.name, len(network.ops), len(measured), predicted, network.library_seconds,
                        trials, budget)

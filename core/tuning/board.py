"""What a tuning run's watcher knows of its ops: the list or the network being tuned, each op's live state in the
run, what each op's work dir holds, and from these each op's share of a network's trials and the predicted network
time. The Tuning view shows a TuneBoard; it keeps no tuning logic of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.codegen.batch import Inputs
from core.opconfigs.opconfig import OpConfig
from core.tuning.job import TuneJob
from core.tuning.network import Network, NetworkEvent, predict, spread_budget
from core.tuning.progress import IDLE, OpRun, plural
from core.tuning.queue import tuning_root
from core.tuning.records import recorded_runs
from core.tuning.request import input_network

History = dict[str, tuple[float | None, ...]]  # by OpConfig.key: each recorded run's best time (None: none measured)


def read_history(configs: list[OpConfig], target: str, arch: str) -> History:
    """What each op's work dir for `target` and `arch` holds (reads files: call it from a worker)."""
    root = tuning_root()
    return {c.key: tuple(recorded_runs(TuneJob(c, 1, target, arch).directory(root))) for c in configs}


@dataclass(frozen=True)
class ImportFound:
    """What a file or model read for tuning holds: its ops to tune, the lines refused, and a sentence saying so."""

    ops: int
    refused: int
    text: str

    @classmethod
    def of(cls, inputs: Inputs, name: str) -> ImportFound:
        network, errors = input_network(inputs), inputs.errors
        refused = f"; {len(errors)} refused (first: {errors[0]})" if errors else ""
        ops = len(network.ops) if network is not None else len(inputs.configs)
        if not ops:
            left = (f" ({plural(len(network.skipped), 'op')}, none NNFusion looks up in the kernel DB)"
                    if network is not None and network.skipped else "")
            return cls(0, len(errors), f"no op configs to tune in {name}{left}{refused}")
        what = "network op" if network is not None else "op config"
        return cls(ops, len(errors), f"{plural(ops, what)} to tune from {name}{refused}")


@dataclass
class TuneBoard:
    inputs: Inputs = field(default_factory=Inputs)  # what a run's request is built from
    source: str = ""  # where the list came from, for people
    network: Network | None = None  # the list is a model's ops, tuned as one network
    configs: list[OpConfig] = field(default_factory=list)  # the ops shown: the list, or a network's ops
    counts: dict[str, int] = field(default_factory=dict)  # a network's ops: how often each occurs in it
    live: dict[str, OpRun] = field(default_factory=dict)  # the last run's ops (kept after it ends)
    history: History = field(default_factory=dict)
    planned: dict[str, int] = field(default_factory=dict)  # a network's trials per op when the run started
    network_event: NetworkEvent | None = None  # the running network's last prediction

    def take(self, inputs: Inputs, source: str) -> None:
        """Show `inputs` from now on; what the last run showed stays only for the ops still listed."""
        self.inputs, self.source, self.network_event = inputs, source, None
        self.network = input_network(inputs)
        self.configs = [op.config for op in self.network.ops] if self.network is not None else list(inputs.configs)
        self.counts = {op.config.key: op.count for op in self.network.ops} if self.network is not None else {}
        self.live = {k: v for k, v in self.live.items() if k in {c.key for c in self.configs}}

    def history_read(self, history: History, *, running: bool) -> None:
        self.history = history
        if not running:  # the work dirs are the truth once a run is over
            self.live = {k: replace(v, runs=history.get(k, v.runs)) for k, v in self.live.items()}

    def run_of(self, key: str) -> OpRun:
        return self.live.get(key) or OpRun(IDLE, self.history.get(key, ()))

    def count(self, key: str) -> int:
        return self.counts.get(key, 1)

    def best_by_op(self) -> dict[str, float]:
        return {c.key: best for c in self.configs if (best := self.run_of(c.key).best_seconds) is not None}

    def shares(self, *, running: bool, trials: int, cap: int | None) -> dict[str, int]:
        """A network's trials per op (what each holds counted in); empty for a plain list (`trials` each)."""
        if self.network is None:
            return {}
        if running:  # the run's own plan: each op's latest job (after a network's probes, its share)
            return {**self.planned, **{key: run.planned for key, run in self.live.items() if run.planned}}
        recorded = {c.key: len(self.history.get(c.key, ())) for c in self.configs}
        return spread_budget(self.network.ops, trials * len(self.network.ops), recorded=recorded,
                             best=self.best_by_op(), cap=cap)

    def status(self, *, running: bool, trials: int, cap: int | None) -> str:
        """What is listed, from where; of a network, what NNFusion leaves to itself and the predicted time."""
        if not self.configs:
            return ""
        if self.network is None:
            return f"{plural(len(self.configs), 'op')} from {self.source}"
        left = sum(count for _, count, _ in self.network.skipped)
        return (f"network {self.network.name}: {plural(len(self.configs), 'distinct op')} NNFusion looks up in the "
                f"kernel DB" + (f" ({plural(left, 'other node')} left to NNFusion)" if left else "")
                + f"\n{self.prediction(running=running, trials=trials, cap=cap).text()}")

    def prediction(self, *, running: bool, trials: int, cap: int | None) -> NetworkEvent:
        """The network's predicted time from the best kernels so far (the run's own while it runs)."""
        assert self.network is not None
        if running and self.network_event is not None:
            return self.network_event
        done = sum(self.run_of(c.key).trials for c in self.configs)
        return predict(self.network, self.best_by_op(), done,
                       sum(self.shares(running=running, trials=trials, cap=cap).values()))

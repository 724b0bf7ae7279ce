"""A tuning job's types: what to tune (TuneJob, RpcTarget), what it reports as it goes (TrialEvent,
PhaseEvent) and what it ends with (TuneResult). No TVM here: the console and the CLI build jobs and read
their events without importing it.

The rest of a job lives beside this module: its work dir's records (records.py), the MetaSchedule run
(run.py), the harvest of its best kernels (harvest.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.opconfigs.opconfig import OpConfig

DEFAULT_BATCH = 32  # candidates per search round, unless a job says otherwise
# The evolutionary search's population, unless a job says otherwise (never below the round's batch). Half of
# MetaSchedule's 512: on this CPU it costs 0.56x the search's CPU and the model rates its picks 2% lower
# (bench/bench_search.py); on the H200 it took ResNet-18 from 122 to 150 trials/min, its kernels as good
# (0.61-0.64x cuDNN, against 0.64x: docs/BENCHMARKS-HISTORY.md, sessions 9 and 10).
DEFAULT_POPULATION = 256
# next records injected as rows too when the best record's row runs slow (core.tuning.queue; runner_up_kernels)
DEFAULT_RUNNER_UPS = 2


@dataclass(frozen=True)
class RpcTarget:
    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, text: str) -> RpcTarget:
        """HOST:PORT:KEY (or HOST:PORT, key "kdb")."""
        parts = text.split(":")
        if len(parts) not in (2, 3) or not parts[1].isdigit():
            raise InputError(f"{text!r} is not HOST:PORT:KEY", where="--rpc")
        return cls(parts[0], int(parts[1]), parts[2] if len(parts) == 3 and parts[2] else "kdb")


def search_population(population: int | None, batch: int) -> int:
    """The population a search round evolves: the job's, else DEFAULT_POPULATION (or the batch, when larger)."""
    return population if population is not None else max(DEFAULT_POPULATION, batch)


@dataclass(frozen=True)
class TuneJob:
    config: OpConfig
    trials: int
    target: str = "cuda"  # cuda | llvm (llvm measures on the CPU: same code path, used in CI)
    arch: str = "sm_90"
    work_dir: Path | None = None
    builder_timeout_s: float = 120.0  # the default 30 s kills nvcc on big unrolled kernels
    runner_timeout_s: float = 30.0
    trials_per_batch: int = DEFAULT_BATCH  # candidates per search round (the search costs about the same per round)
    rpc: RpcTarget | None = None
    rpc_workers: int = 1  # measurements in flight at once over RPC (one per server/GPU)
    builder_workers: int | None = None  # parallel builds (default: sized to this host, pipeline.build_workers)
    min_repeat_ms: int = 20  # warm timing: each measurement repeats the kernel at least this long
    cold_l2: bool | None = None  # time each run after an L2 flush (measure.py); default: on for cuda
    seed: int | None = None
    overlap: bool | None = None  # build while measuring (default: when measuring off this CPU; pipeline.py)
    efficient: bool = False  # also a kernel for the most efficient record (time x resource): harvest.py
    # when the best record's row runs RUNNER_UP_RATIO x the record's time or more, this many next records are
    # injected and timed as rows too (core.tuning.queue; runner_up_kernels)
    runner_ups: int = DEFAULT_RUNNER_UPS
    transfer: bool = True  # one cost model for the process, warm-started from the root's records (costmodel.py)
    population: int | None = None  # the evolutionary search's population (None: search_population's default)
    # every trial sampled at random, whatever the shared model could rank: a network's probe (network.py) only
    # weighs the budget, and an evolutionary round per 16-trial probe cost 20.7 s of the H200's 784 s run (issue 31)
    sampled: bool = False

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise InputError(f"{self.trials} trials: a tuning job needs at least 1", where=self.config.describe())
        if self.trials_per_batch < 1:
            raise InputError(f"batches of {self.trials_per_batch}: a search round needs at least 1 candidate",
                             where=self.config.describe())
        if self.population is not None and self.population < self.trials_per_batch:
            raise InputError(f"a population of {self.population} cannot give batches of {self.trials_per_batch}: "
                             "the search picks each batch from its population", where=self.config.describe())

    @property
    def name(self) -> str:
        return self.config.describe()

    def directory(self, root: Path) -> Path:
        from core.codegen.te_ops import revision
        from core.codegen.tensorcore import refusal

        rev = revision(self.config.op_type)  # revision 1 keeps the dirs named before revisions existed
        name = f"{self.config.key}|{self.target}|{self.arch}" + (f"|r{rev}" if rev > 1 else "")
        if not refusal(self.config):  # another workload than the CUDA cores' definition
            # (a half one's revision 2: operands read at clamped indices and selected, tensorcore._selected)
            name += "|tensor-cores" + ("|r2" if self.config.dtype == "half" else "")
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        return self.work_dir or root / f"{self.config.op_type.lower()}-{digest}"


@dataclass
class TrialEvent:
    """One measured trial (or a failed build/run), as the progress views show it."""

    job: str
    trial: int  # 1-based, counting resumed trials
    total: int
    seconds: float | None  # None: the build or the run failed
    gflops: float | None
    best_seconds: float | None
    best_gflops: float | None
    error: str = ""  # "build: ..." / "run: ..."
    elapsed_s: float = 0.0
    speed: float | None = None  # in speed_unit: GB/s for pools and element-wise ops, GFLOP/s otherwise
    best_speed: float | None = None
    speed_unit: str = "GFLOP/s"

    @classmethod
    def of(cls, job: TuneJob, trial: int, seconds: float | None, best: float | None, error: str,
           elapsed_s: float) -> TrialEvent:
        flops, unit = job.config.flops, job.config.speed(1.0)[1]
        return cls(job.name, trial, job.trials, seconds, flops / seconds / 1e9 if seconds else None, best,
                   flops / best / 1e9 if best else None, error, elapsed_s,
                   job.config.speed(seconds)[0] if seconds else None, job.config.speed(best)[0] if best else None,
                   unit)


@dataclass
class PhaseEvent:
    """Where a batch of candidates is: "search" (MetaSchedule picks the next batch), "build" (done of total
    built), "measure" (measurement begins; each measured candidate is a TrialEvent)."""

    job: str
    phase: str
    batch: int  # 1-based, in this run
    done: int
    total: int
    elapsed_s: float = 0.0


@dataclass
class TuneResult:
    job: TuneJob
    work_dir: Path
    trials: int = 0  # recorded in the work dir, resumed ones included
    new_trials: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    best_seconds: float | None = None
    cancelled: bool = False
    out_of_time: bool = False  # stopped by the run's time budget; its best so far counts (run_queue)
    requeued: int = 0  # trials measured again after their RPC server died
    seconds: float = 0.0
    kernels: dict[str, dict[str, Any]] = field(default_factory=dict)  # "best"/"efficient" -> kernel JSON item
    candidates: list[dict[str, Any]] = field(default_factory=list)  # top records: seconds, resource, role
    resumed: int = 0  # trials an earlier run had recorded in the work dir
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds by phase (pipeline.py); see PHASES
    model_trials: int = 0  # trials the cost model had learnt from when the search began (transfer)
    model_family: str = ""  # the op's kind (costmodel.op_family)
    model_family_trials: int = 0  # of model_trials, those of the op's kind
    # "evolutionary" (the model ranks), "sampled" (at random: the model holds too few trials of the op's kind;
    # no mutation rounds), or "sampled, then evolutionary" (sampled until the model could rank, the rest
    # evolved: see search_legs)
    search: str = ""

    @property
    def reused(self) -> bool:
        """Nothing measured: the work dir already held the whole budget, from an earlier run."""
        return self.new_trials == 0 and self.resumed >= self.job.trials

    @property
    def trials_per_minute(self) -> float:
        return self.new_trials / (self.seconds / 60) if self.seconds > 0 else 0.0


# Phases of a job's wall time, in the order a trial meets them. "build workers" is CPU time summed over the
# parallel builds (not wall time): next to "build", it says how much of the building the overlap hid.
PHASES = ("set-up", "search", "build", "measure", "record", "cost model", "other")

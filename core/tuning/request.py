"""A tuning run as a user asks for it, for both faces: `kdb tune` and the console's Tuning view.

Each face reads its own widgets or options into TuneChoices (None: "the default"), reads op configs with
read_tune_inputs (or hands over a list as Inputs), and calls tune_request: the one place that checks the
choices and resolves their defaults into a TuneRequest. run_request runs it. So for the same choices the two
faces tune the same jobs, with the same defaults, and refuse the same bad values with the same words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path

from core.codegen.batch import Inputs, read_inputs
from core.errors import InputError, ToolError
from core.inject.pipeline import InjectOptions
from core.opconfigs.opconfig import OpConfig
from core.settings import ARCH_RE, MATH_MODES, Settings
from core.tuning.claims import ClaimBoard
from core.tuning.job import DEFAULT_BATCH, DEFAULT_RUNNER_UPS, PhaseEvent, RpcTarget, TrialEvent, TuneJob
from core.tuning.network import Network, NetworkEvent, network_of
from core.tuning.queue import JobEvent, QueueReport, run_network, run_queue, time_budget

TARGETS = ("cuda", "llvm")
# The whole numbers a choice takes: (least, most; None: no most). The most keep a typo from queueing a week.
LIMITS: dict[str, tuple[int, int | None]] = {
    "trials": (1, 100_000), "budget": (1, None), "batch": (1, 4096), "population": (1, 65_536),
    "max_per_op": (1, 100_000), "rpc_workers": (1, None), "builder_workers": (1, None), "runner_ups": (0, None),
    "gpus": (-1, None),
}


class ChoiceError(InputError):
    """A choice refused: `choice` names the TuneChoices field, so each face can point at its own option or field."""

    def __init__(self, choice: str, reason: str) -> None:
        super().__init__(reason, where=choice)
        self.choice = choice


@dataclass(frozen=True)
class TuneChoices:
    """What a user chose, as `kdb tune`'s options and the Tuning view's fields give it; None is the default."""

    trials: int | None = None  # per op (a network: per op on average); default: the settings' tune_trials
    budget: int | None = None  # trials in all, spread over the ops as one network; default: trials x ops
    batch: int | None = None  # candidates per search round; default: DEFAULT_BATCH
    population: int | None = None  # the evolutionary search's, at least the batch; default: job.search_population
    max_per_op: int | None = None  # a network: no op planned more trials than this
    target: str = "cuda"
    arch: str | None = None  # default: the settings' first arch
    rpc: str | None = None  # HOST:PORT[:KEY]; None: the settings' tracker (if any); "": measure on this host
    rpc_workers: int | None = None  # measurements in flight over RPC; default: the tracker's free servers
    gpus: int = 0  # measure on this many GPUs of this host, a local tracker and a server each (-1: all)
    builder_workers: int | None = None  # parallel builds; default: sized to this host
    efficient: bool = False  # also inject each op's most efficient kernel (harvest.py)
    transfer: bool = True  # one cost model for the run, warm-started from every recorded trial
    runner_ups: int | None = None  # default: DEFAULT_RUNNER_UPS
    inject: bool = True  # cuda: verify (on a GPU), time and inject the best kernels
    join: str = ""  # a network: tune it with every other process of this run name (claims.py)
    math: str | None = None  # "fp32" or "tf32" (float Dots and convolutions on the tensor cores); default: settings'
    minutes: float | None = None  # a time budget: at its end the op in flight keeps its best, the rest wait


@dataclass(frozen=True)
class TuneRequest:
    """A checked tuning run: every default resolved, ready for run_request."""

    configs: tuple[OpConfig, ...]  # a plain list's jobs, one each; a network's ops are in `network`
    network: Network | None
    trials: int  # per op (a network: budget / ops on average)
    budget: int  # a network's trials in all; a plain list's trials x ops
    max_per_op: int | None
    target: str
    arch: str
    rpc: RpcTarget | None
    rpc_workers: int | None  # None: the tracker's free servers when the run starts
    gpus: int
    rpc_key: str  # the key of the servers started for `gpus`
    batch: int
    population: int | None
    builder_workers: int | None
    builder_timeout_s: float
    efficient: bool
    transfer: bool
    runner_ups: int
    inject: InjectOptions | None  # None: nothing injected (llvm, or not asked)
    db_path: Path
    join: str
    minutes: float | None = None  # run_request's time budget (run_queue's out_of_time), from the run's start

    def job(self, config: OpConfig, trials: int, rpc_workers: int = 1) -> TuneJob:
        return TuneJob(config, trials, self.target, self.arch, rpc=self.rpc, rpc_workers=rpc_workers,
                       builder_timeout_s=self.builder_timeout_s, efficient=self.efficient, transfer=self.transfer,
                       trials_per_batch=self.batch, population=self.population,
                       builder_workers=self.builder_workers, runner_ups=self.runner_ups)

    def jobs(self) -> list[TuneJob]:
        """A plain list's jobs (a network's are sized as it runs: run_network)."""
        return [self.job(config, self.trials) for config in self.configs]


def read_tune_inputs(paths: list[Path], settings: Settings) -> Inputs:
    """Op configs of files, ONNX models and directories; of a model, the ops NNFusion looks up at the settings'
    nnfusion_flags, in the graph the settings' compiler imports (its ONNX Runtime pre-pass run)."""
    from core.nnfusion.compiler import CompilerFlags, compiler_prepass

    return read_inputs(paths, CompilerFlags.parse(settings.nnfusion_flags),
                       prepass=compiler_prepass("", settings.nnfusion_path))


def list_inputs(configs: list[OpConfig]) -> Inputs:
    """A list handed over (the Op configs view's) as inputs: each op once, no model."""
    inputs = Inputs()
    for config in configs:
        inputs.add(config, 1)
    return inputs


def input_network(inputs: Inputs) -> Network | None:
    """The network a model's inputs make (its ops a kernel-DB row can serve); None for op-config files."""
    return network_of("+".join(inputs.models), inputs.configs, inputs.count) if inputs.models else None


def _check_numbers(choices: TuneChoices) -> None:
    for choice in fields(TuneChoices):
        least, most = LIMITS.get(choice.name, (None, None))
        value = getattr(choices, choice.name)
        if least is None or value is None:
            continue
        if value < least or (most is not None and value > most):
            span = f"from {least} to {most}" if most is not None else f"at least {least}"
            raise ChoiceError(choice.name, f"must be {span}, not {value}")


def check_choices(choices: TuneChoices, settings: Settings) -> None:
    """The checks that need no op configs (tune_request makes them first; a face may make them before it reads
    a model, which takes seconds)."""
    _check_numbers(choices)
    if choices.target not in TARGETS:
        raise ChoiceError("target", f"{choices.target!r}: expected cuda or llvm")
    batch = choices.batch if choices.batch is not None else DEFAULT_BATCH
    if choices.population is not None and choices.population < batch:
        raise ChoiceError("population", f"a population of {choices.population} cannot give batches of {batch}: "
                                        "the search picks each batch from its population")
    arch = choices.arch or settings.archs[0]
    if choices.minutes is not None and not 0 < choices.minutes <= 7 * 24 * 60:
        raise ChoiceError("minutes", f"{choices.minutes:g}: a time budget of more than 0 minutes, at most a week")
    if choices.math is not None and choices.math not in MATH_MODES:
        raise ChoiceError("math", f"{choices.math!r}: one of {', '.join(MATH_MODES)}")
    if choices.target == "cuda" and not ARCH_RE.fullmatch(arch):
        raise ChoiceError("arch", f"{arch!r} is not an SM arch like sm_90")


def tune_request(inputs: Inputs, choices: TuneChoices, settings: Settings, *, db_path: Path,
                 gpu: tuple[bool, str] | None = None) -> TuneRequest:
    """The run these choices ask for, every default resolved, or a KdbError (ChoiceError: which choice, why).

    `gpu`: whether a CUDA device is here, and its name or why not (core.gpu.jobs.gpu_available); asked here
    when not given and the target is cuda.
    """
    check_choices(choices, settings)
    batch = choices.batch if choices.batch is not None else DEFAULT_BATCH
    arch = choices.arch or settings.archs[0]
    inputs = inputs.with_math(choices.math or settings.math)
    if not inputs.configs:
        raise InputError("no op configs to tune")
    network = input_network(inputs)
    if network is None and choices.budget is not None:  # a budget spreads a plain list too, as one network
        network = network_of("op configs", inputs.configs, inputs.count)
    if network is not None and not network.ops:
        raise InputError(f"{network.name}: none of its {len(inputs.configs)} ops is one a kernel-DB row can serve")
    if choices.max_per_op is not None and network is None:
        raise ChoiceError("max_per_op", "only a network's trials are spread over its ops: tune a model, or give "
                                        "a budget in all")
    if choices.join and network is None:
        raise ChoiceError("join", "several processes share the ops of one network: tune a model, or give a "
                                  "budget in all")
    rpc_text = choices.rpc if choices.rpc is not None else (
        f"{settings.rpc_tracker}:{settings.rpc_key}" if settings.rpc_tracker else "")
    try:
        rpc = RpcTarget.parse(rpc_text) if rpc_text and not choices.gpus else None
    except InputError as exc:
        raise ChoiceError("rpc", exc.reason) from exc
    inject = None
    if choices.target == "cuda":
        has_gpu, what = gpu if gpu is not None else _gpu_available()
        if not has_gpu and rpc is None:
            raise ToolError(f"CUDA tuning measures every trial on a GPU, and there is none here ({what}): measure "
                            "on GPU servers registered with an RPC tracker, or tune for target llvm on this CPU")
        if choices.inject:
            inject = InjectOptions.from_settings(settings, verify=has_gpu, profile=has_gpu)
    trials = choices.trials if choices.trials is not None else settings.tune_trials
    ops = len(network.ops) if network is not None else len(inputs.configs)
    return TuneRequest(
        configs=tuple(op.config for op in network.ops) if network is not None else tuple(inputs.configs),
        network=network, trials=trials, budget=choices.budget or trials * ops, max_per_op=choices.max_per_op,
        target=choices.target, arch=arch, rpc=rpc, rpc_workers=choices.rpc_workers, gpus=choices.gpus,
        rpc_key=rpc.key if rpc else settings.rpc_key, batch=batch,
        population=choices.population, builder_workers=choices.builder_workers,
        builder_timeout_s=settings.tune_builder_timeout_s, efficient=choices.efficient, transfer=choices.transfer,
        runner_ups=DEFAULT_RUNNER_UPS if choices.runner_ups is None else choices.runner_ups, inject=inject,
        db_path=db_path, join=choices.join, minutes=choices.minutes)


def _gpu_available() -> tuple[bool, str]:
    from core.gpu.jobs import gpu_available

    return gpu_available()


@contextlib.contextmanager
def _measuring(request: TuneRequest, on_note: Callable[[str], None]) -> Iterator[tuple[RpcTarget | None, int]]:
    """Where the trials are measured while the run is on, and how many at once: this host, the request's
    tracker (as many as its free servers unless told), or a tracker and a server per GPU started here."""
    if request.gpus:
        from core.tuning.rpc import local_gpu_cluster

        cluster = local_gpu_cluster(request.gpus, key=request.rpc_key)
        try:
            on_note(f"measuring on {len(cluster.servers)} GPU(s) through a local tracker at "
                    f"{cluster.host}:{cluster.port}")
            yield RpcTarget(cluster.host, cluster.port, cluster.key), request.rpc_workers or len(cluster.servers)
        finally:
            cluster.stop()
        return
    rpc = request.rpc
    if rpc is None or request.rpc_workers is not None:
        yield rpc, request.rpc_workers or 1
        return
    from core.tuning.rpc import tracker_status

    status = tracker_status(rpc.host, rpc.port)
    if not status.reachable:
        raise ToolError(f"the RPC tracker {rpc.host}:{rpc.port} does not answer: {status.error}")
    yield rpc, max(1, status.queue.get(rpc.key, {}).get("free", 0))


def run_request(request: TuneRequest, *, on_trial: Callable[[TrialEvent], None] | None = None,
                on_job: Callable[[JobEvent], None] | None = None,
                on_phase: Callable[[PhaseEvent], None] | None = None,
                on_network: Callable[[NetworkEvent], None] | None = None,
                on_note: Callable[[str], None] = lambda _: None,
                should_cancel: Callable[[], bool] | None = None) -> QueueReport:
    """Run the request: a plain list's jobs one after the other (run_queue), a network's as one budget
    (run_network); the best kernels injected when the request says so. The events are run_queue's."""
    with _measuring(request, on_note) as (rpc, rpc_workers):
        measured = replace(request, rpc=rpc)

        def make_job(config: OpConfig, trials: int) -> TuneJob:
            return measured.job(config, trials, rpc_workers)

        callbacks = dict(on_trial=on_trial, on_job=on_job, on_phase=on_phase, should_cancel=should_cancel,
                         out_of_time=time_budget(request.minutes))
        if request.network is not None:
            board = ClaimBoard.for_run(request.join) if request.join else None
            return run_network(request.network, request.budget, make_job, db_path=request.db_path,
                               inject_options=request.inject, on_network=on_network, board=board,
                               cap=request.max_per_op, **callbacks)
        return run_queue([make_job(c, request.trials) for c in request.configs], db_path=request.db_path,
                         inject_options=request.inject, **callbacks)

"""One tune request for both faces. `kdb tune`'s arguments and the Tuning view's fields, given the same choices, make
equal TuneRequests through core's tune_request (defaults included) and are refused for the same reason; every
option of `kdb tune` reaches the choices; core refuses each bad choice by name; a tracker that does not answer
stops the run before anything is tuned.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from console_helpers import FixedDeviceApp, wait_until
from textual.widgets import Input, Select

from console.cli.cmd_tune import choices_of, request_of
from console.cli.parser import build_parser
from console.context import ConsoleContext
from console.screens.tuning import TuningScreen
from console.widgets.dialogs import PathDialog
from core.errors import InputError, KdbError, ToolError
from core.opconfigs.opconfig import parse_line
from core.settings import Settings
from core.tuning.request import ChoiceError, TuneChoices, TuneRequest, list_inputs, run_request, tune_request

RELU = "elementwise_relu_op_float|i+1_4096|o+1_4096"
DOT = "cublas_dot_op_float|a+32_32|b+32_32|o+32_32|ta+0|tb+0"
SETTINGS = Settings(workers=1)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same answer on every machine, GPU or not (every GPU question asks detect_devices)."""
    import core.gpu.inventory

    monkeypatch.setattr(core.gpu.inventory, "detect_devices", lambda *_, **__: ([], "no CUDA device found (test)"))


def ops_file(tmp_path: Path) -> Path:
    path = tmp_path / "ops.txt"
    path.write_text(f"{RELU}\n{DOT}\n", encoding="utf-8")
    return path


def small_model(tmp_path: Path) -> Path:
    pytest.importorskip("onnx")
    from onnx_models import small_cnn, write

    return write(small_cnn(), tmp_path / "small.onnx")


def cli(inputs: Path, options: list[str], db: Path) -> TuneRequest | KdbError:
    """What `kdb tune INPUTS OPTIONS --db DB` asks core for: the request, or core's refusal."""
    try:
        return request_of(build_parser().parse_args(["tune", str(inputs), *options, "--db", str(db)]), SETTINGS)
    except KdbError as exc:
        return exc.__cause__ if isinstance(exc.__cause__, ChoiceError) else exc  # core's, before the CLI names it


async def console(inputs: Path, values: dict[str, str], db: Path) -> TuneRequest | KdbError:
    """What the Tuning view's Start hands its worker once INPUTS is imported and the fields hold VALUES, or the
    refusal it explains."""
    app = FixedDeviceApp(ConsoleContext(db_path=db, settings=SETTINGS, device_summary="no CUDA device (test)"))
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.press("7")
        screen = app.screen
        assert isinstance(screen, TuningScreen)
        await pilot.press("i")
        assert isinstance(app.screen, PathDialog)
        app.screen.query_one("#path", Input).value = str(inputs)
        await pilot.press("enter")
        await wait_until(pilot, lambda: bool(screen.configs), "the import")
        await wait_until(pilot, lambda: screen.gpu is not None, "the GPU probe")
        for field, value in values.items():
            if field == "target":
                screen.query_one("#target", Select).value = value
            else:
                screen.query_one(f"#{field}", Input).value = value
        await pilot.pause()  # the fields' Changed messages
        started: list[TuneRequest] = []
        refused: list[KdbError] = []
        screen.tune = lambda request, cancel: started.append(request)  # type: ignore[method-assign]
        build = screen.request

        def request() -> TuneRequest:
            try:
                return build()
            except KdbError as exc:
                refused.append(exc)
                raise

        screen.request = request  # type: ignore[method-assign]
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: bool(started or refused), "Start to start or refuse")
        if refused:
            assert refused[0].reason in str(screen.query_one("#run-note").render())  # the view says why
            return refused[0]
        return started[0]


SAME_CHOICES = [  # (what, the command line's options, the view's fields)
    ("defaults", ["--target", "llvm"], {"target": "llvm"}),
    ("fields left empty are the defaults too", ["--target", "llvm"],
     {"target": "llvm", "trials": "", "batch": "", "population": "", "arch": ""}),
    ("every field the view has", ["--target", "llvm", "--trials", "5", "--batch", "8", "--population", "16",
                                  "--arch", "sm_80"],
     {"target": "llvm", "trials": "5", "batch": "8", "population": "16", "arch": "sm_80"}),
    ("a population smaller than a round", ["--target", "llvm", "--batch", "8", "--population", "4"],
     {"target": "llvm", "batch": "8", "population": "4"}),
    ("no trials", ["--target", "llvm", "--trials", "0"], {"target": "llvm", "trials": "0"}),
    ("a cap on a plain list", ["--target", "llvm", "--max-per-op", "2"], {"target": "llvm", "cap": "2"}),
    ("not an SM arch", ["--arch", "90"], {"arch": "90"}),
    ("a time budget", ["--target", "llvm", "--minutes", "12.5"], {"target": "llvm", "minutes": "12.5"}),
    ("no time at all", ["--target", "llvm", "--minutes", "0"], {"target": "llvm", "minutes": "0"}),
    ("cuda with no GPU and no tracker", [], {}),
]


@pytest.mark.parametrize(("what", "options", "values"), SAME_CHOICES, ids=[what for what, _, _ in SAME_CHOICES])
async def test_both_faces_make_one_request_for_the_same_choices(tmp_path: Path, no_gpu: None, what: str,
                                                                options: list[str], values: dict[str, str]):
    ops, db = ops_file(tmp_path), tmp_path / "k.db"
    by_cli, by_console = cli(ops, options, db), await console(ops, values, db)
    assert type(by_console) is type(by_cli), (what, by_cli, by_console)
    if isinstance(by_cli, KdbError):  # refused by both, for one reason (each face names the choice its own way)
        assert isinstance(by_console, KdbError)
        assert (getattr(by_console, "choice", ""), by_console.reason) == (getattr(by_cli, "choice", ""), by_cli.reason)
    else:
        assert by_console == by_cli, what
        assert isinstance(by_console, TuneRequest) and by_console.jobs() == by_cli.jobs()


async def test_both_faces_make_one_request_for_a_models_network(tmp_path: Path, no_gpu: None):
    model, db = small_model(tmp_path), tmp_path / "k.db"
    by_cli = cli(model, ["--target", "llvm", "--trials", "3", "--max-per-op", "4"], db)
    by_console = await console(model, {"target": "llvm", "trials": "3", "cap": "4"}, db)
    assert isinstance(by_cli, TuneRequest) and by_cli.network is not None and by_cli.budget == 6
    assert by_console == by_cli


def test_every_option_of_kdb_tune_reaches_the_choices():
    args = build_parser().parse_args(
        ["tune", "ops.txt", "--trials", "5", "--budget", "50", "--batch", "8", "--population", "16", "--max-per-op",
         "9", "--target", "llvm", "--arch", "sm_80", "--rpc", "host:9190:key", "--rpc-workers", "3", "--gpus", "2",
         "--workers", "4", "--efficient", "--no-transfer", "--runner-ups", "1", "--no-inject", "--join", "r1",
         "--math", "tf32", "--minutes", "12.5"])
    choices, defaults = choices_of(args), TuneChoices()
    assert [f.name for f in fields(TuneChoices) if getattr(choices, f.name) == getattr(defaults, f.name)] == []
    assert choices_of(build_parser().parse_args(["tune", "ops.txt"])) == defaults  # left out: core's default


def request(choices: TuneChoices, configs: tuple[str, ...] = (DOT,)) -> TuneRequest:
    return tune_request(list_inputs([parse_line(c, "t") for c in configs]), choices, SETTINGS,
                        db_path=Path("k.db"), gpu=(False, "no GPU (test)"))


@pytest.mark.parametrize(("choices", "choice", "reason"), [
    (TuneChoices(trials=0), "trials", "must be from 1 to 100000, not 0"),
    (TuneChoices(trials=100_001), "trials", "must be from 1 to 100000, not 100001"),
    (TuneChoices(batch=0), "batch", "must be from 1 to 4096, not 0"),
    (TuneChoices(budget=0), "budget", "must be at least 1, not 0"),
    (TuneChoices(batch=64, population=32), "population", "a population of 32 cannot give batches of 64"),
    (TuneChoices(runner_ups=-1), "runner_ups", "must be at least 0, not -1"),
    (TuneChoices(gpus=-2), "gpus", "must be at least -1, not -2"),
    (TuneChoices(target="rocm"), "target", "'rocm': expected cuda or llvm"),
    (TuneChoices(arch="sm90"), "arch", "'sm90' is not an SM arch like sm_90"),
    (TuneChoices(minutes=0), "minutes", "0: a time budget of more than 0 minutes, at most a week"),
    (TuneChoices(target="llvm", max_per_op=2), "max_per_op", "only a network's trials are spread over its ops"),
    (TuneChoices(target="llvm", join="r"), "join", "several processes share the ops of one network"),
    (TuneChoices(target="llvm", rpc="host"), "rpc", "'host' is not HOST:PORT:KEY"),
])
def test_core_refuses_each_bad_choice_by_name(choices: TuneChoices, choice: str, reason: str):
    with pytest.raises(ChoiceError) as refused:
        request(choices)
    assert refused.value.choice == choice and refused.value.reason.startswith(reason)


def test_core_resolves_the_defaults_and_refuses_what_it_cannot_tune():
    made = request(TuneChoices(target="llvm"))
    assert (made.trials, made.batch, made.population, made.runner_ups, made.transfer, made.efficient) == \
        (SETTINGS.tune_trials, 32, None, 2, True, False)
    assert made.inject is None and made.network is None and made.arch == SETTINGS.archs[0]
    spread = request(TuneChoices(target="llvm", budget=10), (DOT, RELU))  # a budget: one network of the list
    assert spread.network is not None and len(spread.network.ops) == 2 and spread.budget == 10
    with pytest.raises(InputError, match="no op configs to tune"):
        request(TuneChoices(target="llvm"), ())
    with pytest.raises(ToolError, match=r"there is none here \(no GPU \(test\)\)"):
        request(TuneChoices())  # cuda, no GPU, no tracker
    assert request(TuneChoices(rpc="127.0.0.1:9190:k")).inject is not None  # measured there: injected, unverified


def test_a_tracker_that_does_not_answer_stops_the_run_before_anything_is_tuned(tmp_path: Path):
    pytest.importorskip("tvm")
    from core.tuning.rpc import free_port

    port = free_port()  # nobody listens there
    made = request(TuneChoices(target="llvm", rpc=f"127.0.0.1:{port}:kdb"))
    jobs: list[object] = []
    with pytest.raises(ToolError, match=f"the RPC tracker 127.0.0.1:{port} does not answer"):
        run_request(made, on_job=jobs.append)
    assert not jobs


def test_run_progress_folds_each_event_into_its_ops_snapshot(tmp_path: Path):
    from core.tuning.job import PhaseEvent, TrialEvent
    from core.tuning.progress import RunProgress
    from core.tuning.queue import JobEvent

    made = request(TuneChoices(target="llvm", trials=2), (DOT, RELU))
    dot, relu = (c.key for c in made.configs)
    snapshots, notes = [], []
    progress = RunProgress(made, tmp_path, lambda runs, network: snapshots.append(runs), notes.append)
    job = made.jobs()[0]
    progress.job(JobEvent(job.name, 0, "tuning", key=dot, trials=2, of=2))
    progress.phase(PhaseEvent(job.name, "build", 1, 1, 2))
    assert snapshots[-1][dot].status_text(2) == "build 1/2"
    progress.trial(TrialEvent.of(job, 1, 3e-6, 3e-6, "", 0.1))
    progress.trial(TrialEvent.of(job, 2, None, 3e-6, "build: nvcc failed", 0.2))
    progress.job(JobEvent(job.name, 0, "done", "best 3 us", key=dot, trials=2, of=2))
    last = snapshots[-1]
    assert (last[dot].status, last[dot].runs, last[dot].phase, last[dot].planned) == ("done", (3e-6, None), "", 2)
    assert (last[dot].best_seconds, last[dot].errors) == (3e-6, 1)
    assert last[relu].status == "queued" and last[relu].runs == ()  # untouched: what its work dir holds
    assert len(snapshots) == 5 and all(len(s) == 2 for s in snapshots)  # one per event, every op in each
    assert [n.split(":")[1].strip() for n in notes] == ["tuning in " + str(job.directory(tmp_path)),
                                                        "trial 2 failed", "done"]

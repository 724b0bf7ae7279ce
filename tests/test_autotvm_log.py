"""AutoTVM logs: the demo network's (written by the tests) and every shared log parse, best times agree with
an independent count, bad lines are reported."""

from __future__ import annotations

import functools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from autotvm_logs import LogPlan, demo_network_convolutions, demo_network_dots, demo_network_log
from conftest import needs_shared, run_kdb, run_kdb_json
from shared_data import ARTIFACT_LOGS, ARTIFACT_OPCONFIGS, shared_path

from core.errors import InputError
from core.opconfigs.autotvm_log import CONV_TASK, MAX_LINE_BYTES, LogSummary, match, read_log, workload_key
from core.opconfigs.opconfig import format_lines, read_opconfigs

LOGS = shared_path(ARTIFACT_LOGS)
OP_CONFIGS = shared_path(ARTIFACT_OPCONFIGS)
ALEXNET = "alexnet_nchw_tuned_conv2d.1000.log"
DEEPSPEECH2 = "deepspeech2_tuned_conv2d.1000.log"
TILING_NN = "all_tuned_tilling_dense_nn.1000.log"
TOPI_DENSE = "all_tuned_topi_dense.1000.log"
DEMO_TILING, DEMO_TOPI = "demo-tiling", "demo-topi"  # the demo network's logs, one per dense template

needs_logs = needs_shared(ARTIFACT_LOGS, "the Rammer artifact's AutoTVM logs")
needs_logs_and_configs = [needs_logs, needs_shared(ARTIFACT_OPCONFIGS, "the Rammer artifact's op configs")]

# Counted once by hand from the files (json per line, grouped by (task, args)).
TOPI_TRIALS = {
    (1, 256, 10): 9, (1, 256, 256): 9, (1, 256, 512): 9, (1, 3008, 1024): 14, (1, 4096, 1000): 13,
    (1, 4096, 4096): 13, (1, 512, 1024): 10, (16, 256, 10): 9, (16, 256, 256): 9, (16, 256, 512): 9,
    (16, 3008, 1024): 14, (16, 512, 1024): 10, (1, 768, 10): 18, (1, 9216, 4096): 33, (4, 256, 10): 9,
    (4, 256, 256): 9, (4, 256, 512): 9, (4, 3008, 1024): 14, (4, 512, 1024): 10, (75, 256, 29): 1000,
    (1, 1056, 1000): 24, (1, 2048, 1000): 12,
}


@dataclass(frozen=True)
class Expected:
    workloads: int
    trials: dict[str, int]  # per workload, by args_key
    successes: int
    errors: dict[str, int]


SHARED_EXPECTED = {  # file: (workloads, trials per workload (None: see TOPI_TRIALS), successes, errors by kind)
    ALEXNET: (5, 1000, 4550, {"INSTANTIATION_ERROR": 360, "RUNTIME_DEVICE": 50, "BUILD_TIMEOUT": 40}),
    DEEPSPEECH2: (2, 1000, 1766, {"INSTANTIATION_ERROR": 195, "RUNTIME_DEVICE": 36, "BUILD_TIMEOUT": 3}),
    TILING_NN: (8, 1000, 5924, {"INSTANTIATION_ERROR": 633, "COMPILE_HOST": 1417, "RUNTIME_DEVICE": 19,
                                "BUILD_TIMEOUT": 7}),
    TOPI_DENSE: (22, None, 814, {"INSTANTIATION_ERROR": 309, "COMPILE_HOST": 120, "RUNTIME_DEVICE": 3,
                                 "BUILD_TIMEOUT": 20}),
}
LOG_NAMES = [DEMO_TILING, DEMO_TOPI, *(pytest.param(name, marks=needs_logs) for name in SHARED_EXPECTED)]


@pytest.fixture(scope="module")
def demo_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LogPlan]:
    folder = tmp_path_factory.mktemp("autotvm")
    return {DEMO_TILING: demo_network_log(folder / "demo_tiling.log", "tiling"),
            DEMO_TOPI: demo_network_log(folder / "demo_topi.log", "topi")}


@pytest.fixture
def log_path(demo_logs: dict[str, LogPlan]):
    """A log's path by name: the demo network's or a shared one."""
    return lambda name: demo_logs[name].path if name in demo_logs else LOGS / name


def expected(name: str, demo_logs: dict[str, LogPlan]) -> Expected:
    if name in demo_logs:  # what the writer counted as it wrote
        plan = demo_logs[name]
        return Expected(len(plan.workloads), {args_key(w.args): w.trials for w in plan.workloads},
                        sum(w.successes for w in plan.workloads), dict(plan.errors()))
    count, trials, successes, errors = SHARED_EXPECTED[name]
    summary = summary_of(LOGS / name)
    per_workload = ({args_key(args): n for args, n in TOPI_TRIALS.items()} if trials is None
                    else {args_key(w.args): trials for w in summary.workloads})
    return Expected(count, per_workload, successes, errors)


def args_key(args: list | tuple) -> str:
    return json.dumps(list(args))


@functools.cache
def summary_of(path: Path) -> LogSummary:
    return read_log(path)


@pytest.mark.parametrize("name", LOG_NAMES)
def test_every_log_parses_with_the_expected_counts(demo_logs: dict[str, LogPlan], log_path, name: str) -> None:
    summary = summary_of(log_path(name))
    want = expected(name, demo_logs)
    assert summary.bad_lines == [] and summary.bad_line_count == 0
    assert len(summary.workloads) == want.workloads
    assert {args_key(w.args): w.trials for w in summary.workloads} == want.trials
    assert summary.records == sum(w.trials for w in summary.workloads)
    assert sum(w.successes for w in summary.workloads) == want.successes
    total: Counter[str] = Counter()
    for w in summary.workloads:
        total.update(w.errors_by_kind)
        assert w.successes + sum(w.errors_by_kind.values()) == w.trials
        assert w.op_config is not None, w.op_config_note
    assert dict(total) == want.errors


@pytest.mark.parametrize("name", LOG_NAMES)
def test_best_time_and_curve_match_an_independent_count(log_path, name: str) -> None:
    path = log_path(name)
    times: dict[tuple[str, str], list[float]] = {}  # per workload, per trial: mean cost, inf when it failed
    stamps: dict[tuple[str, str], list[float]] = {}
    with path.open() as f:
        for line in f:
            record = json.loads(line)
            key = workload_key(record["i"][1], record["i"][2])
            costs, error_no, _, stamp = record["r"]
            times.setdefault(key, []).append(sum(costs) / len(costs) if error_no == 0 else math.inf)
            stamps.setdefault(key, []).append(stamp)
    for w in summary_of(path).workloads:
        trial_times = times[w.workload]
        best = min(trial_times)
        assert w.best_seconds == best
        assert w.best_trial == trial_times.index(best) + 1
        assert w.best_so_far == [min(trial_times[: i + 1]) for i in range(len(trial_times))]
        assert (w.first_timestamp, w.last_timestamp) == (min(stamps[w.workload]), max(stamps[w.workload]))
        assert w.best_config and all(len(knob) == 3 for knob in w.best_config)


def demo_opconfigs(folder: Path) -> Path:
    """The demo network's convolutions (as the conv2d template tunes them, unfused) and dot, as a file."""
    path = folder / "demo_opconfigs.txt"
    path.write_text(format_lines([*demo_network_convolutions(), *demo_network_dots()]), encoding="utf-8")
    return path


@pytest.mark.parametrize(("log", "opconfigs"), [
    (DEMO_TILING, None),
    pytest.param(ALEXNET, "alexnet_conv_kernels.txt", marks=needs_logs_and_configs),
    pytest.param(DEEPSPEECH2, "deepspeech2_conv_kernels.txt", marks=needs_logs_and_configs)])
def test_conv_workloads_match_the_op_configs_one_to_one(log_path, tmp_path: Path, log: str,
                                                        opconfigs: str | None) -> None:
    configs = read_opconfigs(OP_CONFIGS / opconfigs if opconfigs else demo_opconfigs(tmp_path))
    assert configs.errors == []
    convs = [c for c in configs.configs if c.op_type == "Convolution"]
    summary = summary_of(log_path(log))
    conv_workloads = {w.workload for w in summary.workloads if w.task == CONV_TASK}
    matched = match(summary, convs)
    assert set(matched) == conv_workloads and len(conv_workloads) == len(convs)
    assert sorted(c.source for c in matched.values()) == sorted(c.source for c in convs)
    assert all(w.op_config is not None and w.op_config.op_type == "Convolution"
               for w in summary.workloads if w.task == CONV_TASK)


@pytest.mark.parametrize(("tiling", "topi"), [(DEMO_TILING, DEMO_TOPI),
                                              pytest.param(TILING_NN, TOPI_DENSE, marks=needs_logs)])
def test_dense_templates_get_the_right_transposes(log_path, tmp_path: Path, tiling: str, topi: str) -> None:
    tiled, dense = summary_of(log_path(tiling)), summary_of(log_path(topi))
    for w in tiled.workloads:  # A[M, K] x B[K, N]
        if w.task == CONV_TASK:
            continue
        _, k, n = w.args
        assert w.op_config is not None and w.op_config.params["arg1_shape"] == [k, n]
        assert not w.op_config.params["transpose_B"]
    for w in dense.workloads:  # TOPI dense: B is [N, K]
        if w.task == CONV_TASK:
            continue
        _, k, n = w.args
        assert w.op_config is not None and w.op_config.params["arg1_shape"] == [n, k]
        assert w.op_config.params["transpose_B"]
    m, k, n = min({tuple(w.args) for w in tiled.workloads if w.task != CONV_TASK}
                  & {tuple(w.args) for w in dense.workloads if w.task != CONV_TASK})
    dots = tmp_path / "dots.txt"
    dots.write_text(f"cublas_dot_op_float|a+{m}_{k}|b+{k}_{n}|o+{m}_{n}|ta+0|tb+0\n"
                    f"cublas_dot_op_float|a+{m}_{k}|b+{n}_{k}|o+{m}_{n}|ta+0|tb+1\n")
    configs = read_opconfigs(dots).configs
    assert [c.source for c in match(tiled, configs).values()] == [f"{dots}:1"]
    assert [c.source for c in match(dense, configs).values()] == [f"{dots}:2"]


def _corrupted_copy(source: Path, tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """A copy of a log (1,000 lines at least) with four bad lines inserted; the path and {line number: what is
    wrong}."""
    lines = source.read_text().splitlines(keepends=True)
    success = next(line for line in lines if json.loads(line)["r"][1] == 0)
    nan = json.loads(success)
    nan["r"][0] = [math.nan]
    bad = {
        10: lines[9][: len(lines[9]) // 2] + "\n",
        100: "this is not JSON\n",
        500: json.dumps({"i": ["cuda", "tvm_matmul_tune_op"], "r": [[1e-5], 0, 1.0, 1.0], "v": 0.1}) + "\n",
        1000: json.dumps(nan) + "\n",  # Python writes NaN, as TVM would
    }
    for number in sorted(bad):
        lines.insert(number - 1, bad[number])
    path = tmp_path / "corrupted.log"
    path.write_text("".join(lines))
    return path, {10: "truncated", 100: "not JSON", 500: '"i" must be', 1000: "cost nan"}


@pytest.mark.parametrize("name", [DEMO_TOPI, pytest.param(TOPI_DENSE, marks=needs_logs)])
def test_a_corrupted_copy_reports_exactly_its_bad_lines(log_path, tmp_path: Path, name: str) -> None:
    path, expected_bad = _corrupted_copy(log_path(name), tmp_path)
    summary = read_log(path)
    assert [exc.where for exc in summary.bad_lines] == [f"{path}:{n}" for n in expected_bad]
    for exc, reason in zip(summary.bad_lines, expected_bad.values(), strict=True):
        assert reason in exc.reason, exc
    assert summary.bad_line_count == 4
    assert [w.as_dict() for w in summary.workloads] == [w.as_dict() for w in summary_of(log_path(name)).workloads]


def _record(task: str, args: list, error_no: int = 0, cost: float = 1e-5, knobs: list | None = None) -> str:
    config = {"i": 0, "t": "", "c": None, "e": knobs or [["tile_k", "sp", [-1, 2]]]}
    costs = [cost] if error_no == 0 else [1e9]
    return json.dumps({"i": ["cuda", task, args, {}, [task, *args], config], "r": [costs, error_no, 1.0, 1.0],
                       "v": 0.1})


def test_odd_lines_are_reported_and_odd_tasks_still_summarised(tmp_path: Path) -> None:
    dot = _record("tvm_matmul_tune_op", [4, 8, 16], cost=2e-5)
    path = tmp_path / "odd.log"
    path.write_bytes("\n".join([
        "# a comment", "", dot,
        "x" * (MAX_LINE_BYTES + 10),  # over the cap
        _record("tvm_matmul_tune_op", [4, 8, 16], error_no=9),
        _record("tvm_matmul_tune_op", [4, 8, 16], cost=-1.0),
        dot.replace("2e-05", "true"),  # a bool is no cost
        _record("my_task", ["anything", None]),
        _record("tvm_matmul_tune_op", [4, 8, 16], error_no=7),
        _record("tvm_matmul_tune_op", [4, 8, 16], cost=1e-5),
    ]).encode() + b"\n\xff\xfe\n" + dot[:40].encode())  # not UTF-8, then a last line cut short (no newline)
    summary = read_log(path)
    assert [(int(e.where.rsplit(":", 1)[1]), e.reason.split()[0]) for e in summary.bad_lines] == [
        (4, "line"), (5, "error_no"), (6, "cost"), (7, '"r"[0]'), (11, "not"), (12, "truncated")]
    dot_summary, other = summary.workloads
    assert (dot_summary.trials, dot_summary.successes, dot_summary.errors_by_kind) == (3, 2, {"RUN_TIMEOUT": 1})
    assert (dot_summary.best_seconds, dot_summary.best_trial, dot_summary.best_so_far) == (1e-5, 3, [2e-5, 2e-5, 1e-5])
    assert other.op_config is None and "my_task" in other.op_config_note and other.trials == 1


def test_a_workload_without_successes_has_no_best(tmp_path: Path) -> None:
    path = tmp_path / "failed.log"
    path.write_text(_record("tvm_matmul_tune_op", [4, 8, 16], error_no=1) + "\n")
    (w,) = read_log(path).workloads
    assert (w.best_seconds, w.best_trial, w.best_so_far) == (None, None, [math.inf])
    assert w.as_dict()["best_so_far"] == [None]


@pytest.mark.parametrize("make", [lambda p: p / "missing.log", lambda p: p])
def test_an_unreadable_log_raises_input_error(tmp_path: Path, make) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_log(make(tmp_path))


@pytest.mark.parametrize(("name", "opconfigs"), [
    (DEMO_TILING, None), pytest.param(ALEXNET, "alexnet_conv_kernels.txt", marks=needs_logs_and_configs)])
def test_cli_json(demo_logs: dict[str, LogPlan], log_path, tmp_path: Path, name: str, opconfigs: str | None) -> None:
    log = log_path(name)
    configs = OP_CONFIGS / opconfigs if opconfigs else demo_opconfigs(tmp_path)
    want = expected(name, demo_logs)
    proc, data = run_kdb_json("autotvm", "summary", str(log), "--opconfigs", str(configs))
    assert proc.returncode == 0, proc.stderr
    assert data["log"] == str(log) and data["bad_lines"] == []
    assert len(data["workloads"]) == want.workloads
    assert all(w["matched_op_config"].startswith(f"{configs}:") for w in data["workloads"])
    assert all(len(w["best_so_far"]) == w["trials"] == want.trials[args_key(w["args"])] for w in data["workloads"])

    path, expected_bad = _corrupted_copy(log, tmp_path)
    proc, data = run_kdb_json("autotvm", "summary", str(path))
    assert proc.returncode == 1
    assert [b["line"] for b in data["bad_lines"]] == list(expected_bad)


@pytest.mark.parametrize("name", [DEMO_TILING, pytest.param(DEEPSPEECH2, marks=needs_logs)])
def test_cli_table_and_exit_codes(log_path, tmp_path: Path, name: str) -> None:
    log = log_path(name)
    proc = run_kdb("autotvm", "summary", str(log), env={"COLUMNS": "200"})  # cells unfolded
    assert proc.returncode == 0, proc.stderr
    assert "conv2d_nchw" in proc.stdout and f"{summary_of(log).records} records" in proc.stdout
    proc = run_kdb("autotvm", "summary", str(tmp_path / "missing.log"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr
